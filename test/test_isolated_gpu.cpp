// The isolated device on the GPU (issue 20): numbers against a double
// precision reference, every fault kind with 100 operations in flight, the
// restart budget, 2000 random operations with faults, a worker killed while
// idle, timeouts, and a clean exit in every worker state. Its own process
// (and main): the last check is that this process never initialised CUDA.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_fixture.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>

#include "../lib/worker/protocol.hpp"

#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;
namespace wire = atomr::cuda::detail::wire;

namespace {

/// True when the CUDA driver library is mapped into this process.
bool cuda_loaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcuda.so") != std::string::npos) return true;
  return false;
}

/// The NVIDIA device files this process holds open: cuInit opens
/// /dev/nvidiactl and a context opens /dev/nvidia<N>, so none means CUDA was
/// never initialised here.
std::vector<std::string> nvidia_fds() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().rfind("/dev/nvidia", 0) == 0) out.push_back(target.string());
  }
  return out;
}

constexpr int n = 64;  // gemm size of the stress operations

struct iso : io_fixture {
  device dev;

  static device_options options() {
    device_options o;
    o.isolation.enabled = true;
    o.isolation.worker_args = {"--test-faults"};
    o.isolation.arena_bytes = std::size_t{32} << 20;
    o.isolation.hang_margin = 1000ms;
    o.isolation.max_op_time = 2000ms;
    o.isolation.heartbeat = 50ms;
    o.isolation.heartbeat_timeout = 1000ms;
    o.isolation.budget.max_restarts = 3;
    return o;
  }

  void open(device_options o = options()) {
    dev = device(ioc.get_executor(), 0, o);
    REQUIRE(dev.isolated());
    REQUIRE_MESSAGE(wait_health(health_state::healthy, 30s), to_string(dev.health()));
  }

  /// The io_context on the test thread until `done()` (2 ms slices, 30 s).
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
    return io_fixture::run_until(done, limit, 2ms);
  }
  /// Drops the device and runs what its last handlers hold, so that the next
  /// open() makes a new state (an isolated ordinal's live state would be
  /// handed out again, with its first opener's options).
  void drop() {
    dev = device{};
    ioc.restart();
    ioc.run_for(100ms);
  }
  bool wait_health(health_state h, std::chrono::milliseconds limit = 30s) {
    return run_until([&] { return dev.health() == h; }, limit);
  }

  /// Runs the io_context on `threads` threads until `left` is 0 (or 120 s).
  bool run_threads(std::atomic<int>& left, int threads = 4) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        while (!stop.load()) {
          ioc.restart();
          ioc.run_for(5ms);
        }
      });
    const auto end = std::chrono::steady_clock::now() + 120s;
    while (left.load() > 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
    stop = true;
    for (auto& t : pool) t.join();
    return left.load() == 0;
  }
};

/// One checked request: upload A (random, seeded), C = A * B, download C and
/// compare with the double-precision reference. 1: correct, 0: an error
/// (the code is counted), -1: wrong numbers (never allowed).
asio::awaitable<int> checked_gemm(device dev, blas_actor blas, const std::vector<float>& b,
                                  std::uint64_t seed, std::map<errc, int>& errors, std::mutex& mu) {
  auto fail = [&](const gpu_error& e) {
    std::lock_guard lk(mu);
    ++errors[e.code()];
    return 0;
  };
  const auto a = random_floats(n * n, seed);
  auto ga = dev.allocate<float>(n * n);
  auto gb = dev.allocate<float>(n * n);
  auto gc = dev.allocate<float>(n * n);
  if (!ga) co_return fail(ga.error());
  if (!gb) co_return fail(gb.error());
  if (!gc) co_return fail(gc.error());
  if (auto r = co_await upload(a, ga.value()); !r) co_return fail(r.error());
  if (auto r = co_await upload(b, gb.value()); !r) co_return fail(r.error());
  gemm_params p;
  p.m = p.n = p.k = n;
  if (auto r = co_await blas.gemm(p, ga.value(), gb.value(), gc.value()); !r)
    co_return fail(r.error());
  std::vector<float> c(n * n, std::nanf(""));
  if (auto r = co_await download(gc.value(), std::span<float>(c)); !r) co_return fail(r.error());
  co_return gemm_rel_error(a, b, c, n) < 1e-5 ? 1 : -1;
}

}  // namespace

