// Completion strategies and run_kernel on a real GPU: real work with the
// right numbers, timeouts and cancellation that stop only the waiting, and
// keep-alives that outlive an abandoned wait until the kernel ends.
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {
const completion all_strategies[] = {event_poll{}, host_fn{}, blocking_sync{}};

constexpr int long_n = 4096;
constexpr int long_repeat = 12;  // ~30 ms of FP32 gemm on an H200

struct long_gemm : gpu_fixture {
  long_gemm() = default;
  explicit long_gemm(const device_options& o) : gpu_fixture(o) {}
  stream s = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  blas_handle blas{s};
  std::vector<float> av = random_floats(std::size_t{long_n} * long_n, 11);
  std::vector<float> bv = random_floats(std::size_t{long_n} * long_n, 12);
  gpu_ref<float> c = alloc<float>(std::size_t{long_n} * long_n);

  /// After an abandoned wait: our own refs to the inputs are gone, yet the
  /// parked keep-alive still holds them; scribbling over any memory the pool
  /// might hand out again must not change the result; once the GPU is done the
  /// keep-alive is released and C is right.
  void check_abandoned_inputs_survive(std::uint64_t live_before_inputs) {
    auto st = dev.statistics();
    CHECK(st.parked == 1);
    CHECK(st.live_buffers == live_before_inputs + 2);  // A and B, held only by the keep-alive
    {
      auto other = dev.acquire_stream(stream_policy::per_actor_fresh).value();
      auto x = dev.allocate<float>(std::size_t{long_n} * long_n, other).value();
      auto y = dev.allocate<float>(std::size_t{long_n} * long_n, other).value();
      REQUIRE(run(fill_bytes(x, 0x7F, {.on = other})));
      REQUIRE(run(fill_bytes(y, 0x7F, {.on = other})));
    }
    drain_parked();
    st = dev.statistics();
    CHECK(st.parked == 0);
    CHECK(st.live_buffers == live_before_inputs);
    auto out = download_floats(c);
    CHECK(gemm_rel_error(av, bv, out, long_n, 256) < 1e-5);
  }
};
/// prefer_batching on this thread while it lives, off again however the
/// test leaves (a thread left preferring batching would change every later test).
struct preferring {
  preferring() { detail::prefer_batching(true); }
  ~preferring() { detail::prefer_batching(false); }
  preferring(const preferring&) = delete;
  preferring& operator=(const preferring&) = delete;
};

}  // namespace

TEST_CASE_FIXTURE(gpu_fixture, "each strategy completes a copy round trip and an sgemm correctly") {
  constexpr int n = 256;
  auto s = dev.acquire_stream().value();
  blas_handle blas(s);
  auto av = random_floats(n * n, 3);
  auto bv = random_floats(n * n, 4);
  for (const completion& how : all_strategies) {
    CAPTURE(to_string(how.kind));
    auto a = alloc<float>(n * n);
    auto b = alloc<float>(n * n);
    auto c = alloc<float>(n * n);
    std::vector<float> cv(n * n), echo(n * n);
    transfer_options o{.on = s, .how = how};
    auto r = run([&]() -> asio::awaitable<result<void>> {
      BOOST_OUTCOME_CO_TRY(co_await upload(std::span<const float>(av), a, o));
      BOOST_OUTCOME_CO_TRY(co_await upload(std::span<const float>(bv), b, o));
      BOOST_OUTCOME_CO_TRY(co_await download(a, std::span<float>(echo), o));
      BOOST_OUTCOME_CO_TRY(co_await fill_bytes(c, 0xFF, o));  // NaN: stale output cannot pass
      BOOST_OUTCOME_CO_TRY(auto out, co_await sgemm(blas, s, how, a, b, c, n));
      co_return co_await download(out, std::span<float>(cv), o);
    }());
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(echo == av);
    CHECK(gemm_rel_error(av, bv, cv, n) < 1e-5);
  }
  // blocking_sync's waits started the device's thread for them: counted.
  CHECK(dev.statistics().blocking_threads == 1);
}

