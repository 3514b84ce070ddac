// A diagnostic LD_PRELOAD shim for atomr-bench-large: for each cuDNN
// convolution and cuFFT C2C call, the host time since this thread's last
// cudaEventRecord (in the bench, the start event e0: so this is the host
// time before the library call, the part a waiting GPU pays in full) and the
// time spent inside the call, per handle (the library's handle and the raw
// side's are different ones). Printed at exit as medians. With
// CALL_GAP_TRACE=1 it also keeps, for each call within 50 us of a record, the
// timeline of malloc, free, pthread_mutex_lock, cudaGetDevice, cudaEventQuery
// and cudaStreamWaitEvent calls between the record and the call (TSC stamps),
// and of a few of the library's own functions on that path (device::status,
// check_conv2d, stream_busy, make_plan_key, launch::begin, launch::access,
// launch::make_current: interposed by their mangled names, which works
// because calls inside the shared library go through its PLT),
// and prints the per-position medians of the most common sequence per handle:
// where the host time before the call goes. Build and use:
//   g++ -O2 -shared -fPIC -o /tmp/call_gap.so bench/tools/call_gap.cpp
//       -I/usr/local/cuda/include -ldl
//   LD_PRELOAD=/tmp/call_gap.so build-gpu/bench/atomr-bench-large --work ...
#include <cuda_runtime_api.h>
#include <cufft.h>
#include <dlfcn.h>
#include <pthread.h>
#include <x86intrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern "C" void* __libc_malloc(size_t);
extern "C" void __libc_free(void*);

