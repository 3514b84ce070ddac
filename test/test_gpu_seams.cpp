// Defects found at the seams by downstream use (issue 18), each with the test
// that failed before its fix: an abandoned download's pinned target reused
// while its DMA was queued, a host function posting into an io_context after
// run() returned, overlapping copies, out-of-range strategies, an invalid
// ordinal leaving a CUDA error pending.
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {
std::vector<float> pattern(std::size_t n, unsigned char byte) {
  std::vector<float> v(n);
  std::memset(v.data(), byte, n * sizeof(float));
  return v;
}

bool all_bytes(const std::vector<float>& v, unsigned char byte) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i)
    if (p[i] != byte) return false;
  return true;
}
}  // namespace

// Root cause of "wrong data after an abandoned upload": run_kernel parked
// only the enqueue's keep-alive after a timeout or cancellation, not the
// output. A download's output is its pinned target, so an abandoned
// download (pageable: its staging block) went back to the device's pinned
// pool while its DMA was still queued behind other work; the next pageable
// upload took the same block (the pool is LIFO per size class), copied its
// data in, and the late DMA overwrote it before the upload's own DMA read
// it: the upload's destination got the other buffer's bytes.
TEST_CASE_FIXTURE(gpu_fixture,
                  "an abandoned download keeps its pinned target until its DMA is done, so the "
                  "next upload's staging is not overwritten") {
  test_kernels kernels;
  constexpr std::size_t n = 64 * 1024;  // 256 KiB: one pinned size class
  auto s1 = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto s2 = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto src = alloc<float>(n);
  auto dst = alloc<float>(n);
  const auto before = dev.statistics();
  for (int trial = 0; trial < 8; ++trial) {
    CAPTURE(trial);
    REQUIRE(run(fill_bytes(src, 0x11)));
    REQUIRE(run(fill_bytes(dst, 0x00)));
    // s1 busy for 20 ms, s2 for 40 ms: the abandoned download's DMA (on s1)
    // lands while the upload's (on s2) is still queued.
    REQUIRE(kernels.spin(s1.native_handle(), 20) == cudaSuccess);
    REQUIRE(kernels.spin(s2.native_handle(), 40) == cudaSuccess);
    std::vector<float> sink(n);
    auto up = pattern(n, 0x22);
    auto r = run([&]() -> asio::awaitable<result<void>> {
      using namespace boost::asio::experimental::awaitable_operators;
      asio::steady_timer t(co_await asio::this_coro::executor, 0us);
      if (trial % 2 == 0) {
        // abandoned by a timeout
        auto d = co_await download(src, std::span<float>(sink), {.on = s1, .how = event_poll{0us}});
        REQUIRE_FALSE(d);
        CHECK(d.error().code() == errc::timeout);
      } else {
        // abandoned by awaitable operators (terminal cancellation)
        auto any = co_await (download(src, std::span<float>(sink), {.on = s1}) ||
                             t.async_wait(asio::use_awaitable));
        CHECK(any.index() == 1);
      }
      auto u = co_await upload(std::span<const float>(up), dst, {.on = s2});
      if (!u) co_return u.error();
      co_return outcome::success();
    }());
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(all_bytes(download_floats(dst), 0x22));
    drain_parked();
    CHECK(dev.statistics().parked == 0);
  }
  CHECK(dev.statistics().live_buffers == before.live_buffers);
}

