// A diagnostic LD_PRELOAD shim for atomr-bench-large: for each cuDNN
// convolution and cuFFT C2C call, the host time since this thread's last
// cudaEventRecord (in the bench, the start event e0: so this is the host
// time before the library call, the part a waiting GPU pays in full) and the
// time spent inside the call, per handle (the library's handle and the raw
// side's are different ones). Printed at exit as medians. Build and use:
//   g++ -O2 -shared -fPIC -o /tmp/call_gap.so bench/tools/call_gap.cpp
//       -I/usr/local/cuda/include -ldl
//   LD_PRELOAD=/tmp/call_gap.so build-gpu/bench/atomr-bench-large --work ...
#include <cuda_runtime_api.h>
#include <cufft.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <vector>

namespace {

double now_us() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

thread_local double t_record = 0;  // this thread's last cudaEventRecord
thread_local double t_getdev = 0;  // its last cudaGetDevice (run_kernel's make_current)
thread_local int n_query = 0;      // cudaEventQuery calls since t_record

struct series {
  std::vector<double> before, inside, after_getdev, queries;
};
std::mutex g_mu;
std::map<std::pair<const char*, const void*>, series> g_calls;  // (call, handle)

void note(const char* call, const void* handle, double t0, double t1) {
  std::lock_guard lk(g_mu);
  auto& s = g_calls[{call, handle}];
  s.before.push_back(t_record > 0 ? t0 - t_record : -1);
  s.inside.push_back(t1 - t0);
  s.after_getdev.push_back(t_getdev > t_record ? t0 - t_getdev : -1);
  s.queries.push_back(n_query);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct report {
  ~report() {
    std::lock_guard lk(g_mu);
    for (auto& [k, s] : g_calls) {
      // The calls right after a start event (gpu_spans), not those whose last
      // record is a whole operation earlier (interleave(), warm-up runs).
      std::vector<double> near;
      for (double b : s.before)
        if (b >= 0 && b < 50) near.push_back(b);
      std::fprintf(stderr,
                   "call_gap: %s handle %p: %zu of the calls within 50 us of a record: %.2f us\n",
                   k.first, k.second, near.size(), median(near));
      std::fprintf(stderr,
                   "call_gap: %s handle %p: %zu calls, median %.2f us since the last "
                   "cudaEventRecord (%.2f us since a cudaGetDevice after it, -1: none; %.0f "
                   "cudaEventQuery calls between), %.2f us inside\n",
                   k.first, k.second, s.inside.size(), median(s.before), median(s.after_getdev),
                   median(s.queries), median(s.inside));
    }
  }
} g_report;

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  static auto real = next<cudaError_t (*)(cudaEvent_t, cudaStream_t)>("cudaEventRecord");
  const auto r = real(e, s);
  t_record = now_us();
  n_query = 0;
  return r;
}

cudaError_t cudaGetDevice(int* d) {
  static auto real = next<cudaError_t (*)(int*)>("cudaGetDevice");
  const auto r = real(d);
  t_getdev = now_us();
  return r;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  static auto real = next<cudaError_t (*)(cudaEvent_t)>("cudaEventQuery");
  ++n_query;
  return real(e);
}

cufftResult cufftExecC2C(cufftHandle h, cufftComplex* in, cufftComplex* out, int dir) {
  static auto real =
      next<cufftResult (*)(cufftHandle, cufftComplex*, cufftComplex*, int)>("cufftExecC2C");
  const double t0 = now_us();
  const auto r = real(h, in, out, dir);
  note("cufftExecC2C", reinterpret_cast<const void*>(static_cast<std::uintptr_t>(h)), t0, now_us());
  return r;
}

// cudnnConvolutionForward, declared here so that the shim needs no cuDNN
// headers (its handle is the first argument; the rest is passed through).
using cudnn_conv_fn = int (*)(void*, const void*, void*, const void*, void*, const void*, void*,
                              int, void*, size_t, const void*, void*, void*);
int cudnnConvolutionForward(void* h, const void* alpha, void* xd, const void* x, void* wd,
                            const void* w, void* cd, int algo, void* ws, size_t wsb,
                            const void* beta, void* yd, void* y) {
  static auto real = next<cudnn_conv_fn>("cudnnConvolutionForward");
  const double t0 = now_us();
  const int r = real(h, alpha, xd, x, wd, w, cd, algo, ws, wsb, beta, yd, y);
  note("cudnnConvolutionForward", h, t0, now_us());
  return r;
}
}
