// atomr-bench-latency: how long `co_await run_kernel(...)` takes to learn
// that GPU work finished, with each completion strategy, against raw
// cudaStreamSynchronize of the same work on the same thread (issue 5 a, d).
//
// Work: an empty stream, and cuBLAS sgemm n = 256, 1024, 4096. Every
// repetition runs each contender once, in a rotating order, so drift in
// clocks or GPU state and the effect of what ran just before hit them alike. Also measured: CPU
// time per operation, CPU use while waiting on one ~10 ms kernel, CPU use of an idle io_context
// with a device open, and (--probes) raw polling mechanisms without the library, to see what the
// floor depends on.
#include "bench.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cublas_v2.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

namespace asio = boost::asio;
namespace cuda = atomr::cuda;
using namespace std::chrono_literals;

namespace {

struct contender {
  std::string name;  // "raw", "default", "event_poll", ...
  std::optional<cuda::completion> how;
  std::vector<double> wall_us;
  double cpu_us = 0, io_cpu_us = 0;
};

struct work_spec {
  std::string name;
  int n;  // 0: empty stream; fill_bytes_work: fill_bytes of 4 bytes
  int reps;
};

struct bench_state {
  bench_state(cuda::device d, cuda::stream st) : dev(std::move(d)), s(std::move(st)) {}
  cuda::device dev;
  cuda::stream s;
  cublasHandle_t h = nullptr;
  cuda::gpu_ref<float> a, b, c;  // 4096 x 4096 each; smaller work uses the front
  cuda::gpu_ref<float> c4;       // c's first element: fill_bytes of 4 bytes
  static constexpr int fill_bytes_work = -1;

  /// Enqueues the work on the stream (no wait).
  cublasStatus_t enqueue(int n, const float* pa, const float* pb, float* pc) const {
    if (n == 0) return CUBLAS_STATUS_SUCCESS;
    if (n == fill_bytes_work)
      return cudaMemsetAsync(pc, 0, 4, s.native_handle()) == cudaSuccess
                 ? CUBLAS_STATUS_SUCCESS
                 : CUBLAS_STATUS_EXECUTION_FAILED;
    const float one = 1.0f, zero = 0.0f;
    return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, pa, n, pb, n, &zero, pc, n);
  }

  const float* raw(const cuda::gpu_ref<float>& r) const { return r.unsafe_data().value(); }
  float* raw_mut(const cuda::gpu_ref<float>& r) const { return r.unsafe_data().value(); }

  /// One library operation: run_kernel with the buffers declared as a user would.
  asio::awaitable<cuda::result<void>> lib_op(int n, cuda::completion how) {
    if (n == fill_bytes_work) {
      // The smallest operation a user awaits: the library's own transfer call.
      auto r = co_await cuda::fill_bytes(c4, 0, {.on = s, .how = how});
      if (!r) co_return r.error();
      co_return cuda::outcome::success();
    }
    if (n == 0) {
      auto r = co_await cuda::run_kernel("bench", s, how, 0, [](cuda::launch&) { return 0; });
      if (!r) co_return r.error();
      co_return cuda::outcome::success();
    }
    auto r =
        co_await cuda::run_kernel("cublas", s, how, c, [&](cuda::launch& l) -> cuda::result<int> {
          BOOST_OUTCOME_TRY(const float* pa, l.read(a));
          BOOST_OUTCOME_TRY(const float* pb, l.read(b));
          BOOST_OUTCOME_TRY(float* pc, l.write(c));
          if (auto st = enqueue(n, pa, pb, pc); st != CUBLAS_STATUS_SUCCESS)
            return cuda::classify(st, "cublasSgemm");
          return 0;
        });
    if (!r) co_return r.error();
    co_return cuda::outcome::success();
  }

  /// The floor: the same work, then cudaStreamSynchronize on this thread.
  bool raw_op(int n) const {
    if (enqueue(n, raw(a), raw(b), raw_mut(c)) != CUBLAS_STATUS_SUCCESS) return false;
    return cudaStreamSynchronize(s.native_handle()) == cudaSuccess;
  }
};