// The scenario the independent check ran (issue 18, 1 wrong result in 512):
// an upload abandoned at once on a stream busy with ~300 us of library work
// (so it joins that stream's batch, or times out on the direct path), then
// other transfers at once on other streams, some abandoned too. Every
// buffer must end up holding either its old bytes or what was written into
// it, never another buffer's.
TEST_CASE_FIXTURE(gpu_fixture, "512 abandoned transfers among others never mix up buffers") {
  test_kernels kernels;
  constexpr std::size_t n = 16 * 1024;  // 64 KiB
  auto a = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto b = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto c = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto other = alloc<float>(n);
  auto dst = alloc<float>(n);
  auto third = alloc<float>(n);
  const auto p22 = pattern(n, 0x22), p33 = pattern(n, 0x33);
  const auto before = dev.statistics();
  int landed = 0, abandoned = 0;
  for (int trial = 0; trial < 512; ++trial) {
    CAPTURE(trial);
    std::vector<float> sink(n);
    auto r = run([&]() -> asio::awaitable<result<void>> {
      using namespace boost::asio::experimental::awaitable_operators;
      BOOST_OUTCOME_CO_TRY(co_await fill_bytes(other, 0x11));
      BOOST_OUTCOME_CO_TRY(co_await fill_bytes(dst, 0x00));
      BOOST_OUTCOME_CO_TRY(co_await fill_bytes(third, 0x00));
      // ~300 us of library work on `a`, not awaited: `a` is busy.
      auto busy = [](stream on, const test_kernels& k) -> asio::awaitable<void> {
        (void)co_await run_kernel("test", on, event_poll{}, 0, [&k](launch& l) -> result<int> {
          if (auto st = k.spin(l.native_stream(), 0.3); st != cudaSuccess)
            return classify(st, "spin");
          return 0;
        });
      };
      asio::co_spawn(co_await asio::this_coro::executor, busy(a, kernels), asio::detached);
      asio::steady_timer t(co_await asio::this_coro::executor, 0us);
      bool up_ok = false;
      if (trial % 2 == 0) {
        auto any = co_await (upload(p22, dst, {.on = a}) || t.async_wait(asio::use_awaitable));
        up_ok = any.index() == 0 && std::get<0>(any);
      } else {
        up_ok = static_cast<bool>(co_await upload(p22, dst, {.on = a, .how = event_poll{2us}}));
      }
      (up_ok ? landed : abandoned)++;
      // At once, on other streams: an abandoned pageable download of
      // `other`, and an upload into `third`.
      asio::steady_timer t2(co_await asio::this_coro::executor, 0us);
      (void)co_await (download(other, std::span<float>(sink), {.on = b}) ||
                      t2.async_wait(asio::use_awaitable));
      BOOST_OUTCOME_CO_TRY(co_await upload(p33, third, {.on = c}));
      co_return outcome::success();
    }());
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    auto got = download_floats(dst);
    // Either the upload landed or dst kept its zeros; never 0x11.
    REQUIRE((all_bytes(got, 0x22) || all_bytes(got, 0x00)));
    REQUIRE(all_bytes(download_floats(third), 0x33));
    REQUIRE(all_bytes(download_floats(other), 0x11));
  }
  MESSAGE("uploads that finished: " << landed << ", abandoned: " << abandoned);
  drain_parked();
  const auto after = dev.statistics();
  CHECK(after.parked == 0);
  CHECK(after.ops_in_flight == 0);
  CHECK(after.live_buffers == before.live_buffers);
}

// The pageable upload copies its source into pinned memory in the call
// itself, so the source may die before the operation is awaited (deferred
// use, completion tokens).
TEST_CASE_FIXTURE(gpu_fixture, "a pageable upload copies its source at the call, from any range") {
  constexpr std::size_t n = 4096;
  auto dst = alloc<float>(n);
  auto op = [&] {
    std::vector<float> temp = random_floats(n, 5);
    return upload(temp, dst);  // std::vector: a contiguous range; dies here
  }();
  REQUIRE(run(std::move(op)));
  auto want = random_floats(n, 5);
  std::vector<float> got(n);
  REQUIRE(run(download(dst, got)));  // into a std::vector
  CHECK(got == want);
  std::array<float, 3> small{1, 2, 3};
  auto three = alloc<float>(3);
  REQUIRE(run(upload(small, three)));
  std::array<float, 3> back{};
  REQUIRE(run(download(three, back)));
  CHECK(back == small);
  // Size mismatch is still refused before any GPU call.
  auto bad = run(upload(std::vector<float>(5), three));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
}

