// Completion tokens on a real GPU: a gemm and a dot through blas_actor (and
// an fft, rng and cudnn operation where those are built) delivered through a
// plain callback, use_future (the io_context on its own thread, get() on the
// test thread), deferred, use_awaitable and || with a timer, each result
// checked against a CPU reference computed in double; and a gemm cancelled
// through its token overload while it waits behind a long kernel: it yields
// errc::cancelled at once, the GPU finishes the work anyway, and the parked
// keep-alive and the inputs it held are released once the GPU is done.
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstdint>
#include <future>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

struct tokens_fixture : gpu_fixture {
  template <class T>
  gpu_ref<T> put(const std::vector<T>& v) {
    auto r = alloc<T>(v.size());
    REQUIRE(run(upload(std::span<const T>(v), r)));
    return r;
  }
  template <class T>
  std::vector<T> get(const gpu_ref<T>& r) {
    std::vector<T> out(r.size());
    REQUIRE(run(download(r, std::span<T>(out))));
    return out;
  }
  /// 0xFF bytes: NaN for floats, so that only the operation under test can make them right.
  template <class T>
  void nan_fill(const gpu_ref<T>& r) {
    REQUIRE(run(fill_bytes(r, 0xFF)));
  }

  /// Runs `start(token)` with each kind of completion token, each time after
  /// `reset()`, and hands every result to `check(kind, result)`.
  template <class R, class Reset, class Start, class Check>
  void through_every_token(Reset reset, Start start, Check check) {
    {  // A plain callback: on the device's io_context, once, never inside start().
      reset();
      int calls = 0;
      bool on_io = false;
      std::optional<result<R>> got;
      start([&](result<R> r) {
        ++calls;
        on_io = ioc.get_executor().running_in_this_thread();
        got.emplace(std::move(r));
        ioc.stop();
      });
      CHECK(calls == 0);
      ioc.restart();
      ioc.run_for(limit);
      REQUIRE(calls == 1);
      CHECK(on_io);
      check("callback", std::move(*got));
      ioc.restart();
      ioc.run_for(20ms);
      CHECK(calls == 1);
    }
    {  // use_future: the io_context runs on its own thread; this one waits in get().
      reset();
      auto work = asio::make_work_guard(ioc);
      ioc.restart();
      std::thread io([this] { ioc.run(); });
      auto fut = start(asio::use_future);
      std::optional<result<R>> got;
      if (fut.wait_for(limit) == std::future_status::ready) got.emplace(fut.get());
      work.reset();
      ioc.stop();
      io.join();
      REQUIRE(got);
      check("use_future", std::move(*got));
    }
    {  // deferred: started only when invoked, with a callback.
      reset();
      auto op = start(asio::deferred);
      int calls = 0;
      std::optional<result<R>> got;
      std::move(op)([&](result<R> r) {
        ++calls;
        got.emplace(std::move(r));
        ioc.stop();
      });
      ioc.restart();
      ioc.run_for(limit);
      REQUIRE(calls == 1);
      check("deferred", std::move(*got));
    }
    {  // use_awaitable, in a coroutine.
      reset();
      check("use_awaitable", run(start(asio::use_awaitable)));
    }
    {  // || with a timer that does not fire first.
      reset();
      using namespace asio::experimental::awaitable_operators;
      auto v = run([&]() -> asio::awaitable<std::variant<result<R>, std::monostate>> {
        asio::steady_timer t(co_await asio::this_coro::executor, 60s);
        co_return co_await (start(asio::use_awaitable) || t.async_wait(asio::use_awaitable));
      }());
      REQUIRE(v.index() == 0);
      check("|| timer", std::move(std::get<0>(v)));
    }
  }
};

template <class R>
void require_value(const char* kind, const result<R>& r) {
  CAPTURE(kind);
  REQUIRE_MESSAGE(r, (r ? std::string() : r.error().message()));
}

}  // namespace

TEST_CASE_FIXTURE(tokens_fixture, "blas gemm through every kind of completion token") {
  constexpr int n = 96;
  const auto av = random_floats(n * n, 31);
  const auto bv = random_floats(n * n, 32);
  auto a = put(av);
  auto b = put(bv);
  auto c = alloc<float>(n * n);
  const gemm_params p{.m = n, .n = n, .k = n};
  auto blas = blas_actor::create(dev).value();
  auto reset = [&] { nan_fill(c); };
  auto start = [&](auto&& token) {
    // A handle dropped right after the call: the operation holds its own copy.
    blas_actor own = blas;
    return own.gemm(p, a, b, c, std::forward<decltype(token)>(token));
  };
  auto check = [&](const char* kind, result<gpu_ref<float>> r) {
    require_value(kind, r);
    CHECK(r.value().state() == c.state());
    CHECK(gemm_rel_error(av, bv, get(c), n) < 1e-5);
  };
  through_every_token<gpu_ref<float>>(reset, start, check);
}

