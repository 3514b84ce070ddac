// The isolated device (issue 20) on a machine without a GPU: the worker is
// started and watched, its "no GPU" is the device's status, bad input is
// refused before anything is sent, what the mode does not offer answers
// not_supported, and no process is left behind.
#include "../lib/remote.hpp"
#include "io_fixture.hpp"

#include <atomr/cuda.hpp>

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#if ATOMR_CUDA_HAS_WORKER

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {

struct iso_fixture : io_fixture {
  device_options options(std::vector<std::string> args = {"--no-cuda", "--test-faults"}) {
    device_options o;
    o.isolation.enabled = true;
    o.isolation.worker_args = std::move(args);
    o.isolation.heartbeat = 20ms;
    o.isolation.heartbeat_timeout = 1000ms;
    o.isolation.arena_bytes = std::size_t{4} << 20;
    return o;
  }
};

/// 64 floats of host data.
const std::vector<float>& host_in_64() {
  static const std::vector<float> v(64, 1.0f);
  return v;
}

/// A worker that starts and never says hello (the device stays starting).
std::string silent_worker() {
  const auto p = std::filesystem::temp_directory_path() /
                 ("atomr-silent-worker-" + std::to_string(::getpid()) + ".sh");
  {
    std::ofstream f(p);
    f << "#!/bin/sh\nexec sleep 600\n";
  }
  ::chmod(p.c_str(), 0755);
  return p.string();
}

}  // namespace

TEST_CASE_FIXTURE(iso_fixture,
                  "isolated device without a GPU: the worker's 'no GPU' is the device's status") {
  int pid = 0;
  {
    auto dev = device(ioc.get_executor(), 0, options());
    CHECK(dev.isolated());
    // Until the worker's hello the device is starting and takes work.
    CHECK((dev.health() == health_state::starting || dev.health() == health_state::unavailable));
    REQUIRE(run_until([&] { return dev.health() == health_state::unavailable; }));
    auto st = dev.status();
    REQUIRE_FALSE(st);
    CHECK(st.error().code() == errc::device_unavailable);
    CHECK(st.error().message().find("--no-cuda") != std::string::npos);
    const auto s = dev.statistics();
    CHECK(s.isolated);
    CHECK(s.worker_pid > 0);
    CHECK(s.worker_restarts == 0);
    CHECK(s.library_threads == 1);  // the reply reader; nothing runs in process
    // The worker's threads (no CUDA here): its io thread and one per request
    // ring, started right after its hello.
    const std::size_t worker_threads = 1 + dev.options().isolation.rings;
    CHECK(run_until([&] { return dev.statistics().worker_threads == worker_threads; }));
    pid = s.worker_pid;
    auto a = dev.allocate<float>(16);
    REQUIRE_FALSE(a);
    CHECK(a.error().code() == errc::device_unavailable);
  }
  // The device is gone with its last handle: so is its worker, reaped.
  ioc.restart();
  ioc.run_for(50ms);
  CHECK(pid_gone(pid));
}

TEST_CASE_FIXTURE(iso_fixture,
                  "isolated device whose worker cannot map the shared arena: a call pushed into "
                  "its rings while it started fails at its hello, not at its deadline") {
  auto dev = device(ioc.get_executor(), 0, options({"--no-cuda", "--test-no-arena"}));
  auto x = dev.allocate<float>(64);
  REQUIRE(x);
  // Spawned before the io_context first runs: the fill reaches the first
  // worker's request ring (which takes calls while the worker starts)
  // before the worker's hello is read.
  std::optional<result<gpu_ref<float>>> filled;
  asio::co_spawn(
      ioc, [&]() -> asio::awaitable<void> { filled.emplace(co_await fill_bytes(x.value(), 0)); },
      asio::detached);
  REQUIRE(run_until([&] { return filled.has_value(); }, 5s));  // for ever without the fix
  REQUIRE_FALSE(*filled);
  CHECK(filled->error().code() == errc::device_unavailable);
  CHECK(filled->error().message().find("could not map the shared arena") != std::string::npos);
  const auto s = dev.statistics();
  CHECK(s.worker_calls_pending == 0);
  CHECK(s.worker_restarts == 0);
}