TEST_CASE_FIXTURE(gpu_fixture,
                  "prefer_batching: on an idle stream run_kernel launches at once on this "
                  "thread, unless the thread prefers batching: then the launch joins a batch") {
  auto s = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto buf = alloc<float>(4096);
  std::thread::id enqueued_on;
  // Fills the buffer with `byte` through run_kernel, remembering the thread
  // that ran the enqueue.
  auto fill = [&](int byte, completion how) {
    return run_kernel("cuda", s, how, buf, [&, byte](launch& l) -> result<int> {
      enqueued_on = std::this_thread::get_id();
      BOOST_OUTCOME_TRY(float* p, l.write(buf));
      if (auto st = cudaMemsetAsync(p, byte, buf.size() * sizeof(float), l.native_stream());
          st != cudaSuccess)
        return classify(st, "cudaMemsetAsync");
      return 0;
    });
  };
  auto holds = [&](unsigned char byte) {
    const auto out = download_floats(buf);
    const auto* b = reinterpret_cast<const unsigned char*>(out.data());
    return std::all_of(b, b + out.size() * sizeof(float),
                       [&](unsigned char x) { return x == byte; });
  };
  const auto me = std::this_thread::get_id();
  const bool launch_threads = dev.options().launch_threads > 0;
  REQUIRE_FALSE(detail::batching_preferred());  // off by default

  auto before = dev.statistics();
  REQUIRE(run(fill(0x11, event_poll{})));
  auto after = dev.statistics();
  CHECK(after.ops_batched == before.ops_batched);  // launched at once, here
  CHECK(enqueued_on == me);
  CHECK(holds(0x11));

  // On for the rest of this scope, off again however the test leaves it.
  std::optional<preferring> on(std::in_place);
  bool other = true;
  std::thread([&] { other = detail::batching_preferred(); }).join();
  CHECK_FALSE(other);  // per thread
  before = dev.statistics();
  REQUIRE(run(fill(0x22, event_poll{})));
  after = dev.statistics();
  CHECK(after.ops_batched - before.ops_batched == 1);  // one op, one batch
  CHECK(after.batches - before.batches == 1);
  CHECK((enqueued_on == me) == !launch_threads);  // on the stream's launch thread
  CHECK(holds(0x22));
  // With a deadline the batch path is not taken (it has none): at once, here.
  completion timed = event_poll{};
  timed.timeout = 10s;
  before = dev.statistics();
  REQUIRE(run(fill(0x33, timed)));
  after = dev.statistics();
  CHECK(after.ops_batched == before.ops_batched);
  CHECK(enqueued_on == me);
  CHECK(holds(0x33));
  on.reset();
  CHECK_FALSE(detail::batching_preferred());
  CHECK(dev.statistics().ops_in_flight == 0);
}