TEST_CASE_FIXTURE(iso,
                  "isolated: upload, gemm (f32, f64) and download match a double-precision "
                  "reference; copy, fill_bytes, and transfers larger than the arena") {
  auto o = options();
  o.isolation.arena_bytes = std::size_t{8} << 20;  // 2 MiB pieces
  open(o);
  auto blas = blas_actor::create(dev).value();
  const int m = 256;
  const auto a = random_floats(m * m, 1), b = random_floats(m * m, 2);
  auto ga = dev.allocate<float>(m * m).value();
  auto gb = dev.allocate<float>(m * m).value();
  auto gc = dev.allocate<float>(m * m).value();
  REQUIRE(run(upload(a, ga)));
  REQUIRE(run(upload(b, gb)));
  gemm_params p;
  p.m = p.n = p.k = m;
  auto g = run(blas.gemm(p, ga, gb, gc));
  REQUIRE_MESSAGE(g, (g ? "" : g.error().message()));
  std::vector<float> c(m * m);
  REQUIRE(run(download(gc, std::span<float>(c))));
  CHECK(gemm_rel_error(a, b, c, m) < 1e-5);

  // f64: exact to rounding.
  const int k = 48;
  std::vector<double> da(k * k), db(k * k), dc(k * k);
  for (int i = 0; i < k * k; ++i) {
    da[i] = std::sin(0.1 * i);
    db[i] = std::cos(0.07 * i);
  }
  auto xa = dev.allocate<double>(k * k).value();
  auto xb = dev.allocate<double>(k * k).value();
  auto xc = dev.allocate<double>(k * k).value();
  REQUIRE(run(upload(da, xa)));
  REQUIRE(run(upload(db, xb)));
  p.m = p.n = p.k = k;
  REQUIRE(run(blas.gemm(p, xa, xb, xc)));
  REQUIRE(run(download(xc, std::span<double>(dc))));
  double worst = 0;
  for (int col = 0; col < k; ++col)
    for (int row = 0; row < k; ++row) {
      double ref = 0;
      for (int i = 0; i < k; ++i) ref += da[i * k + row] * db[col * k + i];
      worst = std::max(worst, std::abs(dc[col * k + row] - ref));
    }
  CHECK(worst < 1e-12);

  // copy, fill_bytes.
  auto cc = dev.allocate<float>(m * m).value();
  REQUIRE(run(copy(gc, cc)));
  std::vector<float> c2(m * m);
  REQUIRE(run(download(cc, std::span<float>(c2))));
  CHECK(std::memcmp(c.data(), c2.data(), c.size() * sizeof(float)) == 0);
  REQUIRE(run(fill_bytes(cc, 0xAB)));
  std::vector<std::uint8_t> bytes(m * m * 4);
  auto cb = dev.allocate<std::uint8_t>(bytes.size()).value();
  REQUIRE(run(fill_bytes(cb, 0xAB)));
  REQUIRE(run(download(cb, std::span<std::uint8_t>(bytes))));
  CHECK(std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t v) { return v == 0xAB; }));

  // 24 MiB through an 8 MiB arena: twelve pieces each way, bit-exact.
  const std::size_t big = std::size_t{6} << 20;
  std::vector<std::uint32_t> in(big), out(big, 0);
  random_bytes(in.data(), big * 4, 7);
  auto gbig = dev.allocate<std::uint32_t>(big).value();
  REQUIRE(run(upload(in, gbig)));
  REQUIRE(run(download(gbig, std::span<std::uint32_t>(out))));
  CHECK(in == out);

  const auto s = dev.statistics();
  CHECK(s.worker_calls_pending == 0);
  CHECK(s.ops_failed == 0);
  CHECK(s.total_bytes > 0);
  CHECK(s.parked == 0);
}

