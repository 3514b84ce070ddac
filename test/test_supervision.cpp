// The supervision policy and its restart budget, on an injected clock.
#include <atomr/cuda/supervision.hpp>

#include <doctest/doctest.h>

using namespace atomr::cuda;
using namespace std::chrono_literals;

namespace {
struct fake_clock {
  supervisor::clock::time_point t{};
  supervisor::now_fn fn() {
    return [this] { return t; };
  }
};
}  // namespace

TEST_CASE("non-restart codes pass through and do not spend the budget") {
  fake_clock c;
  supervisor s({}, c.fn());
  CHECK(s.on_failure(errc::out_of_memory) == decision::resume);
  CHECK(s.on_failure(errc::invalid_argument) == decision::resume);
  CHECK(s.on_failure(errc::device_unavailable) == decision::stop);
  CHECK(s.on_failure(errc::unrecoverable) == decision::escalate);
  CHECK(s.recent_restarts() == 0);
}

TEST_CASE("the default budget allows 3 restarts in 60 s, then stops") {
  fake_clock c;
  supervisor s({}, c.fn());
  auto poisoned = make_error(errc::context_poisoned, "illegal address");
  CHECK(s.on_failure(poisoned) == decision::restart);
  c.t += 10s;
  CHECK(s.on_failure(poisoned) == decision::restart);
  c.t += 10s;
  CHECK(s.on_failure(poisoned) == decision::restart);
  c.t += 10s;
  CHECK(s.on_failure(poisoned) == decision::stop);  // 4th within 60 s
  CHECK(s.recent_restarts() == 3);
  // The first restart leaves the window at t = 60 s: one more is allowed.
  c.t = supervisor::clock::time_point{} + 60s;
  CHECK(s.on_failure(poisoned) == decision::restart);
  CHECK(s.on_failure(poisoned) == decision::stop);
}

TEST_CASE("a custom budget is honoured") {
  fake_clock c;
  supervisor s({.max_restarts = 1, .window = 5s}, c.fn());
  CHECK(s.on_failure(errc::context_poisoned) == decision::restart);
  c.t += 4s;
  CHECK(s.on_failure(errc::context_poisoned) == decision::stop);
  c.t += 1s;
  CHECK(s.on_failure(errc::context_poisoned) == decision::restart);
  supervisor none({.max_restarts = 0}, c.fn());
  CHECK(none.on_failure(errc::context_poisoned) == decision::stop);
}
