// compose(): several operations of several actors and streams as one unit,
// awaited once (issue 19, "Composition").
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {

struct compose_fixture : gpu_fixture {
  blas_actor blas = blas_actor::create(dev).value();

  /// Every counter a unit moves, back where it was once `before` was taken.
  void check_settled(const device_statistics& before, std::uint64_t completed,
                     std::uint64_t failed) {
    drain_parked();
    const auto now = dev.statistics();
    CHECK(now.ops_in_flight == before.ops_in_flight);
    CHECK(now.ops_completed == before.ops_completed + completed);
    CHECK(now.ops_failed == before.ops_failed + failed);
    CHECK(now.parked == 0);
  }
};

bool all_nan(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

}  // namespace

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: upload, gemm, activation, download in one unit give the numbers of "
                  "a double-precision reference") {
  constexpr int n = 256;
  const auto xv = random_floats(n * n, 11), wv = random_floats(n * n, 12);
  auto w = alloc<float>(n * n);
  REQUIRE(run(upload(wv, w)));
  const auto buffers_before = dev.statistics().live_buffers;
  {
    auto x = nan_floats(n * n), y = nan_floats(n * n), z = nan_floats(n * n);
    const auto before = dev.statistics();
    std::vector<float> out(n * n, std::nanf(""));
#if ATOMR_CUDA_HAS_CUDNN
    auto dnn = cudnn_actor::create(dev).value();
    auto last = dnn.activation_forward({1, 1, n, n}, {}, y, z);
#else
    auto last = copy(y, z);  // no cuDNN: the relu is applied on the host below
#endif
    auto r = run(compose(dev, upload(xv, x), blas.gemm(square(n), x, w, y), std::move(last),
                         download(z, out)));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(std::get<0>(r.value()).size() == x.size());
    double num = 0, den = 0;
    for (int c = 0; c < n; ++c)
      for (int row = 0; row < n; ++row) {
        double ref = gemm_ref(xv, wv, n, row, c);
#if ATOMR_CUDA_HAS_CUDNN
        ref = std::max(ref, 0.0);
        const double got = out[static_cast<std::size_t>(c) * n + row];
#else
        const double got = std::max(0.0, double(out[static_cast<std::size_t>(c) * n + row]));
        ref = std::max(ref, 0.0);
#endif
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
    CHECK(std::sqrt(num / den) < 1e-5);
    check_settled(before, 4, 0);
  }
  CHECK(dev.statistics().live_buffers == buffers_before);
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: steps on other streams wait for the steps whose buffers they use") {
  // A long gemm on the actor's stream, then a copy and a download on the
  // main stream (given: a unit's transfer would follow its previous step's
  // stream): without the event wait the copy would read NaN.
  constexpr int n = 2048;
  const auto av = random_floats(std::size_t{n} * n, 3), bv = random_floats(std::size_t{n} * n, 4);
  auto a = alloc<float>(av.size()), b = alloc<float>(bv.size());
  REQUIRE(run(upload(av, a)));
  REQUIRE(run(upload(bv, b)));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto c = nan_floats(av.size()), d = nan_floats(av.size());
    std::vector<float> out(av.size(), std::nanf(""));
    auto r = run(compose(dev, blas.gemm(square(n), a, b, c), copy(c, d, {.on = dev.main_stream()}),
                         download(d, out)));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(gemm_rel_error(av, bv, out, n, 512) < 1e-5);
  }
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: a step failing before its enqueue stops the unit there and is "
                  "named; the steps before it finish, none after it starts") {
  constexpr std::size_t len = 4096;
  auto first = nan_floats(len), third = nan_floats(len);
  const auto before = dev.statistics();
  const std::vector<float> wrong(len + 1, 1.0f);
  auto second = alloc<float>(len);
  auto r = run(compose(dev, fill_bytes(first, 0), upload(wrong, second), fill_bytes(third, 0)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("compose: step 2 of 3") != std::string::npos);
  CHECK(r.error().message().find("upload") != std::string::npos);
  check_settled(before, 0, 1);  // step 1 was enqueued: it counts as failed with the unit
  auto f = download_floats(first);
  CHECK(std::all_of(f.begin(), f.end(), [](float x) { return x == 0.0f; }));  // step 1 ran
  CHECK(all_nan(download_floats(third)));                                     // step 3 did not

  // The same with a failure inside the enqueue (run_kernel's function).
  auto refuse = run_kernel("cuda", dev.main_stream(), third, [](launch&) -> result<int> {
    return make_error(errc::invalid_argument, "refused by the test");
  });
  auto r2 = run(compose(dev, fill_bytes(first, 0xFF), std::move(refuse), fill_bytes(third, 0)));
  REQUIRE_FALSE(r2);
  CHECK(r2.error().message().find("compose: step 2 of 3") != std::string::npos);
  CHECK(r2.error().message().find("refused by the test") != std::string::npos);
  CHECK(all_nan(download_floats(first)));
  CHECK(all_nan(download_floats(third)));
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: operations that yield a GPU-computed host value are refused") {
  auto x = alloc<float>(64);
  REQUIRE(run(fill_bytes(x, 0)));
  auto r = run(compose(dev, fill_bytes(x, 0), blas.dot(64, x, x)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::not_supported);
  CHECK(r.error().message().find("compose: step 2 of 2") != std::string::npos);
  // Outside a unit it works as always.
  auto d = run(blas.dot(64, x, x));
  REQUIRE(d);
  CHECK(d.value() == 0.0f);
  // A unit inside a unit is refused too.
  auto nested = [&]() -> asio::awaitable<result<int>> {
    auto inner = co_await compose(dev, fill_bytes(x, 0));
    if (!inner) co_return inner.error();
    co_return 1;
  };
  auto r3 = run(compose(dev, nested()));
  REQUIRE_FALSE(r3);
  CHECK(r3.error().code() == errc::not_supported);
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: a timeout or a cancellation of the unit's wait parks every step "
                  "until the GPU is done; then all is released") {
  test_kernels kernels;
  auto spin_step = [&](double ms) {
    auto tiny = alloc<int>(1);
    return run_kernel("cuda", dev.main_stream(), tiny,
                      [&kernels, ms](launch& l) -> result<std::tuple<>> {
                        if (auto e = kernels.spin(l.native_stream(), ms); e != cudaSuccess)
                          return classify(e, "cudaLaunchKernel");
                        return std::tuple<>{};
                      });
  };
  const auto buffers_before = dev.statistics().live_buffers;
  {
    auto out = nan_floats(1 << 16);
    std::vector<float> host(out.size(), 1.0f);
    const auto before = dev.statistics();
    auto r =
        run(compose(dev, event_poll(5ms), spin_step(200), fill_bytes(out, 0), download(out, host)));
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::timeout);
    CHECK(dev.statistics().parked > 0);
    // The pageable target is written only when a unit succeeds.
    CHECK(std::all_of(host.begin(), host.end(), [](float x) { return x == 1.0f; }));
    check_settled(before, 0, 3);
    auto got = download_floats(out);  // the GPU did run the fill after the spin
    CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 0.0f; }));

    // Cancelled while waiting.
    const auto before2 = dev.statistics();
    asio::cancellation_signal sig;
    std::optional<result<std::tuple<gpu_ref<int>, gpu_ref<float>>>> res;
    auto body = [&]() -> asio::awaitable<void> {
      res.emplace(co_await compose(dev, spin_step(200), fill_bytes(out, 0xFF)));
    };
    asio::co_spawn(ioc, body(), asio::bind_cancellation_slot(sig.slot(), asio::detached));
    asio::steady_timer t(ioc, 20ms);
    t.async_wait([&](auto) { sig.emit(asio::cancellation_type::terminal); });
    ioc.restart();
    ioc.run_for(5s);
    REQUIRE(res);
    REQUIRE_FALSE(*res);
    CHECK(res->error().code() == errc::cancelled);
    check_settled(before2, 0, 2);
  }
  CHECK(dev.statistics().live_buffers == buffers_before);
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: a unit's transfers with no stream given do not queue behind another "
                  "unit's on one shared stream") {
  // Unit A: a 300 ms kernel on a stream of its own writes `a`, then a download
  // of `a` (no stream given), enqueued at once and waiting on the GPU for the
  // kernel. Unit B, started 20 ms later: an upload and a download of its own
  // buffer. Were both units' transfers on the device's main stream, B's
  // upload would queue behind A's download and finish after A.
  test_kernels kernels;
  auto own = dev.acquire_stream(stream_policy::per_actor_fresh, "test").value();
  auto a = alloc<int>(1024), b = alloc<int>(1024);
  std::vector<int> out_a(1024, -1), in_b(1024, 7), out_b(1024, -1);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::duration> done_a, done_b;
  bool ok_a = false, ok_b = false;
  auto unit_a = [&]() -> asio::awaitable<void> {
    auto spin = run_kernel("cuda", own, a, [&kernels, a](launch& l) -> result<std::tuple<>> {
      BOOST_OUTCOME_TRY(int* p, l.write(a));
      if (auto e = cudaMemsetAsync(p, 0, a.size_bytes(), l.native_stream()); e != cudaSuccess)
        return classify(e, "cudaMemsetAsync");
      if (auto e = kernels.spin(l.native_stream(), 300, p); e != cudaSuccess)
        return classify(e, "cudaLaunchKernel");
      return std::tuple<>{};
    });
    ok_a = bool(co_await compose(dev, std::move(spin), download(a, out_a)));
    done_a = std::chrono::steady_clock::now() - t0;
  };
  auto unit_b = [&]() -> asio::awaitable<void> {
    ok_b = bool(co_await compose(dev, upload(in_b, b), download(b, out_b)));
    done_b = std::chrono::steady_clock::now() - t0;
  };
  asio::co_spawn(ioc, unit_a(), asio::detached);
  asio::steady_timer later(ioc, 20ms);
  later.async_wait([&](auto) { asio::co_spawn(ioc, unit_b(), asio::detached); });
  ioc.restart();
  ioc.run_for(10s);
  REQUIRE(done_a);
  REQUIRE(done_b);
  CHECK(ok_a);
  CHECK(ok_b);
  CHECK(*done_b < *done_a);
  CHECK(*done_b < 250ms);
  CHECK(out_a[0] == 1);  // the spin kernel's mark: the download waited for it
  CHECK(std::all_of(out_a.begin() + 1, out_a.end(), [](int x) { return x == 0; }));
  CHECK(std::all_of(out_b.begin(), out_b.end(), [](int x) { return x == 7; }));
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: a leading upload goes on its next step's stream, and consecutive "
                  "steps on one stream share one event (device_statistics::unit_events)") {
  // Step 1, an upload given no stream, is enqueued on the gemm's lane stream
  // just before the gemm, and the two share one event; then a copy on the
  // main stream (its own event, after a wait on the gemm's), and a download
  // following it on the main stream (sharing the copy's event). A missing
  // wait anywhere shows as NaN in `out`.
  constexpr int n = 1024;
  const auto av = random_floats(std::size_t{n} * n, 21), bv = random_floats(std::size_t{n} * n, 22);
  auto b = alloc<float>(bv.size());
  REQUIRE(run(upload(bv, b)));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto a = nan_floats(av.size()), c = nan_floats(av.size()), d = nan_floats(av.size());
    std::vector<float> out(av.size(), std::nanf(""));
    const auto before = dev.statistics();
    auto r = run(compose(dev, upload(av, a), blas.gemm(square(n), a, b, c),
                         copy(c, d, {.on = dev.main_stream()}), download(d, out)));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(gemm_rel_error(av, bv, out, n, 256) < 1e-5);
    // Before: upload (pooled), gemm (lane), copy (main), download: 4 events.
    CHECK(dev.statistics().unit_events - before.unit_events == 2);
    check_settled(before, 4, 0);
  }
  // Upload then gemm alone: one stream, one event (the upload on a pooled
  // stream would have needed its own, and a cross-stream wait).
  auto a = nan_floats(av.size()), c = nan_floats(av.size());
  const auto before = dev.statistics();
  auto r = run(compose(dev, upload(av, a), blas.gemm(square(n), a, b, c)));
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  CHECK(dev.statistics().unit_events - before.unit_events == 1);
  CHECK(gemm_rel_error(av, bv, download_floats(c), n, 256) < 1e-5);
  // Transfers only: deferred to the unit's end, then on one pooled stream.
  std::vector<float> back(av.size(), std::nanf(""));
  const auto before2 = dev.statistics();
  auto t = run(compose(dev, upload(av, a), download(a, back)));
  REQUIRE_MESSAGE(t, (t ? "" : t.error().message()));
  CHECK(back == av);
  CHECK(dev.statistics().unit_events - before2.unit_events == 1);
  check_settled(before2, 2, 0);
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: an operation outside the unit that meets a step's buffer before the "
                  "step's run has ended waits for it (the run's event is recorded then)") {
  // The gemm's event is not recorded at its enqueue (the run may go on on
  // its stream); a copy awaited by a step on a coroutine of its own (outside
  // the unit, on the main stream) meets c's stamp and must record it and wait.
  constexpr int n = 2048;
  const auto av = random_floats(std::size_t{n} * n, 31), bv = random_floats(std::size_t{n} * n, 32);
  auto a = alloc<float>(av.size()), b = alloc<float>(bv.size());
  REQUIRE(run(upload(av, a)));
  REQUIRE(run(upload(bv, b)));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto c = nan_floats(av.size()), d = nan_floats(av.size());
    auto outside = [&]() -> asio::awaitable<result<gpu_ref<float>>> {
      co_return co_await async_from(dev.get_executor(), copy(c, d, {.on = dev.main_stream()}),
                                    asio::use_awaitable);
    };
    auto r = run(compose(dev, blas.gemm(square(n), a, b, c), outside()));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(gemm_rel_error(av, bv, download_floats(d), n, 512) < 1e-5);
  }
}

TEST_CASE_FIXTURE(compose_fixture,
                  "compose: a leading transfer that fails when its next step enqueues it is "
                  "named as its own step; the next step does not run") {
  constexpr std::size_t len = 4096;
  const std::vector<float> ones(len, 1.0f);
  auto x = nan_floats(len), y = nan_floats(len);
  completion bad;
  bad.timeout = std::chrono::nanoseconds{-1};  // checked when the upload is enqueued
  const auto before = dev.statistics();
  auto r =
      run(compose(dev, upload(ones, x, {.how = bad}), fill_bytes(y, 0, {.on = dev.main_stream()})));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("compose: step 1 of 2") != std::string::npos);
  check_settled(before, 0, 1);  // the upload failed; the fill never started
  CHECK(all_nan(download_floats(x)));
  CHECK(all_nan(download_floats(y)));
}
