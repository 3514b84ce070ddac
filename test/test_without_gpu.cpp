// Without a usable device every entry point answers device_unavailable, with
// the CUDA message, and never touches the GPU. On a machine with a GPU the
// same tests use an ordinal that does not exist.
#include <atomr/cuda.hpp>

#include "io_fixture.hpp"

#include <boost/asio/deferred.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;
namespace asio = boost::asio;

namespace {
// ordinal 0 where there is no GPU (the real case), else one that cannot exist.
std::string cuda_reason() {
  int n = 0;
  auto st = cudaGetDeviceCount(&n);
  cudaGetLastError();
  return st == cudaSuccess ? std::string("does not exist") : std::string(cudaGetErrorString(st));
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture, "opening an unusable device yields device_unavailable") {
  auto d = device::open(ioc.get_executor(), unusable_ordinal());
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::device_unavailable);
  CHECK(d.error().message().find(cuda_reason()) != std::string::npos);
  CHECK_THROWS_WITH_AS(d.value(), d.error().message().c_str(), gpu_exception);
}

TEST_CASE_FIXTURE(io_fixture, "device options out of range are refused before any CUDA call") {
  using std::chrono::microseconds;
  struct bad_case {
    device_options o;
    const char* names;
  };
  device_options threads;
  threads.launch_threads = 65;
  device_options huge;
  huge.launch_threads = std::size_t{1} << 40;  // would be 2^40 thread slots
  device_options slow;
  slow.busy_poll_interval = microseconds(1001);
  device_options negative;
  negative.busy_poll_interval = microseconds(-1);
  device_options long_spin;
  long_spin.launch_spin = microseconds(10001);
  device_options negative_spin;
  negative_spin.launch_spin = microseconds(-5);
  for (const auto& [o, names] : {bad_case{threads, "options.launch_threads (65)"},
                                 bad_case{huge, "options.launch_threads (1099511627776)"},
                                 bad_case{slow, "options.busy_poll_interval (1001 us)"},
                                 bad_case{negative, "options.busy_poll_interval (-1 us)"},
                                 bad_case{long_spin, "options.launch_spin (10001 us)"},
                                 bad_case{negative_spin, "options.launch_spin (-5 us)"}}) {
    CAPTURE(names);
    CHECK(check_device_options(o).error().code() == errc::invalid_argument);
    // Ordinal 0 whether or not it is usable here: the options are refused
    // first, even while another handle holds the ordinal open.
    auto d = device::open(ioc.get_executor(), 0, o);
    REQUIRE_FALSE(d);
    CHECK(d.error().code() == errc::invalid_argument);
    CHECK(d.error().message().find(names) != std::string::npos);
    device handle(ioc.get_executor(), 0, o);
    CHECK(handle.health() == health_state::unavailable);
    CHECK(handle.allocate<float>(4).error().code() == errc::invalid_argument);
  }
  // The bounds themselves are accepted.
  device_options edge;
  edge.launch_threads = 64;
  edge.busy_poll_interval = microseconds(1000);
  edge.launch_spin = microseconds(10000);
  CHECK(check_device_options(edge));
  edge.launch_spin = microseconds(0);
  CHECK(check_device_options(edge));
  CHECK(check_device_options(device_options{}));
}

TEST_CASE_FIXTURE(io_fixture, "an unavailable device reports its state and refuses work") {
  device d(ioc.get_executor(), unusable_ordinal());
  CHECK(d.health() == health_state::unavailable);
  CHECK_FALSE(d.accepting());
  CHECK(d.status().error().code() == errc::device_unavailable);
  CHECK_FALSE(d.fault());

  CHECK(d.allocate<float>(16).error().code() == errc::device_unavailable);
  CHECK(d.allocate_pinned<double>(16).error().code() == errc::device_unavailable);
  for (auto p : {stream_policy::single, stream_policy::pooled, stream_policy::per_actor_shared,
                 stream_policy::per_actor_fresh})
    CHECK(d.acquire_stream(p, "cublas").error().code() == errc::device_unavailable);

  auto s = d.statistics();
  CHECK(s.health == health_state::unavailable);
  CHECK(s.ops_in_flight == 0);
  CHECK(s.total_bytes == 0);
  CHECK(s.library_threads == 0);  // no launch thread for a device without a GPU
  CHECK(s.blocking_threads == 0);

  // The same device handle is returned for the same ordinal while one lives.
  device again(ioc.get_executor(), unusable_ordinal());
  CHECK(again == d);
}

