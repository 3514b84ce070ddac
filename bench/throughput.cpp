// atomr-bench-throughput: issue 5 (b), small-operation throughput.
//
// For every workload and every io thread count T:
//  - ours: C coroutines (default 1024; --coroutines takes a list) on one
//    io_context run by T threads issue the operation through A library actors
//    (default A = T; each actor has its own stream, stream_policy::
//    per_actor_fresh, and one lane unless --max-lanes says otherwise;
//    coroutine i uses actor i % A), co_await-ing each operation, for at least
//    --seconds and --min-ops after a warm-up round. --default-actor makes
//    the actors as users do, with default options (stream policy and lanes:
//    the library's; `--actors 1 --default-actor` is one actor shared by every
//    io thread, scripts/bench.sh's one_actor run);
//  - raw ceiling: T std::threads, each with its own cudaStream_t and its own
//    library handle bound to it, launch the same operation back to back on
//    preallocated buffers for as long, with one cudaStreamSynchronize at the
//    end of the window.
// The shared GPU host drifts a lot between minutes, so one ours window then
// one raw window is a weak comparison. Each side is therefore set up and
// warmed up once (ours: io_context, device, actors, buffers, strands; raw:
// threads, streams, handles, buffers) and then timed in --rounds R paired
// rounds, alternating: ours window 1, raw window 1, ours window 2, raw window
// 2, ... While one side runs, the other is idle (its threads blocked, its
// io_context not run). Each window is timed as one measurement: at least
// --seconds and --min-ops, capped, including its tail (ours: every coroutine
// finishes its in-flight operation; raw: the final cudaStreamSynchronize).
// ops/s = completed operations / wall time of a window; CPU us/op = process
// CPU time over a window / operations. Reported: the medians over the rounds
// of both sides' ops/s and CPU us/op, and ratio = the median over the rounds
// of ours / raw of the same round (adjacent windows). Each coroutine owns its
// buffers (filled with random data before timing); the raw threads rotate over
// as many buffer sets in all, so that both sides touch the same amount of
// memory. After the last window one result of ours is checked on the CPU.

#include "bench.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cufft.h>
#include <curand.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;
using c32 = std::complex<float>;
using clock_type = std::chrono::steady_clock;

constexpr const char* prog = "atomr-bench-throughput";
constexpr int exit_ok = 0;
constexpr int exit_failed = 1;
constexpr int exit_usage = 64;

constexpr unsigned max_threads = 256;
constexpr long long max_coroutines = 100000;
constexpr long long max_actors = 4096;
constexpr double max_seconds = 600;
constexpr long long max_min_ops = 1000000000;
constexpr long long max_warmup = 100;
constexpr long long max_rounds = 50;
constexpr double cap_factor = 3;  // a window stops after cap_factor * --seconds regardless

// ---------------------------------------------------------------------------
// Workloads

enum class family { sgemm, fft, rng };

struct workload {
  const char* name;
  family fam;
  std::int64_t n;  // sgemm: n x n; fft: points; rng: numbers
};

constexpr workload catalogue[] = {
    {"sgemm64", family::sgemm, 64},
    {"sgemm256", family::sgemm, 256},
    {"fft4096", family::fft, 4096},
    {"rng1M", family::rng, std::int64_t{1} << 20},
};

cuda::gemm_params gemm_of(const workload& w) {
  return cuda::gemm_params{.m = w.n, .n = w.n, .k = w.n};  // alpha 1, beta 0
}

cuda::fft_shape fft_of(const workload& w) {
  return cuda::fft_shape{.rank = 1, .dims = {w.n, 1, 1}, .batch = 1};  // forward
}

std::size_t elems(const workload& w) {
  const auto n = static_cast<std::size_t>(w.n);
  return w.fam == family::sgemm ? n * n : n;
}

// ---------------------------------------------------------------------------
// Options

struct options {
  std::vector<unsigned> threads{1, 8};
  std::vector<unsigned> coroutines{1024};
  std::vector<const workload*> work;  // empty after parsing means: all
  unsigned actors = 0;                // 0: one per io thread
  bool pin = false;
  double seconds = 1.0;
  std::uint64_t min_ops = 20000;
  unsigned warmup = 2;
  unsigned rounds = 5;            // paired windows (ours, then raw) per measurement
  long long max_batch = -1;       // -1: the device's default
  long long launch_threads = -1;  // -1: the device's default
  long long busy_poll_us = -1;    // -1: the device's default
  long long launch_spin_us = -1;  // -1: the device's default
  long long graph_cache = -1;     // -1: blas_options' default
  long long max_lanes = -1;       // -1: 1 (or the library's default with --default-actor)
  bool default_actor = false;     // actors with default options
  int device = 0;
  std::string json;
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [options]\n"
               "\n"
               "Small-operation throughput (issue 5 b). For each workload and io thread count T:\n"
               "C coroutines on one io_context run by T threads issue the operation through A\n"
               "library actors (each with its own stream and one lane, or made with default\n"
               "options with --default-actor; coroutine i uses actor i %% A),\n"
               "co_await-ing each one, after a warm-up round; and the raw ceiling: T threads,\n"
               "each with its own stream and library handle, launch the same operation back to\n"
               "back with one cudaStreamSynchronize at the end of a window. Each side is set up\n"
               "(and warmed up) once, then timed in --rounds paired rounds: ours window 1, raw\n"
               "window 1, ours window 2, raw window 2, ... (the host drifts between minutes, so\n"
               "the ratio is taken per round, of adjacent windows). Each window runs for at\n"
               "least --seconds and --min-ops (at most %.0f x --seconds). Prints the medians\n"
               "over the rounds of ops/s of both, of their per-round ratio (and its min..max)\n"
               "and of the process CPU time per operation.\n"
               "\n"
               "Workloads: sgemm64, sgemm256 (cuBLAS SGEMM n x n, pedantic f32 math, no TF32),\n"
               "fft4096 (cuFFT C2C forward, 4096 points, batch 1), rng1M (cuRAND Philox\n"
               "normal f32, 2^20 numbers).\n"
               "\n"
               "Options:\n"
               "  --threads LIST     io thread counts, comma separated, each 1..%u (default 1,8)\n"
               "  --coroutines LIST  concurrent coroutines, comma separated, each 1..%lld\n"
               "                     (default 1024)\n"
               "  --work LIST        workloads, comma separated, or all (default all)\n"
               "  --actors A         actors per measurement, 0..%lld; 0 = one per io thread\n"
               "                     (default 0)\n"
               "  --pin              run the coroutines of actor k on strand k (default: on the\n"
               "                     io_context itself, any thread)\n"
               "  --default-actor    make the actors with default options (the library's stream\n"
               "                     policy and max_lanes) instead of one stream_policy::\n"
               "                     per_actor_fresh stream and one lane each; with --actors 1:\n"
               "                     one actor shared by every io thread\n"
               "  --max-lanes N      the actors' max_lanes, 0..64; 0 = the library's default\n"
               "                     (default: 1, or the library's with --default-actor)\n"
               "  --max-batch N      device_options::max_batch, 1..1048576 (default: the\n"
               "                     library's default)\n"
               "  --launch-threads N device_options::launch_threads, 0..64 (default: the\n"
               "                     library's default; 0 = batches run on the io threads)\n"
               "  --busy-poll-us U   device_options::busy_poll_interval in us, 0..1000\n"
               "                     (default: the library's default)\n"
               "  --launch-spin-us U device_options::launch_spin in us, 0..10000 (default:\n"
               "                     the library's default)\n"
               "  --graph-cache N    blas_options::cuda_graph_cache, 0..65536; 0 = gemm calls\n"
               "                     never recorded as CUDA graphs (default: the library's)\n"
               "  --seconds S        timed seconds per window, > 0 and <= %.0f (default 1)\n"
               "  --min-ops N        at least N operations per window, 1..%lld\n"
               "                     (default 20000)\n"
               "  --rounds R         paired rounds (an ours window, then a raw window) per\n"
               "                     measurement, 1..%lld (default 5)\n"
               "  --warmup W         untimed rounds before timing: W operations per coroutine\n"
               "                     and W per raw buffer set, 0..%lld (default 2)\n"
               "  --device D         device ordinal (default 0)\n"
               "  --json FILE        also write the results as JSON to FILE\n"
               "  --help             print this help and exit\n"
               "Options also take the form --name=value.\n"
               "\n"
               "Exit status: 0 success; 1 an operation failed or a checked result was wrong;\n"
               "64 usage error; 69 no usable GPU.\n",
               prog, cap_factor, max_threads, max_coroutines, max_actors, max_seconds, max_min_ops,
               max_rounds, max_warmup);
}

