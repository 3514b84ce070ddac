// record() / replay() / graph_cache: a unit recorded into a CUDA graph and
// replayed (issue 19, "CUDA graphs, user-facing").
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {

struct graph_fixture : gpu_fixture {
  blas_actor blas = blas_actor::create(dev).value();

  pinned_buffer<float> pinned(std::size_t n) { return dev.allocate_pinned<float>(n).value(); }
  static void put(pinned_buffer<float>& p, const std::vector<float>& v) {
    std::memcpy(static_cast<void*>(p.data()), v.data(), v.size() * sizeof(float));
  }
  static std::vector<float> get(const pinned_buffer<float>& p) {
    return std::vector<float>(p.data(), p.data() + p.size());
  }
  /// relu(X W) against a double-precision reference, relative L2 error.
  static double relu_gemm_error(const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& out, int n, bool relu) {
    double num = 0, den = 0;
    for (int c = 0; c < n; ++c)
      for (int r = 0; r < n; ++r) {
        double ref = gemm_ref(x, w, n, r, c);
        if (relu) ref = std::max(ref, 0.0);
        const double d = out[static_cast<std::size_t>(c) * n + r] - ref;
        num += d * d;
        den += ref * ref;
      }
    return std::sqrt(num / den);
  }
};

template <class V>
std::string why(const result<V>& r) {
  return r ? std::string() : r.error().message();
}

}  // namespace

TEST_CASE_FIXTURE(graph_fixture,
                  "record: upload, gemm, relu, download recorded once; each replay with new "
                  "pinned inputs gives the double-precision reference") {
  constexpr int n = 256;
  const auto wv = random_floats(n * n, 21);
  auto w = alloc<float>(n * n);
  REQUIRE(run(upload(wv, w)));
  const auto buffers_before = dev.statistics().live_buffers;
  {
    auto x = nan_floats(n * n), y = nan_floats(n * n), z = nan_floats(n * n);
    auto in = pinned(n * n), out = pinned(n * n);
    std::fill(out.data(), out.data() + out.size(), std::nanf(""));
#if ATOMR_CUDA_HAS_CUDNN
    auto dnn = cudnn_actor::create(dev).value();
    auto relu_step = dnn.activation_forward({1, 1, n, n}, {}, y, z);
    constexpr bool relu = true;
#else
    auto relu_step = copy(y, z);
    constexpr bool relu = false;
#endif
    const auto base = dev.statistics();
    auto unit = run(record(dev, upload(in, x), blas.gemm(square(n), x, w, y), std::move(relu_step),
                           download(z, out)));
    REQUIRE_MESSAGE(unit, why(unit));
    CHECK(unit.value().steps() == 4);
    CHECK(unit.value().nodes() >= 4);
    CHECK(unit.value().replays() == 0);
    // Recording ran nothing.
    CHECK(std::isnan(get(out)[0]));
    for (int round = 0; round < 3; ++round) {
      CAPTURE(round);
      const auto xv = random_floats(n * n, 100 + round);
      put(in, xv);
      auto r = run(replay(unit.value()));
      REQUIRE_MESSAGE(r, why(r));
      CHECK(relu_gemm_error(xv, wv, get(out), n, relu) < 1e-5);
    }
    CHECK(unit.value().replays() == 3);
    drain_parked();
    const auto now = dev.statistics();
    CHECK(now.ops_in_flight == base.ops_in_flight);
    CHECK(now.ops_completed == base.ops_completed + 3);  // one per replay, none for the record
    CHECK(now.parked == 0);
  }
  drain_parked();
  CHECK(dev.statistics().live_buffers == buffers_before);
}