TEST_CASE_FIXTURE(iso_fixture, "isolated device: options out of range are refused at open") {
  auto o = options();
  o.isolation.arena_bytes = 1024;
  auto d = device::open(ioc.get_executor(), 0, o);
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::invalid_argument);
  CHECK(d.error().message().find("arena_bytes") != std::string::npos);
  o = options();
  o.isolation.heartbeat_timeout = o.isolation.heartbeat;
  d = device::open(ioc.get_executor(), 0, o);
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::invalid_argument);
  CHECK(d.error().message().find("heartbeat_timeout") != std::string::npos);
  o = options();
  o.isolation.hang_margin = 0ms;
  d = device::open(ioc.get_executor(), 0, o);
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::invalid_argument);
  CHECK(d.error().message().find("hang_margin") != std::string::npos);
  for (auto spin : {std::chrono::microseconds(-1), std::chrono::microseconds(10001)}) {
    o = options();
    o.isolation.reply_spin = spin;
    d = device::open(ioc.get_executor(), 0, o);
    REQUIRE_FALSE(d);
    CHECK(d.error().code() == errc::invalid_argument);
    CHECK(d.error().message().find("options.isolation.reply_spin (" + std::to_string(spin.count()) +
                                   " us)") != std::string::npos);
  }
}

TEST_CASE_FIXTURE(iso_fixture,
                  "isolated device while its worker starts: bad input to every actor fails "
                  "before anything is sent; run_kernel, pinned buffers and recordings are "
                  "not_supported") {
  const auto script = silent_worker();
  auto o = options({});
  o.isolation.worker_executable = script;
  int pid = 0;
  {
    auto dev = device(ioc.get_executor(), 0, o);
    REQUIRE(dev.status());
    CHECK(dev.health() == health_state::starting);
    REQUIRE(run_until([&] { return dev.statistics().worker_pid > 0; }));
    pid = dev.statistics().worker_pid;
    auto x = dev.allocate<float>(64).value();
    auto y = dev.allocate<float>(64).value();
    CHECK(x.generation() == dev.generation());
    auto ptr = x.unsafe_data();
    REQUIRE_FALSE(ptr);
    CHECK(ptr.error().code() == errc::not_supported);

    std::vector<float> host(63, 1.0f);
    auto up = run(upload(host, x));  // 63 elements into 64
    REQUIRE_FALSE(up);
    CHECK(up.error().code() == errc::invalid_argument);

    auto blas = blas_actor::create(dev).value();
    gemm_params p;
    p.m = p.n = p.k = 8;
    p.lda = 4;  // < m
    auto g = run(blas.gemm(p, x, y, x));
    REQUIRE_FALSE(g);
    CHECK(g.error().code() == errc::invalid_argument);
    CHECK(dev.statistics().worker_calls_pending == 0);  // nothing was sent

    // Every actor exists on an isolated device, and checks its arguments here.
    auto fused = run(blas.gemm_fused(p, gemm_epilogue::relu, x, y, {}, x));
    REQUIRE_FALSE(fused);
    CHECK(fused.error().code() == errc::invalid_argument);
    CHECK(fused.error().message().find("lda") != std::string::npos);
    auto dot = run(blas.dot(65, x, y));  // more elements than x holds
    REQUIRE_FALSE(dot);
    CHECK(dot.error().code() == errc::invalid_argument);
    auto ax = run(blas.axpy(64, 2.0, x, x));  // y aliases x
    REQUIRE_FALSE(ax);
    CHECK(ax.error().code() == errc::invalid_argument);
#if ATOMR_CUDA_HAS_CUDNN
    auto dnn = cudnn_actor::create(dev);
    REQUIRE(dnn);
    auto act = run(dnn.value().activation_forward(tensor_shape{1, 1, 8, 9}, {}, x, y));  // 72 != 64
    REQUIRE_FALSE(act);
    CHECK(act.error().code() == errc::invalid_argument);
    pooling_params pool;
    pool.window_h = 0;
    auto pl = run(dnn.value().pooling_forward(tensor_shape{1, 1, 8, 8}, pool, x, y));
    REQUIRE_FALSE(pl);
    CHECK(pl.error().code() == errc::invalid_argument);
    {
      // Every cuDNN operation's per-call checks, each naming its argument
      // right after the operation's name, as on the GPU
      // (test_gpu_cudnn.cpp): nothing reaches the worker.
      auto& d = dnn.value();
      auto bad = [](const auto& r, std::string_view arg) {
        REQUIRE_FALSE(r);
        CHECK(r.error().code() == errc::invalid_argument);
        const auto& m = r.error().message();
        CAPTURE(m);
        const auto at = m.find(": ");
        REQUIRE(at != std::string::npos);
        CHECK(m.compare(at + 2, arg.size() + 1, std::string(arg) + " ") == 0);
      };
      auto buf = [&](std::size_t n) { return dev.allocate<float>(n).value(); };
      const tensor_shape xs{1, 2, 4, 4};
      const conv2d_params cp{.out_channels = 2, .filter_h = 3, .filter_w = 3};
      auto cx = buf(32), cf = buf(36), cy = buf(8), c2 = buf(2);
      bad(run(d.conv2d_forward(xs, cp, cx, cf, {}, buf(9))), "y");
      bad(run(d.conv2d_forward(xs, cp, cx, buf(35), {}, cy)), "filter");
      bad(run(d.conv2d_forward(xs, cp, cx, cf, buf(3), cy)), "bias");
      bad(run(d.conv2d_forward(xs, {.out_channels = 3, .groups = 2}, cx, cf, {}, cy)),
          "params.groups");
      bad(run(d.conv2d_forward(xs, cp, cx, cf, {}, cx.subspan(0, 8).value())), "y");
      bad(run(d.activation_forward(xs, {activation_mode::elu, 0}, cx, buf(32))), "params.coef");
      bad(run(d.softmax_forward(xs, softmax_algorithm::accurate, cx, buf(31))), "y");
      bad(run(d.pooling_forward(xs, {.window_h = 5}, cx, buf(8))), "params.window_h");
      bad(run(d.batchnorm_inference(xs, 0.0, cx, c2, c2, c2, c2, buf(32))), "epsilon");
      bad(run(d.batchnorm_inference(xs, 1e-5, cx, c2, buf(3), c2, c2, buf(32))), "bias");
      bad(run(d.batchnorm_inference(xs, 1e-5, cx, c2, c2, c2, gpu_ref<float>{}, buf(32))), "var");
      CHECK(dev.statistics().worker_calls_pending == 0);
    }
#endif
#if ATOMR_CUDA_HAS_CUFFT
    auto fft = fft_actor::create(dev);
    REQUIRE(fft);
    auto zin = dev.allocate<fft_actor::c32>(8).value();
    auto zout = dev.allocate<fft_actor::c32>(8).value();
    fft_shape fs;
    fs.dims = {16, 1, 1};  // 16 points into 8 elements
    auto f = run(fft.value().c2c(fs, zin, zout));
    REQUIRE_FALSE(f);
    CHECK(f.error().code() == errc::invalid_argument);
    fs.dims = {8, 1, 1};
    fs.direction = fft_direction::inverse;
    auto rc = run(fft.value().r2c(fs, x, zout));  // r2c must be forward
    REQUIRE_FALSE(rc);
    CHECK(rc.error().code() == errc::invalid_argument);
#endif
#if ATOMR_CUDA_HAS_CURAND
    auto rng = rng_actor::create(dev, {.seed = 7});
    REQUIRE(rng);
    auto nrm = run(rng.value().normal(x, 0.0f, -1.0f));
    REQUIRE_FALSE(nrm);
    CHECK(nrm.error().code() == errc::invalid_argument);
    CHECK(rng.value().set_seed(9));
    auto sobol = rng_actor::create(dev, {.kind = rng_kind::sobol32});
    REQUIRE(sobol);
    auto seeded = sobol.value().set_seed(1);  // a quasi-random generator has no seed
    REQUIRE_FALSE(seeded);
    CHECK(seeded.error().code() == errc::invalid_argument);
#endif
    CHECK(dev.statistics().worker_calls_pending == 0);  // nothing was sent

    // A good one is held for the worker (which never answers here) and ends
    // with its completion's timeout; its buffers are released after it.
    completion soon;
    soon.timeout = 100ms;
    auto timed = blas_actor::create(dev, {.how = soon}).value();
    auto held = run(timed.scal(64, 2.0, x));
    REQUIRE_FALSE(held);
    CHECK(held.error().code() == errc::timeout);
    CHECK(dev.statistics().worker_calls_pending == 1);

    // A composed unit is one request: its steps are checked and kept here,
    // then sent together at its end (the wait times out as the unit's, not
    // as step 1's), and its download target is left untouched.
    {
      auto z = dev.allocate<float>(64).value();
      std::vector<float> host_in(64, 2.0f), host_out(64, -1.0f);
      gemm_params g8;
      g8.m = g8.n = g8.k = 8;
      auto unit = run(compose(dev, soon, upload(host_in, x), blas.gemm(g8, x, y, z),
                              download(z, std::span<float>(host_out))));
      REQUIRE_FALSE(unit);
      CHECK(unit.error().code() == errc::timeout);
      CHECK(unit.error().message().find("step") == std::string::npos);
      CHECK(dev.statistics().worker_calls_pending == 2);  // one more: the whole unit
      CHECK(std::all_of(host_out.begin(), host_out.end(), [](float v) { return v == -1.0f; }));
      // A step refused here: nothing of the unit is sent, the error names it.
      g8.lda = 4;
      auto bad = run(compose(dev, soon, upload(host_in, x), blas.gemm(g8, x, y, z),
                             download(z, std::span<float>(host_out))));
      REQUIRE_FALSE(bad);
      CHECK(bad.error().code() == errc::invalid_argument);
      CHECK(bad.error().message().find("compose: step 2 of 3") != std::string::npos);
      CHECK(dev.statistics().worker_calls_pending == 2);
    }
    auto k = run(run_kernel("test", dev.main_stream(), event_poll{}, x,
                            [](launch&) { return std::tuple<>{}; }));
    REQUIRE_FALSE(k);
    CHECK(k.error().code() == errc::not_supported);
    CHECK(k.error().message().find("run_kernel") != std::string::npos);
    auto pinned = dev.allocate_pinned<float>(16);
    REQUIRE_FALSE(pinned);
    CHECK(pinned.error().code() == errc::not_supported);
    // A recording on an isolated device is made by the worker; a transfer
    // from host memory cannot be part of it (refused here, nothing sent).
    const auto sent = dev.statistics().worker_calls_pending;
    auto rec = run(record(dev, fill_bytes(x, 0), upload(host_in_64(), x)));
    REQUIRE_FALSE(rec);
    CHECK(rec.error().code() == errc::not_supported);
    CHECK(rec.error().message().find("record: step 2 of 2") != std::string::npos);
    CHECK(dev.statistics().worker_calls_pending == sent);
    auto none = run(replay(recorded_unit{}));
    REQUIRE_FALSE(none);
    CHECK(none.error().code() == errc::invalid_argument);
  }
  ioc.restart();
  ioc.run_for(50ms);
  CHECK(pid_gone(pid));
  std::filesystem::remove(script);
}

