// atomr-bench-large (issue 5, item c): large operations through the library
// against the raw library call, side by side in one process.
//
// Workloads: sgemm 8192 in pedantic f32 and in TF32 (blas_actor::gemm vs
// cublasSgemm on a handle with the same math mode), a single-precision C2C
// forward FFT of 2^26 points (fft_actor::c2c vs cufftExecC2C on a plan made
// once), and a ResNet-50 3x3 convolution at batch 64 in f16, NHWC, in three
// rows: cudnn_actor::conv2d_forward (graph API, its default) vs
// cudnnBackendExecute on a plan the bench builds with the actor's engine
// rule; the same vs the legacy cudnnConvolutionForward; and the actor on
// the legacy API vs cudnnConvolutionForward.
//
// Library time: wall time of `co_await actor.op(...)` on a one-thread
// io_context. Raw time: wall time of the raw call plus cudaStreamSynchronize
// on its own stream. Then, separately, the GPU time of each side (events
// around its enqueue, see gpu_spans), which tells a host-side gap from a
// GPU-side one. Library and raw runs alternate (ABBA order) after the
// warm-up runs, over the same input buffers, each side writing its own
// output; every workload checks its results once.

#include "bench.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <cublas_v2.h>
#include <cufft.h>
#if ATOMR_CUDA_HAS_CUDNN
#include <atomr/cuda/cudnn_error.hpp>

#include <cudnn.h>

#include "raw_graph_conv.hpp"
#endif

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;
using cuda::result;

constexpr const char* prog = "atomr-bench-large";
constexpr int exit_ok = 0;
constexpr int exit_error = 1;     // a library or CUDA error
constexpr int exit_mismatch = 2;  // a result failed its check
constexpr int exit_usage = 64;    // EX_USAGE

constexpr std::string_view w_sgemm_f32 = "sgemm8192_f32";
constexpr std::string_view w_sgemm_tf32 = "sgemm8192_tf32";
constexpr std::string_view w_fft = "fft_c2c_2^26";
constexpr std::string_view w_conv = "conv_resnet50_3x3_b64_f16";
constexpr std::string_view all_works[] = {w_sgemm_f32, w_sgemm_tf32, w_fft, w_conv};

constexpr int gemm_n = 8192;
constexpr long long fft_n = 1LL << 26;

// ------------------------------------------------------------------ options

struct config {
  int device = 0;
  int reps = 50;
  int warmup = 5;
  std::string json_path;
  std::vector<std::string_view> works;  // in the order of all_works
  std::string strategy = "event_poll";
  cuda::completion how = cuda::event_poll{};
  std::string command;
  bool warm_lib = false;  // diagnostic: an untimed library run before each timed GPU span
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [--reps R] [--warmup W] [--work LIST] [--strategy S]\n"
               "       [--spin-us U] [--max-backoff-us U] [--device D] [--json FILE]\n"
               "\n"
               "Large operations through atomr-accel-cuda against the raw library call,\n"
               "in one process, alternating library and raw runs:\n"
               "  %-26s sgemm 8192^3, pedantic f32 math (blas_actor vs cublasSgemm)\n"
               "  %-26s sgemm 8192^3, TF32 math (blas_actor vs cublasSgemm, same math mode)\n"
               "  %-26s single-precision C2C forward FFT of 2^26 points (fft_actor vs\n"
               "  %-26s cufftExecC2C on a plan made once)\n"
               "  %-26s ResNet-50 3x3 conv, N=64 C=K=64 56x56 pad 1, f16 NHWC: cudnn_actor\n"
               "  %-26s vs cudnnBackendExecute (same engine rule); the rows ..._vs_legacy_call\n"
               "  %-26s and ..._legacy_api compare with cudnnConvolutionForward; the row\n"
               "  %-26s ..._no_cuda_graphs has the actor's cuda_graphs option off\n"
               "Library time: co_await of the operation on an io_context; raw time: the\n"
               "call plus cudaStreamSynchronize. Prints medians (ms) and lib/raw, then the\n"
               "GPU time of each side (events recorded around its enqueue).\n"
               "\n"
               "Options:\n"
               "  --reps R            timed runs of each side per workload, 1..10000 (default 50)\n"
               "  --warmup W          untimed runs of each side first, 0..1000 (default 5)\n"
               "  --work LIST         comma-separated workloads from the list above, or all\n"
               "  --strategy S        the library's completion: event_poll (default), host_fn,\n"
               "                      blocking_sync\n"
               "  --spin-us U         event_poll: re-check every turn for U us, 0..1000000\n"
               "                      (default: the library's, 1000)\n"
               "  --max-backoff-us U  event_poll: longest pause between checks, 10..1000000\n"
               "                      (default: the library's, 200)\n"
               "  --device D          device ordinal (default 0)\n"
               "  --json FILE         also write the results as JSON to FILE\n"
               "  --warm-lib          diagnostic: in the GPU-span passes, run the library side\n"
               "                      once, untimed, right before each timed run (its path then\n"
               "                      runs with warm caches; see bench/tools/call_gap.cpp)\n"
               "  --help              print this help and exit\n"
               "Options also take the form --name=value.\n"
               "\n"
               "Exit status: 0 success, 1 a library or CUDA error, 2 a result failed its check,\n"
               "64 bad usage, 69 no usable GPU.\n",
               prog, w_sgemm_f32.data(), w_sgemm_tf32.data(), w_fft.data(), "", w_conv.data(), "",
               "", "");
}

int usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s (try --help)\n", prog, what.c_str());
  return exit_usage;
}

std::optional<long> parse_int(const std::string& s, long lo, long hi) {
  long v = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc{} || p != end || v < lo || v > hi) return std::nullopt;
  return v;
}

