// copybench: the host copies of a pageable transfer's staging, measured.
//
// A pageable upload copies the caller's data into a pinned staging block
// (then DMA); a pageable download copies the DMA-written staging block out.
// This measures, per 256 KiB copy (the pipeline benchmark's request), the
// CPU time of std::memcpy against copies with non-temporal (streaming)
// stores, on 1 and 4 threads at once, and the H2D DMA that follows an
// upload's copy. Not part of the build (a diagnostic for the device):
//
//   g++ -O2 -std=c++20 -o copybench bench/tools/copybench.cpp
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -pthread
//   ./copybench [KiB] [iterations]
#include <cuda_runtime.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace {

// Streaming copies of whole 4-vector chunks (the benchmark's sizes are
// multiples of 128 bytes), four loads then four stores per chunk, fenced.
void nt_sse2(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<__m128i*>(dst);
  auto* s = static_cast<const __m128i*>(src);
  for (std::size_t i = 0; i < n / 16; i += 4) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(s + i + k);
    for (int k = 0; k < 4; ++k) _mm_stream_si128(d + i + k, v[k]);
  }
  _mm_sfence();
}

__attribute__((target("avx2"))) void nt_avx2(void* dst, const void* src, std::size_t n) {
  auto* d = static_cast<__m256i*>(dst);
  auto* s = static_cast<const __m256i*>(src);
  for (std::size_t i = 0; i < n / 32; i += 4) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_si256(s + i + k);
    for (int k = 0; k < 4; ++k) _mm256_stream_si256(d + i + k, v[k]);
  }
  _mm_sfence();
}

using copy_fn = void (*)(void*, const void*, std::size_t);
void plain(void* d, const void* s, std::size_t n) {
  std::memcpy(d, s, n);
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#define CK(x)                                                       \
  do {                                                              \
    if (cudaError_t e_ = (x); e_ != cudaSuccess) {                  \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

struct per_thread {
  double up_copy = 0, up_dma = 0, down_copy = 0;
};

// One thread: `iters` rounds over 16 slots; each round uploads (copy into the
// slot's pinned block, DMA, sync) and downloads (DMA into the pinned block,
// sync, copy out), timing the copies and the upload's DMA.
per_thread run(copy_fn up, copy_fn down, std::size_t bytes, int iters, void* dev) {
  constexpr int slots = 16;
  // 64-byte aligned (the AVX2 streaming stores of the download need 32).
  struct freer {
    void operator()(char* p) const noexcept { std::free(p); }
  };
  using host_block = std::unique_ptr<char[], freer>;
  auto block = [&](char fill) {
    host_block b(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    std::memset(b.get(), fill, bytes);
    return b;
  };
  std::vector<host_block> src, dst;
  for (int k = 0; k < slots; ++k) {
    src.push_back(block(1));
    dst.push_back(block(2));
  }
  std::vector<void*> pin(slots);
  for (auto& p : pin) CK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  per_thread r;
  for (int i = 0; i < iters; ++i) {
    const int k = i % slots;
    double t0 = now_us();
    up(pin[k], src[k].get(), bytes);
    double t1 = now_us();
    CK(cudaMemcpyAsync(dev, pin[k], bytes, cudaMemcpyHostToDevice, st));
    CK(cudaStreamSynchronize(st));
    double t2 = now_us();
    CK(cudaMemcpyAsync(pin[k], dev, bytes, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    double t3 = now_us();
    down(dst[k].get(), pin[k], bytes);
    double t4 = now_us();
    if (i >= slots) {  // the first round warms up
      r.up_copy += t1 - t0;
      r.up_dma += t2 - t1;
      r.down_copy += t4 - t3;
    }
  }
  const int n = iters - slots;
  r.up_copy /= n;
  r.up_dma /= n;
  r.down_copy /= n;
  for (auto* p : pin) CK(cudaFreeHost(p));
  CK(cudaStreamDestroy(st));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t bytes = (argc > 1 ? std::atoi(argv[1]) : 256) * std::size_t(1024);
  const int iters = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const bool avx2 = __builtin_cpu_supports("avx2");
  struct variant {
    const char* name;
    copy_fn up, down;
  };
  std::vector<variant> vs{{"memcpy/memcpy", plain, plain},
                          {"nt_sse2/memcpy", nt_sse2, plain},
                          {"memcpy/nt_sse2", plain, nt_sse2}};
  if (avx2) vs.push_back({"nt_avx2/nt_avx2", nt_avx2, nt_avx2});
  vs.push_back({"memcpy/memcpy (again)", plain, plain});
  std::printf("%zu KiB copies, %d rounds a thread; us per copy (mean over the threads)\n",
              bytes / 1024, iters);
  std::printf("%-24s %7s %9s %9s %9s\n", "upload/download", "threads", "up copy", "up DMA",
              "down copy");
  for (int threads : {1, 4}) {
    for (const auto& v : vs) {
      std::vector<per_thread> got(threads);
      std::vector<void*> dev(threads);
      for (auto& d : dev) CK(cudaMalloc(&d, bytes));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { got[t] = run(v.up, v.down, bytes, iters, dev[t]); });
      for (auto& t : pool) t.join();
      per_thread m;
      for (auto& g : got) {
        m.up_copy += g.up_copy / threads;
        m.up_dma += g.up_dma / threads;
        m.down_copy += g.down_copy / threads;
      }
      std::printf("%-24s %7d %9.2f %9.2f %9.2f\n", v.name, threads, m.up_copy, m.up_dma,
                  m.down_copy);
      for (auto* d : dev) CK(cudaFree(d));
    }
  }
  return 0;
}
