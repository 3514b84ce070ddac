// atomr-bench-isolation (issue 20): the isolated device (the CUDA context in
// the supervised worker process) against the in-process device, in one run:
// latency (fill_bytes of 4 bytes, sgemm 256, sgemm 1024), throughput (sgemm
// 64 and 256, T = 1 and 8 io threads, one actor), a request pipeline
// (pageable upload, gemm, pageable download), 256 MiB upload and download
// bandwidth (and 16 MiB, one piece of the isolated path), and recovery (an
// injected illegal-address fault to the first successful gemm, median of
// 10). --json FILE writes the rows.
#include "bench.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace atomr::cuda;

namespace {

const char* prog = "atomr-bench-isolation";

struct options {
  int reps = 1000;
  double seconds = 2.0;
  int device = 0;
  std::size_t rings = 0;    // 0: isolation_options' default
  long reply_spin_us = -1;  // -1: isolation_options' default
  std::string worker_arg;   // more arguments for the worker, separated by spaces
  std::string json;
  std::vector<std::string> parts{"latency", "throughput", "pipeline", "bandwidth", "recovery"};
  std::vector<int> threads{1, 8};  // the throughput part's io thread counts
};

using bench::run_one;

/// One device (in process or isolated) with an actor and gemm buffers.
struct side {
  std::string name;
  device dev;
  std::optional<blas_actor> blas;
};

result<side> make_side(asio::io_context& ioc, int ordinal, bool isolated, const options& bo) {
  device_options o;
  if (isolated) {
    o.isolation.enabled = true;
    if (bo.rings != 0) o.isolation.rings = bo.rings;
    if (bo.reply_spin_us >= 0) o.isolation.reply_spin = std::chrono::microseconds(bo.reply_spin_us);
    o.isolation.worker_args = {"--test-faults"};  // the recovery part injects faults
    std::istringstream more(bo.worker_arg);
    for (std::string w; more >> w;) o.isolation.worker_args.push_back(w);
    o.isolation.budget.max_restarts = 20;
  }
  side s;
  s.name = isolated ? "isolated" : "in_process";
  s.dev = device(ioc.get_executor(), ordinal, o);
  // An isolated device starts asynchronously: wait for its worker.
  for (int i = 0; i < 3000 && s.dev.health() == health_state::starting; ++i) {
    ioc.restart();
    ioc.run_for(std::chrono::milliseconds(10));
  }
  if (auto ok = s.dev.status(); !ok) return ok.error();
  BOOST_OUTCOME_TRY(auto b, blas_actor::create(s.dev));
  s.blas = b;
  return s;
}

struct gemm_bufs {
  gpu_ref<float> a, b, c;
};

result<gemm_bufs> gemm_buffers(asio::io_context& ioc, side& s, int n) {
  const std::size_t e = static_cast<std::size_t>(n) * n;
  gemm_bufs g;
  BOOST_OUTCOME_TRY(g.a, s.dev.allocate<float>(e));
  BOOST_OUTCOME_TRY(g.b, s.dev.allocate<float>(e));
  BOOST_OUTCOME_TRY(g.c, s.dev.allocate<float>(e));
  std::vector<float> host(e, 0.5f);
  BOOST_OUTCOME_TRY(run_one(ioc, upload(host, g.a)));
  BOOST_OUTCOME_TRY(run_one(ioc, upload(host, g.b)));
  return g;
}

gemm_params square(int n) {
  gemm_params p;
  p.m = p.n = p.k = n;
  return p;
}

// ------------------------------------------------------------------ latency

/// Median and p99 of `reps` awaits of `op`, one at a time from one coroutine.
bench::stats latency(asio::io_context& ioc, int reps,
                     const std::function<asio::awaitable<bool>()>& op) {
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  run_one(ioc, [&]() -> asio::awaitable<bool> {
    for (int i = 0; i < 20; ++i) co_await op();  // warm-up
    for (int i = 0; i < reps; ++i) {
      const double t0 = bench::now_us();
      if (!co_await op()) co_return false;
      t.push_back(bench::now_us() - t0);
    }
    co_return true;
  }());
  return bench::summarize(std::move(t));
}

// ------------------------------------------------------------------ measuring

/// Runs `ioc` on `threads` threads: 0.3 s of warm-up, then `counting` is
/// true for `seconds`; then `stop` is set, and once `left` (the coroutines
/// still running) is 0 the io_context is stopped (an isolated device's
/// heartbeats would keep it busy for ever). Returns the counted seconds.
double measure(asio::io_context& ioc, int threads, double seconds, std::atomic<bool>& counting,
               std::atomic<bool>& stop, const std::atomic<int>& left) {
  ioc.restart();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back([&] { ioc.run(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  counting = true;
  const double t0 = bench::now_us();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  counting = false;
  const double t1 = bench::now_us();
  stop = true;
  while (left.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ioc.stop();
  for (auto& t : pool) t.join();
  return (t1 - t0) / 1e6;
}

// ------------------------------------------------------------------ throughput

/// gemm n x n ops per second on `threads` io threads, 16 coroutines each,
/// every coroutine with buffers of its own, one actor.
double throughput(asio::io_context& ioc, side& s, int n, int threads, double seconds) {
  const int coroutines = 16 * threads;
  std::vector<gemm_bufs> bufs;
  for (int i = 0; i < coroutines; ++i) {
    auto g = gemm_buffers(ioc, s, n);
    if (!g) return 0;
    bufs.push_back(g.value());
  }
  std::atomic<long> ops{0};
  std::atomic<bool> counting{false}, stop{false};
  std::atomic<int> left{coroutines};
  const auto p = square(n);
  for (int i = 0; i < coroutines; ++i)
    asio::co_spawn(
        ioc,
        [&, i]() -> asio::awaitable<void> {
          while (!stop.load(std::memory_order_relaxed)) {
            auto r = co_await s.blas->gemm(p, bufs[i].a, bufs[i].b, bufs[i].c);
            if (!r) break;
            if (counting.load(std::memory_order_relaxed)) ops.fetch_add(1);
          }
          --left;
        },
        asio::detached);
  const double window = measure(ioc, threads, seconds, counting, stop, left);
  return static_cast<double>(ops.load()) / window;
}

// ------------------------------------------------------------------ pipeline

struct pipe_result {
  double req_per_s = 0;
  bench::stats lat;
  long wrong = 0;
};

/// One request: pageable upload of 256 x 256 f32, gemm with resident
/// weights, pageable download, one element checked; `in_flight` requests on
/// 4 io threads. `composed`: the three as one compose() unit (one request to
/// an isolated worker), else three awaits.
pipe_result pipeline(asio::io_context& ioc, side& s, int in_flight, double seconds, bool composed) {
  constexpr int n = 256;
  constexpr std::size_t e = std::size_t{n} * n;
  auto w = gemm_buffers(ioc, s, n);
  if (!w) return {};
  struct slot {
    gpu_ref<float> x, y;
    std::vector<float> hx, hy;
  };
  std::vector<slot> slots(static_cast<std::size_t>(in_flight));
  for (auto& sl : slots) {
    sl.x = s.dev.allocate<float>(e).value();
    sl.y = s.dev.allocate<float>(e).value();
    sl.hx.assign(e, 1.0f);
    sl.hy.assign(e, 0.0f);
  }
  std::atomic<bool> counting{false}, stop{false};
  std::atomic<long> reqs{0}, wrong{0};
  std::atomic<int> left{in_flight};
  std::vector<std::vector<double>> lat(slots.size());
  const auto p = square(n);
  for (std::size_t i = 0; i < slots.size(); ++i)
    asio::co_spawn(
        ioc,
        [&, i]() -> asio::awaitable<void> {
          auto& sl = slots[i];
          while (!stop.load(std::memory_order_relaxed)) {
            const double t0 = bench::now_us();
            bool ok = false;
            if (composed) {
              ok = static_cast<bool>(co_await compose(s.dev, upload(sl.hx, sl.x),
                                                      s.blas->gemm(p, sl.x, w.value().b, sl.y),
                                                      download(sl.y, std::span<float>(sl.hy))));
            } else {
              ok = static_cast<bool>(co_await upload(sl.hx, sl.x));
              ok = ok && co_await s.blas->gemm(p, sl.x, w.value().b, sl.y);
              ok = ok && co_await download(sl.y, sl.hy);
            }
            // Every element of y is 256 * 1.0 * 0.5.
            if (!ok || sl.hy[e / 2] != 128.0f) ++wrong;
            if (counting.load(std::memory_order_relaxed)) {
              ++reqs;
              lat[i].push_back(bench::now_us() - t0);
            }
          }
          --left;
        },
        asio::detached);
  const double window = measure(ioc, 4, seconds, counting, stop, left);
  pipe_result r;
  r.req_per_s = static_cast<double>(reqs.load()) / window;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  r.lat = bench::summarize(std::move(all));
  r.wrong = wrong.load();
  return r;
}

// ------------------------------------------------------------------ bandwidth

/// GB/s of `bytes`-byte pageable uploads (or downloads), median of 5. For
/// an upload, also prints how the time splits between the call (the checks
/// and the copy into staging memory, made before it returns) and the await.
double bandwidth(asio::io_context& ioc, side& s, bool up, std::size_t bytes) {
  std::vector<std::uint8_t> host(bytes, 3);
  auto g = s.dev.allocate<std::uint8_t>(bytes);
  if (!g) return 0;
  std::vector<double> gbs, call_ms, await_ms;
  for (int i = 0; i < 6; ++i) {
    const double t0 = bench::now_us();
    bool ok = false;
    double t_call = t0;
    if (up) {
      auto op = upload(host, g.value());
      t_call = bench::now_us();
      ok = static_cast<bool>(run_one(ioc, std::move(op)));
    } else {
      ok = static_cast<bool>(run_one(ioc, download(g.value(), host)));
    }
    const double t1 = bench::now_us();
    if (!ok) return 0;
    if (i == 0) continue;
    gbs.push_back(static_cast<double>(bytes) / ((t1 - t0) * 1e3));
    call_ms.push_back((t_call - t0) / 1e3);
    await_ms.push_back((t1 - t_call) / 1e3);
  }
  if (up)
    std::printf("  upload %zu MiB, %s: the call %.2f ms, the await %.2f ms (medians)\n",
                bytes >> 20, s.name.c_str(), bench::summarize(call_ms).median,
                bench::summarize(await_ms).median);
  return bench::summarize(gbs).median;
}

// ------------------------------------------------------------------ recovery

/// Seconds from an injected illegal-address fault to the first correct gemm
/// 256 on the restarted worker, `times` times.
bench::stats recovery(asio::io_context& ioc, side& s, int times) {
  std::vector<double> secs;
  for (int i = 0; i < times; ++i) {
    const double t0 = bench::now_us();
    auto f = run_one(ioc, detail::inject_isolated_fault(s.dev.impl(), 4));  // illegal address
    if (f) break;  // no fault: nothing to measure
    bool ok = false;
    for (int tries = 0; tries < 5000 && !ok; ++tries) {
      if (!s.dev.accepting()) {
        ioc.restart();
        ioc.run_for(std::chrono::microseconds(200));
        continue;
      }
      auto g = gemm_buffers(ioc, s, 256);
      if (!g) continue;
      auto r = run_one(ioc, s.blas->gemm(square(256), g.value().a, g.value().b, g.value().c));
      std::vector<float> c(256 * 256);
      ok = r && run_one(ioc, download(g.value().c, c)) && c[1000] == 64.0f;
    }
    if (!ok) break;
    secs.push_back((bench::now_us() - t0) / 1e6);
  }
  return bench::summarize(std::move(secs));
}

int usage(const char* why) {
  if (why) std::fprintf(stderr, "%s: %s\n", prog, why);
  std::fprintf(why ? stderr : stdout,
               "usage: %s [--reps N] [--seconds S] [--parts LIST] [--device D] [--rings N]\n"
               "       [--reply-spin US] [--worker-arg ARG] [--io-threads LIST] [--json FILE]\n"
               "The isolated device against the in-process one in the same run. Parts:\n"
               "latency, throughput, pipeline, bandwidth, recovery (default: all). --rings: the\n"
               "isolated device's request rings, --reply-spin: its reply_spin in us (default:\n"
               "isolation_options'); --worker-arg: more arguments for the worker, separated by\n"
               "spaces (e.g. \"--ring-io-poll --threads 1\"); --io-threads: the throughput\n"
               "part's io thread counts (default 1,8).\n",
               prog);
  return why ? 64 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::args a(argc, argv, {"help"});
  if (a.has("help")) return usage(nullptr);
  if (!a.unknown.empty()) return usage(("unknown argument " + a.unknown.front()).c_str());
  options o;
  for (const auto& [k, v] : a.kv)
    if (k != "reps" && k != "seconds" && k != "device" && k != "json" && k != "parts" &&
        k != "rings" && k != "reply-spin" && k != "worker-arg" && k != "io-threads")
      return usage(("unknown option --" + k).c_str());
  o.reps = static_cast<int>(a.num("reps", o.reps));
  o.device = static_cast<int>(a.num("device", o.device));
  o.json = a.get("json");
  o.rings = static_cast<std::size_t>(a.num("rings", 0));
  o.reply_spin_us = a.num("reply-spin", -1);
  o.worker_arg = a.get("worker-arg");
  if (a.has("seconds")) o.seconds = std::strtod(a.get("seconds").c_str(), nullptr);
  if (a.has("parts")) o.parts = bench::split_list(a.get("parts"));
  if (a.has("io-threads")) {
    o.threads.clear();
    for (const auto& t : bench::split_list(a.get("io-threads"))) {
      const int v = std::atoi(t.c_str());
      if (v < 1 || v > 64) return usage("--io-threads wants a list of 1..64, e.g. 1,8");
      o.threads.push_back(v);
    }
  }
  if (o.reps < 10 || o.reps > 1000000) return usage("--reps wants 10..1000000");
  if (!(o.seconds > 0 && o.seconds <= 60)) return usage("--seconds wants (0, 60]");
  if (o.rings > 16) return usage("--rings wants 1..16");
  if (o.reply_spin_us < -1 || o.reply_spin_us > 10000) return usage("--reply-spin wants 0..10000");
  auto want = [&](const char* part) {
    return std::find(o.parts.begin(), o.parts.end(), part) != o.parts.end();
  };
  bench::require_gpu(prog);

  asio::io_context ioc;
  auto inproc = make_side(ioc, o.device, false, o);
  auto iso = make_side(ioc, o.device, true, o);
  if (!inproc || !iso) {
    std::fprintf(stderr, "%s: %s\n", prog,
                 (!inproc ? inproc.error() : iso.error()).message().c_str());
    return bench::exit_no_gpu;
  }
  side* sides[2] = {&inproc.value(), &iso.value()};
  std::vector<bench::json> rows;
  auto row = [&](const char* metric, const std::string& work, double in, double is,
                 const char* unit, bench::json extra = {}) {
    std::printf("%-10s %-22s in_process %12.2f  isolated %12.2f  %s\n", metric, work.c_str(), in,
                is, unit);
    std::fflush(stdout);
    rows.push_back(bench::json::object({{"metric", metric},
                                        {"work", work},
                                        {"in_process", in},
                                        {"isolated", is},
                                        {"unit", unit},
                                        {"ratio", in != 0 ? is / in : 0.0},
                                        {"difference", is - in},
                                        {"extra", std::move(extra)}}));
  };

  if (want("latency")) {
    for (int n : {0, 256, 1024}) {
      double med[2], p99[2];
      for (int k = 0; k < 2; ++k) {
        side& s = *sides[k];
        auto tiny = s.dev.allocate<float>(1).value();
        auto g = gemm_buffers(ioc, s, n ? n : 8).value();
        const auto p = square(n);
        const int reps = n == 1024 ? std::max(10, o.reps / 5) : o.reps;
        auto st = latency(ioc, reps, [&]() -> asio::awaitable<bool> {
          if (n == 0) co_return static_cast<bool>(co_await fill_bytes(tiny, 0));
          co_return static_cast<bool>(co_await s.blas->gemm(p, g.a, g.b, g.c));
        });
        med[k] = st.median;
        p99[k] = st.p99;
      }
      const std::string work = n == 0 ? "fill4" : "sgemm" + std::to_string(n);
      row("latency", work, med[0], med[1], "us median",
          bench::json::object({{"in_process_p99", p99[0]}, {"isolated_p99", p99[1]}}));
    }
  }
  if (want("throughput")) {
    for (int n : {64, 256})
      for (int t : o.threads) {
        const double in = throughput(ioc, *sides[0], n, t, o.seconds);
        const double is = throughput(ioc, *sides[1], n, t, o.seconds);
        row("throughput", "sgemm" + std::to_string(n) + " T=" + std::to_string(t), in, is, "ops/s");
      }
  }
  if (want("pipeline")) {
    for (bool composed : {false, true})
      for (int f : {4, 16}) {
        const auto in = pipeline(ioc, *sides[0], f, o.seconds, composed);
        const auto is = pipeline(ioc, *sides[1], f, o.seconds, composed);
        row("pipeline",
            std::string(composed ? "compose(upload, gemm256, download)"
                                 : "upload+gemm256+download") +
                " in_flight=" + std::to_string(f),
            in.req_per_s, is.req_per_s, "req/s",
            bench::json::object({{"in_process_p50_us", in.lat.median},
                                 {"isolated_p50_us", is.lat.median},
                                 {"wrong", in.wrong + is.wrong}}));
      }
  }
  if (want("bandwidth")) {
    for (bool up : {true, false}) {
      const double in = bandwidth(ioc, *sides[0], up, std::size_t{256} << 20);
      const double is = bandwidth(ioc, *sides[1], up, std::size_t{256} << 20);
      row("bandwidth", up ? "upload 256 MiB" : "download 256 MiB", in, is, "GB/s");
    }
    // One piece of the isolated path (16 MiB with the default arena): against
    // the 256 MiB rows, whether the pieces' round trips or the copies bound it.
    for (bool up : {true, false}) {
      const double in = bandwidth(ioc, *sides[0], up, std::size_t{16} << 20);
      const double is = bandwidth(ioc, *sides[1], up, std::size_t{16} << 20);
      row("bandwidth_piece", up ? "upload 16 MiB" : "download 16 MiB", in, is, "GB/s");
    }
  }
  if (want("recovery")) {
    const auto r = recovery(ioc, *sides[1], 10);
    row("recovery", "illegal address to first gemm", 0, r.median, "s median",
        bench::json::object({{"n", r.n}, {"max_s", r.max}}));
  }
  const auto doc = bench::json::object({{"device", bench::device_name(o.device)},
                                        {"date", bench::utc_now()},
                                        {"isolation", bench::json::array(rows)}});
  if (!bench::write_json(o.json, doc)) {
    std::fprintf(stderr, "%s: cannot write %s\n", prog, o.json.c_str());
    return 1;
  }
  return 0;
}