TEST_CASE_FIXTURE(graph_fixture,
                  "replay with the same buffers is bit-identical to the steps run unrecorded "
                  "(sgemm through cuBLASLt, dgemm, FFT, convolution)") {
  constexpr int n = 192;
  const auto av = random_floats(n * n, 1), bv = random_floats(n * n, 2);
  auto a = alloc<float>(n * n), b = alloc<float>(n * n), c = nan_floats(n * n);
  REQUIRE(run(upload(av, a)));
  REQUIRE(run(upload(bv, b)));
  std::vector<double> ad(av.begin(), av.end()), bd(bv.begin(), bv.end());
  auto a64 = alloc<double>(ad.size()), b64 = alloc<double>(bd.size()),
       c64 = alloc<double>(ad.size());
  REQUIRE(run(upload(ad, a64)));
  REQUIRE(run(upload(bd, b64)));
#if ATOMR_CUDA_HAS_CUFFT
  auto fft = fft_actor::create(dev).value();
  const fft_shape fs{.rank = 2, .dims = {64, 128, 1}, .batch = 3, .normalize = true};
  std::vector<std::complex<float>> fv(64 * 128 * 3);
  {
    const auto re = random_floats(fv.size(), 5), im = random_floats(fv.size(), 6);
    for (std::size_t i = 0; i < fv.size(); ++i) fv[i] = {re[i], im[i]};
  }
  auto fin = alloc<std::complex<float>>(fv.size()), fout = alloc<std::complex<float>>(fv.size());
  REQUIRE(run(upload(fv, fin)));
  auto third = [&] { return fft.c2c(fs, fin, fout); };
#else
  auto spare = alloc<double>(ad.size());
  auto third = [&] { return copy(c64, spare); };  // no cuFFT: a device copy stands in
#endif

  // Unrecorded, as one unit.
  auto direct = run(
      compose(dev, blas.gemm(square(n), a, b, c), blas.gemm(square(n), a64, b64, c64), third()));
  REQUIRE_MESSAGE(direct, why(direct));
  const auto c_direct = download_floats(c);
  std::vector<double> c64_direct(ad.size());
  REQUIRE(run(download(c64, c64_direct)));
#if ATOMR_CUDA_HAS_CUFFT
  std::vector<std::complex<float>> f_direct(fv.size());
  REQUIRE(run(download(fout, f_direct)));
#endif
  CHECK(gemm_rel_error(av, bv, c_direct, n, 256) < 1e-5);

  // Clobber the outputs, then the recorded replay.
  REQUIRE(run(fill_bytes(c, 0xFF)));
  REQUIRE(run(fill_bytes(c64, 0xFF)));
#if ATOMR_CUDA_HAS_CUFFT
  REQUIRE(run(fill_bytes(fout, 0xFF)));
#endif
  auto unit =
      run(record(dev, blas.gemm(square(n), a, b, c), blas.gemm(square(n), a64, b64, c64), third()));
  REQUIRE_MESSAGE(unit, why(unit));
  REQUIRE(run(replay(unit.value())));
  const auto c_replayed = download_floats(c);
  std::vector<double> c64_replayed(ad.size());
  REQUIRE(run(download(c64, c64_replayed)));
  CHECK(std::memcmp(c_direct.data(), c_replayed.data(), c_direct.size() * 4) == 0);
  CHECK(std::memcmp(c64_direct.data(), c64_replayed.data(), c64_direct.size() * 8) == 0);
#if ATOMR_CUDA_HAS_CUFFT
  std::vector<std::complex<float>> f_replayed(fv.size());
  REQUIRE(run(download(fout, f_replayed)));
  CHECK(std::memcmp(f_direct.data(), f_replayed.data(), f_direct.size() * 8) == 0);
#endif

#if ATOMR_CUDA_HAS_CUDNN
  auto dnn = cudnn_actor::create(dev).value();
  const tensor_shape xs{2, 8, 32, 32};
  const conv2d_params cp{.out_channels = 16, .filter_h = 3, .filter_w = 3, .pad_h = 1, .pad_w = 1};
  const auto xv = random_floats(2 * 8 * 32 * 32, 7), fvv = random_floats(16 * 8 * 9, 8);
  auto x = alloc<float>(xv.size()), f = alloc<float>(fvv.size()), y = nan_floats(2 * 16 * 32 * 32);
  REQUIRE(run(upload(xv, x)));
  REQUIRE(run(upload(fvv, f)));
  REQUIRE(run(dnn.conv2d_forward(xs, cp, x, f, {}, y)));
  const auto y_direct = download_floats(y);
  REQUIRE(run(fill_bytes(y, 0xFF)));
  auto conv_unit = run(record(dev, dnn.conv2d_forward(xs, cp, x, f, {}, y)));
  REQUIRE_MESSAGE(conv_unit, why(conv_unit));
  REQUIRE(run(replay(conv_unit.value())));
  const auto y_replayed = download_floats(y);
  CHECK(std::memcmp(y_direct.data(), y_replayed.data(), y_direct.size() * 4) == 0);
#endif
}

