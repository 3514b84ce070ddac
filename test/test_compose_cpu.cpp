// compose() without a GPU: the unit's executor reaches only its own step's
// coroutines, and a unit that cannot start starts none of its steps.
#include "../lib/device_impl.hpp"
#include "io_fixture.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <new>
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
  // A device that accepts work (a state marked healthy by hand, no CUDA
  // call) and a completion strategy out of range: refused before any step.
  auto impl = std::make_shared<detail::device_impl>(ioc.get_executor(), 4242, device_options{});
  impl->health.store(health_state::healthy);
  REQUIRE(device(impl).status());
  completion bad;
  bad.kind = static_cast<strategy>(9);
  auto r2 = run(compose(device(impl), bad, flagging_step(&started)));
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code() == errc::invalid_argument);
  CHECK_FALSE(started);
  impl->poison(make_error(errc::context_poisoned, "test teardown"));  // no CUDA at teardown
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

namespace {
/// A step that records its turn and whether it ran on the unit's executor.
asio::awaitable<result<int>> ordered_step(std::vector<int>* order, int id, bool* in_unit,
                                          bool suspend) {
  if (suspend) {
    asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(2));
    co_await t.async_wait(asio::use_awaitable);
  }
  *in_unit = detail::unit_of(co_await asio::this_coro::executor) != nullptr;
  order->push_back(id);
  co_return id;
}
/// A step that says it is waiting, then waits 10 s on a timer (cancellable).
asio::awaitable<result<int>> waiting_step(std::vector<int>* order, int id, bool* waiting) {
  asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(10));
  *waiting = true;
  co_await t.async_wait(asio::use_awaitable);
  order->push_back(id);
  co_return id;
}
asio::awaitable<result<int>> failing_step(std::vector<int>* order, int id) {
  order->push_back(id);
  co_return make_error(errc::invalid_argument, "bad shape");
}
asio::awaitable<result<int>> throwing_step(std::vector<int>* order, int id) {
  order->push_back(id);
  throw std::bad_alloc();
  co_return id;
}

/// Runs detail::run_unit_steps, as compose() and record() do, with a unit named `name`.
template <class... T>
asio::awaitable<std::optional<gpu_error>> run_steps(detail::unit_recorder* rec,
                                                    std::tuple<std::optional<result<T>>...>& got,
                                                    asio::awaitable<result<T>>... steps) {
  const detail::unit_executor ex(co_await asio::this_coro::executor, rec);
  co_return co_await detail::run_unit_steps(ex, got, steps...);
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "unit steps run in order on the unit's executor, suspending or not, in one "
                  "spawned coroutine") {
  detail::unit_recorder rec;
  std::vector<int> order;
  bool a = false, b = false, c = false;
  std::tuple<std::optional<result<int>>, std::optional<result<int>>, std::optional<result<int>>>
      got;
  auto failed = run(run_steps<int, int, int>(&rec, got, ordered_step(&order, 1, &a, false),
                                             ordered_step(&order, 2, &b, true),
                                             ordered_step(&order, 3, &c, false)));
  CHECK_FALSE(failed);
  CHECK(order == std::vector<int>{1, 2, 3});
  CHECK(a);
  CHECK(b);
  CHECK(c);
  REQUIRE(std::get<2>(got));
  CHECK(std::get<2>(got)->value() == 3);
}

TEST_CASE_FIXTURE(io_fixture,
                  "a failing or throwing step stops the unit there, named with the unit's name; "
                  "later steps never start") {
  std::vector<int> order;
  bool seen = false;
  {
    detail::unit_recorder rec;
    rec.name = "record";
    std::tuple<std::optional<result<int>>, std::optional<result<int>>, std::optional<result<int>>>
        got;
    auto failed = run(run_steps<int, int, int>(&rec, got, ordered_step(&order, 1, &seen, false),
                                               failing_step(&order, 2),
                                               ordered_step(&order, 3, &seen, false)));
    REQUIRE(failed);
    CHECK(failed->code() == errc::invalid_argument);
    CHECK(failed->message() == "record: step 2 of 3: bad shape");
    CHECK(order == std::vector<int>{1, 2});
    CHECK_FALSE(std::get<2>(got));
  }
  order.clear();
  {
    detail::unit_recorder rec;
    std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
    auto failed = run(run_steps<int, int>(&rec, got, throwing_step(&order, 1),
                                          ordered_step(&order, 2, &seen, false)));
    REQUIRE(failed);
    CHECK(failed->code() == errc::out_of_memory);
    CHECK(failed->message().rfind("compose: step 1 of 2: ", 0) == 0);
    CHECK(order == std::vector<int>{1});
  }
}