TEST_CASE_FIXTURE(iso, "isolated: bad input is refused in the service, before anything is sent") {
  open();
  auto blas = blas_actor::create(dev).value();
  auto x = dev.allocate<float>(64).value();
  const auto before = dev.statistics();
  std::vector<float> host(65);
  auto up = run(upload(host, x));
  REQUIRE_FALSE(up);
  CHECK(up.error().code() == errc::invalid_argument);
  gemm_params p;
  p.m = p.n = p.k = 16;  // 256 elements each: x has 64
  auto g = run(blas.gemm(p, x, x, x));
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == errc::invalid_argument);
  auto sub = x.subspan(0, 32).value();
  auto ov = run(copy(sub, x.subspan(16, 32).value()));
  REQUIRE_FALSE(ov);
  CHECK(ov.error().code() == errc::invalid_argument);
  const auto after = dev.statistics();
  CHECK(after.ops_completed == before.ops_completed);  // nothing reached the worker
  CHECK(after.ops_failed == before.ops_failed);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: each fault kind with 100 operations in flight: every one completes, "
                  "the worker restarts, old refs are stale, new work is correct") {
  struct kind {
    std::string name;
    wire::fault_kind k;
  };
  for (auto fk :
       {kind{"illegal address", wire::fault_kind::illegal_address},
        kind{"abort", wire::fault_kind::abort_process},
        kind{"SIGKILL", wire::fault_kind::kill_self}, kind{"hung process", wire::fault_kind::hang},
        kind{"kernel that never ends", wire::fault_kind::hang_kernel}}) {
    CAPTURE(fk.name);
    open();
    std::optional<blas_actor> blas_holder(blas_actor::create(dev).value());
    auto& blas = *blas_holder;
    const auto b = random_floats(n * n, 99);
    auto old = dev.allocate<float>(16).value();
    const auto gen = dev.generation();
    const int pid = dev.statistics().worker_pid;
    std::map<errc, int> errors;
    std::mutex mu;
    std::atomic<int> left{101}, good{0}, wrong{0};
    std::optional<result<void>> fault_result;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) {
      asio::co_spawn(
          ioc,
          [&, i]() -> asio::awaitable<void> {
            if (i >= 50) {  // the second half starts around the fault
              asio::steady_timer t(ioc, std::chrono::milliseconds(i % 7));
              co_await t.async_wait(asio::use_awaitable);
            }
            const int r = co_await checked_gemm(dev, blas, b, 1000 + i, errors, mu);
            if (r == 1) ++good;
            if (r == -1) ++wrong;
            --left;
          },
          asio::detached);
      if (i == 50)
        asio::co_spawn(
            ioc,
            [&]() -> asio::awaitable<void> {
              fault_result = co_await detail::inject_isolated_fault(
                  dev.impl(), static_cast<std::uint16_t>(fk.k));
              --left;
            },
            asio::detached);
    }
    REQUIRE(run_threads(left));
    CHECK(wrong == 0);
    {
      std::lock_guard lk(mu);
      for (auto [code, count] : errors) {
        MESSAGE(fk.name << ": " << count << " x " << to_string(code));
        CHECK((code == errc::context_poisoned || code == errc::stale_ref ||
               code == errc::device_unavailable || code == errc::timeout));
      }
    }
    MESSAGE(fk.name << ": " << good.load() << " of 100 correct, the rest failed fast");
    if (fk.k == wire::fault_kind::illegal_address) {
      REQUIRE(fault_result);
      REQUIRE_FALSE(*fault_result);
      CHECK(fault_result->error().code() == errc::context_poisoned);
    }
    if (fk.k == wire::fault_kind::hang_kernel) {
      REQUIRE(fault_result);
      REQUIRE_FALSE(*fault_result);
      CHECK(fault_result->error().code() == errc::timeout);
    }
    REQUIRE(run_until([&] {
      return dev.statistics().worker_restarts == 1 && dev.health() == health_state::healthy;
    }));
    const auto recovery = std::chrono::steady_clock::now() - t0;
    const auto hist = detail::health_history(*dev.impl());
    auto at = [&](health_state h, std::size_t from) {
      return std::find(hist.begin() + static_cast<std::ptrdiff_t>(from), hist.end(), h) -
             hist.begin();
    };
    const auto ip = static_cast<std::size_t>(at(health_state::poisoned, 0));
    const auto ir = static_cast<std::size_t>(at(health_state::restarting, ip));
    const auto ih = static_cast<std::size_t>(at(health_state::healthy, ir));
    CHECK(ip < hist.size());
    CHECK(ir < hist.size());
    CHECK(ih < hist.size());
    CHECK(dev.generation() > gen);
    CHECK(old.check().error().code() == errc::stale_ref);
    CHECK(pid_gone(pid));
    CHECK(dev.statistics().worker_restarts == 1);
    std::map<errc, int> after;
    CHECK(run(checked_gemm(dev, blas, b, 5, after, mu)) == 1);
    MESSAGE(fk.name << ": fault to healthy and correct again in "
                    << std::chrono::duration<double>(recovery).count() << " s");
    const auto s = dev.statistics();
    CHECK(s.worker_calls_pending == 0);
    blas_holder.reset();
    drop();
  }
}