TEST_CASE_FIXTURE(
    iso_fixture, "isolated device: stop() ends its worker; later calls answer device_unavailable") {
  auto dev = device(ioc.get_executor(), 0, options());
  REQUIRE(run_until([&] { return dev.statistics().worker_pid > 0; }));
  const int pid = dev.statistics().worker_pid;
  const auto gen = dev.generation();
  dev.stop();
  CHECK(dev.health() == health_state::stopped);
  CHECK(dev.generation() == gen + 1);
  REQUIRE(run_until([&] { return pid_gone(pid); }));
  auto a = dev.allocate<float>(4);
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::device_unavailable);
  CHECK(a.error().message().find("stopped") != std::string::npos);
}

TEST_CASE_FIXTURE(iso_fixture,
                  "health watch: a cancelled async_wait_health_change completes at once with the "
                  "health of the moment; it races a timer with ||; the default token is deferred") {
  // A worker that never says hello: the device stays starting, a passing
  // state, so a watch waits for the next change (which never comes here).
  const auto script = silent_worker();
  auto o = options({});
  o.isolation.worker_executable = script;
  int pid = 0;
  {
    auto dev = device(ioc.get_executor(), 0, o);
    REQUIRE(dev.health() == health_state::starting);
    REQUIRE(run_until([&] { return dev.statistics().worker_pid > 0; }));
    pid = dev.statistics().worker_pid;

    // Cancelled through its slot: completes once, with `starting`.
    int calls = 0;
    std::optional<health_state> got;
    asio::cancellation_signal sig;
    dev.async_wait_health_change(asio::bind_cancellation_slot(sig.slot(), [&](health_state h) {
      ++calls;
      got = h;
    }));
    CHECK_FALSE(run_until([&] { return got.has_value(); }, 50ms));
    sig.emit(asio::cancellation_type::terminal);
    REQUIRE(run_until([&] { return got.has_value(); }));
    CHECK(*got == health_state::starting);

    // Raced against a timer: the timer wins, the watch is cancelled and done.
    auto raced = run([&]() -> asio::awaitable<std::size_t> {
      using namespace asio::experimental::awaitable_operators;
      asio::steady_timer t(co_await asio::this_coro::executor, 30ms);
      auto which = co_await (dev.async_wait_health_change(asio::use_awaitable) ||
                             t.async_wait(asio::use_awaitable));
      co_return which.index();
    }());
    CHECK(raced == 1);

    // No token: a deferred operation, awaitable in a coroutine (Boost 1.81
    // included), here cancelled by a partial cancellation of its coroutine.
    asio::cancellation_signal outer;
    std::optional<health_state> deferred_got;
    asio::co_spawn(
        ioc,
        [&]() -> asio::awaitable<void> {
          co_await asio::this_coro::reset_cancellation_state(asio::enable_partial_cancellation());
          deferred_got = co_await dev.async_wait_health_change();
        },
        asio::bind_cancellation_slot(outer.slot(), [](std::exception_ptr) {}));
    CHECK_FALSE(run_until([&] { return deferred_got.has_value(); }, 50ms));
    outer.emit(asio::cancellation_type::partial);
    REQUIRE(run_until([&] { return deferred_got.has_value(); }));
    CHECK(*deferred_got == health_state::starting);

    // A real change still reaches a watch that was not cancelled; the
    // cancelled one is not called again.
    std::optional<health_state> changed;
    dev.async_wait_health_change([&](health_state h) { changed = h; });
    dev.stop();
    REQUIRE(run_until([&] { return changed.has_value(); }));
    CHECK(*changed == health_state::stopped);
    CHECK(calls == 1);
  }
  REQUIRE(run_until([&] { return pid_gone(pid); }));
}