TEST_CASE_FIXTURE(gpu_fixture,
                  "run_kernel: an enqueue that throws on the batch path leaves through its "
                  "co_await, as on the inline path; the operations queued beside it and later "
                  "ones run") {
  // Before: the exception left the drain, which ended a launch thread
  // (std::terminate) or, with the drains on the io threads, dropped the
  // batch's other operations and left the stream's queue draining for ever.
  auto s = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto a = alloc<float>(1024), b = alloc<float>(1024), c = alloc<float>(1024);
  auto fill = [&](gpu_ref<float> buf, int byte, bool throws) {
    return run_kernel("cuda", s, event_poll{}, buf, [buf, byte, throws](launch& l) -> result<int> {
      if (throws) throw std::runtime_error("the enqueue threw");
      BOOST_OUTCOME_TRY(float* p, l.write(buf));
      if (auto st = cudaMemsetAsync(p, byte, buf.size() * sizeof(float), l.native_stream());
          st != cudaSuccess)
        return classify(st, "cudaMemsetAsync");
      return 0;
    });
  };
  auto holds = [&](const gpu_ref<float>& buf, unsigned char byte) {
    const auto out = download_floats(buf);
    const auto* p = reinterpret_cast<const unsigned char*>(out.data());
    return std::all_of(p, p + out.size() * sizeof(float),
                       [&](unsigned char x) { return x == byte; });
  };
  std::optional<preferring> on(std::in_place);  // every run_kernel here joins a batch
  int ok = 0, threw = 0, done = 0;
  auto one = [&](gpu_ref<float> buf, int byte, bool throws) -> asio::awaitable<void> {
    try {
      auto r = co_await fill(buf, byte, throws);
      ok += r.has_value();
    } catch (const std::runtime_error& e) {
      threw += std::string(e.what()) == "the enqueue threw";
    }
    ++done;
  };
  const auto before = dev.statistics();
  // Spawned together on this one io thread, queued in this order (a launch
  // thread may drain the first before the others come: one batch or two).
  asio::co_spawn(ioc, one(a, 0x11, false), asio::detached);
  asio::co_spawn(ioc, one(b, 0x22, true), asio::detached);
  asio::co_spawn(ioc, one(c, 0x33, false), asio::detached);
  REQUIRE(run_until([&] { return done == 3; }, 20s));
  CHECK(ok == 2);
  CHECK(threw == 1);
  // Counted once enqueued: the two that did.
  CHECK(dev.statistics().ops_batched - before.ops_batched == 2);
  // The stream's queue goes on: a later batched operation runs.
  REQUIRE(run(fill(b, 0x44, false)));
  on.reset();
  CHECK(holds(a, 0x11));
  CHECK(holds(b, 0x44));
  CHECK(holds(c, 0x33));
  CHECK(dev.statistics().ops_in_flight == 0);
}