TEST_CASE_FIXTURE(iso, "isolated: the restart budget spent leads to stopped; no worker is left") {
  auto o = options();
  o.isolation.budget.max_restarts = 1;
  open(o);
  const int pid1 = dev.statistics().worker_pid;
  CHECK(run(detail::inject_isolated_fault(
      dev.impl(), static_cast<std::uint16_t>(wire::fault_kind::kill_self))));
  REQUIRE(run_until([&] {
    return dev.statistics().worker_restarts == 1 && dev.health() == health_state::healthy;
  }));
  CHECK(dev.statistics().restarts_left == 0);
  const int pid2 = dev.statistics().worker_pid;
  CHECK(pid2 != pid1);
  CHECK(run(detail::inject_isolated_fault(
      dev.impl(), static_cast<std::uint16_t>(wire::fault_kind::kill_self))));
  REQUIRE(wait_health(health_state::stopped));
  auto st = dev.status();
  REQUIRE_FALSE(st);
  CHECK(st.error().code() == errc::device_unavailable);
  CHECK(st.error().message().find("budget") != std::string::npos);
  auto a = dev.allocate<float>(4);
  REQUIRE_FALSE(a);
  CHECK(pid_gone(pid1));
  CHECK(run_until([&] { return pid_gone(pid2); }, 5s));
}

TEST_CASE_FIXTURE(iso, "isolated: a worker killed while idle is restarted; work goes on") {
  open();
  auto blas = blas_actor::create(dev).value();
  const int pid = dev.statistics().worker_pid;
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(run_until([&] { return dev.health() != health_state::healthy; }, 10s));
  REQUIRE(wait_health(health_state::healthy));
  CHECK(pid_gone(pid));
  std::map<errc, int> errors;
  std::mutex mu;
  CHECK(run(checked_gemm(dev, blas, random_floats(n * n, 3), 4, errors, mu)) == 1);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: a timed-out download leaves its target untouched and parks its "
                  "arena block until the answer") {
  open();
  const std::size_t big = std::size_t{4} << 20;
  auto g = dev.allocate<std::uint32_t>(big).value();
  REQUIRE(run(fill_bytes(g, 0x11)));
  std::vector<std::uint32_t> out(big, 7);
  auto r = run(download(g, std::span<std::uint32_t>(out), {.how = event_poll{1us}}));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::timeout);
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint32_t v) { return v == 7; }));
  REQUIRE(run_until([&] {
    const auto s = dev.statistics();
    return s.parked == 0 && s.worker_calls_pending == 0;
  }));
  REQUIRE(run(download(g, std::span<std::uint32_t>(out))));
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint32_t v) { return v == 0x11111111u; }));
}

