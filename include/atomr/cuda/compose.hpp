// compose: several dependent GPU operations as one unit, awaited once.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/detail/unit_recorder.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

namespace atomr::cuda {

namespace detail {
/// What a step yields inside compose's tuple: its value, or std::monostate
/// for an operation that yields nothing (a pageable download).
template <class T>
struct step_value {
  using type = T;
};
template <>
struct step_value<void> {
  using type = std::monostate;
};
template <class T>
using step_value_t = typename step_value<T>::type;

/// "<unit>: step k of n: <message>" (unit: "compose" or "record"), with e's
/// code, library and status.
gpu_error unit_step_error(const gpu_error& e, std::size_t k, std::size_t n,
                          std::string_view unit = "compose");
/// The error of a step that threw (cancellation before its enqueue, bad_alloc).
gpu_error unit_step_exception(std::exception_ptr e, std::size_t k, std::size_t n,
                              std::string_view unit = "compose");
/// How many of a unit's first steps had their work enqueued (or ran, for a
/// step that enqueues nothing) when its coroutine was torn down outside any
/// step: the steps that started, less the leading transfers still pending
/// (only the unit's next enqueuing step or its end would have enqueued
/// them; they are dropped unenqueued).
inline std::size_t steps_enqueued(const unit_recorder& rec) noexcept {
  return rec.pending.empty() ? rec.step : rec.pending.front().step - 1;
}
/// The error of a unit's coroutine torn down by an exception outside its
/// steps, after `started` of its `n` steps ran without failing: Asio throws
/// at the co_await of the next step (or of the unit's end) once a
/// cancellation was seen while the previous step was suspended in something
/// deaf to it. Names step started + 1 (it never started), or, after all n,
/// says that every step was enqueued and the wait never began.
gpu_error unit_interrupted(std::exception_ptr e, std::size_t started, std::size_t n,
                           std::string_view unit = "compose");
/// Ends a unit: with `failed`, parks every stage's keep-alive until its event
/// completes and yields the error; else waits for the stages (the last one,
/// then any other stream's last one not done yet) with `how`, parking them
/// on timeout or cancellation, and on success makes the copies out of
/// pageable downloads' staging blocks.
asio::awaitable<result<void>> finish_unit(unit_recorder& rec, completion how,
                                          std::optional<gpu_error> failed);

/// The unit's coroutine: every step in order, each only after the one before
/// it has enqueued; the first error (or a cancellation of the unit seen
/// between two steps) stops it there, and later steps are never started.
/// Then the unit's pending transfers are enqueued (a unit of transfers only,
/// or one whose later step failed before enqueuing anything: the steps before
/// a failed one always run) and the event of every run is recorded.
///
/// It is the first thing the unit's spawned coroutine runs (run_unit_steps,
/// unit_whole), and it first lets every cancellation type through to the
/// whole coroutine, steps and unit_whole's wait alike: co_spawn starts a
/// coroutine that lets only terminal ones through, so partial and total
/// ones of the caller (async_from's handler slot, which lets all three
/// through to a single operation) would otherwise never reach the unit.
/// Nothing suspends before this, so no cancellation is missed. Each type
/// then acts as terminal does: seen between two steps, it stops the unit
/// before the next step starts (an in-process step enqueues without
/// suspending, so none is torn down half-enqueued; a step that suspends
/// sees it as with terminal); seen by the wait, it parks every stage.
template <class... T, std::size_t... I>
asio::awaitable<void> unit_body(unit_recorder& rec,
                                std::tuple<asio::awaitable<result<T>>&...> steps,
                                std::tuple<std::optional<result<T>>...>& got,
                                std::optional<gpu_error>& failed, const char* unit,
                                std::index_sequence<I...>) {
  co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
  constexpr std::size_t n = sizeof...(T);
  std::size_t k = 0;
  auto one = [&]<class V>(asio::awaitable<result<V>>& step,
                          std::optional<result<V>>& out) -> asio::awaitable<void> {
    ++k;
    if (failed) co_return;  // a step before failed: this one never starts
    const auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none) {
      failed =
          unit_step_error(make_error(errc::cancelled, "cancelled before its enqueue"), k, n, unit);
      co_return;
    }
    rec.step = k;
    // The step in this coroutine (whose executor carries the unit, so the
    // step's run_kernel finds it): its value, or the error of what it threw.
    try {
      out.emplace(co_await std::move(step));
    } catch (...) {
      out.emplace(unit_step_exception(std::current_exception(), k, n, unit));
    }
    // A pending transfer this step enqueued failed: that step is named.
    if (rec.pending_failure)
      failed = unit_step_error(rec.pending_failure->second, rec.pending_failure->first, n, unit);
    else if (!*out)
      failed = unit_step_error(out->error(), k, n, unit);
  };
  ((co_await one(std::get<I>(steps), std::get<I>(got))), ...);
  if (!rec.pending.empty() && !flush_pending(rec, stream{}) && !failed)
    failed = unit_step_error(rec.pending_failure->second, rec.pending_failure->first, n, unit);
  if (auto closed = rec.close_runs(); !closed && !failed) failed = closed.error();
}

/// Runs `steps` left to right in one coroutine spawned on `ex` (one trip
/// through the scheduler per unit, not per step), each value or error into
/// `got`; returns the first error, naming its step.
template <class... T>
asio::awaitable<std::optional<gpu_error>> run_unit_steps(
    const unit_executor& ex, std::tuple<std::optional<result<T>>...>& got,
    asio::awaitable<result<T>>&... steps) {
  std::optional<gpu_error> failed;
  const char* unit = ex.recorder()->name;
  try {
    co_await asio::co_spawn(ex,
                            unit_body<T...>(*ex.recorder(), std::forward_as_tuple(steps...), got,
                                            failed, unit, std::index_sequence_for<T...>{}),
                            asio::use_awaitable);
  } catch (...) {
    // The unit's coroutine could not run at all (cancelled before it
    // started), or was cancelled between two steps.
    if (!failed)
      failed = unit_interrupted(std::current_exception(), steps_enqueued(*ex.recorder()),
                                sizeof...(T), unit);
  }
  co_return failed;
}

/// compose()'s whole unit in its one coroutine: the steps (unit_body, which
/// lets every cancellation type through, to the wait too), then the unit's
/// end (`finish`: the wait, compose's finish_unit) on the same executor.
/// The wait suspends the coroutine, so its completion is what resumes it
/// and co_spawn's own extra trip (a post before completing, made only for a
/// coroutine that never suspended) is not taken.
template <class Finish, class... T, std::size_t... I>
asio::awaitable<void> unit_whole(unit_recorder& rec,
                                 std::tuple<asio::awaitable<result<T>>&...> steps,
                                 std::tuple<std::optional<result<T>>...>& got,
                                 std::optional<gpu_error>& failed, result<void>& ended,
                                 Finish& finish, const char* unit, std::index_sequence<I...> seq) {
  co_await unit_body<T...>(rec, std::move(steps), got, failed, unit, seq);
  // A copy: a cancellation seen by the last step makes this co_await throw
  // before finish runs, and run_unit's catch then reports `failed` (moved
  // from, it had lost its message).
  ended = co_await finish(rec, failed);
}

/// Ends a unit whose coroutine was torn down by an exception: records its
/// runs' events, parks every stage until the GPU is done, settles each as
/// failed with `e`. Nothing if the unit had ended already.
void abandon_unit(unit_recorder& rec, const gpu_error& e);

/// Runs compose()'s unit: `steps` left to right, then `finish(rec, failed)`
/// (an awaitable of result<void>), all in one coroutine spawned on `ex`;
/// yields the unit's outcome (the first error naming its step, or finish's).
template <class Finish, class... T>
asio::awaitable<result<void>> run_unit(const unit_executor& ex,
                                       std::tuple<std::optional<result<T>>...>& got, Finish finish,
                                       asio::awaitable<result<T>>&... steps) {
  std::optional<gpu_error> failed;
  result<void> ended = outcome::success();
  auto& rec = *ex.recorder();
  const char* unit = rec.name;
  try {
    co_await asio::co_spawn(
        ex,
        unit_whole<Finish, T...>(rec, std::forward_as_tuple(steps...), got, failed, ended, finish,
                                 unit, std::index_sequence_for<T...>{}),
        asio::use_awaitable);
  } catch (...) {
    // The unit's coroutine could not run at all (cancelled before it
    // started), was cancelled between two steps or after its last, or its
    // wait was abandoned by an exception (finish_unit has parked and settled
    // everything then).
    gpu_error e =
        rec.ended
            ? make_error(errc::cancelled,
                         std::string(unit) + ": the unit's wait was abandoned by an exception")
        : failed
            ? *failed
            : unit_interrupted(std::current_exception(), steps_enqueued(rec), sizeof...(T), unit);
    abandon_unit(rec, e);
    ended = std::move(e);
  }
  co_return ended;
}

template <class T>
step_value_t<T> unit_value(std::optional<result<T>>& r) {
  if constexpr (std::is_void_v<T>)
    return std::monostate{};
  else
    return std::move(*r).value();
}
}  // namespace detail