TEST_CASE_FIXTURE(io_fixture,
                  "a unit cancelled while a step waits: the waiting step is cancelled, no later "
                  "step starts") {
  detail::unit_recorder rec;
  std::vector<int> order;
  bool seen = false;
  std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
  std::optional<std::optional<gpu_error>> failed;
  bool waiting = false;
  asio::cancellation_signal sig;
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        failed.emplace(co_await run_steps<int, int>(&rec, got, waiting_step(&order, 1, &waiting),
                                                    ordered_step(&order, 2, &seen, false)));
      },
      asio::bind_cancellation_slot(sig.slot(), asio::detached));
  // Cancel only once step 1 waits (a fixed delay raced with slow builds: ASan).
  for (int i = 0; i < 1000 && !waiting; ++i) ioc.run_one_for(std::chrono::milliseconds(5));
  REQUIRE(waiting);
  sig.emit(asio::cancellation_type::terminal);
  for (int i = 0; i < 1000 && !failed; ++i) ioc.run_one_for(std::chrono::milliseconds(5));
  REQUIRE(failed);
  REQUIRE(*failed);
  CHECK((*failed)->code() == errc::cancelled);
  CHECK((*failed)->message().rfind("compose: step 1 of 2: ", 0) == 0);
  CHECK(order.empty());
}