namespace {

double now_us() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

thread_local double t_record = 0;  // this thread's last cudaEventRecord
thread_local double t_getdev = 0;  // its last cudaGetDevice (run_kernel's make_current)
thread_local int n_query = 0;      // cudaEventQuery calls since t_record

// --- the timeline (CALL_GAP_TRACE=1) ---
constexpr std::size_t k_marks = 96;
struct mark {
  const char* what;
  std::uint64_t tsc;
};
struct timeline {
  std::array<mark, k_marks> m;
  std::size_t n = 0;
  std::uint64_t start = 0;  // TSC at the record's return
  bool overflow = false;
};
const bool g_trace = [] {
  const char* e = std::getenv("CALL_GAP_TRACE");
  return e && *e == '1';
}();
thread_local timeline t_line;
thread_local bool t_busy = false;  // inside the shim's own bookkeeping

void stamp(const char* what) {
  if (!g_trace || t_busy || t_line.start == 0) return;
  if (t_line.n < k_marks)
    t_line.m[t_line.n++] = {what, __rdtsc()};
  else
    t_line.overflow = true;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct series {
  std::vector<double> before, inside, after_getdev, queries;
  std::vector<timeline> lines;  // the calls within 50 us of a record (trace mode)
};
std::mutex g_mu;
std::map<std::pair<const char*, const void*>, series> g_calls;  // (call, handle)

// TSC against CLOCK_MONOTONIC, from the shim's load to the report.
const std::uint64_t g_tsc0 = __rdtsc();
const double g_us0 = now_us();

void note(const char* call, const void* handle, double t0, double t1, std::uint64_t tsc_call) {
  t_busy = true;
  {
    std::lock_guard lk(g_mu);
    auto& s = g_calls[{call, handle}];
    const double before = t_record > 0 ? t0 - t_record : -1;
    s.before.push_back(before);
    s.inside.push_back(t1 - t0);
    s.after_getdev.push_back(t_getdev > t_record ? t0 - t_getdev : -1);
    s.queries.push_back(n_query);
    if (g_trace && before >= 0 && before < 50 && t_line.start != 0) {
      auto line = t_line;
      if (line.n < k_marks) line.m[line.n++] = {call, tsc_call};
      s.lines.push_back(line);
    }
  }
  t_line.start = 0;
  t_busy = false;
}

/// Per-position medians (us after the record) of the most common sequence of `lines`.
void print_timeline(const char* call, const void* handle, const std::vector<timeline>& lines,
                    double us_per_tick) {
  std::map<std::string, std::vector<const timeline*>> by_seq;
  for (auto& l : lines) {
    std::string key;
    for (std::size_t i = 0; i < l.n; ++i) {
      key += l.m[i].what;
      key += ';';
    }
    if (l.overflow) key += "...";
    by_seq[key].push_back(&l);
  }
  const std::vector<const timeline*>* best = nullptr;
  for (auto& [k, v] : by_seq)
    if (!best || v.size() > best->size()) best = &v;
  if (!best) return;
  const auto& first = *best->front();
  std::fprintf(stderr,
               "call_gap trace: %s handle %p: %zu of %zu timelines share the most common "
               "sequence (%zu distinct, %zu marks); per position, median us after the record:\n",
               call, handle, best->size(), lines.size(), by_seq.size(), first.n);
  for (std::size_t i = 0; i < first.n; ++i) {
    std::vector<double> at;
    for (auto* l : *best) at.push_back(static_cast<double>(l->m[i].tsc - l->start) * us_per_tick);
    std::fprintf(stderr, "call_gap trace:   %2zu %-28s %8.3f\n", i, first.m[i].what, median(at));
  }
}

struct report {
  ~report() {
    std::lock_guard lk(g_mu);
    const double us_per_tick =
        (now_us() - g_us0) / static_cast<double>(std::max<std::uint64_t>(1, __rdtsc() - g_tsc0));
    for (auto& [k, s] : g_calls) {
      print_timeline(k.first, k.second, s.lines, us_per_tick);
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
  t_line.n = 0;
  t_line.overflow = false;
  t_line.start = __rdtsc();
  return r;
}

cudaError_t cudaGetDevice(int* d) {
  static auto real = next<cudaError_t (*)(int*)>("cudaGetDevice");
  stamp("cudaGetDevice");
  const auto r = real(d);
  t_getdev = now_us();
  return r;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  static auto real = next<cudaError_t (*)(cudaEvent_t)>("cudaEventQuery");
  stamp("cudaEventQuery");
  ++n_query;
  return real(e);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
  static auto real =
      next<cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned int)>("cudaStreamWaitEvent");
  stamp("cudaStreamWaitEvent");
  return real(s, e, f);
}

// No function-local static here: its guard may itself take a mutex.
int (*g_real_lock)(pthread_mutex_t*) = nullptr;
int pthread_mutex_lock(pthread_mutex_t* m) {
  if (!g_real_lock) g_real_lock = next<int (*)(pthread_mutex_t*)>("pthread_mutex_lock");
  stamp("pthread_mutex_lock");
  return g_real_lock(m);
}

void* malloc(size_t n) {
  stamp("malloc");
  return __libc_malloc(n);
}

void free(void* p) {
  if (p) stamp("free");
  __libc_free(p);
}

cufftResult cufftExecC2C(cufftHandle h, cufftComplex* in, cufftComplex* out, int dir) {
  static auto real =
      next<cufftResult (*)(cufftHandle, cufftComplex*, cufftComplex*, int)>("cufftExecC2C");
  const auto tsc = __rdtsc();
  const double t0 = now_us();
  const auto r = real(h, in, out, dir);
  note("cufftExecC2C", reinterpret_cast<const void*>(static_cast<std::uintptr_t>(h)), t0, now_us(),
       tsc);
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
  const auto tsc = __rdtsc();
  const double t0 = now_us();
  const int r = real(h, alpha, xd, x, wd, w, cd, algo, ws, wsb, beta, yd, y);
  note("cudnnConvolutionForward", h, t0, now_us(), tsc);
  return r;
}

// The library's functions on the path, by mangled name (g++, x86-64). Each
// takes at most six integer-class arguments (with the hidden result pointer,
// which comes back in rax), so a forwarder of six pointers passes them on.
#define CALL_GAP_MARK(mangled, label)                                   \
  void* mangled(void* a, void* b, void* c, void* d, void* e, void* f) { \
    using fn = void* (*)(void*, void*, void*, void*, void*, void*);     \
    static auto real = next<fn>(#mangled);                              \
    stamp(label);                                                       \
    return real(a, b, c, d, e, f);                                      \
  }
CALL_GAP_MARK(_ZNK5atomr4cuda6device6statusEv, "device::status")
CALL_GAP_MARK(
    _ZN5atomr4cuda6detail12check_conv2dESt17basic_string_viewIcSt11char_traitsIcEERKNS0_12tensor_shapeERKNS0_13conv2d_paramsE,
    "check_conv2d")
CALL_GAP_MARK(_ZN5atomr4cuda6detail11stream_busyERKNS0_6streamE, "stream_busy")
CALL_GAP_MARK(_ZN5atomr4cuda6detail13make_plan_keyERKNS0_9fft_shapeENS1_8fft_typeE, "make_plan_key")
CALL_GAP_MARK(_ZN5atomr4cuda6launch5beginEv, "launch::begin")
CALL_GAP_MARK(_ZN5atomr4cuda6launch6accessERKSt10shared_ptrINS0_6detail12buffer_stateEEb,
              "launch::access")
CALL_GAP_MARK(_ZN5atomr4cuda6launch12make_currentEv, "launch::make_current")
}
