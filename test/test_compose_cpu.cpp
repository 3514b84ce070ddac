// compose() without a GPU: the unit's executor reaches only its own step's
// coroutines, and a unit that cannot start starts none of its steps.
#include "io_fixture.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <tuple>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;

namespace {
asio::awaitable<detail::unit_recorder*> seen_unit() {
  co_return detail::unit_of(co_await asio::this_coro::executor);
}

/// What a step sees before and after a real suspension (a timer), two
/// coroutines deep.
asio::awaitable<void> step_body(std::vector<detail::unit_recorder*>* seen) {
  seen->push_back(co_await seen_unit());
  asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(5));
  co_await t.async_wait(asio::use_awaitable);
  seen->push_back(co_await seen_unit());
}

asio::awaitable<result<int>> flagging_step(bool* started) {
  *started = true;
  co_return 1;
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "unit_executor: a step's coroutines see their unit, across suspensions; "
                  "other coroutines on the same thread never do") {
  detail::unit_recorder rec;
  std::vector<detail::unit_recorder*> in_step, outside;
  const detail::unit_executor ex(ioc.get_executor(), &rec);
  asio::co_spawn(ex, step_body(&in_step), asio::detached);
  // Runs on the same (only) thread while the step waits on its timer.
  asio::co_spawn(ioc, step_body(&outside), asio::detached);
  ioc.run_for(std::chrono::seconds(5));
  REQUIRE(in_step.size() == 2);
  CHECK(in_step[0] == &rec);
  CHECK(in_step[1] == &rec);
  REQUIRE(outside.size() == 2);
  CHECK(outside[0] == nullptr);
  CHECK(outside[1] == nullptr);
}

TEST_CASE_FIXTURE(io_fixture, "compose: a device that does not accept work starts no step") {
  bool started = false;
  auto r = run(compose(device{}, flagging_step(&started)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK_FALSE(started);
  completion bad;
  bad.kind = static_cast<strategy>(9);
  auto d = device::open(ioc.get_executor(), 0);  // no GPU here: device_unavailable
  if (d) {
    auto r2 = run(compose(d.value(), bad, flagging_step(&started)));
    REQUIRE_FALSE(r2);
    CHECK(r2.error().code() == errc::invalid_argument);
    CHECK_FALSE(started);
  } else {
    CHECK(d.error().code() == errc::device_unavailable);
  }
}

TEST_CASE_FIXTURE(io_fixture, "compose through a completion token (use_future, a callback)") {
  bool started = false;
  auto fut =
      async_from(ioc.get_executor(), compose(device{}, flagging_step(&started)), asio::use_future);
  std::optional<result<std::tuple<int>>> by_callback;
  async_from(ioc.get_executor(), compose(device{}, flagging_step(&started)),
             [&](result<std::tuple<int>> r) { by_callback.emplace(std::move(r)); });
  ioc.run_for(std::chrono::seconds(5));
  auto r = fut.get();
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  REQUIRE(by_callback);
  REQUIRE_FALSE(*by_callback);
  CHECK(by_callback->error().code() == errc::invalid_argument);
  CHECK_FALSE(started);
}
