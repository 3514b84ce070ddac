// Seams that need no GPU (issue 18): empty device and stream handles are
// safe everywhere and answer invalid_argument; completion values out of range
// are refused before any CUDA call.
#include <atomr/cuda.hpp>

#include "io_fixture.hpp"

#include <boost/asio/bind_executor.hpp>
#include <doctest/doctest.h>

#include <optional>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;

TEST_CASE("an empty device handle is safe to use and answers invalid_argument") {
  device d;
  CHECK_FALSE(d);
  CHECK(d.ordinal() == -1);
  CHECK(d.health() == health_state::unavailable);
  CHECK_FALSE(d.accepting());
  REQUIRE_FALSE(d.status());
  CHECK(d.status().error().code() == errc::invalid_argument);
  CHECK_FALSE(d.fault());
  CHECK(d.statistics().live_buffers == 0);
  CHECK_FALSE(d.main_stream());
  auto s = d.acquire_stream(stream_policy::pooled);
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::invalid_argument);
  auto a = d.allocate<float>(16, stream{});
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::invalid_argument);
  auto p = d.allocate_pinned<float>(16);
  REQUIRE_FALSE(p);
  CHECK(p.error().code() == errc::invalid_argument);
  d.stop();  // a no-op
  // The same through the shared_ptr constructor with nothing in it.
  device null_impl{std::shared_ptr<detail::device_impl>{}};
  CHECK(null_impl.status().error().code() == errc::invalid_argument);
}

TEST_CASE("the actors' create refuses an empty device handle") {
#if ATOMR_CUDA_HAS_CUBLAS
  auto b = blas_actor::create(device{});
  REQUIRE_FALSE(b);
  CHECK(b.error().code() == errc::invalid_argument);
#endif
#if ATOMR_CUDA_HAS_CUFFT
  auto f = fft_actor::create(device{});
  REQUIRE_FALSE(f);
  CHECK(f.error().code() == errc::invalid_argument);
#endif
#if ATOMR_CUDA_HAS_CURAND
  auto r = rng_actor::create(device{});
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
#endif
#if ATOMR_CUDA_HAS_CUDNN
  auto c = cudnn_actor::create(device{});
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == errc::invalid_argument);
#endif
}

TEST_CASE_FIXTURE(io_fixture, "an empty stream has an empty device; waits on it fail cleanly") {
  stream s;
  CHECK_FALSE(s.get_device());
  CHECK(s.get_device().status().error().code() == errc::invalid_argument);
  std::optional<result<void>> w;
  completion{}.async_wait(
      s, asio::bind_executor(ioc, [&](result<void> r) { w.emplace(std::move(r)); }));
  ioc.run_for(std::chrono::seconds(5));
  REQUIRE(w);
  REQUIRE_FALSE(*w);
  CHECK(w->error().code() == errc::invalid_argument);
  auto k = run(run_kernel("cuda", s, completion{}, 0, [](launch&) -> result<int> { return 0; }));
  REQUIRE_FALSE(k);
  CHECK(k.error().code() == errc::invalid_argument);
}

TEST_CASE_FIXTURE(io_fixture, "an empty device's health wait completes with unavailable") {
  device d;
  std::optional<health_state> h;
  d.async_wait_health_change(asio::bind_executor(ioc, [&](health_state x) { h = x; }));
  ioc.run_for(std::chrono::seconds(5));
  REQUIRE(h);
  CHECK(*h == health_state::unavailable);
}

TEST_CASE("completion values out of range are refused") {
  completion ok{};
  CHECK(check_completion(ok));
  CHECK(check_completion(host_fn{std::chrono::microseconds(0)}));
  completion bad_kind{};
  bad_kind.kind = static_cast<strategy>(9);
  auto r = check_completion(bad_kind);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("9") != std::string::npos);
  completion neg{};
  neg.timeout = std::chrono::nanoseconds(-1);
  CHECK(check_completion(neg).error().code() == errc::invalid_argument);
  neg = {};
  neg.spin = std::chrono::nanoseconds(-1);
  CHECK(check_completion(neg).error().code() == errc::invalid_argument);
  neg = {};
  neg.max_backoff = std::chrono::nanoseconds(-1);
  CHECK(check_completion(neg).error().code() == errc::invalid_argument);
  device_options o;
  o.default_completion = bad_kind;
  auto d = check_device_options(o);
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::invalid_argument);
  CHECK(d.error().message().find("default_completion") != std::string::npos);
}