// Root cause of "post after run() returned": a host_fn wait held outstanding
// work only until its handler ran, so after a timeout run() could return
// while the host function was still queued; when it ran it posted into the
// io_context, which the user had destroyed. Now the host function's own
// ticket holds the work until it has run.
TEST_CASE("io_context::run() returns only after a timed-out host_fn's host function ran") {
  using clock = std::chrono::steady_clock;
  constexpr double kernel_ms = 50;
  test_kernels kernels;
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto ioc = std::make_unique<asio::io_context>();
    auto dev = device::open(ioc->get_executor(), 0).value();
    auto s = dev.acquire_stream(stream_policy::per_actor_fresh).value();
    std::optional<result<void>> waited;
    const auto start = clock::now();
    REQUIRE(kernels.spin(s.native_handle(), kernel_ms) == cudaSuccess);
    host_fn how{1us};
    how.async_wait(s, [&](result<void> r) { waited.emplace(std::move(r)); });
    ioc->run();
    const auto ran = clock::now() - start;
    REQUIRE(waited);
    REQUIRE_FALSE(*waited);
    CHECK(waited->error().code() == errc::timeout);
    // run() came back only once the host function had run and released its work.
    CHECK(dev.statistics().host_fns_pending == 0);
    CHECK(ran >= std::chrono::duration<double, std::milli>(kernel_ms * 0.9));
    // What users do after run() returns: drop the handles, destroy the context.
    std::weak_ptr<detail::device_impl> state = dev.impl();
    s = {};
    dev = {};
    ioc.reset();
    CHECK(state.expired());  // nothing kept the device alive past its context
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }
}

TEST_CASE("stopping and destroying an io_context with a host_fn wait still queued") {
  test_kernels kernels;
  auto ioc = std::make_unique<asio::io_context>();
  auto dev = device::open(ioc->get_executor(), 0).value();
  auto s = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  REQUIRE(kernels.spin(s.native_handle(), 30) == cudaSuccess);
  bool called = false;
  host_fn{}.async_wait(s, [&](result<void>) { called = true; });
  ioc->run_for(1ms);  // stops with the host function still queued
  CHECK(dev.statistics().host_fns_pending == 1);
  std::weak_ptr<detail::device_impl> state = dev.impl();
  s = {};
  dev = {};
  // Shutdown takes the work back from the queued host function, waits (a
  // bounded time) for it to run, and frees it there: its callback posts
  // nowhere, and nothing is left holding the device.
  ioc.reset();
  CHECK(state.expired());
  CHECK_FALSE(called);  // a handler is never run after its context is gone
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE_FIXTURE(gpu_fixture, "copy refuses overlapping views of one allocation") {
  auto a = alloc<float>(100);
  auto same = run(copy(a, a));
  REQUIRE_FALSE(same);
  CHECK(same.error().code() == errc::invalid_argument);
  auto lo = a.subspan(0, 50).value(), mid = a.subspan(25, 50).value(),
       hi = a.subspan(50, 50).value();
  for (auto [x, y] : {std::pair{lo, mid}, std::pair{mid, lo}, std::pair{mid, hi}}) {
    auto r = run(copy(x, y));
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(r.error().message().find("overlap") != std::string::npos);
  }
  // Disjoint halves of one allocation are fine, and right.
  auto v = random_floats(100, 9);
  REQUIRE(run(upload(v, a)));
  REQUIRE(run(copy(lo, hi)));
  auto back = download_floats(a);
  for (std::size_t i = 0; i < 50; ++i) CHECK(back[50 + i] == v[i]);
}

TEST_CASE_FIXTURE(gpu_fixture, "a strategy value out of range is refused before the enqueue") {
  completion bad{};
  bad.kind = static_cast<strategy>(9);
  bool enqueued = false;
  auto r = run(run_kernel("cuda", dev.main_stream(), bad, 0, [&](launch&) -> result<int> {
    enqueued = true;
    return 0;
  }));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK_FALSE(enqueued);
  std::optional<result<void>> w;
  bad.async_wait(dev.main_stream(), [&](result<void> x) { w.emplace(std::move(x)); });
  ioc.restart();
  ioc.run_for(1s);
  REQUIRE(w);
  REQUIRE_FALSE(*w);
  CHECK(w->error().code() == errc::invalid_argument);
  auto t = run(fill_bytes(alloc<float>(4), 0, {.how = bad}));
  REQUIRE_FALSE(t);
  CHECK(t.error().code() == errc::invalid_argument);
  CHECK(dev.health() == health_state::healthy);
}

TEST_CASE("opening a device ordinal that does not exist leaves no CUDA error pending") {
  asio::io_context ioc;
  for (int ordinal : {99, -1}) {
    CAPTURE(ordinal);
    auto d = device::open(ioc.get_executor(), ordinal);
    REQUIRE_FALSE(d);
    CHECK(d.error().code() == errc::device_unavailable);
    CHECK(cudaPeekAtLastError() == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  // and the next, unrelated call works
  auto ok = device::open(ioc.get_executor(), 0);
  REQUIRE(ok);
  CHECK(cudaGetLastError() == cudaSuccess);
}