TEST_CASE_FIXTURE(gpu_fixture, "async_wait with each strategy waits for the stream's work") {
  auto s = dev.acquire_stream().value();
  blas_handle blas(s);
  constexpr int n = 2048;
  auto av = random_floats(std::size_t{n} * n, 5);
  auto a = upload_floats(av, s);
  auto c = alloc<float>(std::size_t{n} * n);
  for (const completion& how : all_strategies) {
    CAPTURE(to_string(how.kind));
    // Enqueue without waiting (a raw cuBLAS call on the stream), then wait.
    const float one = 1, zero = 0;
    REQUIRE(cublasSgemm(blas.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.unsafe_data().value(), n,
                        a.unsafe_data().value(), n, &zero, c.unsafe_data().value(),
                        n) == CUBLAS_STATUS_SUCCESS);
    auto r = run([&]() -> asio::awaitable<result<void>> {
      co_return co_await how.async_wait(s, asio::use_awaitable);
    }());
    REQUIRE(r);
    // Read C back without any ordering help (raw copy on a fresh stream, host
    // sync): only a wait that really covered the gemm makes it right. (With
    // host_fn the stream itself is still busy with the host function.)
    std::vector<float> cv(std::size_t{n} * n);
    REQUIRE(cudaMemcpy(cv.data(), c.unsafe_data().value(), cv.size() * 4, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    CHECK(gemm_rel_error(av, av, cv, n, 256) < 1e-5);
    REQUIRE(run(fill_bytes(c, 0xFF, {.on = s})));  // NaN before the next strategy
  }
}

TEST_CASE_FIXTURE(gpu_fixture,
                  "a wait whose callback is bound to a second io_context keeps that context's "
                  "run() from returning until the callback ran, with each strategy") {
  // An Asio operation holds outstanding work on its handler's executor
  // until the handler runs. The device runs on `ioc`; the callback on
  // `other`, which has nothing else to do: without that work its run()
  // returns at once and the callback never runs.
  test_kernels kernels;
  auto s = dev.acquire_stream().value();
  for (const completion& how : all_strategies) {
    CAPTURE(to_string(how.kind));
    REQUIRE(kernels.spin(s.native_handle(), 50) == cudaSuccess);
    asio::io_context other;
    std::optional<result<void>> got;
    how.async_wait(s, asio::bind_executor(other, [&](result<void> r) { got = r; }));
    std::thread device_io([&] {
      ioc.restart();
      ioc.run_for(5s);
    });
    const auto t0 = std::chrono::steady_clock::now();
    other.run();
    const auto took = std::chrono::steady_clock::now() - t0;
    device_io.join();
    REQUIRE(got);
    CHECK(*got);
    CHECK(took >= 20ms);  // it waited for the spin, not for nothing
  }
}

TEST_CASE_FIXTURE(long_gemm, "a 1 us timeout on a long kernel yields timeout; inputs live on") {
  for (const completion& base : all_strategies) {
    CAPTURE(to_string(base.kind));
    completion how = base;
    how.timeout = 1us;
    REQUIRE(run(fill_bytes(c, 0xFF, {.on = s})));  // NaN: only this run's gemm can pass
    const auto live_before = dev.statistics().live_buffers;
    auto a = upload_floats(av, s);
    auto b = upload_floats(bv, s);
    auto t0 = std::chrono::steady_clock::now();
    auto r = run(sgemm(blas, s, how, std::move(a), std::move(b), c, long_n, long_repeat));
    auto waited = std::chrono::steady_clock::now() - t0;
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::timeout);
    CHECK(r.error().library() == "cublas");
    CHECK(waited < 20ms);  // returned well before the kernel could have finished
    CHECK(cudaStreamQuery(s.native_handle()) == cudaErrorNotReady);
    check_abandoned_inputs_survive(live_before);
  }
}

TEST_CASE_FIXTURE(long_gemm, "cancelling by awaitable_operators || a timer; inputs live on") {
  using namespace asio::experimental::awaitable_operators;
  for (const completion& how : all_strategies) {
    CAPTURE(to_string(how.kind));
    REQUIRE(run(fill_bytes(c, 0xFF, {.on = s})));  // NaN: only this run's gemm can pass
    const auto live_before = dev.statistics().live_buffers;
    auto a = upload_floats(av, s);
    auto b = upload_floats(bv, s);
    auto winner = run([&]() -> asio::awaitable<std::size_t> {
      asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
      auto v = co_await (sgemm(blas, s, how, std::move(a), std::move(b), c, long_n, long_repeat) ||
                         t.async_wait(asio::use_awaitable));
      co_return v.index();
    }());
    CHECK(winner == 1);  // the timer won; the gemm's wait was cancelled
    CHECK(cudaStreamQuery(s.native_handle()) == cudaErrorNotReady);
    check_abandoned_inputs_survive(live_before);
  }
}

TEST_CASE_FIXTURE(long_gemm, "per-operation cancellation yields cancelled") {
  for (const completion& how : all_strategies) {
    CAPTURE(to_string(how.kind));
    REQUIRE(run(fill_bytes(c, 0xFF, {.on = s})));  // NaN: only this run's gemm can pass
    const auto live_before = dev.statistics().live_buffers;
    auto a = upload_floats(av, s);
    auto b = upload_floats(bv, s);
    asio::cancellation_signal sig;
    std::optional<result<gpu_ref<float>>> got;
    auto body = [&]() -> asio::awaitable<void> {
      got.emplace(co_await sgemm(blas, s, how, std::move(a), std::move(b), c, long_n, long_repeat));
      ioc.stop();  // before the parked keep-alive is released (the device keeps the context busy)
    };
    asio::co_spawn(ioc, body(), asio::bind_cancellation_slot(sig.slot(), asio::detached));
    asio::steady_timer t(ioc, 1ms);
    t.async_wait([&](boost::system::error_code) { sig.emit(asio::cancellation_type::terminal); });
    ioc.restart();
    ioc.run_for(limit);
    REQUIRE(got);
    REQUIRE_FALSE(*got);
    CHECK(got->error().code() == errc::cancelled);
    check_abandoned_inputs_survive(live_before);
  }
}

TEST_CASE_FIXTURE(long_gemm, "waiting never blocks the io_context thread") {
  for (const completion& how : all_strategies) {
    CAPTURE(to_string(how.kind));
    auto a = upload_floats(av, s);
    auto b = upload_floats(bv, s);
    std::vector<std::chrono::steady_clock::time_point> ticks;
    auto gemm_done = std::chrono::steady_clock::time_point{};
    auto r = run([&]() -> asio::awaitable<result<void>> {
      auto ex = co_await asio::this_coro::executor;
      // A 1 ms ticker on the same single-threaded io_context keeps ticking while we wait.
      asio::co_spawn(
          ex,
          [&]() -> asio::awaitable<void> {
            asio::steady_timer t(co_await asio::this_coro::executor);
            for (int i = 0; i < 10; ++i) {
              t.expires_after(1ms);
              co_await t.async_wait(asio::use_awaitable);
              ticks.push_back(std::chrono::steady_clock::now());
            }
          },
          asio::detached);
      auto g = co_await sgemm(blas, s, how, a, b, c, long_n, long_repeat);
      gemm_done = std::chrono::steady_clock::now();
      if (!g) co_return g.error();
      co_return outcome::success();
    }());
    REQUIRE(r);
    REQUIRE(ticks.size() == 10);
    CHECK(ticks[4] < gemm_done);  // the ticker ran while the gemm was being awaited
  }
}

namespace {
/// Awaits `op` into `out`; stops the io_context when the last one is done.
template <class T>
asio::awaitable<void> await_into(asio::awaitable<T> op, std::optional<T>& out, int& pending,
                                 asio::io_context& ioc) {
  out.emplace(co_await std::move(op));
  if (--pending == 0) ioc.stop();
}
}  // namespace

/// Small gemms queued behind a long one on the same stream, a refused
/// enqueue and a cancelled one, on a device whose batches run on the io
/// thread (`launch_threads` 0) or on its launch threads.
struct batched_behind_busy_stream : long_gemm {
  explicit batched_behind_busy_stream(const device_options& o) : long_gemm(o) {}
  explicit batched_behind_busy_stream(std::size_t launch_threads)
      : long_gemm(device_options{.launch_threads = launch_threads}) {}
  void check();
};

void batched_behind_busy_stream::check() {
  const bool on_launch_threads = dev.options().launch_threads > 0;
  constexpr int n = 64;
  constexpr int k = 32;
  const auto nn = std::size_t{n} * n;
  std::vector<std::vector<float>> sav, sbv;
  std::vector<gpu_ref<float>> sa, sb, sc;
  for (int i = 0; i < k; ++i) {
    sav.push_back(random_floats(nn, 100 + 2 * static_cast<std::uint64_t>(i)));
    sbv.push_back(random_floats(nn, 101 + 2 * static_cast<std::uint64_t>(i)));
    sa.push_back(upload_floats(sav.back(), s));
    sb.push_back(upload_floats(sbv.back(), s));
    sc.push_back(alloc<float>(nn));
    REQUIRE(run(fill_bytes(sc.back(), 0xFF, {.on = s})));  // NaN: only the gemm can fix it
  }
  auto c_cancel = alloc<float>(nn);
  REQUIRE(run(fill_bytes(c_cancel, 0xFF, {.on = s})));
  REQUIRE(run(fill_bytes(c, 0xFF, {.on = s})));
  auto a = upload_floats(av, s);
  auto b = upload_floats(bv, s);
  const auto before = dev.statistics();

  // One long gemm makes the stream busy; everything after it on the same
  // stream joins a batch (single-threaded io_context: start order is spawn order).
  using gemm_result = result<gpu_ref<float>>;
  std::optional<gemm_result> long_r, cancelled_r;
  std::vector<std::optional<gemm_result>> small(k);
  std::optional<result<int>> refused;
  std::thread::id refused_on{};
  int pending = k + 3;
  asio::co_spawn(
      ioc,
      await_into(sgemm(blas, s, event_poll{}, a, b, c, long_n, long_repeat), long_r, pending, ioc),
      asio::detached);
  for (int i = 0; i < k; ++i)
    asio::co_spawn(
        ioc,
        await_into(sgemm(blas, s, event_poll{}, sa[i], sb[i], sc[i], n), small[i], pending, ioc),
        asio::detached);
  asio::co_spawn(ioc,
                 await_into(run_kernel("test", s, event_poll{}, 7,
                                       [&](launch&) -> result<int> {
                                         refused_on = std::this_thread::get_id();
                                         return make_error(errc::invalid_argument,
                                                           "refused by the test");
                                       }),
                            refused, pending, ioc),
                 asio::detached);
  asio::cancellation_signal sig;
  asio::co_spawn(ioc,
                 await_into(sgemm(blas, s, event_poll{}, sa[0], sb[0], c_cancel, n), cancelled_r,
                            pending, ioc),
                 asio::bind_cancellation_slot(sig.slot(), asio::detached));
  // Runs after every coroutine above has queued its work: before the drain
  // when it is posted to this io_context; a launch thread may be faster.
  asio::post(ioc, [&] { sig.emit(asio::cancellation_type::terminal); });
  ioc.restart();
  ioc.run_for(limit);
  REQUIRE(pending == 0);

  REQUIRE(long_r);
  REQUIRE(*long_r);
  for (int i = 0; i < k; ++i) {
    CAPTURE(i);
    REQUIRE(small[i]);
    REQUIRE(*small[i]);
    CHECK(gemm_rel_error(sav[i], sbv[i], download_floats(sc[i]), n) < 1e-5);
  }
  CHECK(gemm_rel_error(av, bv, download_floats(c), long_n, 256) < 1e-5);
  REQUIRE(refused);
  REQUIRE_FALSE(*refused);
  CHECK(refused->error().code() == errc::invalid_argument);
  CHECK(refused->error().message().find("refused by the test") != std::string::npos);
  // The queued enqueues ran where the device's batches run: on this (the
  // only io) thread, or on a launch thread.
  CHECK((refused_on == std::this_thread::get_id()) == !on_launch_threads);
  REQUIRE(cancelled_r);
  REQUIRE_FALSE(*cancelled_r);
  CHECK(cancelled_r->error().code() == errc::cancelled);
  REQUIRE(cudaStreamSynchronize(s.native_handle()) == cudaSuccess);
  const auto cancelled_out = download_floats(c_cancel);
  const bool launched = !std::isnan(cancelled_out[0]);
  if (!on_launch_threads) {
    // Cancelled while queued: never launched, so its output is still all NaN.
    CHECK_FALSE(launched);
    for (float v : cancelled_out) REQUIRE(std::isnan(v));
  } else if (launched) {
    // The launch thread had enqueued it: the wait ended, the gemm ran whole.
    CHECK(gemm_rel_error(sav[0], sbv[0], cancelled_out, n) < 1e-5);
  }

  const auto after = dev.statistics();
  CHECK(after.ops_batched - before.ops_batched ==
        static_cast<std::uint64_t>(k + (launched ? 1 : 0)));
  CHECK(after.batches - before.batches >= 1);
  CHECK(after.batches - before.batches <= static_cast<std::uint64_t>(k));
  CHECK(after.parked == 0);
  CHECK(after.ops_in_flight == 0);
  // The stream's launch thread was started for its batch (and is counted);
  // without launch threads none is.
  CHECK((after.library_threads >= 1) == on_launch_threads);
  CHECK(after.library_threads <= dev.options().launch_threads);
  // With no more work, a launch thread looks for launch_spin, then sleeps
  // (counted); without launch threads nothing sleeps.
  auto sleeps = after.launch_sleeps;
  for (int i = 0; i < 1000 && on_launch_threads && sleeps == before.launch_sleeps; ++i) {
    std::this_thread::sleep_for(1ms);
    sleeps = dev.statistics().launch_sleeps;
  }
  CHECK((sleeps > before.launch_sleeps) == on_launch_threads);
}

TEST_CASE(
    "work queued behind a busy stream is batched, right, failed alone, or cancelled before "
    "it launches (batches on the io thread)") {
  batched_behind_busy_stream(0).check();
}

TEST_CASE(
    "work queued behind a busy stream is batched on a launch thread, right, failed alone, "
    "or cancelled") {
  batched_behind_busy_stream(2).check();
}

TEST_CASE(
    "work queued behind a busy stream is batched on a launch thread, right, failed alone, "
    "or cancelled, with the poller asking at most every 50 us while a batch launches, and "
    "launch threads that sleep at once when out of work") {
  batched_behind_busy_stream(device_options{.launch_threads = 2,
                                            .busy_poll_interval = std::chrono::microseconds(50),
                                            .launch_spin = std::chrono::microseconds(0)})
      .check();
}

// A blocking_sync wait that timed out is still in the device's worker thread
// (inside cudaEventSynchronize) when the caller drops the stream, the device
// and the io_context: the worker's item may then hold the device's last
// reference. Regression: the device used to be destroyed on the worker
// thread, which then locked the freed device's mutex (and the device's strand
// and timer outlived their io_context): a fault test crashed at exit.
// Teardown must wait for the worker, and a device opened afterwards is a
// fresh one that works.
TEST_CASE("dropping device and io_context while a blocking_sync wait is still pending") {
  using clock = std::chrono::steady_clock;
  constexpr double kernel_ms = 30;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    clock::time_point launched{}, torn_down{};
    {
      asio::io_context ioc;
      auto dev = device::open(ioc.get_executor(), 0);
      REQUIRE(dev);
      test_kernels kernels;
      auto s = dev.value().acquire_stream(stream_policy::per_actor_fresh).value();
      completion how = blocking_sync{};
      how.timeout = 1ms;
      std::optional<result<int>> r;
      asio::co_spawn(
          ioc,
          [&]() -> asio::awaitable<void> {
            r.emplace(co_await run_kernel("cuda", s, how, 0, [&](launch& l) -> result<int> {
              launched = clock::now();
              if (auto st = kernels.spin(l.native_stream(), kernel_ms); st != cudaSuccess)
                return classify(st, "cudaLaunchKernel(spin)");
              return 0;
            }));
          },
          [&](std::exception_ptr) { ioc.stop(); });
      ioc.run_for(10s);
      REQUIRE(r);
      REQUIRE_FALSE(*r);
      CHECK(r->error().code() == errc::timeout);
      // The kernel is still running (the wait gave up after 1 ms).
      CHECK(cudaStreamQuery(s.native_handle()) == cudaErrorNotReady);
      CHECK(dev.value().statistics().parked == 1);
      // Leaving the scope drops s, kernels, dev, then destroys ioc.
    }
    torn_down = clock::now();
    // Destroying the io_context waited for the abandoned kernel (parked
    // keep-alive, blocking worker) instead of leaving it to another thread.
    CHECK(torn_down - launched >= std::chrono::duration<double, std::milli>(kernel_ms * 0.9));

    asio::io_context ioc2;
    auto again = device::open(ioc2.get_executor(), 0);
    REQUIRE(again);
    CHECK(again.value().health() == health_state::healthy);
    CHECK(again.value().statistics().ops_failed == 0);  // a fresh device, not the old one
    std::optional<result<int>> ok;
    asio::co_spawn(
        ioc2,
        [&]() -> asio::awaitable<void> {
          ok.emplace(co_await run_kernel("cuda", again.value().main_stream(), blocking_sync{}, 7,
                                         [](launch&) -> result<int> { return 0; }));
        },
        [&](std::exception_ptr) { ioc2.stop(); });
    ioc2.run_for(10s);
    REQUIRE(ok);
    REQUIRE(*ok);
    CHECK(ok->value() == 7);
  }
}