TEST_CASE_FIXTURE(iso,
                  "isolated: 2000 random operations with a fault every ~200: the service keeps "
                  "working and every successful result is correct") {
  auto o = options();
  o.isolation.budget.max_restarts = 20;
  open(o);
  auto blas = blas_actor::create(dev).value();
  const auto b = random_floats(n * n, 42);
  std::map<errc, int> errors;
  std::mutex mu;
  std::atomic<int> done{0}, good{0}, wrong{0}, faults{0};
  std::atomic<int> left{8};
  for (int w = 0; w < 8; ++w)
    asio::co_spawn(
        ioc,
        [&, w]() -> asio::awaitable<void> {
          std::mt19937 rng(static_cast<unsigned>(w));
          for (int i = 0; i < 250; ++i) {
            const int k = done.fetch_add(1) + 1;
            if (k % 200 == 100) {
              ++faults;
              auto injected = co_await detail::inject_isolated_fault(
                  dev.impl(),
                  static_cast<std::uint16_t>(rng() % 2 ? wire::fault_kind::illegal_address
                                                       : wire::fault_kind::kill_self));
              (void)injected;  // an illegal address answers context_poisoned
            }
            int r = 0;
            switch (rng() % 3) {
              case 0:
                r = co_await checked_gemm(dev, blas, b, rng(), errors, mu);
                break;
              case 1: {  // a round trip through the arena
                std::vector<std::uint32_t> in(1000 + rng() % 5000), back(in.size());
                random_bytes(in.data(), in.size() * 4, rng());
                auto g = dev.allocate<std::uint32_t>(in.size());
                if (!g) {
                  std::lock_guard lk(mu);
                  ++errors[g.error().code()];
                  break;
                }
                auto u = co_await upload(in, g.value());
                auto d = u ? co_await download(g.value(), std::span<std::uint32_t>(back))
                           : result<void>(u.error());
                if (!d) {
                  std::lock_guard lk(mu);
                  ++errors[d.error().code()];
                } else {
                  r = in == back ? 1 : -1;
                }
                break;
              }
              default: {  // fill then copy
                auto x = dev.allocate<std::uint8_t>(4096);
                auto y = dev.allocate<std::uint8_t>(4096);
                if (!x || !y) break;
                std::vector<std::uint8_t> back(4096);
                const auto v = static_cast<unsigned char>(rng());
                auto f = co_await fill_bytes(x.value(), v);
                auto c = f ? co_await copy(x.value(), y.value())
                           : result<gpu_ref<std::uint8_t>>(f.error());
                auto d = c ? co_await download(y.value(), std::span<std::uint8_t>(back))
                           : result<void>(c.error());
                if (!d) {
                  std::lock_guard lk(mu);
                  ++errors[d.error().code()];
                } else {
                  r = std::all_of(back.begin(), back.end(), [&](auto e) { return e == v; }) ? 1
                                                                                            : -1;
                }
                break;
              }
            }
            if (r == 1) ++good;
            if (r == -1) ++wrong;
            // Failed fast during a restart: wait for the new worker (up to 10 s).
            for (int wait = 0; r == 0 && wait < 2000 && !dev.accepting(); ++wait) {
              asio::steady_timer t(ioc, 5ms);
              co_await t.async_wait(asio::use_awaitable);
            }
          }
          --left;
        },
        asio::detached);
  REQUIRE(run_threads(left));
  MESSAGE(good.load() << " of 2000 correct, " << faults.load() << " faults injected, "
                      << dev.statistics().worker_restarts << " restarts");
  for (auto [code, count] : errors) MESSAGE(count << " x " << to_string(code));
  CHECK(wrong == 0);
  CHECK(good > 1500);
  CHECK(faults >= 9);
  REQUIRE(wait_health(health_state::healthy));
  std::map<errc, int> after;
  CHECK(run(checked_gemm(dev, blas, b, 11, after, mu)) == 1);
  REQUIRE(run_until([&] {
    const auto s = dev.statistics();
    return s.worker_calls_pending == 0 && s.parked == 0;
  }));
  CHECK(dev.statistics().live_buffers == 0);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: the service exits cleanly with a live, a dead and a restarting "
                  "worker; no process is left") {
  std::vector<int> pids;
  {  // live
    open();
    pids.push_back(dev.statistics().worker_pid);
    drop();
  }
  {  // dead: the budget spent
    auto o = options();
    o.isolation.budget.max_restarts = 0;
    open(o);
    REQUIRE(dev.statistics().restarts_left == 0);  // a new state, with these options
    pids.push_back(dev.statistics().worker_pid);
    ::kill(pids.back(), SIGKILL);
    REQUIRE(wait_health(health_state::stopped));
    drop();
  }
  {  // restarting: killed, then dropped before the new worker's hello
    open();
    pids.push_back(dev.statistics().worker_pid);
    ::kill(pids.back(), SIGKILL);
    REQUIRE(run_until([&] {
      const auto s = dev.statistics();
      return s.worker_pid != 0 && s.worker_pid != pids.back();
    }));
    pids.push_back(dev.statistics().worker_pid);
    drop();
  }
  for (int p : pids) {
    CAPTURE(p);
    CHECK(pid_gone(p));
  }
}

int main(int argc, char** argv) {
  // No CUDA call here: this process must never initialise CUDA. A GPU is
  // present when the driver says so in /proc.
  if (!std::filesystem::exists("/proc/driver/nvidia/version")) {
    std::printf("SKIP: the isolated GPU tests need an NVIDIA driver (/proc/driver/nvidia)\n");
    return 77;
  }
  const bool loaded_at_start = cuda_loaded();
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  std::printf("libcuda.so mapped into this process: at start %s, at the end %s\n",
              loaded_at_start ? "yes" : "no", cuda_loaded() ? "yes" : "no");
  if (const auto fds = nvidia_fds(); !fds.empty()) {
    std::printf("FAIL: the service process opened %s: it initialised CUDA\n", fds.front().c_str());
    return 1;
  }
  std::printf("the service process never opened an NVIDIA device file (CUDA not initialised)\n");
  return rc;
}
