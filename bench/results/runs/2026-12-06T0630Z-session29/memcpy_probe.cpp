// Why is the copy into the isolated device's shared arena slower than into
// cudaHostAlloc memory? memcpy 256 MiB from pageable memory into several
// kinds of destination; GB/s, median of 7 after one warm-up.
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ipc = boost::interprocess;
using clk = std::chrono::steady_clock;
static const std::size_t N = std::size_t{256} << 20, piece = std::size_t{16} << 20;

static void nt_sse2(std::byte* d, const std::byte* s, std::size_t n) {
  while ((reinterpret_cast<std::uintptr_t>(d) & 15) && n) {
    *d++ = *s++;
    --n;
  }
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();
  std::memcpy(d + i, s + i, n - i);
}
__attribute__((target("avx2"))) static void nt_avx2(std::byte* d, const std::byte* s,
                                                    std::size_t n) {
  while ((reinterpret_cast<std::uintptr_t>(d) & 31) && n) {
    *d++ = *s++;
    --n;
  }
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  _mm_sfence();
  std::memcpy(d + i, s + i, n - i);
}

static double run(const char* what, std::byte* dst, const std::byte* src, int mode,
                  bool down = false) {
  std::vector<double> v;
  for (int i = 0; i < 8; ++i) {
    auto t0 = clk::now();
    auto* d = down ? const_cast<std::byte*>(src) : dst;
    const auto* s = down ? dst : src;
    if (mode == 0)
      std::memcpy(d, s, N);
    else if (mode == -1)
      for (std::size_t at = 0; at < N; at += piece) nt_sse2(d + at, s + at, piece);
    else if (mode == -2)
      for (std::size_t at = 0; at < N; at += piece) nt_avx2(d + at, s + at, piece);
    else if (mode == -4)
      for (std::size_t at = 0; at < N; at += 4 * piece) std::memcpy(d + at, s + at, 4 * piece);
    else if (mode == -5)
      for (std::size_t at = 0; at < N; at += piece / 4) std::memcpy(d + at, s + at, piece / 4);
    else if (mode == 1)
      for (std::size_t at = 0; at < N; at += piece) std::memcpy(d + at, s + at, piece);
    else {
      std::vector<std::thread> th;
      const std::size_t part = N / mode;
      for (int k = 0; k < mode; ++k)
        th.emplace_back([=] { std::memcpy(d + k * part, s + k * part, part); });
      for (auto& t : th) t.join();
    }
    double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    if (i) v.push_back(ms);
  }
  std::sort(v.begin(), v.end());
  double ms = v[v.size() / 2];
  std::printf("%-58s %s %-10s %7.2f ms %6.2f GB/s\n", what, down ? "from" : "into",
              mode == 0    ? "one"
              : mode == 1  ? "16MiB"
              : mode == -1 ? "nt-sse2"
              : mode == -2 ? "nt-avx2"
              : mode == -4 ? "64MiB"
              : mode == -5 ? "4MiB"
                           : (std::to_string(mode) + "thr").c_str(),
              ms, N / ms / 1e6);
  return ms;
}