TEST_CASE_FIXTURE(graph_fixture,
                  "replay is ordered after earlier work on its buffers and before later work, "
                  "on other streams (a missing wait shows as wrong numbers)") {
  test_kernels kernels;
  constexpr int n = 512;
  const auto av = random_floats(n * n, 31), bv = random_floats(n * n, 32);
  auto a = alloc<float>(n * n), b = alloc<float>(n * n), c = nan_floats(n * n);
  auto staged_a = alloc<float>(n * n);
  REQUIRE(run(upload(av, staged_a)));
  REQUIRE(run(upload(bv, b)));
  auto unit = run(record(dev, blas.gemm(square(n), a, b, c)));
  REQUIRE_MESSAGE(unit, why(unit));
  auto other = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    REQUIRE(run(fill_bytes(a, 0xFF)));
    REQUIRE(run(fill_bytes(c, 0xFF)));
    auto d = nan_floats(n * n);
    std::vector<float> out(n * n, std::nanf(""));
    // On `other`: a 20 ms spin, then a's real values. The replay must wait
    // for them on the GPU; the copy of c after it must wait for the replay.
    auto spin_then_copy =
        run_kernel("cuda", other, event_poll{}, a, [&](launch& l) -> result<gpu_ref<float>> {
          BOOST_OUTCOME_TRY(const float* s, l.read(staged_a));
          BOOST_OUTCOME_TRY(float* t, l.write(a));
          if (auto e = kernels.spin(l.native_stream(), 20); e != cudaSuccess)
            return classify(e, "spin");
          if (auto e = cudaMemcpyAsync(t, s, a.size_bytes(), cudaMemcpyDeviceToDevice,
                                       l.native_stream());
              e != cudaSuccess)
            return classify(e, "cudaMemcpyAsync");
          return staged_a;
        });
    auto r = run(compose(dev, std::move(spin_then_copy), replay(unit.value()),
                         copy(c, d, {.on = other}), download(d, out)));
    REQUIRE_MESSAGE(r, why(r));
    CHECK(gemm_rel_error(av, bv, out, n, 512) < 1e-5);
  }
}

TEST_CASE_FIXTURE(graph_fixture,
                  "record refuses what cannot be captured with not_supported naming the step, "
                  "and leaves nothing behind") {
  constexpr int n = 64;
  auto x = nan_floats(n * n), y = nan_floats(n * n);
  auto in = pinned(n * n);
  std::vector<float> host(n * n, 1.0f);
  const auto base = dev.statistics();
  auto expect_refused = [&](auto r, const char* step, const char* what) {
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::not_supported);
    const auto m = r.error().message();
    CAPTURE(m);
    CHECK(m.find(step) != std::string::npos);
    CHECK(m.find(what) != std::string::npos);
  };
  expect_refused(run(record(dev, upload(in, x), upload(host, y))), "record: step 2 of 2",
                 "pageable");
  expect_refused(run(record(dev, upload(in, x), download(x, host))), "record: step 2 of 2",
                 "pageable");
#if ATOMR_CUDA_HAS_CURAND
  auto rng = rng_actor::create(dev).value();
  expect_refused(run(record(dev, upload(in, x), rng.uniform(y), copy(y, x))), "record: step 2 of 3",
                 "curand");
#endif
  expect_refused(run(record(dev, blas.dot(n, x, y))), "record: step 1 of 1", "dot");
  auto ok_unit = run(record(dev, copy(x, y)));
  REQUIRE_MESSAGE(ok_unit, why(ok_unit));
  expect_refused(run(record(dev, copy(y, x), replay(ok_unit.value()))), "record: step 2 of 2",
                 "replay");
  // An enqueue that synchronises: capture is invalidated by it.
  auto syncing = run_kernel(
      "cuda", dev.main_stream(), event_poll{}, y, [&](launch& l) -> result<std::tuple<>> {
        BOOST_OUTCOME_TRY(l.write(y));
        if (auto e = cudaStreamSynchronize(l.native_stream()); e != cudaSuccess)
          return classify(e, "cudaStreamSynchronize");
        return std::tuple<>{};
      });
  expect_refused(run(record(dev, copy(x, y), std::move(syncing))), "record: step 2 of 2",
                 "cannot be recorded");
  // A recording inside a unit.
  auto nested = run(compose(dev, copy(x, y), record(dev, copy(y, x))));
  REQUIRE_FALSE(nested);
  // The device still works, and nothing leaked.
  REQUIRE(run(fill_bytes(x, 0)));
  ok_unit = recorded_unit{};
  drain_parked();
  const auto now = dev.statistics();
  CHECK(now.ops_in_flight == base.ops_in_flight);
  CHECK(now.parked == 0);
  CHECK(now.live_buffers == base.live_buffers);
  CHECK(dev.health() == health_state::healthy);
}