TEST_CASE_FIXTURE(io_fixture, "every completion strategy yields device_unavailable") {
  device d(ioc.get_executor(), unusable_ordinal());
  for (completion how :
       {completion(event_poll{}), completion(host_fn{}), completion(blocking_sync{})}) {
    CAPTURE(to_string(how.kind));
    auto r = run([&]() -> asio::awaitable<result<void>> {
      co_return co_await how.async_wait(d.main_stream(), asio::use_awaitable);
    }());
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::device_unavailable);
    CHECK(r.error().message().find(cuda_reason()) != std::string::npos);

    // Any completion token: a plain callback, and deferred.
    std::optional<result<void>> cb;
    how.async_wait(d.main_stream(), [&](result<void> x) { cb = std::move(x); });
    CHECK_FALSE(cb);  // never completes inside the initiating call
    ioc.restart();
    ioc.run();
    REQUIRE(cb);
    CHECK(cb->error().code() == errc::device_unavailable);

    auto op = how.async_wait(d.main_stream(), asio::deferred);
    std::optional<result<void>> viad;
    std::move(op)([&](result<void> x) { viad = std::move(x); });
    ioc.restart();
    ioc.run();
    REQUIRE(viad);
    CHECK(viad->error().code() == errc::device_unavailable);
  }
}

TEST_CASE_FIXTURE(io_fixture, "run_kernel on an unavailable device never calls enqueue") {
  device d(ioc.get_executor(), unusable_ordinal());
  bool enqueued = false;
  auto r = run(run_kernel("cublas", d.main_stream(), event_poll{}, 42, [&](launch&) -> result<int> {
    enqueued = true;
    return 0;
  }));
  CHECK_FALSE(enqueued);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::device_unavailable);
  CHECK(r.error().library() == "cublas");
  CHECK(d.statistics().ops_in_flight == 0);
}

TEST_CASE_FIXTURE(io_fixture, "transfers on an empty ref fail with invalid_argument") {
  std::vector<float> host(8, 1.0f);
  auto r = run(upload(std::span<const float>(host), gpu_ref<float>{}));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  auto m = run(upload(std::span<const float>(host.data(), 4), gpu_ref<float>{}));
  CHECK(m.error().code() == errc::invalid_argument);
  CHECK(m.error().message().find("source has 4 elements, destination 0") != std::string::npos);
}

TEST_CASE_FIXTURE(io_fixture, "health observers of an unavailable device complete at once") {
  device d(ioc.get_executor(), unusable_ordinal());
  std::optional<health_state> seen;
  d.async_wait_health_change([&](health_state h) { seen = h; });
  ioc.restart();
  ioc.run();
  REQUIRE(seen);
  CHECK(*seen == health_state::unavailable);
}

TEST_CASE("a default-constructed device: every member may be called and answers as 'no device'") {
  const device d;
  CHECK_FALSE(d);
  CHECK(d.ordinal() == -1);
  CHECK(d.health() == health_state::unavailable);
  CHECK_FALSE(d.accepting());
  CHECK_FALSE(d.isolated());
  CHECK(d.generation() == 0);  // read through a null state before session 41
  CHECK(d.options().launch_threads == device_options{}.launch_threads);
  CHECK_FALSE(d.fault());
  REQUIRE_FALSE(d.status());
  CHECK(d.status().error().code() == errc::invalid_argument);
  const auto s = d.statistics();
  CHECK(s.generation == 0);
  CHECK(s.library_threads == 0);
  CHECK(s.blocking_threads == 0);
  CHECK(s.live_buffers == 0);
  CHECK_FALSE(d.main_stream());
  device e;
  CHECK(e.acquire_stream().error().code() == errc::invalid_argument);
  CHECK(e.allocate<float>(4).error().code() == errc::invalid_argument);
  CHECK(e.allocate_pinned<float>(4).error().code() == errc::invalid_argument);
  e.stop();  // nothing to stop
  CHECK(e == device{});
}