// The io_context is destroyed while a launch thread may be enqueuing a busy
// stream's queue (the coroutines are suspended, their frames hold the
// enqueues): teardown stops the launch threads before it drops the queued
// work, nothing crashes or hangs, and a device opened afterwards works.
TEST_CASE("dropping the io_context while launch threads drain a busy stream") {
  constexpr std::int64_t big = 8192, small = 64;  // ~20 ms, then 64 small ones
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    std::uint64_t in_flight = 0;
    {
      asio::io_context ioc;
      auto dev = device::open(ioc.get_executor(), 0, device_options{.launch_threads = 2});
      REQUIRE(dev);
      auto blas = blas_actor::create(dev.value());
      REQUIRE(blas);
      auto a = dev.value().allocate<float>(big * big).value();
      auto c = dev.value().allocate<float>(big * big).value();
      const gemm_params pb{.m = big, .n = big, .k = big, .lda = big, .ldb = big, .ldc = big};
      const gemm_params ps{
          .m = small, .n = small, .k = small, .lda = small, .ldb = small, .ldc = small};
      std::vector<gpu_ref<float>> outs;
      for (int i = 0; i < 64; ++i)
        outs.push_back(dev.value().allocate<float>(small * small).value());
      // Parameters, not captures: they live in the coroutine frame.
      auto gemm = [](blas_actor b, gemm_params p, gpu_ref<float> x,
                     gpu_ref<float> y) -> asio::awaitable<void> {
        (void)co_await b.gemm(p, x, x, y);
      };
      asio::co_spawn(ioc, gemm(blas.value(), pb, a, c), asio::detached);
      for (auto& o : outs) asio::co_spawn(ioc, gemm(blas.value(), ps, a, o), asio::detached);
      ioc.run_for(2ms);
      in_flight = dev.value().statistics().ops_in_flight;
    }
    CHECK(in_flight > 0);  // something was still queued or running at teardown
    asio::io_context ioc2;
    auto again = device::open(ioc2.get_executor(), 0);
    REQUIRE(again);
    CHECK(again.value().health() == health_state::healthy);
    CHECK(again.value().statistics().ops_in_flight == 0);  // a fresh device
  }
}