// ------------------------------------------------------------------ probes
// Polling mechanisms written directly against CUDA and Asio, no library:
// what does the time to notice completion depend on?
struct probe {
  std::string name;
  // Waits for `ev` from a coroutine on the io_context.
  std::function<asio::awaitable<void>(cudaEvent_t)> wait;
};

asio::awaitable<void> busy_for(double us) {
  const double until = bench::now_us() + us;
  while (bench::now_us() < until) {
  }
  co_return;
}

std::vector<probe> make_probes() {
  std::vector<probe> ps;
  // One co_await asio::post between checks (DEVICE.md: sits on the floor).
  ps.push_back({"post_per_check", [](cudaEvent_t ev) -> asio::awaitable<void> {
                  auto ex = co_await asio::this_coro::executor;
                  while (cudaEventQuery(ev) == cudaErrorNotReady)
                    co_await asio::post(ex, asio::use_awaitable);
                }});
  // Check, then spin the thread without yielding (blocks the io thread; a
  // reference for the query rate alone).
  ps.push_back({"spin_no_yield", [](cudaEvent_t ev) -> asio::awaitable<void> {
                  while (cudaEventQuery(ev) == cudaErrorNotReady) {
                  }
                  co_return;
                }});
  for (double gap : {1.0, 2.0, 5.0, 10.0}) {
    ps.push_back({"spin_gap_" + std::to_string(static_cast<int>(gap)) + "us",
                  [gap](cudaEvent_t ev) -> asio::awaitable<void> {
                    while (cudaEventQuery(ev) == cudaErrorNotReady) co_await busy_for(gap);
                  }});
  }
  // Re-post through the executor, checking only every `gap` us.
  for (double gap : {1.0, 3.0}) {
    ps.push_back({"post_gap_" + std::to_string(static_cast<int>(gap)) + "us",
                  [gap](cudaEvent_t ev) -> asio::awaitable<void> {
                    auto ex = co_await asio::this_coro::executor;
                    double last = 0;
                    for (;;) {
                      const double t = bench::now_us();
                      if (t - last >= gap) {
                        if (cudaEventQuery(ev) != cudaErrorNotReady) break;
                        last = t;
                      }
                      co_await asio::post(ex, asio::use_awaitable);
                    }
                  }});
  }
  // A completion callback from the CUDA driver thread, posted back.
  return ps;
}

double percent(double cpu_us, double wall_us) {
  return wall_us > 0 ? 100.0 * cpu_us / wall_us : 0.0;
}

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