/// Runs `steps` as one unit (docs/design.md, "Composed units"): operations
/// of any actor, transfers and run_kernel calls, each an awaitable that has
/// not started yet (what `blas.gemm(...)`, `upload(...)` return before
/// `co_await`). They are enqueued back to back, in order, each on its own
/// stream as when awaited alone, with the cross-stream order of every
/// buffer kept by events as always; then the unit waits once, with `how`,
/// and yields every step's value (std::monostate for a step that yields
/// nothing). Step values (buffers written, pinned targets, pageable download
/// targets) are final when the unit's wait has ended.
///
/// Errors: `how` out of range, or `dev` not accepting work: before any
/// step. A step failing before or at its enqueue (a bad argument, a library
/// error) stops the unit there: nothing after it is started, the error
/// names the step ("compose: step k of n: ..."), and the steps before it,
/// already enqueued, are parked until the GPU is done with them. A fault
/// while the unit runs, a timeout or a cancellation of the wait: that error;
/// on timeout and cancellation every step's keep-alive and output are parked
/// until the GPU is done, as with one operation. Operations that yield a
/// host value computed by the GPU (blas dot, nrm2, asum, iamax) are refused
/// inside a unit (not_supported): await them alone.
///
/// Every step shares the unit's coroutine; none blocks the thread. With a
/// completion token (a callback, use_future, deferred):
/// `async_from(dev.get_executor(), compose(dev, step...), token)` (async.hpp).
template <class... T>
asio::awaitable<result<std::tuple<detail::step_value_t<T>...>>> compose(
    device dev, completion how, asio::awaitable<result<T>>... steps) {
  if (auto ok = dev.status(); !ok) co_return ok.error();
  if (auto ok = check_completion(how); !ok) co_return ok.error();
  auto outer = co_await asio::this_coro::executor;
  if (detail::unit_of(outer))
    co_return make_error(errc::not_supported,
                         "compose: a unit cannot be a step of another unit (pass its steps to "
                         "the outer one)");
  detail::unit_recorder rec;
  // A stage per step, as most steps make; on an isolated device a request
  // per step instead (the worker makes the stages).
  if (dev.isolated())
    rec.remote_requests.reserve(sizeof...(T));
  else
    rec.stages.reserve(sizeof...(T));
  const detail::unit_executor ex(std::move(outer), &rec);
  std::tuple<std::optional<result<T>>...> got;
  auto finish = [how](detail::unit_recorder& r, std::optional<gpu_error> failed) {
    return detail::finish_unit(r, how, std::move(failed));
  };
  BOOST_OUTCOME_CO_TRY(co_await detail::run_unit(ex, got, finish, steps...));
  co_return std::apply(
      [](auto&... r) { return std::tuple<detail::step_value_t<T>...>(detail::unit_value(r)...); },
      got);
}

/// compose() with the device's default completion strategy.
template <class... T>
asio::awaitable<result<std::tuple<detail::step_value_t<T>...>>> compose(
    device dev, asio::awaitable<result<T>>... steps) {
  const completion how = dev.options().default_completion;
  return compose(std::move(dev), how, std::move(steps)...);
}

}  // namespace atomr::cuda