std::string shell_word(std::string_view a) {
  if (!a.empty() && a.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;#~!") == std::string_view::npos)
    return std::string(a);
  std::string q = "'";
  for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Parses argv into `cfg`; an exit status when the program should stop.
std::optional<int> parse(int argc, char** argv, config& cfg) {
  for (int i = 0; i < argc; ++i) cfg.command += (i ? " " : "") + shell_word(argv[i]);
  const bench::args a(argc, argv, {"help", "warm-lib"});
  if (a.has("help")) {
    usage(stdout);
    return exit_ok;
  }
  if (!a.unknown.empty()) {
    const std::string& u = a.unknown.front();
    return usage_error(u.rfind("--", 0) == 0 ? "unknown option or missing value: " + u
                                             : "unexpected argument '" + u + "'");
  }
  static constexpr std::string_view known[] = {"reps",           "warmup",  "work",
                                               "strategy",       "spin-us", "device",
                                               "max-backoff-us", "json",    "warm-lib"};
  for (const auto& [k, v] : a.kv)
    if (std::find(std::begin(known), std::end(known), k) == std::end(known))
      return usage_error("unknown option --" + k);

  auto integer = [&](const char* name, long lo, long hi, long& out) -> bool {
    if (!a.has(name)) return true;
    auto v = parse_int(a.get(name), lo, hi);
    if (!v) return false;
    out = *v;
    return true;
  };
  auto range = [](const char* name, long lo, long hi) {
    return "--" + std::string(name) + " takes an integer in " + std::to_string(lo) + ".." +
           std::to_string(hi);
  };
  long reps = cfg.reps, warmup = cfg.warmup, dev = cfg.device, spin = -1, backoff = -1;
  if (!integer("reps", 1, 10000, reps)) return usage_error(range("reps", 1, 10000));
  if (!integer("warmup", 0, 1000, warmup)) return usage_error(range("warmup", 0, 1000));
  if (!integer("device", 0, INT_MAX, dev)) return usage_error(range("device", 0, INT_MAX));
  if (!integer("spin-us", 0, 1000000, spin)) return usage_error(range("spin-us", 0, 1000000));
  // The poll back-off clamps to [10 us, max_backoff]: a smaller maximum is not a range.
  if (!integer("max-backoff-us", 10, 1000000, backoff))
    return usage_error(range("max-backoff-us", 10, 1000000));
  cfg.reps = static_cast<int>(reps);
  cfg.warmup = static_cast<int>(warmup);
  cfg.device = static_cast<int>(dev);

  cfg.warm_lib = a.has("warm-lib");
  if (a.has("json")) {
    cfg.json_path = a.get("json");
    if (cfg.json_path.empty()) return usage_error("--json needs a file name");
  }

  cfg.strategy = a.get("strategy", "event_poll");
  if (cfg.strategy == "event_poll") {
    cfg.how = cuda::event_poll{};
  } else if (cfg.strategy == "host_fn") {
    cfg.how = cuda::host_fn{};
  } else if (cfg.strategy == "blocking_sync") {
    cfg.how = cuda::blocking_sync{};
  } else {
    return usage_error("--strategy takes event_poll, host_fn or blocking_sync, not '" +
                       cfg.strategy + "'");
  }
  if ((spin >= 0 || backoff >= 0) && cfg.strategy != "event_poll")
    return usage_error("--spin-us and --max-backoff-us apply to --strategy event_poll only");
  if (spin >= 0) cfg.how.spin = std::chrono::microseconds(spin);
  if (backoff >= 0) cfg.how.max_backoff = std::chrono::microseconds(backoff);

  std::vector<std::string_view> asked;
  const std::string list = a.get("work", "all");
  for (std::size_t pos = 0; pos <= list.size();) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    const std::string_view item = std::string_view(list).substr(pos, comma - pos);
    pos = comma + 1;
    if (item == "all") {
      asked.insert(asked.end(), std::begin(all_works), std::end(all_works));
      continue;
    }
    auto it = std::find(std::begin(all_works), std::end(all_works), item);
    if (it == std::end(all_works))
      return usage_error("--work: unknown workload '" + std::string(item) + "'");
#if !ATOMR_CUDA_HAS_CUDNN
    if (item == w_conv && list != "all")
      return usage_error("--work: " + std::string(w_conv) + " needs cuDNN, which this build lacks");
#endif
    asked.push_back(*it);
  }
  for (auto w : all_works)
    if (std::find(asked.begin(), asked.end(), w) != asked.end()) cfg.works.push_back(w);
  return std::nullopt;
}

bool selected(const config& cfg, std::string_view w) {
  return std::find(cfg.works.begin(), cfg.works.end(), w) != cfg.works.end();
}

// ------------------------------------------------------------------ helpers

/// splitmix64: a small, fast generator for test data.
class splitmix {
public:
  explicit splitmix(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform magnitude in [0.25, 1) with a random sign: never zero.
  float nonzero() {
    const std::uint64_t r = next();
    const float mag = 0.25f + 0.75f * static_cast<float>(r >> 40) * 0x1p-24f;
    return (r & 1) ? -mag : mag;
  }

private:
  std::uint64_t s_;
};

/// A native handle destroyed with its owner.
template <class H, auto Destroy>
struct scoped {
  H h{};
  bool live = false;
  scoped() = default;
  scoped(const scoped&) = delete;
  scoped& operator=(const scoped&) = delete;
  ~scoped() {
    if (live) Destroy(h);
  }
};

result<void> cuda_ok(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return cuda::outcome::success();
  cudaGetLastError();
  return cuda::classify(e, call);
}
result<void> cublas_ok(cublasStatus_t e, const char* call) {
  if (e == CUBLAS_STATUS_SUCCESS) return cuda::outcome::success();
  return cuda::classify(e, call);
}
result<void> cufft_ok(cufftResult e, const char* call) {
  if (e == CUFFT_SUCCESS) return cuda::outcome::success();
  return cuda::classify(e, call);
}

/// The raw side's own stream, non-blocking like every library stream.
struct raw_stream : scoped<cudaStream_t, cudaStreamDestroy> {
  result<void> create(int ordinal) {
    BOOST_OUTCOME_TRY(cuda_ok(cudaSetDevice(ordinal), "cudaSetDevice"));
    BOOST_OUTCOME_TRY(
        cuda_ok(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    live = true;
    return cuda::outcome::success();
  }
  result<void> sync() const { return cuda_ok(cudaStreamSynchronize(h), "cudaStreamSynchronize"); }
};

/// A workload's sanity check.
struct check {
  bool ok = true;
  double worst = 0;      // the largest error seen, in the unit of `tolerance`
  double tolerance = 0;  // the bound on it
  std::string what;      // what was compared
};

/// GPU time and enqueue time of each side (gpu_spans), milliseconds.
struct spans {
  bench::stats lib_gpu, raw_gpu, lib_enqueue, raw_enqueue;
};

/// One row of the results.
struct row {
  std::string work;
  bench::stats lib, raw;  // milliseconds, wall time
  spans gpu;              // GPU time and enqueue host time (gpu_spans)
  int reps = 0;
  std::string raw_call;
  // False for a row that runs the library in a non-default configuration
  // (shown for comparison; the targets are judged on the default rows).
  bool library_default = true;
  check chk;
  bench::json details = bench::json::object({});
  // The device's counters over the workload's whole run (both rows of the
  // sgemm run share them): operations that joined a busy stream's batch
  // (launched by a drain, possibly on a launch thread) instead of at once.
  std::uint64_t ops_batched = 0, batches = 0;
};

/// A number, or null when it is not finite (JSON has no NaN or infinity).
bench::json number(double v) {
  return std::isfinite(v) ? bench::json(v) : bench::json();
}

bench::json to_json(const row& r) {
  const double ratio = r.raw.median > 0 ? r.lib.median / r.raw.median : 0.0;
  return bench::json::object({
      {"work", r.work},
      {"lib_ms", r.lib.median},
      {"raw_ms", r.raw.median},
      {"ratio", ratio},
      {"library_default", r.library_default},
      {"lib_p99_ms", r.lib.p99},
      {"raw_p99_ms", r.raw.p99},
      {"reps", r.reps},
      {"lib_min_ms", r.lib.min},
      {"raw_min_ms", r.raw.min},
      {"lib_mean_ms", r.lib.mean},
      {"raw_mean_ms", r.raw.mean},
      {"lib_gpu_ms", r.gpu.lib_gpu.median},
      {"raw_gpu_ms", r.gpu.raw_gpu.median},
      {"lib_enqueue_us", r.gpu.lib_enqueue.median * 1e3},
      {"raw_enqueue_us", r.gpu.raw_enqueue.median * 1e3},
      {"raw_call", r.raw_call},
      {"lib_ops_batched", r.ops_batched},
      {"lib_batches", r.batches},
      {"check", bench::json::object({{"ok", r.chk.ok},
                                     {"what", r.chk.what},
                                     {"worst", number(r.chk.worst)},
                                     {"tolerance", r.chk.tolerance}})},
      {"details", r.details},
  });
}

void print_header() {
  std::printf("%-27s %10s %10s %8s %10s %10s %10s %10s  %s\n", "work", "lib ms", "raw ms",
              "lib/raw", "lib p99", "raw p99", "lib GPU", "raw GPU", "check");
}

void print_row(const row& r) {
  const double ratio = r.raw.median > 0 ? r.lib.median / r.raw.median : 0.0;
  std::printf("%-27s %10.4f %10.4f %8.4f %10.4f %10.4f %10.4f %10.4f  %s (%.2g <= %.2g)\n",
              r.work.c_str(), r.lib.median, r.raw.median, ratio, r.lib.p99, r.raw.p99,
              r.gpu.lib_gpu.median, r.gpu.raw_gpu.median, r.chk.ok ? "ok" : "FAIL", r.chk.worst,
              r.chk.tolerance);
  std::fflush(stdout);
}

/// Runs warm-up then timed runs of both sides, alternating which goes first
/// (lib, raw, raw, lib, ...). `lib()` yields an awaitable of a result;
/// `raw()` makes the call on `rs` (result<void>); the raw side's time
/// includes cudaStreamSynchronize(rs).
template <class Lib, class Raw>
asio::awaitable<result<std::pair<bench::stats, bench::stats>>> interleave(const config& cfg,
                                                                          Lib lib, Raw raw,
                                                                          const raw_stream& rs) {
  std::vector<double> lib_ms, raw_ms;
  lib_ms.reserve(static_cast<std::size_t>(cfg.reps));
  raw_ms.reserve(static_cast<std::size_t>(cfg.reps));
  for (int i = 0; i < cfg.warmup + cfg.reps; ++i) {
    const bool timed = i >= cfg.warmup;
    for (int side = 0; side < 2; ++side) {
      const bool run_lib = (side == 0) == (i % 2 == 0);
      if (run_lib) {
        const double t0 = bench::now_us();
        auto r = co_await lib();
        const double dt = bench::now_us() - t0;
        if (!r) co_return r.error();
        if (timed) lib_ms.push_back(dt / 1e3);
      } else {
        const double t0 = bench::now_us();
        auto r = raw();
        if (r) r = rs.sync();
        const double dt = bench::now_us() - t0;
        if (!r) co_return r.error();
        if (timed) raw_ms.push_back(dt / 1e3);
      }
    }
  }
  co_return std::pair{bench::summarize(std::move(lib_ms)), bench::summarize(std::move(raw_ms))};
}

/// A CUDA event with timing, destroyed on scope exit.
struct timing_event : scoped<cudaEvent_t, cudaEventDestroy> {
  result<void> create() {
    BOOST_OUTCOME_TRY(cuda_ok(cudaEventCreate(&h), "cudaEventCreate"));
    live = true;
    return cuda::outcome::success();
  }
};

/// GPU time of each side, without completion: cudaEventElapsedTime between
/// events recorded on the side's stream just before its enqueue and just
/// after it (for the library, e0 from the coroutine that then awaits the
/// operation, e1 from one that runs once the operation has enqueued and
/// suspended). Same warm-up, reps and ABBA order as interleave(). A gap here
/// is the GPU's (different kernels or plans) or host time before the launch
/// (the GPU idles from e0 until the work arrives); a gap only in
/// interleave() is the completion's. With `ahead`, a memset of `ahead_bytes`
/// there runs on the side's stream before e0, so the host's time is hidden
/// and the spans are the GPU's alone. The enqueue times are the host time
/// from e0's record to e1's (for the library: its checks and launch path,
/// and one turn of the io_context).
template <class Lib, class Raw>
asio::awaitable<result<spans>> gpu_spans(const config& cfg, Lib lib, cudaStream_t lib_stream,
                                         Raw raw, const raw_stream& rs, void* ahead = nullptr,
                                         std::size_t ahead_bytes = 0) {
  timing_event e0, e1;
  BOOST_OUTCOME_CO_TRY(e0.create());
  BOOST_OUTCOME_CO_TRY(e1.create());
  auto ex = co_await asio::this_coro::executor;
  auto span_ms = [&]() -> result<double> {
    BOOST_OUTCOME_TRY(cuda_ok(cudaEventSynchronize(e1.h), "cudaEventSynchronize"));
    float ms = 0;
    BOOST_OUTCOME_TRY(cuda_ok(cudaEventElapsedTime(&ms, e0.h, e1.h), "cudaEventElapsedTime"));
    return static_cast<double>(ms);
  };
  std::vector<double> lib_ms, raw_ms, lib_host, raw_host;
  for (int i = 0; i < cfg.warmup + cfg.reps; ++i) {
    const bool timed = i >= cfg.warmup;
    for (int side = 0; side < 2; ++side) {
      const bool run_lib = (side == 0) == (i % 2 == 0);
      double t0 = 0;
      // A memset ahead of e0 keeps the GPU busy while the host enqueues:
      // the span is then the GPU's time alone, without the host's.
      if (ahead) {
        BOOST_OUTCOME_CO_TRY(
            cuda_ok(cudaMemsetAsync(ahead, 0, ahead_bytes, run_lib ? lib_stream : rs.h),
                    "cudaMemsetAsync"));
      }
      if (run_lib) {
        bool finished = false;
        std::optional<cuda::gpu_error> failed;
        asio::co_spawn(
            ex,
            [&]() -> asio::awaitable<void> {
              if (cfg.warm_lib) {
                if (auto w = co_await lib(); !w) {
                  failed = w.error();
                  finished = true;
                  co_return;
                }
              }
              t0 = bench::now_us();
              if (auto rec = cuda_ok(cudaEventRecord(e0.h, lib_stream), "cudaEventRecord"); !rec) {
                failed = rec.error();
              } else {
                auto r = co_await lib();
                if (!r) failed = r.error();
              }
              finished = true;
            },
            asio::detached);
        // The operation's coroutine was queued first: by now it has enqueued
        // its work and waits, so e1 follows that work in stream order.
        co_await asio::post(ex, asio::use_awaitable);
        BOOST_OUTCOME_CO_TRY(cuda_ok(cudaEventRecord(e1.h, lib_stream), "cudaEventRecord"));
        const double dt = bench::now_us() - t0;
        while (!finished) co_await asio::post(ex, asio::use_awaitable);
        if (failed) co_return *failed;
        if (timed) lib_host.push_back(dt / 1e3);
      } else {
        t0 = bench::now_us();
        BOOST_OUTCOME_CO_TRY(cuda_ok(cudaEventRecord(e0.h, rs.h), "cudaEventRecord"));
        BOOST_OUTCOME_CO_TRY(raw());
        BOOST_OUTCOME_CO_TRY(cuda_ok(cudaEventRecord(e1.h, rs.h), "cudaEventRecord"));
        if (timed) raw_host.push_back((bench::now_us() - t0) / 1e3);
      }
      BOOST_OUTCOME_CO_TRY(auto ms, span_ms());
      if (timed) (run_lib ? lib_ms : raw_ms).push_back(ms);
    }
  }
  co_return spans{bench::summarize(std::move(lib_ms)), bench::summarize(std::move(raw_ms)),
                  bench::summarize(std::move(lib_host)), bench::summarize(std::move(raw_host))};
}

/// The outputs the checks compare, when both sides write `out`: one untimed
/// run of each side into it, cleared to 0xFF bytes before each (so a side
/// that wrote nothing cannot pass), read back into `y_lib` and `y_raw`.
template <class T, class Lib, class Raw>
asio::awaitable<result<void>> outputs_of_each(cuda::gpu_ref<T>& out, Lib lib, Raw raw,
                                              const raw_stream& rs, std::vector<T>& y_lib,
                                              std::vector<T>& y_raw) {
  BOOST_OUTCOME_CO_TRY(co_await cuda::fill_bytes(out, 0xFF));
  BOOST_OUTCOME_CO_TRY(co_await lib());
  BOOST_OUTCOME_CO_TRY(co_await cuda::download(out, std::span<T>(y_lib)));
  BOOST_OUTCOME_CO_TRY(co_await cuda::fill_bytes(out, 0xFF));
  BOOST_OUTCOME_CO_TRY(raw());
  BOOST_OUTCOME_CO_TRY(rs.sync());
  BOOST_OUTCOME_CO_TRY(co_await cuda::download(out, std::span<T>(y_raw)));
  co_return cuda::outcome::success();
}

/// Bytes of the memset gpu_spans runs ahead of e0 (~0.25 ms on an H200).
constexpr std::size_t ahead_bytes = std::size_t{1} << 30;

/// A device buffer of `n` elements.
template <class T>
result<cuda::gpu_ref<T>> buffer(cuda::device& dev, std::size_t n) {
  return dev.allocate<T>(n);
}

/// gpu_spans behind a memset of ahead_bytes on each side's stream: the
/// GPU's time alone (the scratch buffer is freed afterwards).
template <class Lib, class Raw>
asio::awaitable<result<spans>> gpu_only_spans(cuda::device& dev, const config& cfg, Lib lib,
                                              cudaStream_t lib_stream, Raw raw,
                                              const raw_stream& rs) {
  BOOST_OUTCOME_CO_TRY(auto scratch, buffer<std::uint8_t>(dev, ahead_bytes));
  BOOST_OUTCOME_CO_TRY(std::uint8_t * p, scratch.unsafe_data());
  BOOST_OUTCOME_CO_TRY(cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  co_return co_await gpu_spans(cfg, lib, lib_stream, raw, rs, p, ahead_bytes);
}

// -------------------------------------------------------------------- sgemm

/// Relative error of sampled entries of c = a * b (n x n, column-major),
/// each against sum_k |a_ik b_kj| (the scale of any summation's rounding).
void check_gemm(const std::vector<float>& a, const std::vector<float>& b,
                const std::vector<float>& c, std::size_t n, const char* side, check& chk) {
  constexpr int samples = 64;
  splitmix pick(0x5eed);
  for (int s = 0; s < samples; ++s) {
    const std::size_t i = s == 0 ? 0 : s == 1 ? n - 1 : pick.next() % n;
    const std::size_t j = s == 0 ? 0 : s == 1 ? n - 1 : pick.next() % n;
    double ref = 0, scale = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const double p = static_cast<double>(a[i + k * n]) * static_cast<double>(b[k + j * n]);
      ref += p;
      scale += std::fabs(p);
    }
    const double got = c[i + j * n];
    const double err = std::fabs(got - ref) / scale;
    if (!(err <= chk.tolerance)) {  // NaN too
      if (chk.ok)
        std::fprintf(stderr, "%s: MISMATCH: %s C(%zu, %zu) is %.9g, expected %.9g\n", prog, side, i,
                     j, got, ref);
      chk.ok = false;
    }
    if (!std::isnan(chk.worst) && !(err <= chk.worst)) chk.worst = err;
  }
}

asio::awaitable<result<void>> run_gemm(cuda::device dev, const config& cfg,
                                       std::vector<row>& rows) {
  const std::size_t n = gemm_n, elems = n * n;
  std::vector<float> a(elems), b(elems);
  splitmix gen(1);
  for (auto& x : a) x = gen.nonzero();
  for (auto& x : b) x = gen.nonzero();

  BOOST_OUTCOME_CO_TRY(auto da, buffer<float>(dev, elems));
  BOOST_OUTCOME_CO_TRY(auto db, buffer<float>(dev, elems));
  BOOST_OUTCOME_CO_TRY(auto dc_lib, buffer<float>(dev, elems));
  BOOST_OUTCOME_CO_TRY(auto dc_raw, buffer<float>(dev, elems));
  BOOST_OUTCOME_CO_TRY(co_await cuda::upload(std::span<const float>(a), da));
  BOOST_OUTCOME_CO_TRY(co_await cuda::upload(std::span<const float>(b), db));

  // One lane: gpu_spans records its events on get_stream(), so every call
  // must run there (one call at a time here, so a default actor would keep
  // one lane anyway).
  BOOST_OUTCOME_CO_TRY(auto blas, cuda::blas_actor::create(dev, {.how = cfg.how, .max_lanes = 1}));

  raw_stream rs;
  BOOST_OUTCOME_CO_TRY(rs.create(dev.ordinal()));
  scoped<cublasHandle_t, cublasDestroy> h;
  BOOST_OUTCOME_CO_TRY(cublas_ok(cublasCreate(&h.h), "cublasCreate"));
  h.live = true;
  BOOST_OUTCOME_CO_TRY(cublas_ok(cublasSetStream(h.h, rs.h), "cublasSetStream"));
  BOOST_OUTCOME_CO_TRY(
      cublas_ok(cublasSetPointerMode(h.h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode"));
  BOOST_OUTCOME_CO_TRY(const float* pa, da.unsafe_data());
  BOOST_OUTCOME_CO_TRY(const float* pb, db.unsafe_data());
  BOOST_OUTCOME_CO_TRY(float* pc, dc_raw.unsafe_data());

  const int ni = gemm_n;
  const cuda::gemm_params p{.m = ni, .n = ni, .k = ni};
  auto lib = [&] { return blas.gemm(p, da, db, dc_lib); };
  auto raw = [&]() -> result<void> {
    const float one = 1.0f, zero = 0.0f;
    BOOST_OUTCOME_TRY(cublas_ok(
        cublasSgemm(h.h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one, pa, ni, pb, ni, &zero, pc, ni),
        "cublasSgemm"));
    return cuda::outcome::success();
  };

  std::vector<float> c_lib(elems), c_raw(elems);
  for (const bool tf32 : {false, true}) {
    const std::string_view work = tf32 ? w_sgemm_tf32 : w_sgemm_f32;
    if (!selected(cfg, work)) continue;
    BOOST_OUTCOME_CO_TRY(blas.set_tf32(tf32));
    BOOST_OUTCOME_CO_TRY(
        cublas_ok(cublasSetMathMode(h.h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH),
                  "cublasSetMathMode"));
    // NaN in both outputs, so that a product never written cannot pass.
    BOOST_OUTCOME_CO_TRY(co_await cuda::fill_bytes(dc_lib, 0xFF));
    BOOST_OUTCOME_CO_TRY(co_await cuda::fill_bytes(dc_raw, 0xFF));

    BOOST_OUTCOME_CO_TRY(auto t, co_await interleave(cfg, lib, raw, rs));
    BOOST_OUTCOME_CO_TRY(auto g,
                         co_await gpu_spans(cfg, lib, blas.get_stream().native_handle(), raw, rs));

    BOOST_OUTCOME_CO_TRY(co_await cuda::download(dc_lib, std::span<float>(c_lib)));
    BOOST_OUTCOME_CO_TRY(co_await cuda::download(dc_raw, std::span<float>(c_raw)));
    row r;
    r.work = std::string(work);
    r.lib = t.first;
    r.raw = t.second;
    r.gpu = g;
    r.reps = cfg.reps;
    r.raw_call =
        tf32 ? "cublasSgemm, CUBLAS_TF32_TENSOR_OP_MATH" : "cublasSgemm, CUBLAS_PEDANTIC_MATH";
    r.chk.tolerance = tf32 ? 1e-2 : 1e-5;
    r.chk.what =
        "64 entries of C (lib and raw) vs a double CPU dot product, error / sum_k |a_ik b_kj|";
    check_gemm(a, b, c_lib, n, "library", r.chk);
    check_gemm(a, b, c_raw, n, "raw", r.chk);
    double diff = 0;
    for (std::size_t i = 0; i < elems; ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(c_lib[i] - c_raw[i])));
    const double flops =
        2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    r.details = bench::json::object({{"m", ni},
                                     {"n", ni},
                                     {"k", ni},
                                     {"math", tf32 ? "tf32" : "pedantic_f32"},
                                     {"lib_tflops", flops / (r.lib.median * 1e9)},
                                     {"raw_tflops", flops / (r.raw.median * 1e9)},
                                     {"lib_raw_max_abs_diff", number(diff)}});
    print_row(r);
    rows.push_back(std::move(r));
  }
  co_return cuda::outcome::success();
}

// ---------------------------------------------------------------------- FFT

/// e^{-2 pi i m / N} for N = 2^26, m < N, from two 2^13-entry tables.
class twiddles {
public:
  twiddles() : lo_(1 << 13), hi_(1 << 13) {
    const double step = -2.0 * std::numbers::pi / static_cast<double>(fft_n);
    for (int i = 0; i < (1 << 13); ++i) {
      lo_[static_cast<std::size_t>(i)] = std::polar(1.0, step * i);
      hi_[static_cast<std::size_t>(i)] =
          std::polar(1.0, step * (static_cast<double>(i) * (1 << 13)));
    }
  }
  std::complex<double> operator()(std::uint64_t m) const {
    const auto& h = hi_[m >> 13];
    const auto& l = lo_[m & ((1 << 13) - 1)];
    return {h.real() * l.real() - h.imag() * l.imag(), h.real() * l.imag() + h.imag() * l.real()};
  }

private:
  std::vector<std::complex<double>> lo_, hi_;
};

/// X[k] = sum_j x_j e^{-2 pi i jk/N}, in double.
std::complex<double> dft_bin(const std::vector<std::complex<float>>& x, std::uint64_t k,
                             const twiddles& w) {
  double re = 0, im = 0;
  const std::uint64_t mask = static_cast<std::uint64_t>(fft_n) - 1;
  for (std::uint64_t j = 0; j < x.size(); ++j) {
    const auto t = w((j * k) & mask);
    const double xr = x[j].real(), xi = x[j].imag();
    re += xr * t.real() - xi * t.imag();
    im += xr * t.imag() + xi * t.real();
  }
  return {re, im};
}

asio::awaitable<result<void>> run_fft(cuda::device dev, const config& cfg, std::vector<row>& rows) {
  using c32 = std::complex<float>;
  const auto n = static_cast<std::size_t>(fft_n);
  std::vector<c32> x(n);
  splitmix gen(2);
  for (auto& v : x) {
    const float re = gen.nonzero();
    v = c32(re, gen.nonzero());
  }

  // Both sides read the same input and write the same output buffer, so
  // that where the 512 MiB arrays lie does not count (it moved the GPU time
  // by up to 1%: docs/history/performance.md, session 7). The outputs are compared
  // from one untimed run of each side afterwards.
  BOOST_OUTCOME_CO_TRY(auto din, buffer<c32>(dev, n));
  BOOST_OUTCOME_CO_TRY(auto dout, buffer<c32>(dev, n));
  BOOST_OUTCOME_CO_TRY(co_await cuda::upload(std::span<const c32>(x), din));

  // One lane: the spans' events are recorded on get_stream() (see sgemm).
  BOOST_OUTCOME_CO_TRY(auto fft, cuda::fft_actor::create(dev, {.how = cfg.how, .max_lanes = 1}));
  cuda::fft_shape shape;
  shape.rank = 1;
  shape.dims = {fft_n, 1, 1};
  shape.batch = 1;
  shape.direction = cuda::fft_direction::forward;

  raw_stream rs;
  BOOST_OUTCOME_CO_TRY(rs.create(dev.ordinal()));
  scoped<cufftHandle, cufftDestroy> plan;
  BOOST_OUTCOME_CO_TRY(
      cufft_ok(cufftPlan1d(&plan.h, static_cast<int>(fft_n), CUFFT_C2C, 1), "cufftPlan1d"));
  plan.live = true;
  BOOST_OUTCOME_CO_TRY(cufft_ok(cufftSetStream(plan.h, rs.h), "cufftSetStream"));
  BOOST_OUTCOME_CO_TRY(const c32* pin, din.unsafe_data());
  BOOST_OUTCOME_CO_TRY(c32 * pout, dout.unsafe_data());

  auto lib = [&] { return fft.c2c(shape, din, dout); };
  // The raw call on plan `h` (cuFFT does not write the input of an
  // out-of-place C2C; its API is not const).
  auto raw_on = [&](const cufftHandle& h) {
    return [&]() -> result<void> {
      auto* in = reinterpret_cast<cufftComplex*>(const_cast<c32*>(pin));
      return cufft_ok(cufftExecC2C(h, in, reinterpret_cast<cufftComplex*>(pout), CUFFT_FORWARD),
                      "cufftExecC2C");
    };
  };
  auto raw = raw_on(plan.h);
  BOOST_OUTCOME_CO_TRY(auto t, co_await interleave(cfg, lib, raw, rs));
  BOOST_OUTCOME_CO_TRY(auto g,
                       co_await gpu_spans(cfg, lib, fft.get_stream().native_handle(), raw, rs));
  BOOST_OUTCOME_CO_TRY(
      auto gb, co_await gpu_only_spans(dev, cfg, lib, fft.get_stream().native_handle(), raw, rs));

  // Diagnostic: a raw plan made the way fft_actor makes its plans (no
  // auto-allocation, cufftMakePlanMany, work area from the device's pool),
  // timed on the GPU against the library once more. Equal GPU times here
  // mean a lib/raw gap above comes from how the plan is made, not from the
  // library's path.
  scoped<cufftHandle, cufftDestroy> plan2;
  BOOST_OUTCOME_CO_TRY(cufft_ok(cufftCreate(&plan2.h), "cufftCreate"));
  plan2.live = true;
  BOOST_OUTCOME_CO_TRY(cufft_ok(cufftSetAutoAllocation(plan2.h, 0), "cufftSetAutoAllocation"));
  int n2 = static_cast<int>(fft_n);
  std::size_t work2 = 0;
  BOOST_OUTCOME_CO_TRY(cufft_ok(
      cufftMakePlanMany(plan2.h, 1, &n2, nullptr, 1, 0, nullptr, 1, 0, CUFFT_C2C, 1, &work2),
      "cufftMakePlanMany"));
  BOOST_OUTCOME_CO_TRY(cufft_ok(cufftSetStream(plan2.h, rs.h), "cufftSetStream"));
  BOOST_OUTCOME_CO_TRY(auto dwork2, buffer<std::uint8_t>(dev, std::max<std::size_t>(work2, 1)));
  BOOST_OUTCOME_CO_TRY(std::uint8_t * pwork2, dwork2.unsafe_data());
  BOOST_OUTCOME_CO_TRY(cufft_ok(cufftSetWorkArea(plan2.h, pwork2), "cufftSetWorkArea"));
  BOOST_OUTCOME_CO_TRY(cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  BOOST_OUTCOME_CO_TRY(
      auto g2, co_await gpu_spans(cfg, lib, fft.get_stream().native_handle(), raw_on(plan2.h), rs));
  std::printf("  (%s GPU ms: library %.4f, raw with a plan made like the library's %.4f)\n",
              w_fft.data(), g2.lib_gpu.median, g2.raw_gpu.median);

  std::vector<c32> y_lib(n), y_raw(n);
  BOOST_OUTCOME_CO_TRY(co_await outputs_of_each(dout, lib, raw, rs, y_lib, y_raw));

  row r;
  r.work = std::string(w_fft);
  r.lib = t.first;
  r.raw = t.second;
  r.gpu = g;
  r.reps = cfg.reps;
  r.raw_call = "cufftExecC2C on a cufftPlan1d plan made once";
  // (1) library and raw outputs equal: max |lib - raw| / max |raw|.
  double diff = 0, peak = 0;
  bool finite = true;
  for (std::size_t i = 0; i < n; ++i) {
    // Squared magnitudes here (no hypot per element), roots once at the end.
    const double d = std::norm(std::complex<double>(y_lib[i]) - std::complex<double>(y_raw[i]));
    const double m = std::norm(std::complex<double>(y_raw[i]));
    if (!std::isfinite(d) || !std::isfinite(m)) finite = false;
    diff = std::max(diff, d);
    peak = std::max(peak, m);
  }
  const double rel_diff = finite && peak > 0 ? std::sqrt(diff / peak) : INFINITY;
  constexpr double equal_tol = 1e-5;
  // (2) bins 0, N/4 (exact twiddles) and two random ones against a double
  // DFT, the error relative to ||x||_2 (FFT rounding grows like eps log N ||x||_2).
  double norm = 0;
  for (const auto& v : x) norm += std::norm(std::complex<double>(v));
  norm = std::sqrt(norm);
  constexpr double bin_tol = 1e-4;
  const twiddles tw;
  splitmix pick(3);
  double worst_bin = 0;
  for (const std::uint64_t k :
       {std::uint64_t{0}, std::uint64_t(fft_n / 4), pick.next() % n, pick.next() % n}) {
    const auto ref = dft_bin(x, k, tw);
    for (const auto* y : {&y_lib, &y_raw}) {
      const double err = std::abs(std::complex<double>((*y)[k]) - ref) / norm;
      if (!(err <= bin_tol) && r.chk.ok)
        std::fprintf(stderr,
                     "%s: MISMATCH: %s FFT bin %llu is (%.6g, %.6g), expected (%.6g, %.6g)\n", prog,
                     y == &y_lib ? "library" : "raw", static_cast<unsigned long long>(k),
                     static_cast<double>((*y)[k].real()), static_cast<double>((*y)[k].imag()),
                     ref.real(), ref.imag());
      if (!(err <= bin_tol)) r.chk.ok = false;
      if (!std::isnan(worst_bin) && !(err <= worst_bin)) worst_bin = err;
    }
  }
  if (!(rel_diff <= equal_tol)) {
    std::fprintf(stderr, "%s: MISMATCH: FFT library vs raw output max |diff| / max |raw| = %.3g\n",
                 prog, rel_diff);
    r.chk.ok = false;
  }
  r.chk.what =
      "library vs raw output arrays: max |lib - raw| / max |raw|; also bins 0, N/4 and 2 "
      "random ones vs a double DFT, error / ||x||_2 (details)";
  r.chk.worst = rel_diff;
  r.chk.tolerance = equal_tol;
  r.details = bench::json::object({{"points", fft_n},
                                   {"type", "C2C"},
                                   {"direction", "forward"},
                                   {"lib_raw_rel_diff", number(rel_diff)},
                                   {"dft_bins_worst_rel_error", number(worst_bin)},
                                   {"dft_bins_tolerance", bin_tol},
                                   {"buffers", "both sides read and write the same buffers"},
                                   {"lib_gpu_ms_again", g2.lib_gpu.median},
                                   {"raw_pool_workarea_gpu_ms", g2.raw_gpu.median},
                                   {"raw_pool_workarea_bytes", work2},
                                   {"lib_gpu_busy_ms", gb.lib_gpu.median},
                                   {"raw_gpu_busy_ms", gb.raw_gpu.median}});
  print_row(r);
  rows.push_back(std::move(r));
  co_return cuda::outcome::success();
}

// --------------------------------------------------------------- convolution

#if ATOMR_CUDA_HAS_CUDNN
// cuDNN 9 marks its legacy convolution API deprecated; it is the API the
// actor uses, so the raw side uses it too.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

result<void> cudnn_ok(cudnnStatus_t e, const char* call) {
  if (e == CUDNN_STATUS_SUCCESS) return cuda::outcome::success();
  return cuda::classify(e, call);
}

const char* algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
      return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
      return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
      return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT:
      return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "unknown";
  }
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH:
      return "TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH:
      return "FMA_MATH";
    default:
      return "unknown";
  }
}

// The ResNet-50 conv2_x 3x3 layer at batch 64.
constexpr int cv_n = 64, cv_c = 64, cv_k = 64, cv_h = 56, cv_w = 56, cv_r = 3, cv_s = 3, cv_pad = 1;

/// Sampled outputs of y = conv(x, w) (NHWC, KRSC, stride 1, pad 1) against a
/// double reference, the error relative to sum |x w| of each output.
void check_conv(const std::vector<cuda::half>& x, const std::vector<cuda::half>& w,
                const std::vector<cuda::half>& y, check& chk, double& worst) {
  constexpr int samples = 256;
  constexpr double tol = 5e-3;
  splitmix pick(4);
  auto at = [](const std::vector<cuda::half>& v, std::size_t i) {
    return static_cast<double>(__half2float(v[i]));
  };
  for (int s = 0; s < samples; ++s) {
    const int n = static_cast<int>(pick.next() % cv_n);
    // The corners first (padding on two sides), then anywhere.
    const int p = s == 0 ? 0 : s == 1 ? cv_h - 1 : static_cast<int>(pick.next() % cv_h);
    const int q = s == 0 ? 0 : s == 1 ? cv_w - 1 : static_cast<int>(pick.next() % cv_w);
    const int k = static_cast<int>(pick.next() % cv_k);
    double ref = 0, scale = 0;
    for (int r = 0; r < cv_r; ++r) {
      const int hh = p + r - cv_pad;
      if (hh < 0 || hh >= cv_h) continue;
      for (int t = 0; t < cv_s; ++t) {
        const int ww = q + t - cv_pad;
        if (ww < 0 || ww >= cv_w) continue;
        for (int c = 0; c < cv_c; ++c) {
          const double prod =
              at(x, ((static_cast<std::size_t>(n) * cv_h + hh) * cv_w + ww) * cv_c + c) *
              at(w, ((static_cast<std::size_t>(k) * cv_r + r) * cv_s + t) * cv_c + c);
          ref += prod;
          scale += std::fabs(prod);
        }
      }
    }
    const double got = at(y, ((static_cast<std::size_t>(n) * cv_h + p) * cv_w + q) * cv_k + k);
    const double err = std::fabs(got - ref) / scale;
    if (!(err <= tol)) {
      if (chk.ok)
        std::fprintf(stderr,
                     "%s: MISMATCH: conv y[n=%d, p=%d, q=%d, k=%d] is %.6g, expected %.6g\n", prog,
                     n, p, q, k, got, ref);
      chk.ok = false;
    }
    if (!std::isnan(worst) && !(err <= worst)) worst = err;
  }
}

/// The raw side's convolution: descriptors, and the algorithm chosen by the
/// rule cudnn_actor applies (it does not expose its choice): the first
/// successful result of cudnnGetConvolutionForwardAlgorithm_v7 whose
/// workspace fits the actor's default limit, with the math type cuDNN
/// reported for it.
struct raw_conv {
  scoped<cudnnHandle_t, cudnnDestroy> handle;
  scoped<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor> x, y;
  scoped<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor> w;
  scoped<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor> conv;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnMathType_t math = CUDNN_TENSOR_OP_MATH;
  std::size_t workspace = 0;
  int candidates = 0;

  result<void> setup(cudaStream_t s, std::size_t workspace_limit) {
    BOOST_OUTCOME_TRY(cudnn_ok(cudnnCreate(&handle.h), "cudnnCreate"));
    handle.live = true;
    BOOST_OUTCOME_TRY(cudnn_ok(cudnnSetStream(handle.h, s), "cudnnSetStream"));
    BOOST_OUTCOME_TRY(cudnn_ok(cudnnCreateTensorDescriptor(&x.h), "cudnnCreateTensorDescriptor"));
    x.live = true;
    BOOST_OUTCOME_TRY(cudnn_ok(
        cudnnSetTensor4dDescriptor(x.h, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, cv_n, cv_c, cv_h, cv_w),
        "cudnnSetTensor4dDescriptor"));
    BOOST_OUTCOME_TRY(cudnn_ok(cudnnCreateFilterDescriptor(&w.h), "cudnnCreateFilterDescriptor"));
    w.live = true;
    BOOST_OUTCOME_TRY(cudnn_ok(
        cudnnSetFilter4dDescriptor(w.h, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, cv_k, cv_c, cv_r, cv_s),
        "cudnnSetFilter4dDescriptor"));
    BOOST_OUTCOME_TRY(
        cudnn_ok(cudnnCreateConvolutionDescriptor(&conv.h), "cudnnCreateConvolutionDescriptor"));
    conv.live = true;
    BOOST_OUTCOME_TRY(
        cudnn_ok(cudnnSetConvolution2dDescriptor(conv.h, cv_pad, cv_pad, 1, 1, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                 "cudnnSetConvolution2dDescriptor"));
    BOOST_OUTCOME_TRY(cudnn_ok(cudnnSetConvolutionMathType(conv.h, CUDNN_TENSOR_OP_MATH),
                               "cudnnSetConvolutionMathType"));
    int on = 0, oc = 0, oh = 0, ow = 0;
    BOOST_OUTCOME_TRY(
        cudnn_ok(cudnnGetConvolution2dForwardOutputDim(conv.h, x.h, w.h, &on, &oc, &oh, &ow),
                 "cudnnGetConvolution2dForwardOutputDim"));
    if (on != cv_n || oc != cv_k || oh != cv_h || ow != cv_w)
      return cuda::make_error(cuda::errc::invalid_argument,
                              "conv: unexpected output shape " + std::to_string(on) + "x" +
                                  std::to_string(oc) + "x" + std::to_string(oh) + "x" +
                                  std::to_string(ow));
    BOOST_OUTCOME_TRY(cudnn_ok(cudnnCreateTensorDescriptor(&y.h), "cudnnCreateTensorDescriptor"));
    y.live = true;
    BOOST_OUTCOME_TRY(cudnn_ok(
        cudnnSetTensor4dDescriptor(y.h, CUDNN_TENSOR_NHWC, CUDNN_DATA_HALF, on, oc, oh, ow),
        "cudnnSetTensor4dDescriptor"));

    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    BOOST_OUTCOME_TRY(cudnn_ok(
        cudnnGetConvolutionForwardAlgorithm_v7(handle.h, x.h, w.h, conv.h, y.h,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &candidates, perf),
        "cudnnGetConvolutionForwardAlgorithm_v7"));
    for (int i = 0; i < candidates; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      if (cudnnSetConvolutionMathType(conv.h, perf[i].mathType) != CUDNN_STATUS_SUCCESS) continue;
      std::size_t ws = 0;
      if (cudnnGetConvolutionForwardWorkspaceSize(handle.h, x.h, w.h, conv.h, y.h, perf[i].algo,
                                                  &ws) != CUDNN_STATUS_SUCCESS)
        continue;
      if (ws > workspace_limit) continue;
      algo = perf[i].algo;
      math = perf[i].mathType;
      workspace = ws;
      return cuda::outcome::success();
    }
    return cuda::make_error(cuda::errc::not_supported,
                            "conv: no forward algorithm within the workspace limit");
  }
};

/// Which APIs the two sides of a convolution row use.
struct conv_variant {
  std::string_view suffix;  ///< appended to the work's name
  cuda::conv_api lib_api;
  bool lib_cuda_graphs;  ///< cudnn_options::cuda_graphs
  bool raw_graph;        ///< the raw side on the graph API (else cudnnConvolutionForward)
};
constexpr conv_variant conv_variants[] = {
    // The library's default against the raw call of the same API and engine rule.
    {"", cuda::conv_api::graph, true, true},
    // The library's default against the legacy call most cuDNN code makes.
    {"_vs_legacy_call", cuda::conv_api::graph, true, false},
    // Opt-in configurations: the graph API without CUDA graphs, and both
    // sides on the legacy API (the comparison of runs (a) to (j)).
    {"_no_cuda_graphs", cuda::conv_api::graph, false, true},
    {"_legacy_api", cuda::conv_api::legacy, true, false},
};

asio::awaitable<result<void>> run_conv_variant(cuda::device dev, const config& cfg,
                                               std::vector<row>& rows, conv_variant v) {
  using cuda::half;
  const std::size_t x_elems = std::size_t{cv_n} * cv_c * cv_h * cv_w;
  const std::size_t w_elems = std::size_t{cv_k} * cv_c * cv_r * cv_s;
  const std::size_t y_elems = std::size_t{cv_n} * cv_k * cv_h * cv_w;
  std::vector<half> x(x_elems), w(w_elems);
  splitmix gen(5);
  for (auto& v : x) v = __float2half(gen.nonzero());
  for (auto& v : w) v = __float2half(gen.nonzero());

  BOOST_OUTCOME_CO_TRY(auto dx, buffer<half>(dev, x_elems));
  BOOST_OUTCOME_CO_TRY(auto dw, buffer<half>(dev, w_elems));
  // One output buffer for both sides (as for the FFT: placement does not
  // count); the outputs are compared from one untimed run of each side.
  BOOST_OUTCOME_CO_TRY(auto dy, buffer<half>(dev, y_elems));
  BOOST_OUTCOME_CO_TRY(co_await cuda::upload(std::span<const half>(x), dx));
  BOOST_OUTCOME_CO_TRY(co_await cuda::upload(std::span<const half>(w), dw));

  // One lane: the spans' events are recorded on get_stream() (see sgemm).
  const cuda::cudnn_options copts{.how = cfg.how,
                                  .convolution_api = v.lib_api,
                                  .cuda_graphs = v.lib_cuda_graphs,
                                  .max_lanes = 1};
  BOOST_OUTCOME_CO_TRY(auto dnn, cuda::cudnn_actor::create(dev, copts));
  const cuda::tensor_shape xs{cv_n, cv_c, cv_h, cv_w, cuda::tensor_layout::nhwc};
  const cuda::conv2d_params cp{
      .out_channels = cv_k, .filter_h = cv_r, .filter_w = cv_s, .pad_h = cv_pad, .pad_w = cv_pad};

  raw_stream rs;
  BOOST_OUTCOME_CO_TRY(rs.create(dev.ordinal()));
  raw_conv rc;  // the legacy side (its handle serves the graph side too)
  BOOST_OUTCOME_CO_TRY(rc.setup(rs.h, copts.workspace_limit));
  raw_graph::conv rg;
  if (v.raw_graph && !rg.plan_for(rc.handle.h, cv_n, cv_c, cv_h, cv_w, cv_k, cv_r, cv_s, cv_pad,
                                  copts.workspace_limit))
    co_return cudnn_ok(rg.a.status, rg.a.failed_call.c_str()).error();
  const std::size_t raw_ws = v.raw_graph ? static_cast<std::size_t>(rg.workspace) : rc.workspace;
  cuda::gpu_ref<std::uint8_t> dws;
  void* pws = nullptr;
  if (raw_ws > 0) {
    BOOST_OUTCOME_CO_TRY(dws, buffer<std::uint8_t>(dev, raw_ws));
    BOOST_OUTCOME_CO_TRY(std::uint8_t * p, dws.unsafe_data());
    pws = p;
  }
  BOOST_OUTCOME_CO_TRY(const half* px, dx.unsafe_data());
  BOOST_OUTCOME_CO_TRY(const half* pw, dw.unsafe_data());
  BOOST_OUTCOME_CO_TRY(half * py, dy.unsafe_data());
  if (v.raw_graph && !rg.bind(px, pw, py, pws))
    co_return cudnn_ok(rg.a.status, rg.a.failed_call.c_str()).error();
  // The raw workspace comes from the pool on the main stream: make sure it exists.
  BOOST_OUTCOME_CO_TRY(cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));

  auto lib = [&] { return dnn.conv2d_forward(xs, cp, dx, dw, cuda::gpu_ref<half>{}, dy); };
  auto raw = [&]() -> result<void> {
    if (v.raw_graph)
      return cudnn_ok(cudnnBackendExecute(rc.handle.h, rg.plan, rg.pack), "cudnnBackendExecute");
    const float one = 1.0f, zero = 0.0f;
    return cudnn_ok(cudnnConvolutionForward(rc.handle.h, &one, rc.x.h, px, rc.w.h, pw, rc.conv.h,
                                            rc.algo, pws, rc.workspace, &zero, rc.y.h, py),
                    "cudnnConvolutionForward");
  };
  BOOST_OUTCOME_CO_TRY(auto t, co_await interleave(cfg, lib, raw, rs));
  BOOST_OUTCOME_CO_TRY(auto g,
                       co_await gpu_spans(cfg, lib, dnn.get_stream().native_handle(), raw, rs));

  BOOST_OUTCOME_CO_TRY(
      auto gb, co_await gpu_only_spans(dev, cfg, lib, dnn.get_stream().native_handle(), raw, rs));

  std::vector<half> y_lib(y_elems), y_raw(y_elems);
  BOOST_OUTCOME_CO_TRY(co_await outputs_of_each(dy, lib, raw, rs, y_lib, y_raw));
  const auto st = dnn.statistics();

  row r;
  r.work = std::string(w_conv) + std::string(v.suffix);
  r.library_default = v.lib_api == cuda::cudnn_options{}.convolution_api &&
                      v.lib_cuda_graphs == cuda::cudnn_options{}.cuda_graphs;
  r.lib = t.first;
  r.raw = t.second;
  r.gpu = g;
  r.reps = cfg.reps;
  r.raw_call = v.raw_graph ? "cudnnBackendExecute, engine " + std::to_string(rg.engine)
                           : std::string("cudnnConvolutionForward, ") + algo_name(rc.algo) + ", " +
                                 math_name(rc.math);
  // (1) library and raw outputs equal within f16 tolerance.
  double diff = 0, peak = 0;
  bool finite = true;
  for (std::size_t i = 0; i < y_elems; ++i) {
    const double l = __half2float(y_lib[i]), v = __half2float(y_raw[i]);
    if (!std::isfinite(l) || !std::isfinite(v)) finite = false;
    diff = std::max(diff, std::fabs(l - v));
    peak = std::max(peak, std::fabs(v));
  }
  const double rel_diff = finite && peak > 0 ? diff / peak : INFINITY;
  constexpr double equal_tol = 5e-3;
  if (!(rel_diff <= equal_tol)) {
    std::fprintf(stderr, "%s: MISMATCH: conv library vs raw output max |diff| / max |raw| = %.3g\n",
                 prog, rel_diff);
    r.chk.ok = false;
  }
  // (2) sampled outputs of both against a double CPU convolution.
  double worst_ref = 0;
  check ref_chk;
  check_conv(x, w, y_lib, ref_chk, worst_ref);
  check_conv(x, w, y_raw, ref_chk, worst_ref);
  if (!ref_chk.ok) r.chk.ok = false;
  r.chk.what =
      "library vs raw output arrays: max |lib - raw| / max |raw|; also 256 outputs of each vs "
      "a double CPU convolution, error / sum |x w| (details)";
  r.chk.worst = rel_diff;
  r.chk.tolerance = equal_tol;
  r.details = bench::json::object({
      {"n", cv_n},
      {"c", cv_c},
      {"k", cv_k},
      {"h", cv_h},
      {"w", cv_w},
      {"filter", "3x3"},
      {"pad", cv_pad},
      {"stride", 1},
      {"dtype", "f16"},
      {"layout", "nhwc"},
      {"lib_api", to_string(v.lib_api)},
      {"lib_graph_plans", st.graph_plans},
      {"lib_legacy_plans", st.legacy_plans},
      {"lib_cuda_graphs", v.lib_cuda_graphs},
      {"lib_cuda_graph_records", st.cuda_graph_records},
      {"lib_cuda_graph_launches", st.cuda_graph_launches},
      {"lib_cuda_graph_failures", st.cuda_graph_failures},
      {"raw_api", v.raw_graph ? "graph" : "legacy"},
      {"raw_algo",
       v.raw_graph ? "graph engine " + std::to_string(rg.engine) : std::string(algo_name(rc.algo))},
      {"raw_math", v.raw_graph ? "f32 accumulation" : math_name(rc.math)},
      {"raw_workspace_bytes", raw_ws},
      {"algo_choice",
       "cudnn_actor does not expose its choice; the raw side applies the actor's rule. Graph "
       "API: the first engine configuration of heuristics mode A not noted reduced-precision "
       "that finalizes with a workspace within cudnn_options::workspace_limit. Legacy API: the "
       "first successful result of cudnnGetConvolutionForwardAlgorithm_v7 whose workspace "
       "fits, with its math type"},
      {"workspace_limit_bytes", copts.workspace_limit},
      {"lib_workspace_bytes", st.workspace_bytes},
      {"raw_candidates", v.raw_graph ? rg.candidates : rc.candidates},
      {"lib_raw_rel_diff", number(rel_diff)},
      {"cpu_ref_worst_rel_error", number(worst_ref)},
      {"cpu_ref_tolerance", 5e-3},
      {"buffers", "both sides read and write the same buffers"},
      {"lib_gpu_busy_ms", gb.lib_gpu.median},
      {"raw_gpu_busy_ms", gb.raw_gpu.median},
  });
  print_row(r);
  rows.push_back(std::move(r));
  co_return cuda::outcome::success();
}

asio::awaitable<result<void>> run_conv(cuda::device dev, const config& cfg,
                                       std::vector<row>& rows) {
  for (const auto& v : conv_variants) {
    BOOST_OUTCOME_CO_TRY(co_await run_conv_variant(dev, cfg, rows, v));
  }
  co_return cuda::outcome::success();
}

#pragma GCC diagnostic pop
#endif  // ATOMR_CUDA_HAS_CUDNN

// --------------------------------------------------------------------- main

asio::awaitable<int> run_all(cuda::device dev, const config& cfg) {
  std::vector<row> rows;
  const std::string device = bench::device_name(cfg.device);
  std::printf("%s: %s, %d timed runs of each side after %d warm-up, library completion %s\n", prog,
              device.c_str(), cfg.reps, cfg.warmup, cfg.strategy.c_str());
  print_header();
  std::fflush(stdout);

  auto failed = [&](std::string_view what, const cuda::gpu_error& e) {
    std::fprintf(stderr, "%s: %.*s: %s\n", prog, static_cast<int>(what.size()), what.data(),
                 e.message().c_str());
    return exit_error;
  };
  // Runs one workload's function and notes the device's batch counters on its rows.
  auto counted = [&](auto run) -> asio::awaitable<result<void>> {
    const auto before = dev.statistics();
    const std::size_t first = rows.size();
    auto r = co_await run(dev, cfg, rows);
    const auto after = dev.statistics();
    for (std::size_t i = first; i < rows.size(); ++i) {
      rows[i].ops_batched = after.ops_batched - before.ops_batched;
      rows[i].batches = after.batches - before.batches;
    }
    co_return r;
  };
  if (selected(cfg, w_sgemm_f32) || selected(cfg, w_sgemm_tf32)) {
    auto r = co_await counted(run_gemm);
    if (!r) co_return failed("sgemm8192", r.error());
  }
  if (selected(cfg, w_fft)) {
    auto r = co_await counted(run_fft);
    if (!r) co_return failed(w_fft, r.error());
  }
  if (selected(cfg, w_conv)) {
#if ATOMR_CUDA_HAS_CUDNN
    auto r = co_await counted(run_conv);
    if (!r) co_return failed(w_conv, r.error());
#else
    std::fprintf(stderr, "%s: %s skipped: this build has no cuDNN\n", prog, w_conv.data());
#endif
  }
  std::printf("(medians and nearest-rank p99 over %d runs; lib/raw = ratio of the medians)\n",
              cfg.reps);

  bool all_ok = true;
  std::vector<bench::json> items;
  for (const auto& r : rows) {
    all_ok = all_ok && r.chk.ok;
    items.push_back(to_json(r));
  }
  const auto& how = cfg.how;
  const auto doc = bench::json::object({
      {"bench", "large"},
      {"device", device},
      {"date", bench::utc_now()},
      {"command", cfg.command},
      {"strategy", cfg.strategy},
      {"spin_us", std::chrono::duration<double, std::micro>(how.spin).count()},
      {"max_backoff_us", std::chrono::duration<double, std::micro>(how.max_backoff).count()},
      {"warmup", cfg.warmup},
      {"warm_lib", cfg.warm_lib},
      {"timing",
       "lib: wall time of co_await actor.op(...) on a one-thread io_context; raw: wall time of "
       "the raw call + cudaStreamSynchronize on its own stream; sides alternate (ABBA) over "
       "the same inputs"},
      {"large", bench::json::array(items)},
  });
  if (!bench::write_json(cfg.json_path, doc)) {
    std::fprintf(stderr, "%s: cannot write %s\n", prog, cfg.json_path.c_str());
    co_return exit_error;
  }
  co_return all_ok ? exit_ok : exit_mismatch;
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  if (auto done = parse(argc, argv, cfg)) return *done;
  bench::require_gpu(prog);

  asio::io_context ioc;
  int status = exit_error;
  {
    cuda::device_options opts;
    opts.default_completion = cfg.how;
    auto opened = cuda::device::open(ioc.get_executor(), cfg.device, opts);
    if (!opened) {
      std::fprintf(stderr, "%s: device %d: %s\n", prog, cfg.device,
                   opened.error().message().c_str());
      return opened.error() == cuda::errc::device_unavailable ? bench::exit_no_gpu : exit_error;
    }
    asio::co_spawn(ioc, run_all(std::move(opened).value(), cfg),
                   [&](std::exception_ptr ep, int rc) {
                     if (ep) {
                       try {
                         std::rethrow_exception(ep);
                       } catch (const std::exception& e) {
                         std::fprintf(stderr, "%s: %s\n", prog, e.what());
                       } catch (...) {
                         std::fprintf(stderr, "%s: unknown exception\n", prog);
                       }
                       status = exit_error;
                       return;
                     }
                     status = rc;
                   });
    ioc.run();
  }
  return status;
}
