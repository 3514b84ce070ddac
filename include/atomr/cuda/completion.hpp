// Completion strategies: how a coroutine learns that GPU work on a stream finished.
#pragma once

#include <atomr/cuda/error.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string_view>

#include <atomr/cuda/stream.hpp>

namespace atomr::cuda {

namespace asio = boost::asio;

namespace detail {
class pooled_event;
}

/// Which mechanism detects completion. The trade-offs: docs/design.md, "Completion
/// strategies"; the measurements behind the default: docs/history/performance.md.
enum class strategy : std::uint8_t {
  event_poll,     ///< record an event, query it from the awaiting executor until done
  host_fn,        ///< cudaLaunchHostFunc; the callback only posts to the awaiting executor
  blocking_sync,  ///< cudaEventSynchronize on a device-owned thread, never an io thread
};

/// The enumerator's name ("event_poll", ...); "unknown" for any other value.
std::string_view to_string(strategy s) noexcept;

/// No deadline.
inline constexpr std::chrono::nanoseconds no_timeout = std::chrono::nanoseconds::max();

/// A completion strategy with its settings; a plain value, cheap to copy.
/// A timeout or a cancellation ends only the waiting, never the GPU work.
struct completion {
  /// The mechanism (event_poll by default).
  strategy kind = strategy::event_poll;
  /// Longest wait; when it passes the wait yields errc::timeout.
  std::chrono::nanoseconds timeout = no_timeout;
  /// event_poll: how long to re-check on every turn of the executor before
  /// backing off to timer-driven checks (bounds CPU use on long kernels).
  std::chrono::nanoseconds spin = std::chrono::microseconds(1000);
  /// event_poll: the longest pause between checks once backed off.
  std::chrono::nanoseconds max_backoff = std::chrono::microseconds(200);

  /// Waits until all work enqueued on `s` so far has finished, with this
  /// strategy. Completion signature void(result<void>); works with any Asio
  /// completion token. Never blocks the calling thread. Cancellable through
  /// the handler's cancellation slot (terminal, partial or total): yields
  /// errc::cancelled. The CUDA call used: cudaEventRecord, then
  /// cudaEventQuery (event_poll), cudaLaunchHostFunc (host_fn) or
  /// cudaEventSynchronize on a worker thread (blocking_sync). Without a
  /// token it returns a deferred operation (asio::deferred), on every Boost
  /// from 1.81: `co_await how.async_wait(s)` works in a coroutine.
  template <class Token = asio::deferred_t>
  auto async_wait(const stream& s, Token&& token = {}) const;
};

/// Success, or invalid_argument naming the field: `kind` not one of the three
/// strategies (e.g. a cast integer), or a negative timeout, spin or
/// max_backoff. No CUDA call; every operation checks its completion with it.
result<void> check_completion(const completion& how);

/// Strategy values with the defaults above; e.g. `host_fn{5ms}`.
/// event_poll: an event recorded after the work, queried from the awaiting
/// executor (through the device's poll hub) until done. The default.
struct event_poll : completion {
  /// With timeout `t` (no_timeout: none) and the default spin settings.
  explicit event_poll(std::chrono::nanoseconds t = no_timeout)
      : completion{strategy::event_poll, t} {}
};
/// host_fn: a host function queued on the stream after the work
/// (cudaLaunchHostFunc); it only posts the completion to the awaiting
/// executor.
struct host_fn : completion {
  /// With timeout `t` (no_timeout: none).
  explicit host_fn(std::chrono::nanoseconds t = no_timeout) : completion{strategy::host_fn, t} {}
};
/// blocking_sync: cudaEventSynchronize on a thread of the device (never an
/// io thread), which then posts the completion to the awaiting executor.
struct blocking_sync : completion {
  /// With timeout `t` (no_timeout: none).
  explicit blocking_sync(std::chrono::nanoseconds t = no_timeout)
      : completion{strategy::blocking_sync, t} {}
};

class launch;

namespace detail {
using wait_handler = asio::any_completion_handler<void(result<void>)>;

/// A type-erased enqueue, run later by the stream's batch drain.
struct deferred_enqueue {
  void* ctx;
  result<void> (*fn)(void* ctx, launch& l);
};

/// Where a deferred enqueue reports back (fields live in the awaiting
/// coroutine's frame; written before its handler runs).
struct deferred_status {
  bool enqueued = false;             ///< the enqueue ran and succeeded
  std::shared_ptr<pooled_event> ev;  ///< the batch's event once recorded
  /// What the enqueue threw, if it did: that operation alone fails in the
  /// drain, and the awaiting coroutine rethrows it (run_kernel).
  std::exception_ptr thrown;
};

/// True while `s` has event_poll work in flight or queued: run_kernel then
/// joins the stream's batch (start_deferred) instead of launching at once.
bool stream_busy(const stream& s) noexcept;

/// While on, run_kernel on this thread joins a stream's batch even when the
/// stream is idle, so the library call runs on the stream's launch thread
/// instead of this one. An isolated device's worker sets it on a request
/// ring's thread while that thread has other requests in flight
/// (docs/design.md, "The request rings"); off by default on every thread.
void prefer_batching(bool on) noexcept;
/// Whether prefer_batching is on for this thread.
bool batching_preferred() noexcept;

/// While nonzero on this thread, an actor spreads the operations it chooses a
/// lane for by their written buffer over this many lanes (up to its
/// max_lanes) instead of over one lane per thread that has submitted to it.
/// An isolated device's worker sets it on its request rings' threads
/// (`--lanes`), which are fewer than the service's threads; 0 (the default
/// on every thread) keeps one lane per submitting thread.
void spread_lanes(std::size_t n) noexcept;
/// This thread's spread_lanes count (0: none).
std::size_t lanes_spread() noexcept;

/// Queues `what` on the stream of `l`; a drain posted to the device's
/// executor runs the queued enqueues of the stream back to back, records one
/// event after them, stamps each launch with it and waits on it (event_poll,
/// `how`'s spin settings; no deadline). The handler gets the enqueue's error
/// (status->enqueued false) or the wait's result.
void start_deferred(launch& l, deferred_enqueue what, deferred_status* status,
                    const completion& how, std::string_view library, wait_handler handler);

template <class Token>
auto async_deferred(launch& l, deferred_enqueue what, deferred_status* status,
                    const completion& how, std::string_view library, Token&& token) {
  return asio::async_initiate<Token, void(result<void>)>(
      [](auto handler, launch* l, deferred_enqueue what, deferred_status* status, completion how,
         std::string_view library) {
        start_deferred(*l, what, status, how, library, wait_handler(std::move(handler)));
      },
      token, &l, what, status, how, library);
}

/// Starts a wait for `ev` (recorded on `s` already) or, if `ev` is null, for
/// everything enqueued on `s` so far. Errors are tagged with `library`.
void start_wait(const stream& s, std::shared_ptr<pooled_event> ev, const completion& how,
                std::string_view library, wait_handler handler);

template <class Token>
auto async_wait_event(const stream& s, std::shared_ptr<pooled_event> ev, const completion& how,
                      std::string_view library, Token&& token) {
  return asio::async_initiate<Token, void(result<void>)>(
      [](auto handler, stream s, std::shared_ptr<pooled_event> ev, completion how,
         std::string_view library) {
        start_wait(s, std::move(ev), how, library, wait_handler(std::move(handler)));
      },
      token, s, std::move(ev), how, library);
}
}  // namespace detail

template <class Token>
auto completion::async_wait(const stream& s, Token&& token) const {
  return detail::async_wait_event(s, nullptr, *this, "cuda", std::forward<Token>(token));
}

}  // namespace atomr::cuda
