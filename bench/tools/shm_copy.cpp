// A diagnostic for the isolated device's bandwidth (issue 20): how fast does
// a host memcpy of 256 MiB go into (and out of) each kind of memory a
// transfer can stage through, and how fast does the DMA read and write it?
// No library involved. Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -o /tmp/shm_copy bench/tools/shm_copy.cpp
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -lrt
//   /tmp/shm_copy [MiB]   (default 256)
// Kinds: cudaHostAlloc (the in-process pinned pool), POSIX shared memory
// mapped and cudaHostRegister'ed (the isolated device's arena; the service
// maps the same object a second time, as here), and plain malloc. Each
// line: memcpy in (pageable source -> staging), memcpy out (staging ->
// pageable), H2D and D2H DMA, in GB/s, median of 5.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

double gbs(std::size_t bytes, const std::function<void()>& f) {
  std::vector<double> v;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    if (i)
      v.push_back(static_cast<double>(bytes) / std::chrono::duration<double>(t1 - t0).count() /
                  1e9);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void row(const char* name, std::byte* staging, std::size_t bytes, std::byte* page, void* dev,
         cudaStream_t s, bool dma) {
  const double in = gbs(bytes, [&] { std::memcpy(staging, page, bytes); });
  const double out = gbs(bytes, [&] { std::memcpy(page, staging, bytes); });
  double h2d = 0, d2h = 0;
  if (dma) {
    h2d = gbs(bytes, [&] {
      check(cudaMemcpyAsync(dev, staging, bytes, cudaMemcpyHostToDevice, s), "h2d");
      check(cudaStreamSynchronize(s), "sync");
    });
    d2h = gbs(bytes, [&] {
      check(cudaMemcpyAsync(staging, dev, bytes, cudaMemcpyDeviceToHost, s), "d2h");
      check(cudaStreamSynchronize(s), "sync");
    });
  }
  std::printf("%-28s memcpy in %6.2f  out %6.2f  H2D %6.2f  D2H %6.2f GB/s\n", name, in, out, h2d,
              d2h);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const std::size_t bytes = mib << 20;
  std::vector<std::byte> page(bytes, std::byte{3});  // the user's pageable buffer
  void* dev = nullptr;
  cudaStream_t s;
  check(cudaMalloc(&dev, bytes), "cudaMalloc");
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");

  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::memset(pinned, 0, bytes);
  row("cudaHostAlloc", static_cast<std::byte*>(pinned), bytes, page.data(), dev, s, true);

  const std::string name = "/atomr-shm-copy-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return 1;
  // The worker's mapping (registered) and the service's (a second mapping).
  void* worker = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* service = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* service_pop =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::shm_unlink(name.c_str());
  if (worker == MAP_FAILED || service == MAP_FAILED || service_pop == MAP_FAILED) return 1;
  check(cudaHostRegister(worker, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  row("shm, registered mapping", static_cast<std::byte*>(worker), bytes, page.data(), dev, s, true);
  row("shm, second mapping", static_cast<std::byte*>(service), bytes, page.data(), dev, s, false);
  row("shm, second, MAP_POPULATE", static_cast<std::byte*>(service_pop), bytes, page.data(), dev, s,
      false);
  if (::madvise(service, bytes, MADV_HUGEPAGE) == 0)
    row("shm, second, MADV_HUGEPAGE", static_cast<std::byte*>(service), bytes, page.data(), dev, s,
        false);
  else
    std::printf("shm MADV_HUGEPAGE: refused\n");

  std::vector<std::byte> plain(bytes, std::byte{0});
  row("malloc (pageable)", plain.data(), bytes, page.data(), dev, s, false);
  return 0;
}