TEST_CASE_FIXTURE(gpu_fixture,
                  "a wait ended by stop() parks its keep-alives until the GPU is done (a queued "
                  "download's staging block is not reused early)") {
  test_kernels kernels;
  const std::size_t n = std::size_t{1} << 20;
  auto src = alloc<float>(n);
  REQUIRE(run(fill_bytes(src, 0)));
  // A 300 ms spin on the main stream, then a pageable download queued behind it.
  auto s = dev.main_stream();
  REQUIRE(kernels.spin(s.native_handle(), 300) == cudaSuccess);
  std::vector<float> out(n, -1.0f);
  std::optional<result<void>> got;
  asio::co_spawn(
      ioc, [&]() -> asio::awaitable<void> { got.emplace(co_await download(src, std::span(out))); },
      asio::detached);
  // Until the download has enqueued its DMA and waits.
  REQUIRE(run_until([&] { return dev.statistics().ops_in_flight > 0; }));
  const auto before = dev.statistics().parked;
  dev.stop();
  REQUIRE(run_until([&] { return got.has_value(); }));
  REQUIRE_FALSE(*got);
  CHECK(got->error().code() == errc::device_unavailable);
  // The DMA is still queued behind the spin: its staging block (and the
  // source) are parked, not handed back to the pinned pool.
  CHECK(cudaStreamQuery(s.native_handle()) == cudaErrorNotReady);
  CHECK(dev.statistics().parked == before + 1);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == -1.0f; }));
  // The device's monitor lets it go once the GPU is done.
  REQUIRE(run_until([&] { return dev.statistics().parked == before; }, 5s));
}