int usage(const char* what) {
  std::fprintf(stderr,
               "atomr-bench-latency: %s\n"
               "usage: atomr-bench-latency [--reps N] [--reps-4096 N] [--json FILE] [--no-probes]\n"
               "                           [--long-ms MS] [--idle-s S]\n",
               what);
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  bench::args opt(argc, argv, {"no-probes", "help"});
  if (opt.has("help")) {
    std::printf(
        "atomr-bench-latency: completion latency of co_await run_kernel per strategy against\n"
        "raw cudaStreamSynchronize (empty, sgemm 256/1024/4096), CPU per op, CPU while\n"
        "waiting on a ~10 ms kernel, idle CPU, and raw polling probes.\n"
        "  --reps N       repetitions for empty/256/1024 (default 2000)\n"
        "  --reps-4096 N  repetitions for sgemm 4096 (default 200)\n"
        "  --long-ms MS   the long kernel's length (default 10)\n"
        "  --idle-s S     how long to watch the idle io_context (default 2)\n"
        "  --no-probes    skip the raw polling probes\n"
        "  --json FILE    write all results as JSON\n");
    return 0;
  }
  if (!opt.unknown.empty()) return usage(("unknown argument " + opt.unknown.front()).c_str());
  const long reps = opt.num("reps", 2000), reps_big = opt.num("reps-4096", 200);
  const long long_ms = opt.num("long-ms", 10), idle_s = opt.num("idle-s", 2);
  if (reps < 10 || reps > 1000000 || reps_big < 5 || reps_big > 100000)
    return usage("--reps must be 10..1000000 and --reps-4096 5..100000");
  if (long_ms < 1 || long_ms > 10000 || idle_s < 1 || idle_s > 600)
    return usage("--long-ms must be 1..10000 and --idle-s 1..600");
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  bench::require_gpu("atomr-bench-latency");

  asio::io_context ioc(1);
  auto dev = cuda::device::open(ioc.get_executor(), 0);
  if (!dev) {
    std::fprintf(stderr, "atomr-bench-latency: %s\n", dev.error().message().c_str());
    return dev.error() == cuda::errc::device_unavailable ? bench::exit_no_gpu : 1;
  }
  constexpr int big = 4096;
  auto st = std::make_shared<bench_state>(
      dev.value(), dev.value().acquire_stream(cuda::stream_policy::per_actor_fresh).value());
  st->a = st->dev.allocate<float>(std::size_t{big} * big, st->s).value();
  st->b = st->dev.allocate<float>(std::size_t{big} * big, st->s).value();
  st->c = st->dev.allocate<float>(std::size_t{big} * big, st->s).value();
  st->c4 = st->c.subspan(0, 1).value();
  {
    std::vector<float> host(std::size_t{big} * big);
    for (std::size_t i = 0; i < host.size(); ++i)
      host[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    cudaMemcpy(st->raw_mut(st->a), host.data(), host.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(st->raw_mut(st->b), host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  }
  if (cublasCreate(&st->h) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "atomr-bench-latency: cublasCreate failed\n");
    return 1;
  }
  cublasSetStream(st->h, st->s.native_handle());
  cublasSetMathMode(st->h, CUBLAS_PEDANTIC_MATH);

  const std::vector<work_spec> works = {
      {"empty", 0, static_cast<int>(reps)},
      {"fill4", bench_state::fill_bytes_work, static_cast<int>(reps)},
      {"sgemm256", 256, static_cast<int>(reps)},
      {"sgemm1024", 1024, static_cast<int>(reps)},
      {"sgemm4096", big, static_cast<int>(reps_big)}};
  std::vector<bench::json> latency_rows, probe_rows, long_rows;
  double idle_pct = 0, long_default_pct = 0;
  int failures = 0;

  auto body = [&]() -> asio::awaitable<void> {
    const cuda::completion def = st->dev.options().default_completion;
    std::printf("default strategy: %s (spin %lld us, max_backoff %lld us)\n",
                std::string(cuda::to_string(def.kind)).c_str(),
                static_cast<long long>(def.spin.count() / 1000),
                static_cast<long long>(def.max_backoff.count() / 1000));
    std::printf("\n%-10s %-14s %10s %10s %10s %10s %11s %11s %8s\n", "work", "strategy",
                "median us", "p99 us", "raw med", "overhead", "cpu us/op", "io cpu/op", "paired");
    for (const auto& w : works) {
      std::vector<contender> cs;
      cs.push_back({"raw", std::nullopt, {}});
      cs.push_back({"default", def, {}});
      cs.push_back({"event_poll", cuda::event_poll{}, {}});
      cs.push_back({"host_fn", cuda::host_fn{}, {}});
      cs.push_back({"blocking_sync", cuda::blocking_sync{}, {}});
      for (int warm = 0; warm < 20; ++warm)
        for (auto& c : cs)
          if (c.how)
            (void)co_await st->lib_op(w.n, *c.how);
          else
            (void)st->raw_op(w.n);
      for (int r = 0; r < w.reps; ++r) {
        // Each repetition starts with the next contender, so none always
        // follows the raw synchronisation (or any other one).
        for (std::size_t k = 0; k < cs.size(); ++k) {
          auto& c = cs[(k + static_cast<std::size_t>(r)) % cs.size()];
          const double c0 = bench::process_cpu_us(), i0 = bench::thread_cpu_us();
          const double t0 = bench::now_us();
          bool ok = true;
          if (c.how)
            ok = static_cast<bool>(co_await st->lib_op(w.n, *c.how));
          else
            ok = st->raw_op(w.n);
          const double t1 = bench::now_us();
          c.wall_us.push_back(t1 - t0);
          c.cpu_us += bench::process_cpu_us() - c0;
          c.io_cpu_us += bench::thread_cpu_us() - i0;
          if (!ok) ++failures;
        }
      }
      const auto raw = bench::summarize(cs[0].wall_us);
      for (auto& c : cs) {
        const auto s = bench::summarize(c.wall_us);
        // Also the median of the per-repetition differences (this contender
        // against the raw run of the same repetition, a few tens of us apart):
        // less sensitive to the host drifting during the run than the
        // difference of the two medians, which is the reported overhead.
        std::vector<double> diff(c.wall_us.size());
        for (std::size_t r = 0; r < diff.size(); ++r) diff[r] = c.wall_us[r] - cs[0].wall_us[r];
        const double paired = bench::summarize(std::move(diff)).median;
        const double per = static_cast<double>(w.reps);
        std::printf("%-10s %-14s %10.2f %10.2f %10.2f %10.2f %11.2f %11.2f %8.2f\n", w.name.c_str(),
                    c.name.c_str(), s.median, s.p99, raw.median, s.median - raw.median,
                    c.cpu_us / per, c.io_cpu_us / per, paired);
        latency_rows.push_back(bench::json::object({{"work", w.name},
                                                    {"strategy", c.name},
                                                    {"median_us", s.median},
                                                    {"p99_us", s.p99},
                                                    {"mean_us", s.mean},
                                                    {"raw_median_us", raw.median},
                                                    {"raw_p99_us", raw.p99},
                                                    {"overhead_us", s.median - raw.median},
                                                    {"paired_overhead_us", paired},
                                                    {"cpu_us_per_op", c.cpu_us / per},
                                                    {"io_thread_cpu_us_per_op", c.io_cpu_us / per},
                                                    {"reps", w.reps}}));
      }
    }

    if (!opt.has("no-probes")) {
      std::printf("\nprobes (no library): record an event after the work, then wait for it\n");
      std::printf("%-10s %-16s %10s %10s %10s\n", "work", "mechanism", "median us", "p99 us",
                  "raw med");
      cudaEvent_t ev{};
      cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      auto probes = make_probes();
      for (const auto& w : works) {
        if (w.n == big) continue;
        std::vector<std::vector<double>> times(probes.size() + 1);
        const int preps = std::min(w.reps, 1000);
        for (int r = 0; r < preps; ++r) {
          const double t0 = bench::now_us();
          (void)st->raw_op(w.n);
          times[0].push_back(bench::now_us() - t0);
          for (std::size_t p = 0; p < probes.size(); ++p) {
            const double p0 = bench::now_us();
            st->enqueue(w.n, st->raw(st->a), st->raw(st->b), st->raw_mut(st->c));
            cudaEventRecord(ev, st->s.native_handle());
            co_await probes[p].wait(ev);
            times[p + 1].push_back(bench::now_us() - p0);
          }
        }
        const auto raw = bench::summarize(times[0]);
        for (std::size_t p = 0; p < probes.size(); ++p) {
          const auto s = bench::summarize(times[p + 1]);
          std::printf("%-10s %-16s %10.2f %10.2f %10.2f\n", w.name.c_str(), probes[p].name.c_str(),
                      s.median, s.p99, raw.median);
          probe_rows.push_back(bench::json::object({{"work", w.name},
                                                    {"mechanism", probes[p].name},
                                                    {"median_us", s.median},
                                                    {"p99_us", s.p99},
                                                    {"raw_median_us", raw.median},
                                                    {"reps", preps}}));
        }
      }
      cudaEventDestroy(ev);
    }

    // CPU use while waiting on one long kernel: sgemm 4096 repeated to ~long_ms.
    {
      double one_ms = 0;
      {
        std::vector<double> t;
        for (int i = 0; i < 5; ++i) {
          const double t0 = bench::now_us();
          (void)st->raw_op(big);
          t.push_back(bench::now_us() - t0);
        }
        one_ms = bench::summarize(t).median / 1000.0;
      }
      const int repeat =
          std::max(1, static_cast<int>(std::lround(static_cast<double>(long_ms) / one_ms)));
      std::printf("\nCPU while waiting on sgemm 4096 x %d (~%.1f ms), process CPU / wall:\n",
                  repeat, repeat * one_ms);
      std::vector<std::pair<std::string, cuda::completion>> strategies = {
          {"default", def},
          {"event_poll", cuda::event_poll{}},
          {"host_fn", cuda::host_fn{}},
          {"blocking_sync", cuda::blocking_sync{}}};
      for (const auto& [name, how] : strategies) {
        double cpu = 0, wall = 0;
        for (int r = 0; r < 20; ++r) {
          const double c0 = bench::process_cpu_us(), t0 = bench::now_us();
          auto res = co_await cuda::run_kernel(
              "cublas", st->s, how, 0, [&](cuda::launch&) -> cuda::result<int> {
                for (int i = 0; i < repeat; ++i)
                  if (auto e = st->enqueue(big, st->raw(st->a), st->raw(st->b), st->raw_mut(st->c));
                      e != CUBLAS_STATUS_SUCCESS)
                    return cuda::classify(e, "cublasSgemm");
                return 0;
              });
          wall += bench::now_us() - t0;
          cpu += bench::process_cpu_us() - c0;
          if (!res) ++failures;
        }
        const double pct = percent(cpu, wall);
        if (name == "default") long_default_pct = pct;
        std::printf("  %-14s %6.1f %% of one core (wait %.2f ms)\n", name.c_str(), pct,
                    wall / 20000);
        long_rows.push_back(bench::json::object(
            {{"strategy", name}, {"kernel_ms", wall / 20000}, {"cpu_percent", pct}}));
      }
    }
    co_return;
  };

  bool finished = false;
  asio::co_spawn(ioc, body(), [&](std::exception_ptr e) {
    finished = true;
    if (e) std::rethrow_exception(e);
  });
  ioc.run();
  if (!finished) return 1;

  // Idle: the device open, a work guard, nothing pending.
  {
    auto guard = asio::make_work_guard(ioc);
    ioc.restart();
    const double c0 = bench::process_cpu_us(), t0 = bench::now_us();
    ioc.run_for(std::chrono::seconds(idle_s));
    idle_pct = percent(bench::process_cpu_us() - c0, bench::now_us() - t0);
    std::printf("\nidle io_context with the device open: %.2f %% of one core over %ld s\n",
                idle_pct, idle_s);
  }
  cublasDestroy(st->h);

  const auto doc = bench::json::object({{"bench", "latency"},
                                        {"device", bench::device_name()},
                                        {"date", bench::utc_now()},
                                        {"command", command},
                                        {"latency", bench::json::array(latency_rows)},
                                        {"probes", bench::json::array(probe_rows)},
                                        {"long_wait", bench::json::array(long_rows)},
                                        {"long_wait_cpu_percent", long_default_pct},
                                        {"idle_cpu_percent", idle_pct},
                                        {"failures", failures}});
  if (!bench::write_json(opt.get("json"), doc)) {
    std::fprintf(stderr, "atomr-bench-latency: cannot write %s\n", opt.get("json").c_str());
    return 1;
  }
  if (failures) std::fprintf(stderr, "atomr-bench-latency: %d operations failed\n", failures);
  return failures ? 1 : 0;
}
