// A diagnostic LD_PRELOAD shim: counts the CUDA runtime and cuBLAS calls a
// process makes and the wall time spent in them, printed at exit. Used to
// see where the library's per-operation CPU time goes (docs/history/performance.md):
//   g++ -O2 -shared -fPIC -o /tmp/api_counter.so bench/tools/api_counter.cpp
//       -I/usr/local/cuda/include -ldl
//   LD_PRELOAD=/tmp/api_counter.so build-gpu/bench/atomr-bench-throughput ...
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace {

struct counter {
  const char* name;
  std::atomic<unsigned long long> calls{0}, ns{0};
};

inline unsigned long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<unsigned long long>(t.tv_sec) * 1000000000ull +
         static_cast<unsigned long long>(t.tv_nsec);
}

counter c_query{"cudaEventQuery"}, c_record{"cudaEventRecord"}, c_wait{"cudaStreamWaitEvent"},
    c_getdev{"cudaGetDevice"}, c_setdev{"cudaSetDevice"}, c_squery{"cudaStreamQuery"},
    c_lasterr{"cudaGetLastError"}, c_sgemm{"cublasSgemm_v2"}, c_sync{"cudaStreamSynchronize"};
counter* all[] = {&c_query,  &c_record,  &c_wait,  &c_getdev, &c_setdev,
                  &c_squery, &c_lasterr, &c_sgemm, &c_sync};

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

struct timed {
  counter& c;
  unsigned long long t0 = now_ns();
  ~timed() {
    c.calls.fetch_add(1, std::memory_order_relaxed);
    c.ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  }
};

struct reporter {
  ~reporter() {
    std::fprintf(stderr, "\napi_counter: %-24s %12s %12s %10s\n", "call", "calls", "total ms",
                 "avg us");
    for (auto* c : all)
      if (c->calls)
        std::fprintf(
            stderr, "api_counter: %-24s %12llu %12.1f %10.3f\n", c->name, c->calls.load(),
            static_cast<double>(c->ns.load()) / 1e6,
            static_cast<double>(c->ns.load()) / 1e3 / static_cast<double>(c->calls.load()));
  }
} report;

}  // namespace

extern "C" {
// With ATOMR_SHIM_NO_BLOCKING_SYNC=1, events are created without
// cudaEventBlockingSync (to measure what that flag costs).
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  static auto f = next<cudaError_t (*)(cudaEvent_t*, unsigned)>("cudaEventCreateWithFlags");
  static const bool strip = [] {
    const char* v = std::getenv("ATOMR_SHIM_NO_BLOCKING_SYNC");
    return v != nullptr && v[0] == '1';
  }();
  return f(e, strip ? (flags & ~cudaEventBlockingSync) : flags);
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  static auto f = next<cudaError_t (*)(cudaEvent_t)>("cudaEventQuery");
  timed t{c_query};
  return f(e);
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  static auto f = next<cudaError_t (*)(cudaEvent_t, cudaStream_t)>("cudaEventRecord");
  timed t{c_record};
  return f(e, s);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int fl) {
  static auto f = next<cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned)>("cudaStreamWaitEvent");
  timed t{c_wait};
  return f(s, e, fl);
}
cudaError_t cudaGetDevice(int* d) {
  static auto f = next<cudaError_t (*)(int*)>("cudaGetDevice");
  timed t{c_getdev};
  return f(d);
}
cudaError_t cudaSetDevice(int d) {
  static auto f = next<cudaError_t (*)(int)>("cudaSetDevice");
  timed t{c_setdev};
  return f(d);
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  static auto f = next<cudaError_t (*)(cudaStream_t)>("cudaStreamQuery");
  timed t{c_squery};
  return f(s);
}
cudaError_t cudaGetLastError() {
  static auto f = next<cudaError_t (*)()>("cudaGetLastError");
  timed t{c_lasterr};
  return f();
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  static auto f = next<cudaError_t (*)(cudaStream_t)>("cudaStreamSynchronize");
  timed t{c_sync};
  return f(s);
}
cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const float* alpha, const float* a, int lda,
                              const float* b, int ldb, const float* beta, float* c, int ldc) {
  static auto f = next<cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                          int, int, const float*, const float*, int, const float*,
                                          int, const float*, float*, int)>("cublasSgemm_v2");
  timed t{c_sgemm};
  return f(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
}