TEST_CASE_FIXTURE(tokens_fixture,
                  "blas dot (a scalar result) through every kind of completion token") {
  constexpr int n = 4096;
  const auto xv = random_floats(n, 33);
  const auto yv = random_floats(n, 34);
  double want = 0, magnitude = 0;  // the sum, and the sum of |terms| that bounds its rounding
  for (int i = 0; i < n; ++i) {
    const double term = static_cast<double>(xv[i]) * static_cast<double>(yv[i]);
    want += term;
    magnitude += std::abs(term);
  }
  auto x = put(xv);
  auto y = put(yv);
  auto blas = blas_actor::create(dev).value();
  through_every_token<float>(
      [] {}, [&](auto&& token) { return blas.dot(n, x, y, std::forward<decltype(token)>(token)); },
      [&](const char* kind, result<float> r) {
        require_value(kind, r);
        CHECK(std::abs(static_cast<double>(r.value()) - want) < 1e-5 * magnitude);
      });
}

#if ATOMR_CUDA_HAS_CUFFT
TEST_CASE_FIXTURE(tokens_fixture, "fft c2c through every kind of completion token") {
  using c32 = std::complex<float>;
  using c64 = std::complex<double>;
  constexpr int n = 64, batch = 3;
  const auto f = random_floats(2 * n * batch, 41);
  std::vector<c32> xv(n * batch);
  for (int i = 0; i < n * batch; ++i) xv[i] = c32(f[2 * i], f[2 * i + 1]);
  // The forward DFT by definition, in double.
  std::vector<c64> want(n * batch);
  for (int bt = 0; bt < batch; ++bt)
    for (int k = 0; k < n; ++k) {
      c64 acc = 0;
      for (int j = 0; j < n; ++j)
        acc += c64(xv[bt * n + j]) * std::polar(1.0, -2 * std::numbers::pi * j * k / n);
      want[bt * n + k] = acc;
    }
  auto in = put(xv);
  auto out = alloc<c32>(n * batch);
  const fft_shape s{.rank = 1, .dims = {n, 1, 1}, .batch = batch};
  auto fft = fft_actor::create(dev).value();
  through_every_token<gpu_ref<c32>>(
      [&] { nan_fill(out); },
      [&](auto&& token) { return fft.c2c(s, in, out, std::forward<decltype(token)>(token)); },
      [&](const char* kind, result<gpu_ref<c32>> r) {
        require_value(kind, r);
        const auto got = get(out);
        double num = 0, den = 0;
        for (int i = 0; i < n * batch; ++i) {
          num += std::norm(c64(got[i]) - want[i]);
          den += std::norm(want[i]);
        }
        CHECK(std::sqrt(num / den) < 1e-5);
      });
}
#endif

#if ATOMR_CUDA_HAS_CURAND
TEST_CASE_FIXTURE(tokens_fixture, "rng uniform through every kind of completion token") {
  constexpr std::size_t count = std::size_t{1} << 16;
  constexpr std::uint64_t seed = 1234;
  auto rng = rng_actor::create(dev, rng_options{.seed = seed}).value();
  auto out = alloc<float>(count);
  // The reference: the same seed through a plain co_await.
  REQUIRE(rng.set_seed(seed));
  REQUIRE(run(rng.uniform(out)));
  const auto want = get(out);
  double mean = 0;
  for (float v : want) {
    REQUIRE(v > 0.0f);
    REQUIRE(v <= 1.0f);
    mean += v;
  }
  mean /= static_cast<double>(count);
  CHECK(std::abs(mean - 0.5) < 5 * std::sqrt(1.0 / 12 / static_cast<double>(count)));
  through_every_token<gpu_ref<float>>(
      [&] {
        REQUIRE(rng.set_seed(seed));
        nan_fill(out);
      },
      [&](auto&& token) { return rng.uniform(out, std::forward<decltype(token)>(token)); },
      [&](const char* kind, result<gpu_ref<float>> r) {
        require_value(kind, r);
        CHECK(get(out) == want);  // the same numbers as the awaitable, bit for bit
      });
}
#endif