#else
TEST_CASE("isolated device: not built (Boost.Process v2 did not compile)") {
  MESSAGE("SKIP: the isolated device mode was not built");
}
#endif

// The arena's host copies (lib/remote.hpp, for_each_run): one run per stretch
// of adjacent blocks, each run at its offset in the transfer, the last block
// only as far as the transfer goes, and nothing outside the blocks touched.
TEST_CASE("isolated device: arena copies go in runs of adjacent blocks") {
  using namespace atomr::cuda::detail;
  constexpr std::size_t mib = std::size_t{1} << 20;
  std::vector<std::byte> mem(8 * mib, std::byte{0xEE});
  auto space = std::make_shared<arena_space>(worker_arena{nullptr, mem.data(), mem.size(), 1});
  auto block = [&](std::size_t bytes) {
    auto off = space->take(bytes);
    REQUIRE(off);
    return std::make_shared<arena_block>(space, *off, bytes);
  };
  // Held blocks at 0 and 2 MiB, a freed one between them: the transfer's
  // blocks land at 1, 3, 4 and 5 MiB (first fit).
  auto held0 = block(mib);
  auto freed = block(mib);
  auto held2 = block(mib);
  CHECK(freed->offset() == mib);
  freed.reset();
  std::vector<std::shared_ptr<arena_block>> blocks{block(mib), block(mib), block(mib), block(mib)};
  CHECK(blocks[0]->offset() == mib);
  CHECK(blocks[1]->offset() == 3 * mib);
  CHECK(blocks[2]->offset() == 4 * mib);
  CHECK(blocks[3]->offset() == 5 * mib);
  const std::size_t bytes = 3 * mib + 700;  // the last block only in part
  std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> runs;
  for_each_run(blocks, bytes, [&](std::byte* where, std::size_t from, std::size_t n) {
    runs.emplace_back(static_cast<std::size_t>(where - mem.data()), from, n);
  });
  using run = std::tuple<std::size_t, std::size_t, std::size_t>;
  REQUIRE(runs.size() == 2);
  CHECK(runs[0] == run{mib, 0, mib});
  CHECK(runs[1] == run{3 * mib, mib, 2 * mib + 700});

  // A round trip through them: bytes in, arena checked, bytes out.
  std::vector<std::byte> in(bytes), out(bytes, std::byte{0});
  for (std::size_t i = 0; i < bytes; ++i) in[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  for_each_run(blocks, bytes, [&](std::byte* where, std::size_t from, std::size_t n) {
    std::memcpy(where, in.data() + from, n);
  });
  CHECK(std::memcmp(mem.data() + mib, in.data(), mib) == 0);
  CHECK(std::memcmp(mem.data() + 3 * mib, in.data() + mib, 2 * mib + 700) == 0);
  auto untouched = [&](std::size_t from, std::size_t to) {
    return std::all_of(mem.begin() + static_cast<std::ptrdiff_t>(from),
                       mem.begin() + static_cast<std::ptrdiff_t>(to),
                       [](std::byte b) { return b == std::byte{0xEE}; });
  };
  CHECK(untouched(0, mib));                     // held0
  CHECK(untouched(2 * mib, 3 * mib));           // held2
  CHECK(untouched(5 * mib + 700, mem.size()));  // past the transfer's end
  for_each_run(blocks, bytes, [&](std::byte* where, std::size_t from, std::size_t n) {
    std::memcpy(out.data() + from, where, n);
  });
  CHECK(in == out);

  // Fewer bytes than the first block holds: one run, that long.
  runs.clear();
  for_each_run(blocks, 100, [&](std::byte* where, std::size_t from, std::size_t n) {
    runs.emplace_back(static_cast<std::size_t>(where - mem.data()), from, n);
  });
  REQUIRE(runs.size() == 1);
  CHECK(runs[0] == run{mib, 0, 100});
  blocks.clear();
  held0.reset();
  held2.reset();
  CHECK(space->take(8 * mib) == std::optional<std::size_t>{0});  // all given back and merged
}
