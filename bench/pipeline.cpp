// atomr-bench-pipeline (issue 19): one request = pageable upload of an n x n
// f32 matrix, gemm with device-resident weights, cuDNN relu, pageable
// download, one element checked against a double-precision reference. The
// library (per-op awaits, or one compose() unit) on an io_context run by T
// threads, against raw CUDA in the same run: T threads, each with its own
// stream, cuBLAS and cuDNN handles, pinned staging, one event sync per
// request, the same number of requests in flight in all.
#include "bench.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace atomr::cuda;

namespace {

constexpr const char* prog = "atomr-bench-pipeline";

struct options {
  int n = 256;
  int threads = 4;
  std::vector<int> in_flight{4, 16, 512};
  std::vector<std::string> variants{"per_op", "composed", "fused", "graph", "fused_graph"};
  double seconds = 2.0;
  double warmup = 0.3;
  int device = 0;
  /// --timeout-ms: every wait's deadline (the device's default completion,
  /// event_poll with this timeout), as a service puts on its requests; 0 none.
  long timeout_ms = 0;
  /// Diagnostics of the library's side (the device's options; -1 and ""
  /// keep the library's defaults): where a composed unit's time goes.
  long long launch_threads = -1;
  long long launch_spin_us = -1;
  std::string strategy;
  /// --io-spin-us: the io threads look for handlers for this long after
  /// their last one before they block (0: io_context::run, the default).
  long long io_spin_us = 0;
  std::string json;
};

std::vector<float> random_matrix(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (auto& f : v) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    f = static_cast<float>((x * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f - 0.5f;
  }
  return v;
}

/// (X W)[k] in double (column-major), through relu when `relu`, and the sum
/// of |terms| for a tolerance.
std::pair<double, double> reference(const std::vector<float>& x, const std::vector<float>& w, int n,
                                    std::size_t k, bool relu = true) {
  const std::size_t r = k % n, c = k / n;
  double acc = 0, mag = 0;
  for (int j = 0; j < n; ++j) {
    const double t = double(x[r + std::size_t(j) * n]) * double(w[j + c * n]);
    acc += t;
    mag += std::fabs(t);
  }
  return {relu ? std::max(acc, 0.0) : acc, mag};
}

/// One request's data: fixed input, the checked element and its reference.
/// serve_gemm's request (atomr-serve's /v1/gemm: both factors in the
/// request, no relu) also has hb, the second factor, and its own reference.
struct request_data {
  std::vector<float> hx, hb, hz;
  std::size_t k = 0;
  double ref = 0, tol = 0, ref_ab = 0, tol_ab = 0;
  bool check(bool ab = false) const {
    const double got = hz[k];
    return std::isfinite(got) && std::fabs(got - (ab ? ref_ab : ref)) <= (ab ? tol_ab : tol);
  }
};

request_data make_request_data(const std::vector<float>& w, int n, std::uint64_t seed) {
  request_data d;
  const std::size_t nn = std::size_t(n) * n;
  d.hx = random_matrix(nn, seed);
  d.hz.assign(nn, std::nanf(""));
  d.k = (seed * 7919) % nn;
  auto [ref, mag] = reference(d.hx, w, n, d.k);
  d.ref = ref;
  d.tol = 1e-5 * mag + 1e-6;
  d.hb = random_matrix(nn, seed + 100000);
  auto [ref_ab, mag_ab] = reference(d.hx, d.hb, n, d.k, false);
  d.ref_ab = ref_ab;
  d.tol_ab = 1e-5 * mag_ab + 1e-6;
  return d;
}

struct result_row {
  std::string variant;
  int in_flight = 0;
  double req_per_s = 0, p50_us = 0, p99_us = 0, mean_us = 0, cpu_us_per_req = 0;
  long wrong = 0;
};

/// Samples the process CPU clock at the start and the end of the window.
struct window {
  double t_start = 0, t_end = 0, cpu_start = 0, cpu_end = 0;
  std::thread sampler;
  window(double warmup_s, double seconds) {
    t_start = bench::now_us() + warmup_s * 1e6;
    t_end = t_start + seconds * 1e6;
    sampler = std::thread([this] {
      std::this_thread::sleep_for(std::chrono::microseconds(long(t_start - bench::now_us())));
      cpu_start = bench::process_cpu_us();
      std::this_thread::sleep_for(std::chrono::microseconds(long(t_end - bench::now_us())));
      cpu_end = bench::process_cpu_us();
    });
  }
  void join() { sampler.join(); }
};

result_row finish(std::string variant, int in_flight, window& win,
                  std::vector<std::vector<double>>& lat, long wrong) {
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  const auto s = bench::summarize(all);
  result_row r;
  r.variant = std::move(variant);
  r.in_flight = in_flight;
  const double secs = (win.t_end - win.t_start) / 1e6;
  r.req_per_s = double(all.size()) / secs;
  r.p50_us = s.median;
  r.p99_us = s.p99;
  r.mean_us = s.mean;
  r.cpu_us_per_req = all.empty() ? 0 : (win.cpu_end - win.cpu_start) / double(all.size());
  r.wrong = wrong;
  return r;
}

// ------------------------------------------------------------------ library

struct lib_ctx {
  asio::io_context& ioc;
  device dev;
  blas_actor blas;
  cudnn_actor dnn;
  gpu_ref<float> w;
  gemm_params p;
  tensor_shape shape;
};

struct lib_slot {
  request_data d;
  gpu_ref<float> x, y, z;
  gpu_ref<float> b;  // serve_gemm: the request's second factor
  // The graph variants: the request's input and output in pinned memory (the
  // graph's copy nodes read and write them), and its unit, recorded once.
  pinned_buffer<float> in, out;
  recorded_unit graph, fused_graph;
  // composed_own (a diagnostic): actors of this slot alone, one lane each on
  // a fresh stream, and a stream for the upload, so that no two requests
  // share a stream (as raw's threads do not); made at the slot's first use.
  std::optional<blas_actor> own_blas;
  std::optional<cudnn_actor> own_dnn;
  stream own_stream;
};

/// Records the slot's request (upload from its pinned input, gemm, relu,
/// download into its pinned output) once; `fused`: gemm_fused's relu.
asio::awaitable<result<recorded_unit>> record_request(lib_ctx& c, lib_slot& s, bool fused) {
  if (fused)
    co_return co_await record(c.dev, upload(s.in, s.x),
                              c.blas.gemm_fused(c.p, gemm_epilogue::relu, s.x, c.w, {}, s.z),
                              download(s.z, s.out));
  co_return co_await record(c.dev, upload(s.in, s.x), c.blas.gemm(c.p, s.x, c.w, s.y),
                            c.dnn.activation_forward(c.shape, {}, s.y, s.z), download(s.z, s.out));
}

asio::awaitable<bool> one_request(lib_ctx& c, lib_slot& s, const std::string& variant) {
  s.d.hz[s.d.k] = std::nanf("");
  if (variant == "graph" || variant == "fused_graph") {
    // The same work as per_op: the input copied into pinned memory, the four
    // operations (replayed as one graph), the output copied out of it.
    const bool fused = variant == "fused_graph";
    auto& unit = fused ? s.fused_graph : s.graph;
    if (!unit) {  // the slot's first request (in the warm-up)
      auto made = co_await record_request(c, s, fused);
      if (!made) {
        std::fprintf(stderr, "%s: record: %s\n", prog, made.error().message().c_str());
        co_return false;
      }
      unit = std::move(made).value();
    }
    std::memcpy(static_cast<void*>(s.in.data()), s.d.hx.data(), s.in.size_bytes());
    if (!co_await replay(unit)) co_return false;
    std::memcpy(s.d.hz.data(), s.out.data(), s.out.size_bytes());
    co_return s.d.check();
  }
  if (variant == "fused") {  // one unit; the relu runs in the gemm's kernel (cuBLASLt)
    auto r = co_await compose(c.dev, upload(s.d.hx, s.x),
                              c.blas.gemm_fused(c.p, gemm_epilogue::relu, s.x, c.w, {}, s.z),
                              download(s.z, s.d.hz));
    co_return r&& s.d.check();
  }
  if (variant == "composed_own") {
    if (!s.own_blas) {
      auto b =
          blas_actor::create(c.dev, {.streams = stream_policy::per_actor_fresh, .max_lanes = 1});
      auto d =
          cudnn_actor::create(c.dev, {.streams = stream_policy::per_actor_fresh, .max_lanes = 1});
      auto st = c.dev.acquire_stream(stream_policy::per_actor_fresh, "bench");
      if (!b || !d || !st) co_return false;
      s.own_blas = b.value();
      s.own_dnn = d.value();
      s.own_stream = st.value();
    }
    auto r = co_await compose(
        c.dev, upload(s.d.hx, s.x, {.on = s.own_stream}), s.own_blas->gemm(c.p, s.x, c.w, s.y),
        s.own_dnn->activation_forward(c.shape, {}, s.y, s.z), download(s.z, s.d.hz));
    co_return r&& s.d.check();
  }
  if (variant == "serve_gemm") {  // atomr-serve's /v1/gemm as one unit
    auto r = co_await compose(c.dev, upload(s.d.hx, s.x), upload(s.d.hb, s.b),
                              c.blas.gemm(c.p, s.x, s.b, s.y), download(s.y, s.d.hz));
    co_return r&& s.d.check(true);
  }
  if (variant == "serve_gemm_alloc") {
    // As atomr-serve does it: the three device buffers allocated for the
    // request and released after it.
    const auto nn = s.d.hx.size();
    auto x = c.dev.allocate<float>(nn), b = c.dev.allocate<float>(nn),
         y = c.dev.allocate<float>(nn);
    if (!x || !b || !y) co_return false;
    auto r = co_await compose(c.dev, upload(s.d.hx, x.value()), upload(s.d.hb, b.value()),
                              c.blas.gemm(c.p, x.value(), b.value(), y.value()),
                              download(y.value(), s.d.hz));
    co_return r&& s.d.check(true);
  }
  if (variant == "composed") {
    auto r =
        co_await compose(c.dev, upload(s.d.hx, s.x), c.blas.gemm(c.p, s.x, c.w, s.y),
                         c.dnn.activation_forward(c.shape, {}, s.y, s.z), download(s.z, s.d.hz));
    co_return r&& s.d.check();
  }
  if (!co_await upload(s.d.hx, s.x)) co_return false;
  if (!co_await c.blas.gemm(c.p, s.x, c.w, s.y)) co_return false;
  if (!co_await c.dnn.activation_forward(c.shape, {}, s.y, s.z)) co_return false;
  if (!co_await download(s.z, s.d.hz)) co_return false;
  co_return s.d.check();
}

asio::awaitable<void> client(lib_ctx& c, lib_slot& s, std::string variant, const window& win,
                             std::vector<double>& lat, std::atomic<long>& wrong,
                             std::atomic<int>& left) {
  for (;;) {
    const double t0 = bench::now_us();
    if (t0 >= win.t_end) break;
    const bool ok = co_await one_request(c, s, variant);
    const double t1 = bench::now_us();
    if (t0 >= win.t_start && t1 <= win.t_end) lat.push_back(t1 - t0);
    if (!ok) ++wrong;
  }
  if (--left == 0) c.ioc.stop();
}

/// One io thread: io_context::run, or with `spin_us` > 0 a loop that polls
/// for handlers and blocks only after `spin_us` without one (a thread that
/// blocks takes microseconds to wake when a completion is posted).
void run_io(asio::io_context& ioc, long long spin_us) {
  if (spin_us <= 0) {
    ioc.run();
    return;
  }
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(spin_us);
  auto last = clock::now();
  for (;;) {
    if (ioc.poll_one()) {
      last = clock::now();
      continue;
    }
    if (ioc.stopped()) return;
    if (clock::now() - last < spin) {
      for (int i = 0; i < 16; ++i) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
      continue;
    }
    if (!ioc.run_one()) return;
    last = clock::now();
  }
}

result_row run_library(lib_ctx& c, std::vector<lib_slot>& slots, const std::string& variant,
                       int in_flight, const options& o) {
  std::vector<std::vector<double>> lat(in_flight);
  std::atomic<long> wrong{0};
  std::atomic<int> left{in_flight};
  window win(o.warmup, o.seconds);
  for (int i = 0; i < in_flight; ++i)
    asio::co_spawn(c.ioc, client(c, slots[i], variant, win, lat[i], wrong, left), asio::detached);
  c.ioc.restart();
  std::vector<std::thread> pool;
  for (int t = 0; t < o.threads; ++t) pool.emplace_back([&] { run_io(c.ioc, o.io_spin_us); });
  for (auto& t : pool) t.join();
  win.join();
  return finish(variant, in_flight, win, lat, wrong.load());
}

// ------------------------------------------------------------------ raw CUDA

#define RAW_OK(call)                                                                          \
  do {                                                                                        \
    if (!(call)) {                                                                            \
      std::fprintf(stderr, "%s: raw baseline failed: %s (line %d)\n", prog, #call, __LINE__); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

/// What a raw thread runs: the pipeline's request as four calls, the same
/// captured once into a CUDA graph per slot, serve_gemm's request (two
/// uploads, the gemm, the download), or the four calls with the relu and the
/// download on a second stream that waits for the gemm's event (`hop`: the
/// streams of a composed unit, whose cuBLAS and cuDNN steps run on their
/// actors' lanes).
enum class raw_kind { calls, graph, serve_gemm, hop };

struct raw_slot {
  request_data d;
  float *px = nullptr, *pz = nullptr, *dx = nullptr, *dy = nullptr, *dz = nullptr;
  float *pb = nullptr, *db = nullptr;  // serve_gemm's second factor
  cudaEvent_t ev = nullptr;
  cudaEvent_t mid = nullptr;       // raw_kind::hop: the gemm's, waited for by the second stream
  cudaGraphExec_t exec = nullptr;  // raw_graph: the slot's captured request
  bool busy = false;
  double t0 = 0;
};

/// One raw thread: its own stream and handles, `depth` requests in flight.
/// raw_kind::graph: each slot's four calls captured once into a CUDA graph
/// (stream capture), then one cudaGraphLaunch per request.
void raw_thread(const options& o, const float* dw, const std::vector<request_data>& data, int depth,
                const window& win, std::vector<double>& lat, std::atomic<long>& wrong,
                raw_kind kind) {
  const bool graph = kind == raw_kind::graph, ab = kind == raw_kind::serve_gemm,
             hop = kind == raw_kind::hop;
  const int n = o.n;
  const std::size_t nn = std::size_t(n) * n, bytes = nn * sizeof(float);
  RAW_OK(cudaSetDevice(o.device) == cudaSuccess);
  cudaStream_t s;
  RAW_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaStream_t s2 = s;  // the relu's and the download's
  if (hop) RAW_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
  cublasHandle_t b;
  RAW_OK(cublasCreate(&b) == CUBLAS_STATUS_SUCCESS);
  RAW_OK(cublasSetStream(b, s) == CUBLAS_STATUS_SUCCESS);
  RAW_OK(cublasSetMathMode(b, CUBLAS_PEDANTIC_MATH) == CUBLAS_STATUS_SUCCESS);  // as blas_actor
  cudnnHandle_t h;
  RAW_OK(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS);
  RAW_OK(cudnnSetStream(h, s2) == CUDNN_STATUS_SUCCESS);
  cudnnTensorDescriptor_t td;
  RAW_OK(cudnnCreateTensorDescriptor(&td) == CUDNN_STATUS_SUCCESS);
  RAW_OK(cudnnSetTensor4dDescriptor(td, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, n, n) ==
         CUDNN_STATUS_SUCCESS);
  cudnnActivationDescriptor_t ad;
  RAW_OK(cudnnCreateActivationDescriptor(&ad) == CUDNN_STATUS_SUCCESS);
  RAW_OK(cudnnSetActivationDescriptor(ad, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0) ==
         CUDNN_STATUS_SUCCESS);
  std::vector<raw_slot> slots(depth);
  for (int i = 0; i < depth; ++i) {
    auto& sl = slots[i];
    sl.d = data[i % data.size()];
    RAW_OK(cudaMallocHost(&sl.px, bytes) == cudaSuccess);
    RAW_OK(cudaMallocHost(&sl.pz, bytes) == cudaSuccess);
    RAW_OK(cudaMalloc(&sl.dx, bytes) == cudaSuccess);
    RAW_OK(cudaMalloc(&sl.dy, bytes) == cudaSuccess);
    RAW_OK(cudaMalloc(&sl.dz, bytes) == cudaSuccess);
    RAW_OK(cudaEventCreateWithFlags(&sl.ev, cudaEventDisableTiming) == cudaSuccess);
    if (hop) RAW_OK(cudaEventCreateWithFlags(&sl.mid, cudaEventDisableTiming) == cudaSuccess);
    if (ab) {
      RAW_OK(cudaMallocHost(&sl.pb, bytes) == cudaSuccess);
      RAW_OK(cudaMalloc(&sl.db, bytes) == cudaSuccess);
    }
  }
  const float one = 1.0f, zero = 0.0f;
  auto enqueue = [&](raw_slot& sl) {
    RAW_OK(cudaMemcpyAsync(sl.dx, sl.px, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
    if (ab) {
      RAW_OK(cudaMemcpyAsync(sl.db, sl.pb, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
      RAW_OK(cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, sl.dx, n, sl.db, n, &zero,
                         sl.dy, n) == CUBLAS_STATUS_SUCCESS);
      RAW_OK(cudaMemcpyAsync(sl.pz, sl.dy, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
      return;
    }
    RAW_OK(cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, sl.dx, n, dw, n, &zero, sl.dy,
                       n) == CUBLAS_STATUS_SUCCESS);
    if (hop) {
      RAW_OK(cudaEventRecord(sl.mid, s) == cudaSuccess);
      RAW_OK(cudaStreamWaitEvent(s2, sl.mid, 0) == cudaSuccess);
    }
    RAW_OK(cudnnActivationForward(h, ad, &one, td, sl.dy, &zero, td, sl.dz) ==
           CUDNN_STATUS_SUCCESS);
    RAW_OK(cudaMemcpyAsync(sl.pz, sl.dz, bytes, cudaMemcpyDeviceToHost, s2) == cudaSuccess);
  };
  void* workspace = nullptr;  // cuBLAS's workspace in the captured graphs
  if (graph) {
    const std::size_t ws = std::size_t{32} << 20;
    RAW_OK(cudaMalloc(&workspace, ws) == cudaSuccess);
    RAW_OK(cublasSetWorkspace(b, workspace, ws) == CUBLAS_STATUS_SUCCESS);
    for (auto& sl : slots) {
      RAW_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      enqueue(sl);
      cudaGraph_t g = nullptr;
      RAW_OK(cudaStreamEndCapture(s, &g) == cudaSuccess);
      RAW_OK(cudaGraphInstantiate(&sl.exec, g, 0) == cudaSuccess);
      cudaGraphDestroy(g);
    }
  }
  for (bool running = true; running;) {
    running = false;
    for (auto& sl : slots) {
      if (sl.busy) {
        RAW_OK(cudaEventSynchronize(sl.ev) == cudaSuccess);  // the request's one sync
        std::memcpy(sl.d.hz.data(), sl.pz, bytes);           // out of pinned staging
        const double t1 = bench::now_us();
        if (sl.t0 >= win.t_start && t1 <= win.t_end) lat.push_back(t1 - sl.t0);
        if (!sl.d.check(ab)) ++wrong;
        sl.busy = false;
      }
      sl.t0 = bench::now_us();
      if (sl.t0 >= win.t_end) continue;
      running = true;
      sl.d.hz[sl.d.k] = std::nanf("");
      std::memcpy(sl.px, sl.d.hx.data(), bytes);  // into pinned staging
      if (ab) std::memcpy(sl.pb, sl.d.hb.data(), bytes);
      if (graph)
        RAW_OK(cudaGraphLaunch(sl.exec, s) == cudaSuccess);
      else
        enqueue(sl);
      RAW_OK(cudaEventRecord(sl.ev, s2) == cudaSuccess);
      sl.busy = true;
    }
  }
  for (auto& sl : slots) {
    if (sl.exec) cudaGraphExecDestroy(sl.exec);
    cudaEventDestroy(sl.ev);
    if (sl.mid) cudaEventDestroy(sl.mid);
    cudaFreeHost(sl.px);
    cudaFreeHost(sl.pz);
    cudaFree(sl.dx);
    cudaFree(sl.dy);
    cudaFree(sl.dz);
    if (sl.pb) cudaFreeHost(sl.pb);
    if (sl.db) cudaFree(sl.db);
  }
  cudnnDestroyActivationDescriptor(ad);
  cudnnDestroyTensorDescriptor(td);
  cudnnDestroy(h);
  cublasDestroy(b);
  if (workspace) cudaFree(workspace);
  if (hop) cudaStreamDestroy(s2);
  cudaStreamDestroy(s);
}

result_row run_raw(const options& o, const float* dw, const std::vector<request_data>& data,
                   int in_flight, raw_kind kind = raw_kind::calls) {
  const int threads = std::min(o.threads, in_flight);
  std::vector<std::vector<double>> lat(threads);
  std::atomic<long> wrong{0};
  window win(o.warmup, o.seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int depth = in_flight / threads + (t < in_flight % threads ? 1 : 0);
    pool.emplace_back([&, t, depth] { raw_thread(o, dw, data, depth, win, lat[t], wrong, kind); });
  }
  for (auto& t : pool) t.join();
  win.join();
  return finish(kind == raw_kind::graph        ? "raw_graph"
                : kind == raw_kind::serve_gemm ? "raw_serve_gemm"
                : kind == raw_kind::hop        ? "raw_hop"
                                               : "raw",
                in_flight, win, lat, wrong.load());
}

// ------------------------------------------------------------------ main

int usage(const char* why) {
  if (why) std::fprintf(stderr, "%s: %s\n", prog, why);
  std::fprintf(why ? stderr : stdout,
               "usage: %s [--n N] [--threads T] [--in-flight LIST] [--variants LIST]\n"
               "          [--seconds S] [--device D] [--timeout-ms MS] [--json FILE]\n"
               "          [--launch-threads N] [--launch-spin-us U] [--strategy S]\n"
               "          [--io-spin-us U]\n"
               "One request: pageable upload of N x N f32 (default 256), gemm with device\n"
               "weights, cuDNN relu, pageable download, one element checked. Variants:\n"
               "per_op (four awaits), composed (one compose() unit), fused (one unit with\n"
               "gemm_fused's relu epilogue), graph (the four recorded once with record(),\n"
               "then replay() with the input and output in pinned memory), fused_graph\n"
               "(the fused unit recorded); each against raw CUDA (four calls) with the\n"
               "same requests in flight (default 4,16,512) on T threads (default 4).\n"
               "Reports req/s, p50, p99 and mean latency (raw CUDA's too), process CPU time\n"
               "per request.\n"
               "Diagnostics, not in the default list: composed_own (composed with actors\n"
               "and an upload stream of each request slot's own: no stream shared between\n"
               "requests) and raw_graph (raw CUDA with each slot's four calls captured once\n"
               "into a CUDA graph, one cudaGraphLaunch per request), raw_hop (raw CUDA\n"
               "with the relu and the download on a second stream of the thread that\n"
               "waits for the gemm's event: a composed unit's two streams). serve_gemm: the\n"
               "request of atomr-serve's /v1/gemm (pageable uploads of both N x N factors,\n"
               "the gemm, pageable download; one element checked) as one compose() unit,\n"
               "against raw CUDA doing that request (its row's raw columns), for the\n"
               "service's comparison with the library (scripts/bench.sh service);\n"
               "serve_gemm_alloc: the same with the request's three device buffers\n"
               "allocated and released per request, as atomr-serve does.\n"
               "--timeout-ms MS: the library's waits (each await, each unit) get a deadline\n"
               "of MS milliseconds, as a service's requests have (default: none); raw CUDA\n"
               "is unchanged.\n"
               "Diagnostics (the library's device options; default: the library's):\n"
               "--launch-threads N (0..64), --launch-spin-us U (0..10000), --strategy S\n"
               "(event_poll, host_fn or blocking_sync: the default completion),\n"
               "--io-spin-us U (0..100000: the io threads poll for handlers for U us\n"
               "after their last one before they block; default 0, io_context::run).\n",
               prog);
  return why ? 64 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args a(argc, argv, {"help"});
  if (a.has("help")) return usage(nullptr);
  if (!a.unknown.empty()) return usage(("unknown argument " + a.unknown.front()).c_str());
  for (const auto& [k, v] : a.kv)
    if (k != "help" && k != "n" && k != "threads" && k != "device" && k != "json" &&
        k != "seconds" && k != "in-flight" && k != "variants" && k != "timeout-ms" &&
        k != "launch-threads" && k != "launch-spin-us" && k != "strategy" && k != "io-spin-us")
      return usage(("unknown option --" + k).c_str());
  options o;
  o.n = int(a.num("n", o.n));
  o.threads = int(a.num("threads", o.threads));
  o.device = int(a.num("device", o.device));
  o.json = a.get("json");
  o.timeout_ms = long(a.num("timeout-ms", 0));
  o.launch_threads = static_cast<long long>(a.num("launch-threads", -1));
  o.launch_spin_us = static_cast<long long>(a.num("launch-spin-us", -1));
  o.strategy = a.get("strategy");
  o.io_spin_us = static_cast<long long>(a.num("io-spin-us", 0));
  if (a.has("seconds")) o.seconds = std::strtod(a.get("seconds").c_str(), nullptr);
  if (a.has("in-flight")) {
    o.in_flight.clear();
    for (auto& x : bench::split_list(a.get("in-flight")))
      o.in_flight.push_back(std::atoi(x.c_str()));
  }
  if (a.has("variants")) o.variants = bench::split_list(a.get("variants"));
  if (o.n < 1 || o.n > 8192) return usage("--n wants 1..8192");
  if (o.threads < 1 || o.threads > 64) return usage("--threads wants 1..64");
  if (o.timeout_ms < 0 || o.timeout_ms > 3600000) return usage("--timeout-ms wants 0..3600000");
  if (a.has("launch-threads") && (o.launch_threads < 0 || o.launch_threads > 64))
    return usage("--launch-threads wants 0..64");
  if (a.has("launch-spin-us") && (o.launch_spin_us < 0 || o.launch_spin_us > 10000))
    return usage("--launch-spin-us wants 0..10000");
  if (o.io_spin_us < 0 || o.io_spin_us > 100000) return usage("--io-spin-us wants 0..100000");
  if (a.has("strategy") && o.strategy != "event_poll" && o.strategy != "host_fn" &&
      o.strategy != "blocking_sync")
    return usage("--strategy: event_poll, host_fn or blocking_sync");
  if (!(o.seconds > 0 && o.seconds <= 60)) return usage("--seconds wants a number in (0, 60]");
  for (int f : o.in_flight)
    if (f < 1 || f > 4096) return usage("--in-flight wants counts in 1..4096");
  for (auto& v : o.variants)
    if (v != "per_op" && v != "composed" && v != "fused" && v != "graph" && v != "fused_graph" &&
        v != "composed_own" && v != "raw_graph" && v != "raw_hop" && v != "serve_gemm" &&
        v != "serve_gemm_alloc")
      return usage(
          "--variants: per_op, composed, fused, graph, fused_graph, composed_own, raw_graph, "
          "raw_hop, "
          "serve_gemm, serve_gemm_alloc");
  bench::require_gpu(prog);

  asio::io_context ioc;
  device_options dopt;
  if (o.strategy == "host_fn") dopt.default_completion = host_fn();
  if (o.strategy == "blocking_sync") dopt.default_completion = blocking_sync();
  if (o.timeout_ms > 0) dopt.default_completion.timeout = std::chrono::milliseconds(o.timeout_ms);
  if (o.launch_threads >= 0) dopt.launch_threads = static_cast<std::size_t>(o.launch_threads);
  if (o.launch_spin_us >= 0) dopt.launch_spin = std::chrono::microseconds(o.launch_spin_us);
  auto dev = device::open(ioc.get_executor(), o.device, dopt);
  if (!dev) {
    std::fprintf(stderr, "%s: %s\n", prog, dev.error().message().c_str());
    return bench::exit_no_gpu;
  }
  auto blas = blas_actor::create(dev.value());
  auto dnn = cudnn_actor::create(dev.value());
  if (!blas || !dnn) {
    std::fprintf(stderr, "%s: %s\n", prog, (!blas ? blas.error() : dnn.error()).message().c_str());
    return 1;
  }
  const int n = o.n;
  const std::size_t nn = std::size_t(n) * n;
  const auto wv = random_matrix(nn, 1);
  auto w = dev.value().allocate<float>(nn);
  if (!w) return usage("cannot allocate the weights");
  float* dw = nullptr;  // the raw side's copy of the weights
  RAW_OK(cudaSetDevice(o.device) == cudaSuccess);
  RAW_OK(cudaMalloc(&dw, nn * sizeof(float)) == cudaSuccess);
  RAW_OK(cudaMemcpy(dw, wv.data(), nn * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  lib_ctx c{ioc,
            dev.value(),
            blas.value(),
            dnn.value(),
            w.value(),
            gemm_params{.m = n, .n = n, .k = n, .lda = n, .ldb = n, .ldc = n},
            tensor_shape{1, 1, n, n}};
  {
    std::optional<bool> up;
    asio::co_spawn(
        ioc, [&]() -> asio::awaitable<void> { up = bool(co_await upload(wv, c.w)); },
        asio::detached);
    ioc.run();
    if (!up || !*up) return usage("cannot upload the weights");
  }
  const int most = *std::max_element(o.in_flight.begin(), o.in_flight.end());
  std::vector<request_data> data;
  for (int i = 0; i < std::min(most, 64); ++i) data.push_back(make_request_data(wv, n, i + 2));
  std::vector<lib_slot> slots(most);
  for (int i = 0; i < most; ++i) {
    slots[i].d = data[i % data.size()];
    for (auto* r : {&slots[i].x, &slots[i].y, &slots[i].z, &slots[i].b}) {
      auto m = c.dev.allocate<float>(nn);
      if (!m) return usage("cannot allocate the request buffers");
      *r = m.value();
    }
    auto in = c.dev.allocate_pinned<float>(nn), out = c.dev.allocate_pinned<float>(nn);
    if (!in || !out) return usage("cannot allocate the pinned request buffers");
    slots[i].in = in.value();
    slots[i].out = out.value();
  }

  const std::string deadline =
      o.timeout_ms > 0 ? ", library waits with a " + std::to_string(o.timeout_ms) + " ms deadline"
                       : "";
  std::string tuned;  // the diagnostics' device options, when given
  if (!o.strategy.empty()) tuned += ", strategy " + o.strategy;
  if (o.launch_threads >= 0) tuned += ", launch_threads " + std::to_string(o.launch_threads);
  if (o.launch_spin_us >= 0) tuned += ", launch_spin " + std::to_string(o.launch_spin_us) + " us";
  if (o.io_spin_us > 0) tuned += ", io threads spin " + std::to_string(o.io_spin_us) + " us";
  std::printf("%s: %s, n = %d, %d threads, %.1f s windows%s%s\n", prog,
              bench::device_name().c_str(), n, o.threads, o.seconds, deadline.c_str(),
              tuned.c_str());
  std::printf("%-11s %6s %10s %9s %9s %9s %10s %9s %9s %7s %6s %9s %9s %9s\n", "variant", "in_fl",
              "req/s", "p50 us", "p99 us", "CPU us", "raw req/s", "raw p50", "raw CPU", "ratio",
              "wrong", "mean us", "raw p99", "raw mean");
  std::vector<bench::json> rows;
  long wrong_total = 0;
  auto serve_like = [](const std::string& v) { return v.starts_with("serve_gemm"); };
  const bool only_serve_gemm = std::all_of(o.variants.begin(), o.variants.end(), serve_like);
  for (int f : o.in_flight) {
    // The pipeline's raw request once per depth; serve_gemm's rows compare
    // with raw CUDA doing serve_gemm's request instead.
    const auto pipeline_raw = only_serve_gemm ? result_row{} : run_raw(o, dw, data, f);
    wrong_total += pipeline_raw.wrong;
    for (auto& v : o.variants) {
      const auto raw = serve_like(v) ? run_raw(o, dw, data, f, raw_kind::serve_gemm) : pipeline_raw;
      if (serve_like(v)) wrong_total += raw.wrong;
      const auto r = v == "raw_graph" ? run_raw(o, dw, data, f, raw_kind::graph)
                     : v == "raw_hop" ? run_raw(o, dw, data, f, raw_kind::hop)
                                      : run_library(c, slots, v, f, o);
      wrong_total += r.wrong;
      std::printf(
          "%-11s %6d %10.0f %9.1f %9.1f %9.1f %10.0f %9.1f %9.1f %7.3f %6ld %9.1f %9.1f %9.1f\n",
          v.c_str(), f, r.req_per_s, r.p50_us, r.p99_us, r.cpu_us_per_req, raw.req_per_s,
          raw.p50_us, raw.cpu_us_per_req, raw.req_per_s > 0 ? r.req_per_s / raw.req_per_s : 0.0,
          r.wrong + raw.wrong, r.mean_us, raw.p99_us, raw.mean_us);
      rows.push_back(bench::json::object({{"variant", r.variant},
                                          {"in_flight", f},
                                          {"req_per_s", r.req_per_s},
                                          {"p50_us", r.p50_us},
                                          {"p99_us", r.p99_us},
                                          {"mean_us", r.mean_us},
                                          {"cpu_us_per_req", r.cpu_us_per_req},
                                          {"raw_req_per_s", raw.req_per_s},
                                          {"raw_p50_us", raw.p50_us},
                                          {"raw_p99_us", raw.p99_us},
                                          {"raw_mean_us", raw.mean_us},
                                          {"raw_cpu_us_per_req", raw.cpu_us_per_req},
                                          {"wrong", r.wrong + raw.wrong}}));
    }
  }
  std::printf(
      "(raw: %d threads, each its own stream, cuBLAS and cuDNN handles, pinned staging,\n"
      " one cudaEventSynchronize per request; CPU us = process CPU time / requests)\n",
      o.threads);
  cudaFree(dw);
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  const auto j = bench::json::object({{"device", bench::device_name(o.device)},
                                      {"date", bench::utc_now()},
                                      {"command", cmd},
                                      {"n", n},
                                      {"threads", o.threads},
                                      {"pipeline", bench::json::array(rows)}});
  if (!bench::write_json(o.json, j)) {
    std::fprintf(stderr, "%s: cannot write %s\n", prog, o.json.c_str());
    return 1;
  }
  return wrong_total == 0 ? 0 : 2;
}