#if ATOMR_CUDA_HAS_CUDNN
TEST_CASE_FIXTURE(tokens_fixture, "cudnn softmax through every kind of completion token") {
  const tensor_shape s{.n = 2, .c = 10, .h = 3, .w = 4};
  const auto count = static_cast<std::size_t>(s.elements());
  const auto xv = random_floats(count, 61);
  // Softmax over the channels for each (n, h, w), NCHW, in double.
  std::vector<double> want(count);
  const auto at = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    return static_cast<std::size_t>(((n * s.c + c) * s.h + h) * s.w + w);
  };
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t w = 0; w < s.w; ++w) {
        double top = -1e300, sum = 0;
        for (std::int64_t c = 0; c < s.c; ++c) top = std::max(top, double(xv[at(n, c, h, w)]));
        for (std::int64_t c = 0; c < s.c; ++c) sum += std::exp(xv[at(n, c, h, w)] - top);
        for (std::int64_t c = 0; c < s.c; ++c)
          want[at(n, c, h, w)] = std::exp(xv[at(n, c, h, w)] - top) / sum;
      }
  auto x = put(xv);
  auto y = alloc<float>(count);
  auto dnn = cudnn_actor::create(dev).value();
  through_every_token<gpu_ref<float>>(
      [&] { nan_fill(y); },
      [&](auto&& token) {
        return dnn.softmax_forward(s, softmax_algorithm::accurate, x, y,
                                   std::forward<decltype(token)>(token));
      },
      [&](const char* kind, result<gpu_ref<float>> r) {
        require_value(kind, r);
        const auto got = get(y);
        double worst = 0;
        for (std::size_t i = 0; i < count; ++i)
          worst = std::max(worst, std::abs(double(got[i]) - want[i]));
        CHECK(worst < 1e-5);
      });
}
#endif

TEST_CASE_FIXTURE(tokens_fixture,
                  "a gemm cancelled through its token while it waits behind a long kernel") {
  test_kernels kernels;
  constexpr int n = 256;
  const auto av = random_floats(n * n, 51);
  const auto bv = random_floats(n * n, 52);
  const gemm_params p{.m = n, .n = n, .k = n};
  auto blas = blas_actor::create(dev).value();
  const auto busy = blas.get_stream().native_handle();
  auto c = alloc<float>(n * n);
  {
    // Warm up: the first gemm makes the actor's workspace and plans, which then
    // neither count against the baseline nor run while the stream is busy.
    auto a = put(av);
    auto b = put(bv);
    REQUIRE(run(blas.gemm(p, a, b, c)));
  }
  // Each way to cancel: a signal of each type bound to a callback, and || with
  // a timer that fires first.
  for (int way = 0; way < 4; ++way) {
    CAPTURE(way);
    nan_fill(c);
    const auto live_before = dev.statistics().live_buffers;
    auto a = put(av);
    auto b = put(bv);
    // 300 ms of spinning on the actor's stream: the gemm is queued behind it.
    REQUIRE(kernels.spin(busy, 300) == cudaSuccess);
    const auto t0 = steady::now();
    std::optional<result<gpu_ref<float>>> got;
    if (way < 3) {
      const asio::cancellation_type_t type[] = {asio::cancellation_type::terminal,
                                                asio::cancellation_type::partial,
                                                asio::cancellation_type::total};
      asio::cancellation_signal sig;
      int calls = 0;
      blas.gemm(p, std::move(a), std::move(b), c,
                asio::bind_cancellation_slot(sig.slot(), [&](result<gpu_ref<float>> r) {
                  ++calls;
                  got.emplace(std::move(r));
                  ioc.stop();
                }));
      asio::steady_timer t(ioc, 5ms);
      t.async_wait([&](boost::system::error_code) { sig.emit(type[way]); });
      ioc.restart();
      ioc.run_for(limit);
      REQUIRE(calls == 1);
    } else {
      using namespace asio::experimental::awaitable_operators;
      auto v = run([&]() -> asio::awaitable<std::variant<result<gpu_ref<float>>, std::monostate>> {
        asio::steady_timer t(co_await asio::this_coro::executor, 5ms);
        co_return co_await (blas.gemm(p, std::move(a), std::move(b), c, asio::use_awaitable) ||
                            t.async_wait(asio::use_awaitable));
      }());
      CHECK(v.index() == 1);  // the timer won; the gemm's wait was cancelled
    }
    const auto waited = steady::now() - t0;
    if (got) {
      REQUIRE_FALSE(*got);
      CHECK(got->error().code() == errc::cancelled);
    }
    CHECK(waited < 200ms);  // well before the spin (and the gemm behind it) ended
    CHECK(cudaStreamQuery(busy) == cudaErrorNotReady);
    CHECK(dev.statistics().parked >= 1);  // the keep-alive waits for the GPU
    drain_parked();
    REQUIRE(cudaStreamSynchronize(busy) == cudaSuccess);
    const auto st = dev.statistics();
    CHECK(st.parked == 0);
    CHECK(st.ops_in_flight == 0);
    CHECK(st.live_buffers == live_before);            // A and B went with the keep-alive
    CHECK(gemm_rel_error(av, bv, get(c), n) < 1e-5);  // only the waiting stopped
  }
}