static std::string cat(const char* p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

int main() {
  std::printf("avx2: %d\n", __builtin_cpu_supports("avx2"));
  std::printf("THP enabled: %s\nTHP shmem: %s\nnr_hugepages: %s\n",
              cat("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              cat("/sys/kernel/mm/transparent_hugepage/shmem_enabled").c_str(),
              cat("/proc/sys/vm/nr_hugepages").c_str());
  std::vector<std::byte> src(N, std::byte{3});
  auto fresh_shm = [](const char* name, bool huge, bool touch) {
    ipc::shared_memory_object::remove(name);
    ipc::shared_memory_object shm(ipc::create_only, name, ipc::read_write);
    shm.truncate(N);
    auto* r = new ipc::mapped_region(shm, ipc::read_write);
    if (huge) madvise(r->get_address(), N, MADV_HUGEPAGE);
    if (touch) std::memset(r->get_address(), 0, N);
    return r;
  };
  // pageable destination
  std::vector<std::byte> plain(N, std::byte{1});
  for (int m : {0, 1, 2, 4}) run("malloc'd, touched", plain.data(), src.data(), m);
  run("malloc'd, touched", plain.data(), src.data(), 0, true);
  {
    void* p = std::aligned_alloc(2 << 20, N);
    madvise(p, N, MADV_HUGEPAGE);
    std::memset(p, 0, N);
    run("aligned_alloc 2 MiB + MADV_HUGEPAGE, touched", static_cast<std::byte*>(p), src.data(), 0);
    run("aligned_alloc 2 MiB + MADV_HUGEPAGE, touched", static_cast<std::byte*>(p), src.data(), 0,
        true);
    std::free(p);
  }
  void* pinned = nullptr;
  if (cudaHostAlloc(&pinned, N, cudaHostAllocDefault) == cudaSuccess) {
    for (int m : {0, 1, 2, 4, -1, -2})
      run("cudaHostAlloc", static_cast<std::byte*>(pinned), src.data(), m);
    run("cudaHostAlloc", static_cast<std::byte*>(pinned), src.data(), 0, true);
    cudaFreeHost(pinned);
  } else
    std::printf("cudaHostAlloc failed\n");
  {
    auto* r = fresh_shm("/atomr-probe-a", false, true);
    for (int m : {0, 1, 2, 4, -1, -2, -4, -5})
      run("shm (interprocess), touched", static_cast<std::byte*>(r->get_address()), src.data(), m);
    run("shm (interprocess), touched", static_cast<std::byte*>(r->get_address()), src.data(), 0,
        true);
    run("shm (interprocess), touched", static_cast<std::byte*>(r->get_address()), src.data(), 1,
        true);
    run("shm (interprocess), touched", static_cast<std::byte*>(r->get_address()), src.data(), -1,
        true);
    // The worker's view: a second mapping of the object, registered.
    ipc::shared_memory_object shm(ipc::open_only, "/atomr-probe-a", ipc::read_write);
    ipc::mapped_region w(shm, ipc::read_write);
    auto e = cudaHostRegister(w.get_address(), N, cudaHostRegisterDefault);
    std::printf("cudaHostRegister of a second mapping: %s\n", cudaGetErrorString(e));
    run("shm, another mapping registered", static_cast<std::byte*>(r->get_address()), src.data(),
        0);
    run("shm, another mapping registered", static_cast<std::byte*>(r->get_address()), src.data(), 0,
        true);
    run("shm, the registered mapping itself", static_cast<std::byte*>(w.get_address()), src.data(),
        0);
    if (e == cudaSuccess) cudaHostUnregister(w.get_address());
    delete r;
    ipc::shared_memory_object::remove("/atomr-probe-a");
  }
  {
    auto* r = fresh_shm("/atomr-probe-b", true, true);
    run("shm + MADV_HUGEPAGE, touched", static_cast<std::byte*>(r->get_address()), src.data(), 0);
    delete r;
    ipc::shared_memory_object::remove("/atomr-probe-b");
  }
  {
    auto* r = fresh_shm("/atomr-probe-c", false, false);
    auto t0 = clk::now();
    std::memcpy(r->get_address(), src.data(), N);
    std::printf("shm, first touch by the copy itself: %.2f ms\n",
                std::chrono::duration<double, std::milli>(clk::now() - t0).count());
    delete r;
    ipc::shared_memory_object::remove("/atomr-probe-c");
  }
  {
    void* p = mmap(nullptr, N, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    std::memset(p, 0, N);
    run("mmap MAP_SHARED|MAP_ANONYMOUS, touched", static_cast<std::byte*>(p), src.data(), 0);
    munmap(p, N);
  }
  return 0;
}