std::optional<long long> parse_int(const std::string& s) {
  if (s.empty() || s[0] == ' ') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

std::optional<double> parse_double(const std::string& s) {
  if (s.empty() || s[0] == ' ') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A usage error: the message, then a pointer to --help.
int usage_error(const std::string& what) {
  std::fprintf(stderr, "%s: %s\nTry '%s --help'.\n", prog, what.c_str(), prog);
  return exit_usage;
}

// Fills `o`; returns an exit status when the program should end now.
std::optional<int> parse_args(int argc, char** argv, options& o) {
  const bench::args a(argc, argv, {"help", "pin", "default-actor"});
  if (!a.unknown.empty()) {
    const auto& u = a.unknown.front();
    if (u.rfind("--", 0) == 0) return usage_error("option '" + u + "' needs a value");
    return usage_error("unexpected argument '" + u + "'");
  }
  static const char* const known[] = {
      "threads",     "coroutines",     "work",      "actors",         "pin",
      "seconds",     "min-ops",        "warmup",    "rounds",         "device",
      "json",        "help",           "max-batch", "launch-threads", "busy-poll-us",
      "graph-cache", "launch-spin-us", "max-lanes", "default-actor"};
  for (const auto& [k, v] : a.kv) {
    bool ok = false;
    for (const char* name : known) ok = ok || k == name;
    if (!ok) return usage_error("unknown option '--" + k + "'");
  }
  for (const char* flag : {"help", "pin", "default-actor"})
    if (a.has(flag) && a.get(flag) != "1")
      return usage_error("--" + std::string(flag) + " takes no value");
  if (a.has("help")) {
    print_usage(stdout);
    return exit_ok;
  }
  // An integer option in [lo, hi].
  auto integer = [&](const char* name, long long lo, long long hi,
                     auto& out) -> std::optional<int> {
    if (!a.has(name)) return std::nullopt;
    const auto v = parse_int(a.get(name));
    if (!v || *v < lo || *v > hi)
      return usage_error("--" + std::string(name) + " wants an integer in " + std::to_string(lo) +
                         ".." + std::to_string(hi) + ", not '" + a.get(name) + "'");
    out = static_cast<std::remove_reference_t<decltype(out)>>(*v);
    return std::nullopt;
  };
  // A comma separated list of integers in [lo, hi].
  auto list = [&](const char* name, long long lo, long long hi,
                  std::vector<unsigned>& out) -> std::optional<int> {
    if (!a.has(name)) return std::nullopt;
    out.clear();
    for (const auto& t : bench::split_list(a.get(name))) {
      const auto v = parse_int(t);
      if (!v || *v < lo || *v > hi)
        return usage_error("--" + std::string(name) +
                           " wants a comma separated list of integers in " + std::to_string(lo) +
                           ".." + std::to_string(hi) + ", not '" + a.get(name) + "'");
      out.push_back(static_cast<unsigned>(*v));
    }
    return std::nullopt;
  };
  if (auto r = list("threads", 1, max_threads, o.threads)) return r;
  if (auto r = list("coroutines", 1, max_coroutines, o.coroutines)) return r;
  if (auto r = integer("actors", 0, max_actors, o.actors)) return r;
  if (auto r = integer("min-ops", 1, max_min_ops, o.min_ops)) return r;
  if (auto r = integer("warmup", 0, max_warmup, o.warmup)) return r;
  if (auto r = integer("rounds", 1, max_rounds, o.rounds)) return r;
  if (auto r = integer("device", 0, 1 << 20, o.device)) return r;
  if (auto r = integer("max-batch", 1, 1 << 20, o.max_batch)) return r;
  if (auto r = integer("launch-threads", 0, 64, o.launch_threads)) return r;
  if (auto r = integer("busy-poll-us", 0, 1000, o.busy_poll_us)) return r;
  if (auto r = integer("launch-spin-us", 0, 10000, o.launch_spin_us)) return r;
  if (auto r = integer("graph-cache", 0, 1 << 16, o.graph_cache)) return r;
  if (auto r = integer("max-lanes", 0, 64, o.max_lanes)) return r;
  if (a.has("work")) {
    for (const auto& name : bench::split_list(a.get("work"))) {
      bool found = false;
      for (const auto& w : catalogue) {
        if (name != "all" && name != w.name) continue;
        found = true;
        if (std::find(o.work.begin(), o.work.end(), &w) == o.work.end()) o.work.push_back(&w);
      }
      if (!found)
        return usage_error("--work: unknown workload '" + name +
                           "' (known: sgemm64, sgemm256, fft4096, rng1M, all)");
    }
  } else {
    for (const auto& w : catalogue) o.work.push_back(&w);
  }
  if (a.has("seconds")) {
    const auto v = parse_double(a.get("seconds"));
    if (!v || !(*v > 0) || *v > max_seconds)
      return usage_error(
          "--seconds wants a number > 0 and <= " + std::to_string(static_cast<int>(max_seconds)) +
          ", not '" + a.get("seconds") + "'");
    o.seconds = *v;
  }
  o.pin = a.has("pin");
  o.default_actor = a.has("default-actor");
  if (a.has("json")) {
    o.json = a.get("json");
    if (o.json.empty()) return usage_error("--json wants a file name");
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Shared pieces

// The first failure (its message) and how many there were; any thread.
class failures {
public:
  void add(std::string what) {
    std::lock_guard lk(m_);
    if (count_++ == 0) first_ = std::move(what);
  }
  bool any() const {
    std::lock_guard lk(m_);
    return count_ != 0;
  }
  std::uint64_t count() const {
    std::lock_guard lk(m_);
    return count_;
  }
  std::string first() const {
    std::lock_guard lk(m_);
    return first_;
  }

private:
  mutable std::mutex m_;
  std::uint64_t count_ = 0;
  std::string first_;
};

std::string describe(const cuda::gpu_error& e) {
  const auto code = cuda::to_string(e.code());
  return "[" + std::string(code) + "] " + e.message();
}

std::string describe(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& ex) {
    return std::string("exception: ") + ex.what();
  } catch (...) {
  }
  return "unknown exception";
}

// xorshift64*: fast deterministic test data.
class xorshift {
public:
  explicit xorshift(std::uint64_t seed) noexcept : s_(0x9E3779B97F4A7C15ull + 2 * seed) {}  // odd
  std::uint64_t next() noexcept {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545F4914F6CDD1Dull;
  }
  /// Uniform in [-1, 1).
  float symmetric() noexcept { return static_cast<float>(next() >> 40) * 0x1p-23f - 1.0f; }

private:
  std::uint64_t s_;
};

void fill_random(std::span<float> v, std::uint64_t seed) {
  xorshift g(seed);
  for (auto& x : v) x = g.symmetric();
}

void fill_random(std::span<c32> v, std::uint64_t seed) {
  xorshift g(seed);
  for (auto& z : v) z = c32(g.symmetric(), g.symmetric());
}

// Seeds of coroutine i's inputs (A or the FFT input: which = 0; B: which = 1).
std::uint64_t seed_of(std::size_t i, int which) {
  return 2 * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(which);
}

// When a timed loop stops: after `deadline` once `min_ops` are done, or at `cap`.
struct stop_rule {
  clock_type::time_point deadline{}, cap{};
  std::uint64_t min_ops = 0;
  bool reached(clock_type::time_point now, std::uint64_t done) const {
    return (now >= deadline && done >= min_ops) || now >= cap;
  }
  static stop_rule from_now(const options& o) {
    const auto start = clock_type::now();
    const auto s = std::chrono::duration<double>(o.seconds);
    const auto c = std::chrono::duration<double>(o.seconds * cap_factor);
    return {start + std::chrono::duration_cast<clock_type::duration>(s),
            start + std::chrono::duration_cast<clock_type::duration>(c), o.min_ops};
  }
};

// One timed window of one side.
struct measured {
  std::uint64_t ops = 0;
  double seconds = 0;
  double cpu_us = 0;
  // Ours only: the device's statistics over the window (device_statistics).
  std::uint64_t batches = 0, ops_batched = 0, launch_sleeps = 0;
  // Ours only: lanes the actors had made by the end of the window, summed.
  std::size_t lanes = 0;
  double ops_per_s() const { return seconds > 0 ? static_cast<double>(ops) / seconds : 0.0; }
  double cpu_us_per_op() const { return ops > 0 ? cpu_us / static_cast<double>(ops) : 0.0; }
};

// "sgemm64 T=8 C=1024 (ours)", for messages.
std::string where_of(const workload& w, unsigned threads, unsigned coroutines, const char* side) {
  return std::string(w.name) + " T=" + std::to_string(threads) +
         " C=" + std::to_string(coroutines) + " (" + side + ")";
}

// ---------------------------------------------------------------------------
// Ours: the library's actors on an io_context run by T threads

// The actors of one measurement (only the kind the workload needs).
struct actor_pool {
  std::vector<cuda::blas_actor> blas;
  std::vector<cuda::fft_actor> fft;
  std::vector<cuda::rng_actor> rng;

  const cuda::stream& stream_of(std::size_t i) const {
    if (!blas.empty()) return blas[i].get_stream();
    if (!fft.empty()) return fft[i].get_stream();
    return rng[i].get_stream();
  }

  // Lanes the actors have made so far, summed.
  std::size_t lanes() const {
    std::size_t n = 0;
    for (const auto& b : blas) n += b.statistics().lanes;
    for (const auto& t : fft) n += t.statistics().lanes;
    for (const auto& r : rng) n += r.statistics().lanes;
    return n;
  }
};

// The actors' max_lanes: --max-lanes, else 1 (one stream per actor, as the
// rows before lanes measured), or the library's default with --default-actor.
std::size_t lanes_of(const options& o) {
  if (o.max_lanes >= 0) return static_cast<std::size_t>(o.max_lanes);
  return o.default_actor ? cuda::blas_options{}.max_lanes : 1;
}

cuda::result<actor_pool> make_actors(const cuda::device& dev, family f, unsigned count,
                                     const options& o) {
  actor_pool p;
  // --default-actor: default options, as a user writes create(dev); else one
  // fresh stream of its own per actor.
  const auto streams = o.default_actor ? std::optional<cuda::stream_policy>{}
                                       : std::optional(cuda::stream_policy::per_actor_fresh);
  const std::size_t lanes = lanes_of(o);
  for (unsigned i = 0; i < count; ++i) {
    switch (f) {
      case family::sgemm: {
        cuda::blas_options b;
        b.streams = streams;
        b.max_lanes = lanes;
        if (o.graph_cache >= 0) b.cuda_graph_cache = static_cast<std::size_t>(o.graph_cache);
        BOOST_OUTCOME_TRY(auto a, cuda::blas_actor::create(dev, b));
        p.blas.push_back(std::move(a));
        break;
      }
      case family::fft: {
        BOOST_OUTCOME_TRY(auto t,
                          cuda::fft_actor::create(dev, {.streams = streams, .max_lanes = lanes}));
        p.fft.push_back(std::move(t));
        break;
      }
      case family::rng: {
        BOOST_OUTCOME_TRY(auto r,
                          cuda::rng_actor::create(
                              dev, {.seed = 1000 + i, .streams = streams, .max_lanes = lanes}));
        p.rng.push_back(std::move(r));
        break;
      }
    }
  }
  return p;
}

// One coroutine's buffers.
struct slot {
  cuda::gpu_ref<float> a, b, c;  // sgemm: A, B, C; rng: c receives the numbers
  cuda::gpu_ref<c32> x, y;       // fft: input, output
};

// A batch of coroutines run to completion on `threads` threads. The window
// runs from just before the threads start to the moment the last coroutine
// finished (the io_context is stopped then).
class batch {
public:
  batch(asio::io_context& ioc, std::size_t count, failures& fail)
      : ioc_(ioc), left_(count), fail_(fail) {}

  auto handler() {
    return [this](std::exception_ptr ep) {
      if (ep) fail_.add(describe(ep));
      if (left_.fetch_sub(1) == 1) {
        end_us_ = bench::now_us();
        end_cpu_us_ = bench::process_cpu_us();
        ioc_.stop();
      }
    };
  }

  measured run(unsigned threads) {
    auto guard = asio::make_work_guard(ioc_);
    ioc_.restart();
    const double cpu0 = bench::process_cpu_us();
    const double t0 = bench::now_us();
    auto body = [this] {
      try {
        ioc_.run();
      } catch (const std::exception& ex) {
        fail_.add(std::string("io thread: exception: ") + ex.what());
        ioc_.stop();
      }
    };
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(body);
    body();
    for (auto& t : pool) t.join();
    guard.reset();
    measured m;
    m.seconds = (end_us_ - t0) * 1e-6;
    m.cpu_us = end_cpu_us_ - cpu0;
    return m;
  }

private:
  asio::io_context& ioc_;
  std::atomic<std::size_t> left_;
  failures& fail_;
  double end_us_ = 0, end_cpu_us_ = 0;
};

// What the issuing loops share.
struct loop_control {
  std::uint64_t rounds = 0;  // 0: until `rule` says stop
  stop_rule rule{};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> stop{false};
  failures* fail = nullptr;
  std::string where;  // where_of(...), for messages
};

// Allocates and fills the buffers of slots first, first + stride, ... one after
// the other, each on the stream of the actor that will use it.
template <family F>
asio::awaitable<void> prepare(cuda::device dev, const actor_pool& pool, const workload& w,
                              std::vector<slot>& slots, std::size_t first, std::size_t stride,
                              loop_control& ctl) {
  const std::size_t actors = std::max({pool.blas.size(), pool.fft.size(), pool.rng.size()});
  const std::size_t n = elems(w);
  std::vector<float> hf(F == family::sgemm ? n : 0);
  std::vector<c32> hc(F == family::fft ? n : 0);
  for (std::size_t i = first; i < slots.size() && !ctl.stop.load(); i += stride) {
    const cuda::stream& on = pool.stream_of(i % actors);
    const cuda::transfer_options where{.on = on};
    auto fail = [&](const char* what, const cuda::gpu_error& e) {
      ctl.fail->add(ctl.where + ": " + what + " for coroutine " + std::to_string(i) +
                    " failed: " + describe(e));
      ctl.stop = true;
    };
    slot& s = slots[i];
    if constexpr (F == family::sgemm) {
      auto a = dev.allocate<float>(n, on);
      auto b = a ? dev.allocate<float>(n, on) : a;
      auto c = b ? dev.allocate<float>(n, on) : b;
      if (!c) co_return fail("allocate", c.error());
      fill_random(hf, seed_of(i, 0));
      auto ua = co_await cuda::upload(std::span<const float>(hf), a.value(), where);
      if (!ua) co_return fail("upload A", ua.error());
      fill_random(hf, seed_of(i, 1));
      auto ub = co_await cuda::upload(std::span<const float>(hf), b.value(), where);
      if (!ub) co_return fail("upload B", ub.error());
      s.a = a.value();
      s.b = b.value();
      s.c = c.value();
    } else if constexpr (F == family::fft) {
      auto x = dev.allocate<c32>(n, on);
      auto y = x ? dev.allocate<c32>(n, on) : x;
      if (!y) co_return fail("allocate", y.error());
      fill_random(hc, seed_of(i, 0));
      auto ux = co_await cuda::upload(std::span<const c32>(hc), x.value(), where);
      if (!ux) co_return fail("upload", ux.error());
      s.x = x.value();
      s.y = y.value();
    } else {
      auto c = dev.allocate<float>(n, on);  // output only: nothing to fill
      if (!c) co_return fail("allocate", c.error());
      s.c = c.value();
    }
  }
}

// Issues the workload's operation through actor `actor` on the buffers of
// `s`, co_await-ing each, for ctl.rounds operations or until ctl.rule says stop.
template <family F>
asio::awaitable<void> issue_loop(const actor_pool& pool, std::size_t actor, const workload& w,
                                 const slot& s, loop_control& ctl) {
  const auto gemm = gemm_of(w);
  const auto shape = fft_of(w);
  for (std::uint64_t k = 0; ctl.rounds == 0 || k < ctl.rounds; ++k) {
    if (ctl.stop.load(std::memory_order_relaxed)) co_return;
    std::optional<cuda::gpu_error> err;
    if constexpr (F == family::sgemm) {
      auto r = co_await pool.blas[actor].gemm(gemm, s.a, s.b, s.c);
      if (!r) err = r.error();
    } else if constexpr (F == family::fft) {
      auto r = co_await pool.fft[actor].c2c(shape, s.x, s.y);
      if (!r) err = r.error();
    } else {
      auto r = co_await pool.rng[actor].normal(s.c);
      if (!r) err = r.error();
    }
    if (err) {
      ctl.fail->add(ctl.where + ": operation failed: " + describe(*err));
      ctl.stop = true;
      co_return;
    }
    const auto done = ctl.completed.fetch_add(1, std::memory_order_relaxed) + 1;
    if (ctl.rounds == 0 && ctl.rule.reached(clock_type::now(), done))
      ctl.stop.store(true, std::memory_order_relaxed);
  }
}

// Copies coroutine 0's output back (for the CPU check).
template <family F>
asio::awaitable<void> fetch_result(const slot& s, std::vector<float>& f, std::vector<c32>& c,
                                   loop_control& ctl) {
  cuda::result<void> r = cuda::outcome::success();
  if constexpr (F == family::fft) {
    c.resize(s.y.size());
    r = co_await cuda::download(s.y, std::span<c32>(c));
  } else {
    f.resize(s.c.size());
    r = co_await cuda::download(s.c, std::span<float>(f));
  }
  if (!r) ctl.fail->add(ctl.where + ": download of a result failed: " + describe(r.error()));
}

// --- CPU checks of coroutine 0's result: empty when right, else what is wrong.

std::string check_sgemm(std::size_t n, std::span<const float> c) {
  std::vector<float> a(n * n), b(n * n);
  fill_random(a, seed_of(0, 0));
  fill_random(b, seed_of(0, 1));
  // Error relative to sum_k |a_ik b_kj|: a few units of f32 rounding per term
  // at most; TF32 (10-bit mantissa) or garbage would be far above.
  const double tol = 4.0 * static_cast<double>(n) * 0x1p-24;
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      double ref = 0, scale = 0;
      for (std::size_t k = 0; k < n; ++k) {
        const double p = static_cast<double>(a[i + k * n]) * static_cast<double>(b[k + j * n]);
        ref += p;
        scale += std::fabs(p);
      }
      const double err =
          std::fabs(static_cast<double>(c[i + j * n]) - ref) / std::max(scale, 1e-30);
      if (!(err <= tol))
        return "sgemm: C(" + std::to_string(i) + ", " + std::to_string(j) +
               ") = " + std::to_string(c[i + j * n]) + ", expected " + std::to_string(ref);
    }
  return {};
}

std::string check_fft(std::size_t n, std::span<const c32> y) {
  std::vector<c32> x(n);
  fill_random(x, seed_of(0, 0));
  double norm = 0;
  for (const auto& v : x) norm += std::norm(std::complex<double>(v));
  const double tol = 1e-4 * std::sqrt(norm);  // |X_k| is about sqrt(norm)
  // 16 output bins against the DFT sum in double precision.
  for (std::size_t q = 0; q < 16; ++q) {
    const std::size_t k = (q * 257 + q * q * 31) % n;
    std::complex<double> ref = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const double ang =
          -2.0 * std::numbers::pi * static_cast<double>((j * k) % n) / static_cast<double>(n);
      ref += std::complex<double>(x[j]) * std::complex<double>(std::cos(ang), std::sin(ang));
    }
    if (!(std::abs(std::complex<double>(y[k]) - ref) <= tol))
      return "fft: bin " + std::to_string(k) + " off by " +
             std::to_string(std::abs(std::complex<double>(y[k]) - ref)) + " (tolerance " +
             std::to_string(tol) + ")";
  }
  return {};
}

std::string check_normal(std::span<const float> v) {
  double sum = 0, sq = 0;
  for (float x : v) {
    if (!std::isfinite(x)) return "rng: a drawn value is not finite";
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size());
  const double mean = sum / n, var = sq / n - mean * mean;
  // 5 standard errors: 5/sqrt(n) for the mean, 5*sqrt(2/n) for the variance.
  if (!(std::fabs(mean) <= 5 / std::sqrt(n)) || !(std::fabs(var - 1) <= 5 * std::sqrt(2 / n)))
    return "rng: sample mean " + std::to_string(mean) + ", variance " + std::to_string(var) +
           " (expected 0 and 1)";
  return {};
}

template <family F>
std::string check_result(const workload& w, const std::vector<float>& f,
                         const std::vector<c32>& c) {
  const auto n = static_cast<std::size_t>(w.n);
  if constexpr (F == family::sgemm)
    return check_sgemm(n, f);
  else if constexpr (F == family::fft)
    return check_fft(n, c);
  else
    return check_normal(f);
}

// Runs `make(i)` as coroutine i (i < count), on the executor `ex(i)`, on
// `threads` threads of `ioc`, to completion.
template <class Ex, class Make>
measured run_batch(asio::io_context& ioc, unsigned threads, std::size_t count, failures& fail,
                   Ex ex, Make make) {
  batch b(ioc, count, fail);
  for (std::size_t i = 0; i < count; ++i) asio::co_spawn(ex(i), make(i), b.handler());
  return b.run(threads);
}

// Ours, set up once and timed in windows (see run_rounds): the io_context, the
// device, the actors, the coroutines' buffers and the strands live from start()
// to finish(); each window() spawns the C coroutines afresh and runs the
// io_context on T threads until the last of them finished its in-flight
// operation. Between windows no thread runs the io_context.
template <family F>
class ours_side {
public:
  ours_side(const options& o, const workload& w, unsigned threads, unsigned coroutines,
            unsigned actors, failures& fail)
      : o_(o),
        w_(w),
        threads_(threads),
        coroutines_(coroutines),
        actors_(actors),
        fail_(fail),
        ioc_(static_cast<int>(threads)) {
    ctl_.fail = &fail;
    ctl_.where = where_of(w, threads, coroutines, "ours");
  }
  ours_side(const ours_side&) = delete;
  ours_side& operator=(const ours_side&) = delete;
  ~ours_side() { release(); }

  // Opens the device, creates the actors, fills the buffers and runs the
  // warm-up round (first launches load kernels, FFT plans are made); false on
  // a failure (recorded).
  bool start() {
    cuda::device_options dopts;
    if (o_.max_batch > 0) dopts.max_batch = static_cast<std::size_t>(o_.max_batch);
    if (o_.launch_threads >= 0) dopts.launch_threads = static_cast<std::size_t>(o_.launch_threads);
    if (o_.busy_poll_us >= 0) dopts.busy_poll_interval = std::chrono::microseconds(o_.busy_poll_us);
    if (o_.launch_spin_us >= 0) dopts.launch_spin = std::chrono::microseconds(o_.launch_spin_us);
    auto opened = cuda::device::open(ioc_.get_executor(), o_.device, dopts);
    if (!opened) {
      fail_.add(ctl_.where + ": device::open failed: " + describe(opened.error()));
      return false;
    }
    const cuda::device dev = opened.value();
    if (dev.get_executor() != asio::any_io_executor(ioc_.get_executor())) {
      // A device state of an earlier measurement is still alive (its io_context is gone).
      fail_.add(ctl_.where + ": device::open returned a device bound to another io_context");
      return false;
    }
    auto made = make_actors(dev, w_.fam, actors_, o_);
    if (!made) {
      fail_.add(ctl_.where + ": creating the actors failed: " + describe(made.error()));
      return false;
    }
    live& l = live_.emplace(live{dev, std::move(made).value(), std::vector<slot>(coroutines_), {}});
    for (unsigned k = 0; k < actors_; ++k) l.strands.push_back(asio::make_strand(ioc_));

    // Buffers: one preparing coroutine per io thread, each slot in turn.
    const std::size_t preparers = std::min<std::size_t>(threads_, l.slots.size());
    run_batch(ioc_, threads_, preparers, fail_, on_ioc(), [&](std::size_t p) {
      return prepare<F>(l.dev, l.pool, w_, l.slots, p, preparers, ctl_);
    });
    if (!fail_.any() && o_.warmup > 0) {
      ctl_.rounds = o_.warmup;
      issue_all();
    }
    return !fail_.any();
  }

  // One timed window, under a stop_rule from now; nullopt on a failure.
  std::optional<measured> window() {
    ctl_.rounds = 0;
    ctl_.completed = 0;
    ctl_.stop = false;  // the previous window ended by setting it
    const auto before = live_->dev.statistics();
    ctl_.rule = stop_rule::from_now(o_);
    measured m = issue_all();
    m.ops = ctl_.completed.load();
    const auto after = live_->dev.statistics();
    m.batches = after.batches - before.batches;
    m.ops_batched = after.ops_batched - before.ops_batched;
    m.launch_sleeps = after.launch_sleeps - before.launch_sleeps;
    m.lanes = live_->pool.lanes();
    if (fail_.any()) return std::nullopt;
    return m;
  }

  // Copies coroutine 0's output back, releases everything of the device and
  // checks that output on the CPU; false on a failure (recorded).
  bool finish() {
    std::vector<float> got_f;
    std::vector<c32> got_c;
    run_batch(ioc_, threads_, 1, fail_, on_ioc(),
              [&](std::size_t) { return fetch_result<F>(live_->slots[0], got_f, got_c, ctl_); });
    release();
    if (fail_.any()) return false;
    if (auto wrong = check_result<F>(w_, got_f, got_c); !wrong.empty()) {
      fail_.add(ctl_.where + ": wrong result: " + wrong);
      return false;
    }
    return true;
  }

private:
  // What lives from start() to finish().
  struct live {
    cuda::device dev;
    actor_pool pool;
    std::vector<slot> slots;
    std::vector<asio::strand<asio::io_context::executor_type>> strands;
  };

  auto on_ioc() {
    return [this](std::size_t) { return asio::any_io_executor(ioc_.get_executor()); };
  }

  // All C coroutines, each running issue_loop under ctl_ (--pin: coroutine i
  // on the strand of its actor).
  measured issue_all() {
    live& l = *live_;
    auto exec_of = [&](std::size_t i) {
      return o_.pin ? asio::any_io_executor(l.strands[i % actors_])
                    : asio::any_io_executor(ioc_.get_executor());
    };
    return run_batch(ioc_, threads_, l.slots.size(), fail_, exec_of, [&](std::size_t i) {
      return issue_loop<F>(l.pool, i % actors_, w_, l.slots[i], ctl_);
    });
  }

  // Releases everything of the device, then lets what it queued on the
  // io_context run.
  void release() {
    if (!live_) return;
    live_.reset();
    ioc_.restart();
    ioc_.run_for(std::chrono::seconds(5));
  }

  const options& o_;
  const workload& w_;
  const unsigned threads_, coroutines_, actors_;
  failures& fail_;
  loop_control ctl_;
  asio::io_context ioc_;      // outlives live_
  std::optional<live> live_;  // engaged from a successful start() to finish()
};

// ---------------------------------------------------------------------------
// The raw ceiling: T threads, each with its own stream and library handle

std::string cuda_status(cudaError_t e, const char* call) {
  return std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
}
std::string cublas_status(cublasStatus_t e, const char* call) {
  return std::string(call) + ": " + cublasGetStatusName(e) + ": " + cublasGetStatusString(e);
}
std::string cufft_status(cufftResult e, const char* call) {
  return std::string(call) + ": cufftResult " + std::to_string(static_cast<int>(e));
}
std::string curand_status(curandStatus_t e, const char* call) {
  return std::string(call) + ": curandStatus " + std::to_string(static_cast<int>(e));
}

// One raw thread's stream, handle and buffer sets.
class raw_lane {
public:
  explicit raw_lane(const workload& w) : w_(w) {}
  raw_lane(const raw_lane&) = delete;
  raw_lane& operator=(const raw_lane&) = delete;
  ~raw_lane() {
    if (stream_) cudaStreamSynchronize(stream_);
    if (blas_) cublasDestroy(blas_);
    if (planned_) cufftDestroy(plan_);
    if (gen_) curandDestroyGenerator(gen_);
    for (void* p : mem_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Creates everything and fills the inputs with random data; an error message or "".
  std::string init(int ordinal, std::size_t sets, std::uint64_t seed) {
    if (auto e = cudaSetDevice(ordinal); e != cudaSuccess) return cuda_status(e, "cudaSetDevice");
    if (auto e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_status(e, "cudaStreamCreateWithFlags");
    const auto n = static_cast<int>(w_.n);
    switch (w_.fam) {
      case family::sgemm:
        if (auto e = cublasCreate(&blas_); e != CUBLAS_STATUS_SUCCESS)
          return cublas_status(e, "cublasCreate");
        if (auto e = cublasSetStream(blas_, stream_); e != CUBLAS_STATUS_SUCCESS)
          return cublas_status(e, "cublasSetStream");
        if (auto e = cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH); e != CUBLAS_STATUS_SUCCESS)
          return cublas_status(e, "cublasSetMathMode");
        break;
      case family::fft:
        if (auto e = cufftPlan1d(&plan_, n, CUFFT_C2C, 1); e != CUFFT_SUCCESS)
          return cufft_status(e, "cufftPlan1d");
        planned_ = true;
        if (auto e = cufftSetStream(plan_, stream_); e != CUFFT_SUCCESS)
          return cufft_status(e, "cufftSetStream");
        break;
      case family::rng:
        if (auto e = curandCreateGenerator(&gen_, CURAND_RNG_PSEUDO_PHILOX4_32_10);
            e != CURAND_STATUS_SUCCESS)
          return curand_status(e, "curandCreateGenerator");
        if (auto e = curandSetStream(gen_, stream_); e != CURAND_STATUS_SUCCESS)
          return curand_status(e, "curandSetStream");
        if (auto e = curandSetPseudoRandomGeneratorSeed(gen_, seed); e != CURAND_STATUS_SUCCESS)
          return curand_status(e, "curandSetPseudoRandomGeneratorSeed");
        break;
    }
    // Buffers (bytes): sgemm A, B, C; fft input, output; rng output.
    const std::size_t count = elems(w_);
    const std::size_t bytes = w_.fam == family::fft ? count * sizeof(c32) : count * sizeof(float);
    const int per_set = w_.fam == family::sgemm ? 3 : w_.fam == family::fft ? 2 : 1;
    const int inputs = per_set - 1;
    std::vector<float> host(bytes / sizeof(float));
    for (std::size_t s = 0; s < sets; ++s) {
      std::array<void*, 3> set{};
      for (int b = 0; b < per_set; ++b) {
        if (auto e = cudaMalloc(&set[b], bytes); e != cudaSuccess)
          return cuda_status(e, "cudaMalloc");
        mem_.push_back(set[b]);
        if (b < inputs) {
          fill_random(host, seed * 7919 + s * 3 + static_cast<std::uint64_t>(b));
          if (auto e = cudaMemcpy(set[b], host.data(), bytes, cudaMemcpyHostToDevice);
              e != cudaSuccess)
            return cuda_status(e, "cudaMemcpy");
        }
      }
      sets_.push_back(set);
    }
    return {};
  }

  // Launches the operation on buffer set k % sets; an error message or "".
  std::string launch(std::uint64_t k) {
    const auto& s = sets_[k % sets_.size()];
    const auto n = static_cast<int>(w_.n);
    switch (w_.fam) {
      case family::sgemm: {
        const float one = 1.0f, zero = 0.0f;
        auto e = cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one,
                             static_cast<const float*>(s[0]), n, static_cast<const float*>(s[1]), n,
                             &zero, static_cast<float*>(s[2]), n);
        return e == CUBLAS_STATUS_SUCCESS ? std::string() : cublas_status(e, "cublasSgemm");
      }
      case family::fft: {
        auto e = cufftExecC2C(plan_, static_cast<cufftComplex*>(s[0]),
                              static_cast<cufftComplex*>(s[1]), CUFFT_FORWARD);
        return e == CUFFT_SUCCESS ? std::string() : cufft_status(e, "cufftExecC2C");
      }
      case family::rng: {
        auto e = curandGenerateNormal(gen_, static_cast<float*>(s[0]),
                                      static_cast<std::size_t>(w_.n), 0.0f, 1.0f);
        return e == CURAND_STATUS_SUCCESS ? std::string()
                                          : curand_status(e, "curandGenerateNormal");
      }
    }
    return "unknown workload";
  }

  std::string sync() {
    auto e = cudaStreamSynchronize(stream_);
    return e == cudaSuccess ? std::string() : cuda_status(e, "cudaStreamSynchronize");
  }

  std::size_t sets() const { return sets_.size(); }

private:
  const workload& w_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cufftHandle plan_ = 0;
  bool planned_ = false;
  curandGenerator_t gen_ = nullptr;
  std::vector<void*> mem_;
  std::vector<std::array<void*, 3>> sets_;
};

// The raw ceiling, set up once and timed in windows (see run_rounds): T
// threads, each owning a raw_lane (stream, handle, buffer sets) from start()
// to the destructor. Between windows every thread sleeps in an atomic wait on
// phase_; a window wakes them all, and each launches until the stop rule (or a
// failure) says stop, synchronises its stream and reports back through
// arrived_.
class raw_side {
public:
  raw_side(const options& o, const workload& w, unsigned threads, unsigned coroutines,
           failures& fail)
      : o_(o),
        w_(w),
        threads_(threads),
        // As many buffer sets in all as ours has coroutines (at least one per thread).
        sets_(std::max<std::size_t>(1, (coroutines + threads - 1) / threads)),
        where_(where_of(w, threads, coroutines, "raw")),
        fail_(fail) {}
  raw_side(const raw_side&) = delete;
  raw_side& operator=(const raw_side&) = delete;
  ~raw_side() {
    quit_ = true;
    phase_.fetch_add(1);
    phase_.notify_all();
    for (auto& t : pool_) t.join();  // each thread tears its lane down
  }

  // Starts the threads and waits until each has set up its lane and run its
  // warm-up round; false on a failure (recorded).
  bool start() {
    pool_.reserve(threads_);
    for (unsigned t = 0; t < threads_; ++t) pool_.emplace_back([this, t] { lane_main(t); });
    wait_arrivals();
    return !fail_.any();
  }

  // One timed window, under a stop_rule from now, up to the last thread's
  // final cudaStreamSynchronize; nullopt on a failure.
  std::optional<measured> window() {
    stop_ = false;
    total_ = 0;
    const double cpu0 = bench::process_cpu_us();
    const double t0 = bench::now_us();
    rule_ = stop_rule::from_now(o_);
    phase_.fetch_add(1);  // publishes rule_, stop_ and total_ to the threads
    phase_.notify_all();
    wait_arrivals();
    measured m;
    m.seconds = (bench::now_us() - t0) * 1e-6;
    m.cpu_us = bench::process_cpu_us() - cpu0;
    m.ops = total_.load();
    if (fail_.any()) return std::nullopt;
    return m;
  }

private:
  void failed(const std::string& what) {
    fail_.add(where_ + ": " + what);
    stop_ = true;
  }

  // Each thread adds 1 to arrived_ after setting up and after each window.
  void arrive() {
    arrived_.fetch_add(1);
    arrived_.notify_all();
  }
  void wait_arrivals() {
    expected_ += threads_;
    for (auto v = arrived_.load(); v < expected_; v = arrived_.load()) arrived_.wait(v);
  }

  void lane_main(unsigned t) {
    raw_lane lane(w_);
    if (auto e = lane.init(o_.device, sets_, 1000 + t); !e.empty()) failed(e);
    // Warm-up: --warmup launches per buffer set, then wait for them.
    for (std::uint64_t k = 0; !stop_.load() && k < o_.warmup * lane.sets(); ++k)
      if (auto e = lane.launch(k); !e.empty()) failed(e);
    if (!stop_.load())
      if (auto e = lane.sync(); !e.empty()) failed(e);
    arrive();
    for (std::uint64_t seen = 0;;) {
      phase_.wait(seen);  // idle (not spinning) between windows
      seen = phase_.load();
      if (quit_.load()) return;
      for (std::uint64_t k = 0; !stop_.load(std::memory_order_relaxed); ++k) {
        if (auto e = lane.launch(k); !e.empty()) {
          failed(e);
          break;
        }
        const auto done = total_.fetch_add(1, std::memory_order_relaxed) + 1;
        if (rule_.reached(clock_type::now(), done)) stop_.store(true, std::memory_order_relaxed);
      }
      if (auto e = lane.sync(); !e.empty()) failed(e);
      arrive();
    }
  }

  const options& o_;
  const workload& w_;
  const unsigned threads_;
  const std::size_t sets_;  // buffer sets per thread
  const std::string where_;
  failures& fail_;
  std::vector<std::thread> pool_;
  std::atomic<std::uint64_t> phase_{0};    // bumped to start a window (or to quit)
  std::atomic<bool> quit_{false};          // set before the last bump of phase_
  std::atomic<std::uint64_t> arrived_{0};  // see arrive()
  std::uint64_t expected_ = 0;             // arrived_ once the current step is done
  std::atomic<bool> stop_{false};          // ends a window (or the warm-up, on a failure)
  std::atomic<std::uint64_t> total_{0};    // operations launched in the current window
  stop_rule rule_{};                       // written before phase_ is bumped
};

// ---------------------------------------------------------------------------
// Paired rounds
//
// The shared GPU host drifts a lot from one minute to the next, so one ours
// window followed by one raw window compares two different machines. Both
// sides are therefore set up once and then timed in R rounds of two adjacent
// windows, ours then raw, and the ratio is taken per round (each pair saw
// nearly the same host) and reported as the median over the rounds; the
// per-side rates are medians too. While one side runs, the other is fully idle:
// its raw threads sleep in an atomic wait, or nobody runs its io_context.

// Per round r, ours[r] and the raw window right after it.
struct rounds_measured {
  std::vector<measured> ours, raw;
};

template <family F>
std::optional<rounds_measured> run_rounds(const options& o, const workload& w, unsigned threads,
                                          unsigned coroutines, unsigned actors, failures& fail) {
  ours_side<F> ours(o, w, threads, coroutines, actors, fail);
  if (!ours.start()) return std::nullopt;
  raw_side raw(o, w, threads, coroutines, fail);  // torn down first, on any return
  if (!raw.start()) return std::nullopt;
  rounds_measured m;
  for (unsigned r = 0; r < o.rounds; ++r) {
    const auto a = ours.window();
    if (!a) return std::nullopt;
    const auto b = raw.window();
    if (!b) return std::nullopt;
    m.ours.push_back(*a);
    m.raw.push_back(*b);
  }
  if (!ours.finish()) return std::nullopt;
  return m;
}

// The median of `v` (the mean of the middle two when the count is even).
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// f(m) for each round's measurement.
std::vector<double> per_round(const std::vector<measured>& ms, double (measured::*f)() const) {
  std::vector<double> out;
  for (const auto& m : ms) out.push_back((m.*f)());
  return out;
}

// What one (work, T, C) reports: per-round values and their medians.
struct summary {
  std::vector<double> round_ops_per_s, round_raw_ops_per_s, round_ratio;
  double ops_per_s = 0, raw_ops_per_s = 0, ratio = 0, ratio_min = 0, ratio_max = 0;
  double cpu_us_per_op = 0, raw_cpu_us_per_op = 0;
  measured ours_total, raw_total;  // ops, seconds and CPU summed over the rounds
};

measured sum(const std::vector<measured>& ms) {
  measured t;
  for (const auto& m : ms) {
    t.ops += m.ops;
    t.seconds += m.seconds;
    t.cpu_us += m.cpu_us;
    t.batches += m.batches;
    t.ops_batched += m.ops_batched;
    t.launch_sleeps += m.launch_sleeps;
    t.lanes = std::max(t.lanes, m.lanes);
  }
  return t;
}

summary summarise(const rounds_measured& m) {
  summary s;
  s.round_ops_per_s = per_round(m.ours, &measured::ops_per_s);
  s.round_raw_ops_per_s = per_round(m.raw, &measured::ops_per_s);
  // Paired: ours of round r against the raw window right after it.
  for (std::size_t r = 0; r < s.round_ops_per_s.size(); ++r)
    s.round_ratio.push_back(
        s.round_raw_ops_per_s[r] > 0 ? s.round_ops_per_s[r] / s.round_raw_ops_per_s[r] : 0.0);
  s.ops_per_s = median(s.round_ops_per_s);
  s.raw_ops_per_s = median(s.round_raw_ops_per_s);
  s.ratio = median(s.round_ratio);
  const auto [lo, hi] = std::minmax_element(s.round_ratio.begin(), s.round_ratio.end());
  s.ratio_min = lo != s.round_ratio.end() ? *lo : 0.0;
  s.ratio_max = hi != s.round_ratio.end() ? *hi : 0.0;
  s.cpu_us_per_op = median(per_round(m.ours, &measured::cpu_us_per_op));
  s.raw_cpu_us_per_op = median(per_round(m.raw, &measured::cpu_us_per_op));
  s.ours_total = sum(m.ours);
  s.raw_total = sum(m.raw);
  return s;
}

bench::json json_array(const std::vector<double>& v) {
  return bench::json::array(std::vector<bench::json>(v.begin(), v.end()));
}

// ---------------------------------------------------------------------------

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

int run(const options& o, const std::string& command) {
  bench::require_gpu(prog);
  if (int n = 0; cudaGetDeviceCount(&n) != cudaSuccess || o.device >= n) {
    std::fprintf(stderr, "%s: there is no device %d (%d devices); nothing to measure\n", prog,
                 o.device, n);
    return bench::exit_no_gpu;
  }
  const std::string device = bench::device_name(o.device);
  std::printf(
      "%s: %s; %u paired rounds (ours window, then raw window), each window at least\n"
      "%.3g s and %llu ops\n",
      prog, device.c_str(), o.rounds, o.seconds, static_cast<unsigned long long>(o.min_ops));
  std::printf("%-9s %4s %6s %6s %12s %12s %7s %10s %10s  %s\n", "work", "T", "coros", "actors",
              "ours ops/s", "raw ops/s", "ratio", "CPU us/op", "raw CPU", "ratio min..max");
  std::fflush(stdout);

  std::vector<bench::json> rows;
  failures fail;
  for (const workload* w : o.work) {
    for (unsigned threads : o.threads) {
      for (unsigned coroutines : o.coroutines) {
        const unsigned actors = o.actors ? o.actors : threads;
        std::optional<rounds_measured> m;
        switch (w->fam) {
          case family::sgemm:
            m = run_rounds<family::sgemm>(o, *w, threads, coroutines, actors, fail);
            break;
          case family::fft:
            m = run_rounds<family::fft>(o, *w, threads, coroutines, actors, fail);
            break;
          case family::rng:
            m = run_rounds<family::rng>(o, *w, threads, coroutines, actors, fail);
            break;
        }
        if (!m) {
          const auto n = fail.count();
          std::fprintf(stderr, "%s: %s\n", prog, fail.first().c_str());
          if (n > 1)
            std::fprintf(stderr, "%s: (%llu failures in all)\n", prog,
                         static_cast<unsigned long long>(n));
          return exit_failed;
        }
        const summary s = summarise(*m);
        std::printf("%-9s %4u %6u %6u %12.0f %12.0f %7.3f %10.2f %10.2f  %.3f..%.3f\n", w->name,
                    threads, coroutines, actors, s.ops_per_s, s.raw_ops_per_s, s.ratio,
                    s.cpu_us_per_op, s.raw_cpu_us_per_op, s.ratio_min, s.ratio_max);
        // How ours ran: operations per batch (one event each), the share that
        // joined a batch, and how often a launch thread ran dry and slept.
        const auto& t = s.ours_total;
        const double per_batch =
            t.batches ? static_cast<double>(t.ops_batched) / static_cast<double>(t.batches) : 0.0;
        const double batched_share =
            t.ops ? static_cast<double>(t.ops_batched) / static_cast<double>(t.ops) : 0.0;
        const double sleeps_per_kop =
            t.ops ? 1000.0 * static_cast<double>(t.launch_sleeps) / static_cast<double>(t.ops)
                  : 0.0;
        std::printf(
            "%-9s   ours: %.1f ops per batch, %.1f%% of ops batched, %.2f launch-thread "
            "sleeps per 1000 ops, %zu lanes%s\n",
            "", per_batch, 100.0 * batched_share, sleeps_per_kop, t.lanes,
            o.default_actor ? " (default actors)" : "");
        std::fflush(stdout);
        rows.push_back(bench::json::object(
            {{"work", w->name},
             {"io_threads", threads},
             {"coroutines", coroutines},
             {"actors", actors},
             {"default_actor", o.default_actor},
             {"max_lanes", static_cast<std::int64_t>(lanes_of(o))},
             {"lanes", static_cast<std::int64_t>(t.lanes)},
             {"pinned", o.pin},
             {"max_batch",
              static_cast<std::int64_t>(
                  o.max_batch > 0 ? o.max_batch
                                  : static_cast<long long>(cuda::device_options{}.max_batch))},
             {"launch_threads",
              static_cast<std::int64_t>(
                  o.launch_threads >= 0
                      ? o.launch_threads
                      : static_cast<long long>(cuda::device_options{}.launch_threads))},
             {"busy_poll_us",
              static_cast<std::int64_t>(o.busy_poll_us >= 0
                                            ? o.busy_poll_us
                                            : cuda::device_options{}.busy_poll_interval.count())},
             {"launch_spin_us",
              static_cast<std::int64_t>(o.launch_spin_us >= 0
                                            ? o.launch_spin_us
                                            : cuda::device_options{}.launch_spin.count())},
             {"ops_per_batch", per_batch},
             {"batched_share", batched_share},
             {"launch_sleeps_per_kop", sleeps_per_kop},
             {"blas_graph_cache",
              static_cast<std::int64_t>(
                  o.graph_cache >= 0
                      ? o.graph_cache
                      : static_cast<long long>(cuda::blas_options{}.cuda_graph_cache))},
             {"ops_per_s", s.ops_per_s},
             {"raw_ceiling_ops_per_s", s.raw_ops_per_s},
             {"ratio", s.ratio},
             {"cpu_us_per_op", s.cpu_us_per_op},
             {"raw_cpu_us_per_op", s.raw_cpu_us_per_op},
             {"ops", s.ours_total.ops},
             {"seconds", s.ours_total.seconds},
             {"raw_ops", s.raw_total.ops},
             {"raw_seconds", s.raw_total.seconds},
             {"rounds", o.rounds},
             {"round_ops_per_s", json_array(s.round_ops_per_s)},
             {"round_raw_ops_per_s", json_array(s.round_raw_ops_per_s)},
             {"round_ratio", json_array(s.round_ratio)}}));
      }
    }
  }
  std::printf(
      "(medians over the rounds; ratio = median over the rounds of ours / raw of the same\n"
      " round, min..max its spread; CPU us/op = process CPU time over a timed window / ops;\n"
      " raw threads each own a stream and a library handle and synchronise once at the end\n"
      " of each window)\n");
  if (!o.json.empty()) {
    const auto doc = bench::json::object({{"bench", "throughput"},
                                          {"device", device},
                                          {"date", bench::utc_now()},
                                          {"command", command},
                                          {"min_seconds", o.seconds},
                                          {"min_ops", o.min_ops},
                                          {"warmup_rounds", o.warmup},
                                          {"rounds", o.rounds},
                                          {"throughput", bench::json::array(rows)}});
    if (!bench::write_json(o.json, doc)) {
      std::fprintf(stderr, "%s: cannot write %s\n", prog, o.json.c_str());
      return exit_failed;
    }
  }
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (auto done = parse_args(argc, argv, o)) return *done;
  return run(o, command_line(argc, argv));
}
