// record() / replay() / graph_cache without a GPU: what is refused before any
// CUDA call, and the cache's bookkeeping.
#include "io_fixture.hpp"

#include <atomr/cuda.hpp>
#include <atomr/cuda/detail/lru.hpp>

#include <boost/asio/use_future.hpp>
#include <doctest/doctest.h>

#include <string>

using namespace atomr::cuda;
using namespace atomr::cuda::test;

namespace {
asio::awaitable<result<int>> flagging_step(bool* started) {
  *started = true;
  co_return 1;
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture, "record: a device that does not accept work records no step") {
  bool started = false;
  auto r = run(record(device{}, flagging_step(&started)));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK_FALSE(started);
  device unavailable(ioc.get_executor(), unusable_ordinal());
  REQUIRE(unavailable.health() == health_state::unavailable);
  auto r2 = run(record(unavailable, flagging_step(&started)));
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code() == errc::device_unavailable);
  CHECK_FALSE(started);
}

TEST_CASE_FIXTURE(io_fixture,
                  "replay of an empty recorded_unit: invalid_argument, awaited or "
                  "through a completion token") {
  recorded_unit none;
  CHECK_FALSE(none);
  CHECK(none.steps() == 0);
  CHECK(none.nodes() == 0);
  CHECK(none.replays() == 0);
  auto r = run(replay(none));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CHECK(r.error().message().find("empty recorded_unit") != std::string::npos);
  auto f = replay(none, event_poll{}, asio::use_future);
  auto got = f.get();
  REQUIRE_FALSE(got);
  CHECK(got.error().code() == errc::invalid_argument);
}

TEST_CASE(
    "graph_cache: capacity and misses; an empty unit is never stored; erasing and clearing "
    "what is not there is harmless") {
  graph_cache zero(0);
  CHECK(zero.statistics().capacity == 1);
  graph_cache cache(3);
  CHECK_FALSE(cache.find(1));
  cache.insert(1, recorded_unit{});  // erases, stores nothing
  auto s = cache.statistics();
  CHECK(s.size == 0);
  CHECK(s.capacity == 3);
  CHECK(s.misses == 1);
  CHECK(s.hits == 0);
  CHECK(s.evictions == 0);
  cache.erase(42);
  cache.clear();
  CHECK(cache.statistics().size == 0);
}

TEST_CASE("lru::erase drops one entry without counting an eviction") {
  detail::lru<int, int> l(2);
  l.insert(1, 10);
  l.insert(2, 20);
  CHECK(l.erase(1));
  CHECK_FALSE(l.erase(1));
  CHECK(l.size() == 1);
  l.insert(3, 30);
  CHECK(l.size() == 2);
  CHECK(l.evictions() == 0);
  l.insert(4, 40);
  CHECK(l.evictions() == 1);
  CHECK_FALSE(l.contains(2));
}