namespace {
/// A step that defers a transfer of device `d` (as a unit's leading transfer
/// given no stream does), yielding 1.
asio::awaitable<result<int>> deferring_step(device d) {
  auto* unit = detail::unit_of(co_await asio::this_coro::executor);
  if (!unit) co_return make_error(errc::invalid_argument, "not in a unit");
  co_return detail::defer_in_unit(*unit, std::move(d), "cuda", completion{}, 1,
                                  [](launch&) -> result<int> { return 1; });
}
/// A step that enqueues the unit's pending transfers, as the next enqueuing
/// step does before its own enqueue, and yields its error if that fails.
asio::awaitable<result<int>> flushing_step(std::vector<int>* order, int id) {
  order->push_back(id);
  auto* unit = detail::unit_of(co_await asio::this_coro::executor);
  if (auto ok = detail::begin_unit_step(*unit, stream{}); !ok) co_return ok.error();
  co_return id;
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "a deferred leading transfer that fails when it is enqueued is named as its own "
                  "step, whether the next step or the unit's end enqueues it") {
  std::vector<int> order;
  bool seen = false;
  {
    // Enqueued by step 2 (on no device: no stream can be had for it).
    detail::unit_recorder rec;
    std::tuple<std::optional<result<int>>, std::optional<result<int>>, std::optional<result<int>>>
        got;
    auto failed =
        run(run_steps<int, int, int>(&rec, got, deferring_step(device{}), flushing_step(&order, 2),
                                     ordered_step(&order, 3, &seen, false)));
    REQUIRE(failed);
    CHECK(failed->message().rfind("compose: step 1 of 3: ", 0) == 0);
    CHECK(order == std::vector<int>{2});  // step 3 never started
    CHECK(rec.pending.empty());
    CHECK(rec.stages.empty());
  }
  order.clear();
  {
    // Only transfers before the end: the unit's end enqueues it.
    detail::unit_recorder rec;
    std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
    auto failed = run(run_steps<int, int>(&rec, got, ordered_step(&order, 1, &seen, false),
                                          deferring_step(device{})));
    REQUIRE(failed);
    CHECK(failed->message().rfind("compose: step 2 of 2: ", 0) == 0);
    CHECK(order == std::vector<int>{1});
    CHECK(rec.pending.empty());
  }
}

namespace {
/// Counts the handlers the io_context runs for one unit of two steps that
/// never suspend, whose end waits once (a timer standing for the GPU wait):
/// the end inside the unit's coroutine (run_unit, what compose() does) or
/// after it, in the caller's (the structure before session 19).
std::size_t handlers_for_unit(asio::io_context& ioc, bool end_inside, bool* end_saw_unit) {
  std::vector<int> order;
  bool a = false, b = false;
  auto finish = [&ioc, end_saw_unit](
                    detail::unit_recorder& rec,
                    std::optional<gpu_error> failed) -> asio::awaitable<result<void>> {
    *end_saw_unit = detail::unit_of(co_await asio::this_coro::executor) == &rec;
    asio::steady_timer t(ioc, std::chrono::milliseconds(1));
    co_await t.async_wait(asio::use_awaitable);
    if (failed) co_return *failed;
    co_return outcome::success();
  };
  auto body = [&]() -> asio::awaitable<void> {
    detail::unit_recorder rec;
    const detail::unit_executor ex(co_await asio::this_coro::executor, &rec);
    std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
    auto s1 = ordered_step(&order, 1, &a, false);
    auto s2 = ordered_step(&order, 2, &b, false);
    if (end_inside) {
      auto r = co_await detail::run_unit(ex, got, finish, s1, s2);
      CHECK(r);
    } else {
      auto failed = co_await detail::run_unit_steps(ex, got, s1, s2);
      auto r = co_await finish(rec, std::move(failed));
      CHECK(r);
    }
  };
  asio::co_spawn(ioc, body(), asio::detached);
  ioc.restart();
  const auto n = ioc.run();
  CHECK(order == std::vector<int>{1, 2});
  return n;
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "a unit's wait runs in the unit's own coroutine: one trip through the scheduler "
                  "fewer than waiting after it") {
  bool inside_saw = false, after_saw = true;
  const auto inside = handlers_for_unit(ioc, true, &inside_saw);
  const auto after = handlers_for_unit(ioc, false, &after_saw);
  CHECK(inside_saw);       // the wait's coroutine is the unit's
  CHECK_FALSE(after_saw);  // (the caller's is not)
  CHECK(inside + 1 == after);
}

namespace {
/// A step that waits `ms` on a timer (cancellable), then records its turn.
asio::awaitable<result<int>> timed_step(std::vector<int>* order, int id, bool* waiting,
                                        std::chrono::milliseconds ms) {
  asio::steady_timer t(co_await asio::this_coro::executor, ms);
  *waiting = true;
  co_await t.async_wait(asio::use_awaitable);
  order->push_back(id);
  co_return id;
}

/// A unit run as compose() runs it (detail::run_unit) whose end waits `ms`
/// on a timer, standing for the GPU wait (finish_unit): a cancelled wait
/// yields cancelled, as async_wait_event does; yields the unit's outcome.
asio::awaitable<result<int>> unit_with_wait(std::vector<int>* order, bool* waiting,
                                            std::chrono::milliseconds ms) {
  detail::unit_recorder rec;
  const detail::unit_executor ex(co_await asio::this_coro::executor, &rec);
  std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
  bool a = false, b = false;
  auto finish = [waiting, ms](detail::unit_recorder&,
                              std::optional<gpu_error> failed) -> asio::awaitable<result<void>> {
    if (failed) co_return *failed;
    asio::steady_timer t(co_await asio::this_coro::executor, ms);
    *waiting = true;
    boost::system::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted)
      co_return make_error(errc::cancelled, "compose: wait cancelled");
    co_return outcome::success();
  };
  auto s1 = ordered_step(order, 1, &a, false);
  auto s2 = ordered_step(order, 2, &b, false);
  auto ended = co_await detail::run_unit(ex, got, finish, s1, s2);
  if (!ended) co_return ended.error();
  co_return 0;
}

/// detail::run_unit_steps (record()'s unit) as a result<int>: 0 or the first error.
asio::awaitable<result<int>> steps_as_result(asio::awaitable<result<int>> s1,
                                             asio::awaitable<result<int>> s2) {
  detail::unit_recorder rec;
  std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
  auto failed = co_await run_steps<int, int>(&rec, got, std::move(s1), std::move(s2));
  if (failed) co_return *failed;
  co_return 0;
}

constexpr asio::cancellation_type_t every_type[] = {asio::cancellation_type::terminal,
                                                    asio::cancellation_type::partial,
                                                    asio::cancellation_type::total};
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "a unit's wait sees every cancellation type of an async_from handler's slot "
                  "(terminal, partial, total), as one operation's wait does") {
  for (const auto type : every_type) {
    CAPTURE(static_cast<unsigned>(type));
    std::vector<int> order;
    bool waiting = false;
    std::optional<result<int>> res;
    asio::cancellation_signal sig;
    // The wait lasts 2 s: a cancellation that does not reach it lets the
    // unit succeed after that (the test fails, and leaves nothing behind).
    async_from(ioc.get_executor(), unit_with_wait(&order, &waiting, std::chrono::seconds(2)),
               asio::bind_cancellation_slot(sig.slot(),
                                            [&](result<int> r) { res.emplace(std::move(r)); }));
    REQUIRE(run_until([&] { return waiting; }));
    const auto emitted = std::chrono::steady_clock::now();
    sig.emit(type);
    REQUIRE(run_until([&] { return res.has_value(); }, std::chrono::seconds(30)));
    const auto took = std::chrono::steady_clock::now() - emitted;
    REQUIRE_FALSE(*res);
    CHECK(res->error().code() == errc::cancelled);
    CHECK(took < std::chrono::seconds(1));
    CHECK(order == std::vector<int>{1, 2});  // the steps ran before the wait
  }
}

TEST_CASE_FIXTURE(io_fixture,
                  "a unit's steps see every cancellation type of an async_from handler's slot: "
                  "the waiting step is cancelled, no later step starts (record()'s unit)") {
  for (const auto type : every_type) {
    CAPTURE(static_cast<unsigned>(type));
    std::vector<int> order;
    bool waiting = false, seen = false;
    std::optional<result<int>> res;
    asio::cancellation_signal sig;
    async_from(ioc.get_executor(),
               steps_as_result(timed_step(&order, 1, &waiting, std::chrono::seconds(2)),
                               ordered_step(&order, 2, &seen, false)),
               asio::bind_cancellation_slot(sig.slot(),
                                            [&](result<int> r) { res.emplace(std::move(r)); }));
    REQUIRE(run_until([&] { return waiting; }));
    const auto emitted = std::chrono::steady_clock::now();
    sig.emit(type);
    REQUIRE(run_until([&] { return res.has_value(); }, std::chrono::seconds(30)));
    const auto took = std::chrono::steady_clock::now() - emitted;
    REQUIRE_FALSE(*res);
    CHECK(res->error().code() == errc::cancelled);
    CHECK(res->error().message().rfind("compose: step 1 of 2: ", 0) == 0);
    CHECK(took < std::chrono::seconds(1));
    CHECK(order.empty());
  }
}

namespace {
/// A unit run as compose() runs it whose last step waits on a cancellable
/// timer; its end (standing for finish_unit) reports the failure it is given.
asio::awaitable<result<int>> unit_cancelled_in_last_step(std::vector<int>* order, bool* waiting) {
  detail::unit_recorder rec;
  const detail::unit_executor ex(co_await asio::this_coro::executor, &rec);
  std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
  bool a = false;
  auto finish = [](detail::unit_recorder&,
                   std::optional<gpu_error> failed) -> asio::awaitable<result<void>> {
    if (failed) co_return *failed;
    co_return outcome::success();
  };
  auto s1 = ordered_step(order, 1, &a, false);
  auto s2 = timed_step(order, 2, waiting, std::chrono::seconds(2));
  auto ended = co_await detail::run_unit(ex, got, finish, s1, s2);
  if (!ended) co_return ended.error();
  co_return 0;
}

/// Runs `unit` through async_from with a cancellation slot, emits terminal
/// once `*waiting`, and yields the unit's outcome (which must fail).
result<int> cancelled_once_waiting(io_fixture& f, asio::awaitable<result<int>> unit,
                                   const bool* waiting) {
  std::optional<result<int>> res;
  asio::cancellation_signal sig;
  async_from(
      f.ioc.get_executor(), std::move(unit),
      asio::bind_cancellation_slot(sig.slot(), [&](result<int> r) { res.emplace(std::move(r)); }));
  REQUIRE(f.run_until([&] { return *waiting; }));
  sig.emit(asio::cancellation_type::terminal);
  REQUIRE(f.run_until([&] { return res.has_value(); }, std::chrono::seconds(30)));
  REQUIRE_FALSE(*res);
  CHECK(res->error().code() == errc::cancelled);
  return std::move(*res);
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "a unit cancelled in its last step names that step: the error is the step's, "
                  "not a moved-from one") {
  // The cancellation makes the co_await of the unit's end throw before the
  // end runs; run_unit then reports the step's error, which the unit had
  // moved into the end's call (an empty message) before the fix.
  std::vector<int> order;
  bool waiting = false;
  const auto res =
      cancelled_once_waiting(*this, unit_cancelled_in_last_step(&order, &waiting), &waiting);
  CAPTURE(res.error().message());
  CHECK(res.error().message().find("step 2 of 2: ") != std::string::npos);
  CHECK(order == std::vector<int>{1});
}

namespace {
/// A step that waits `ms` on a timer deaf to cancellation (an empty slot of
/// its own), then records its turn: a cancellation of the unit while it
/// waits is seen only by the unit's next co_await.
asio::awaitable<result<int>> deaf_step(std::vector<int>* order, int id, bool* waiting,
                                       std::chrono::milliseconds ms) {
  asio::steady_timer t(co_await asio::this_coro::executor, ms);
  *waiting = true;
  co_await t.async_wait(
      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  order->push_back(id);
  co_return id;
}

/// A unit run as compose() runs it: steps 1 and 2 (2 deaf, waiting 500 ms),
/// and a third when `three`; its end records that it ran.
asio::awaitable<result<int>> unit_with_deaf_step(std::vector<int>* order, bool* waiting, bool three,
                                                 bool* end_ran) {
  detail::unit_recorder rec;
  const detail::unit_executor ex(co_await asio::this_coro::executor, &rec);
  bool a = false, c = false;
  auto finish = [end_ran](detail::unit_recorder&,
                          std::optional<gpu_error> failed) -> asio::awaitable<result<void>> {
    *end_ran = true;
    if (failed) co_return *failed;
    co_return outcome::success();
  };
  auto s1 = ordered_step(order, 1, &a, false);
  auto s2 = deaf_step(order, 2, waiting, std::chrono::milliseconds(500));
  result<void> ended = outcome::success();
  if (three) {
    std::tuple<std::optional<result<int>>, std::optional<result<int>>, std::optional<result<int>>>
        got;
    auto s3 = ordered_step(order, 3, &c, false);
    ended = co_await detail::run_unit(ex, got, finish, s1, s2, s3);
  } else {
    std::tuple<std::optional<result<int>>, std::optional<result<int>>> got;
    ended = co_await detail::run_unit(ex, got, finish, s1, s2);
  }
  if (!ended) co_return ended.error();
  co_return 0;
}
}  // namespace

TEST_CASE_FIXTURE(io_fixture,
                  "a unit cancelled while a step waits on something deaf to it stops before the "
                  "next step and names that step, or says all its steps were enqueued") {
  // Asio throws the cancellation at the unit's next co_await (of step 3, or
  // of the unit's end), outside any step: before the fix the unit named
  // step 1 "cancelled before its enqueue" whatever had run.
  for (const bool three : {true, false}) {
    CAPTURE(three);
    std::vector<int> order;
    bool waiting = false, end_ran = false;
    const auto res = cancelled_once_waiting(
        *this, unit_with_deaf_step(&order, &waiting, three, &end_ran), &waiting);
    CAPTURE(res.error().message());
    if (three)
      CHECK(res.error().message() == "compose: step 3 of 3: cancelled before its enqueue");
    else
      CHECK(res.error().message() ==
            "compose: after its 2 steps were enqueued: cancelled before the unit's wait began");
    CHECK(order == std::vector<int>{1, 2});  // the deaf step ended; step 3 never started
    CHECK_FALSE(end_ran);
  }
  // record()'s unit (run_unit_steps) names the step the same way: steps
  // `first`, a deaf one (2) and an ordinary one (3), cancelled while 2 waits.
  std::vector<int> order;
  bool seen = false, a = false;
  auto cancel_record_unit = [&](asio::awaitable<result<int>> first) {
    bool waiting = false;
    std::optional<std::optional<gpu_error>> failed;
    asio::cancellation_signal sig;
    detail::unit_recorder rec;
    std::tuple<std::optional<result<int>>, std::optional<result<int>>, std::optional<result<int>>>
        got;
    asio::co_spawn(
        ioc,
        [&]() -> asio::awaitable<void> {
          failed.emplace(co_await run_steps<int, int, int>(
              &rec, got, std::move(first),
              deaf_step(&order, 2, &waiting, std::chrono::milliseconds(500)),
              ordered_step(&order, 3, &seen, false)));
        },
        asio::bind_cancellation_slot(sig.slot(), asio::detached));
    REQUIRE(run_until([&] { return waiting; }));
    sig.emit(asio::cancellation_type::terminal);
    REQUIRE(run_until([&] { return failed.has_value(); }, std::chrono::seconds(30)));
    REQUIRE(*failed);
    CHECK((*failed)->code() == errc::cancelled);
    return (*failed)->message();
  };
  CHECK(cancel_record_unit(ordered_step(&order, 1, &a, false)) ==
        "compose: step 3 of 3: cancelled before its enqueue");
  CHECK(order == std::vector<int>{1, 2});
  CHECK_FALSE(seen);
  // A leading transfer still pending (no enqueuing step came after it) was
  // never enqueued: the unit names it, not the step after the deaf one.
  order.clear();
  CHECK(cancel_record_unit(deferring_step(device{})) ==
        "compose: step 1 of 3: cancelled before its enqueue");
  CHECK(order == std::vector<int>{2});
  CHECK_FALSE(seen);
}