TEST_CASE_FIXTURE(graph_fixture,
                  "graph_cache: bounded, least recently used evicted, an evicted unit's "
                  "running replay finishes with correct numbers") {
  constexpr int n = 512;
  const auto av = random_floats(n * n, 41), bv = random_floats(n * n, 42);
  auto a = alloc<float>(n * n), b = alloc<float>(n * n);
  REQUIRE(run(upload(av, a)));
  REQUIRE(run(upload(bv, b)));
  graph_cache cache(2);
  test_kernels kernels;
  std::vector<gpu_ref<float>> outs;
  for (int i = 0; i < 3; ++i) outs.push_back(nan_floats(n * n));
  int recorded = 0;
  auto make = [&](int i) {
    return [&, i]() -> asio::awaitable<result<recorded_unit>> {
      ++recorded;
      if (i != 1) co_return co_await record(dev, blas.gemm(square(n), a, b, outs[i]));
      // Unit 1 spins 50 ms before its gemm: it is still running when evicted.
      auto spin = run_kernel("cuda", dev.main_stream(), event_poll{}, outs[1],
                             [&](launch& l) -> result<std::tuple<>> {
                               BOOST_OUTCOME_TRY(l.write(outs[1]));
                               if (auto e = kernels.spin(l.native_stream(), 50); e != cudaSuccess)
                                 return classify(e, "spin");
                               return std::tuple<>{};
                             });
      co_return co_await record(dev, std::move(spin), blas.gemm(square(n), a, b, outs[1]));
    };
  };
  REQUIRE(run(cache.replay(0, make(0), event_poll{})));
  REQUIRE(run(cache.replay(1, make(1), event_poll{})));
  CHECK(recorded == 2);
  auto u1 = cache.find(1);
  REQUIRE(u1);
  REQUIRE(cache.find(0));  // a hit: 0 is now the most recent, 1 the least
  REQUIRE(run(fill_bytes(outs[1], 0xFF)));
  // Start unit 1's replay (50 ms on the GPU), then evict it while it runs;
  // the only handle left is the replay's own.
  std::optional<result<void>> running;
  asio::co_spawn(
      ioc,
      [u = u1, &running]() mutable -> asio::awaitable<void> {
        running.emplace(co_await replay(std::move(u)));
      },
      asio::detached);
  u1 = recorded_unit{};
  REQUIRE(run(cache.replay(2, make(2), event_poll{})));  // evicts 1
  CHECK(recorded == 3);
  CHECK_FALSE(cache.find(1));
  for (int i = 0; i < 400 && !running; ++i) {
    ioc.restart();
    ioc.run_for(5ms);
  }
  REQUIRE(running);
  REQUIRE_MESSAGE(*running, why(*running));
  const auto st = cache.statistics();
  CHECK(st.size == 2);
  CHECK(st.capacity == 2);
  CHECK(st.evictions == 1);
  for (int i = 0; i < 3; ++i)
    CHECK(gemm_rel_error(av, bv, download_floats(outs[i]), n, 256) < 1e-5);
}

TEST_CASE_FIXTURE(graph_fixture,
                  "replay cancelled or timed out: the graph keeps running, everything it uses "
                  "is parked until done, nothing leaks") {
  test_kernels kernels;
  auto y = nan_floats(1024);
  const auto base = dev.statistics();
  {
    auto unit =
        run(record(dev,
                   run_kernel("cuda", dev.main_stream(), event_poll{}, y,
                              [&](launch& l) -> result<std::tuple<>> {
                                BOOST_OUTCOME_TRY(l.write(y));
                                if (auto e = kernels.spin(l.native_stream(), 30); e != cudaSuccess)
                                  return classify(e, "spin");
                                return std::tuple<>{};
                              }),
                   fill_bytes(y, 0)));
    REQUIRE_MESSAGE(unit, why(unit));
    completion quick = event_poll{};
    quick.timeout = 2ms;
    auto r = run(replay(unit.value(), quick));
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::timeout);
    // Cancelled through a completion token's slot.
    asio::cancellation_signal sig;
    std::optional<result<void>> got;
    replay(unit.value(), event_poll{},
           asio::bind_cancellation_slot(sig.slot(), [&](result<void> v) { got.emplace(v); }));
    ioc.restart();
    ioc.run_for(1ms);
    sig.emit(asio::cancellation_type::terminal);
    for (int i = 0; i < 200 && !got; ++i) {
      ioc.restart();
      ioc.run_for(5ms);
    }
    REQUIRE(got);
    REQUIRE_FALSE(*got);
    CHECK(got->error().code() == errc::cancelled);
    // The unit is dropped while its replays may still run on the GPU.
  }
  drain_parked();
  const auto now = dev.statistics();
  CHECK(now.parked == 0);
  CHECK(now.ops_in_flight == base.ops_in_flight);
  CHECK(now.live_buffers == base.live_buffers);
  // Both replays ran to the end after their waits were abandoned: the
  // recorded fill after the spin left zeros (the buffer was NaN before).
  const auto after = download_floats(y);
  CHECK(std::all_of(after.begin(), after.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE_FIXTURE(graph_fixture,
                  "replay after stop: no launch, the device's error; the cache drops the unit") {
  auto x = nan_floats(64), y = nan_floats(64);
  auto unit = run(record(dev, copy(x, y)));
  REQUIRE_MESSAGE(unit, why(unit));
  graph_cache cache(4);
  cache.insert(7, unit.value());
  REQUIRE(run(replay(unit.value())));
  CHECK(unit.value().replays() == 1);
  dev.stop();
  auto r = run(replay(unit.value()));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::device_unavailable);
  CHECK(unit.value().replays() == 1);
  CHECK_FALSE(cache.find(7));
  CHECK(cache.statistics().stale == 1);
}
