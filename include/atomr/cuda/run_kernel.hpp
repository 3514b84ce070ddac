// run_kernel: the one place where GPU work is launched and awaited.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/detail/unit_capture.hpp>
#include <atomr/cuda/detail/unit_recorder.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <exception>
#include <memory>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace atomr::cuda {

namespace detail {
/// The buffers one launch has ordered, with whether it writes them. The
/// first few live inline: an operation touches two to four buffers, and this
/// list is built on every launch (a growing vector cost up to three mallocs).
class touch_list {
public:
  struct entry {
    std::shared_ptr<buffer_state> st;
    bool write = false;
  };
  entry* find(const buffer_state* st) noexcept {
    for (std::size_t i = 0; i < n_; ++i)
      if (at(i).st.get() == st) return &at(i);
    return nullptr;
  }
  void add(std::shared_ptr<buffer_state> st, bool write) {
    if (n_ >= k_inline) more_.emplace_back();
    auto& e = at(n_++);
    e.st = std::move(st);
    e.write = write;
  }
  template <class F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i < n_; ++i) f(at(i));
  }
  void clear() noexcept {
    for (std::size_t i = 0; i < std::min(n_, k_inline); ++i) small_[i].st.reset();
    more_.clear();
    n_ = 0;
  }

private:
  static constexpr std::size_t k_inline = 4;
  entry& at(std::size_t i) noexcept { return i < k_inline ? small_[i] : more_[i - k_inline]; }
  std::array<entry, k_inline> small_{};
  std::vector<entry> more_;
  std::size_t n_ = 0;
};
}  // namespace detail

/// What an enqueue function gets: the stream to launch on, and ordered
/// access to buffers. read()/write() validate the ref (stale_ref,
/// wrong device) and make this stream wait on the GPU (cudaStreamWaitEvent,
/// never the host) for earlier conflicting work on other streams; after the
/// enqueue the accesses are stamped with one event recorded on this stream.
/// Not thread-safe: used by one enqueue call.
class launch {
public:
  /// A launch on `s` whose errors are tagged with `library` ("cuda",
  /// "cublas", ...); run_kernel makes it, not users.
  launch(stream s, std::string_view library) : stream_(std::move(s)), library_(library) {}
  /// A launch inside a recording (graph.hpp): `s` is the recording's stream,
  /// which is being captured, so what the enqueue puts on it is recorded, not run.
  launch(stream s, std::string_view library, detail::unit_capture& capture)
      : stream_(std::move(s)), library_(library), capture_(&capture) {}
  launch(const launch&) = delete;
  launch& operator=(const launch&) = delete;
  ~launch();

  /// The raw stream to enqueue on.
  cudaStream_t native_stream() const noexcept { return stream_.native_handle(); }
  /// The stream to enqueue on.
  const stream& get_stream() const noexcept { return stream_; }
  /// The library tag errors of this launch carry.
  std::string_view library() const noexcept { return library_; }
  /// True when this launch is recorded into a CUDA graph rather than run
  /// (record(), graph.hpp): native_stream() is then the recording's stream,
  /// and a library handle bound to another stream must be pointed at it for
  /// the call (the actors' lane_hold does).
  bool recording() const noexcept { return capture_ != nullptr; }
  /// Inside a recording: a workspace of at least `bytes` that belongs to the
  /// recorded graph (a lane's own workspace cannot be baked into a graph that
  /// is replayed on another stream). invalid_argument outside a recording.
  result<void*> recording_workspace(std::size_t bytes);

  /// Device pointer for reading `r` on this stream after its last write.
  template <element T>
  result<const T*> read(const gpu_ref<T>& r) {
    BOOST_OUTCOME_TRY(void* p, access(r.state(), false));
    return static_cast<const T*>(p) + r.offset();
  }
  /// Device pointer for writing `r` on this stream after its earlier reads and writes.
  template <element T>
  result<T*> write(const gpu_ref<T>& r) {
    BOOST_OUTCOME_TRY(void* p, access(r.state(), true));
    return static_cast<T*>(p) + r.offset();
  }

  /// read() for a buffer of another in-process device (a copy between
  /// devices, a collective over several): this stream waits for the
  /// buffer's earlier writes on its own device's streams (an event of one
  /// device may be waited on by a stream of another), and the buffer is
  /// stamped with this launch's completion like any other. Work the enqueue
  /// puts on streams other than this one must be ordered after it and joined
  /// back into it by the enqueue itself.
  template <element T>
  result<const T*> read_peer(const gpu_ref<T>& r) {
    BOOST_OUTCOME_TRY(void* p, access(r.state(), false, true));
    return static_cast<const T*>(p) + r.offset();
  }
  /// write() for a buffer of another in-process device (see read_peer).
  template <element T>
  result<T*> write_peer(const gpu_ref<T>& r) {
    BOOST_OUTCOME_TRY(void* p, access(r.state(), true, true));
    return static_cast<T*>(p) + r.offset();
  }

  /// Orders one buffer by its shared state, as read() or write() do (a
  /// recorded unit's replay orders every buffer its graph touches).
  /// `any_device`: the buffer may belong to another device (read_peer);
  /// yields the allocation's base pointer.
  result<void*> order(const std::shared_ptr<detail::buffer_state>& st, bool write,
                      bool any_device = false) {
    return access(st, write, any_device);
  }

  // --- used by run_kernel ---
  /// Checks the device accepts work; counts the op in flight.
  result<void> begin();
  /// Makes the stream's device current on this thread (cudaSetDevice if needed).
  result<void> make_current();
  /// Records the completion event and stamps every accessed buffer with it;
  /// `blocking`: a blocking-sync event, for a blocking_sync wait.
  result<std::shared_ptr<detail::pooled_event>> commit(bool blocking = false);
  /// Stamps every accessed buffer with `ev`, recorded on this stream after the enqueue.
  void stamp(const std::shared_ptr<detail::pooled_event>& ev);
  /// Finishes the accounting with `r`; tags an error with the library, counts
  /// it, probes the context after driver/library failures, poisons on sticky faults.
  gpu_error fail(gpu_error e);
  /// Finishes the accounting of a successful operation (counted completed).
  void succeed();
  /// After an enqueue whose tracking failed (no event, an exception while
  /// keeping it): waits on this thread for the stream, so that the work's
  /// keep-alive can be dropped (docs/design.md, "Work that no event tracks").
  void wait_untracked() noexcept;
  /// Hands `keep_alive` to the device until `done` completes.
  void park(std::shared_ptr<detail::pooled_event> done, std::shared_ptr<void> keep_alive);
  /// Inside a composed unit: the operation stays counted in flight after this
  /// launch ends; the unit settles it (detail::settle_unit_op) when it ends.
  void hand_over() noexcept { counted_ = false; }
  /// Inside a recording: hands the accessed buffers to the recording and
  /// ends the count without counting an operation (nothing ran).
  void end_recorded();

private:
  /// `any_device`: the buffer may belong to another device (read_peer).
  result<void*> access(const std::shared_ptr<detail::buffer_state>& st, bool write,
                       bool any_device = false);

  stream stream_;
  std::string_view library_;
  bool counted_ = false;
  detail::touch_list touched_;
  detail::unit_capture* capture_ = nullptr;
};

namespace detail {
template <class T>
struct is_gpu_ref : std::false_type {};
template <class T>
struct is_gpu_ref<gpu_ref<T>> : std::true_type {};

// Outputs that are gpu_refs (alone or in a tuple) are written by the kernel.
template <class O>
result<void> declare_output(launch& l, const O& out) {
  if constexpr (is_gpu_ref<O>::value) {
    BOOST_OUTCOME_TRY(l.write(out));
  } else if constexpr (requires { std::tuple_size<O>::value; }) {
    result<void> r = outcome::success();
    std::apply([&](const auto&... xs) { ((r = r ? declare_output(l, xs) : r), ...); }, out);
    return r;
  }
  return outcome::success();
}

/// True when the work before `ev` has finished (an error or "not ready" is
/// left to the completion strategy, which reports it).
inline bool already_done(const pooled_event& ev) noexcept {
  return cudaEventQuery(ev.native_handle()) == cudaSuccess;
}

/// The keep-alive type an enqueue function returns (unwrapped from result<>).
template <class F>
struct enqueue_keep {
  using raw = std::invoke_result_t<F&, launch&>;
  template <class R>
  struct unwrap {
    using type = R;
  };
  template <class R>
  requires outcome::is_basic_result_v<R>
  struct unwrap<R> {
    using type = typename R::value_type;
  };
  using type = typename unwrap<raw>::type;
};

/// Hands the keep-alive and the output to the device until `done` completes:
/// the output is GPU memory or host memory the work writes (a pinned
/// download target), so it must outlive an abandoned wait as much as the
/// inputs do. (Only the keep-alive was parked once, and a pinned download
/// target went back to the pool while its DMA was still queued: the next
/// transfer that took the block from the pool had its data overwritten.)
template <class K, class O>
void park_with_output(launch& l, std::shared_ptr<pooled_event> done, K&& keep, O&& output) {
  using both = std::pair<std::decay_t<K>, std::decay_t<O>>;
  l.park(std::move(done), std::make_shared<both>(std::forward<K>(keep), std::forward<O>(output)));
}

/// Ends the count of one operation a unit took over (launch::hand_over):
/// completed, or failed with `e`.
void settle_unit_op(const stream& s, const gpu_error* e);

template <class F>
auto call_enqueue(F& f, launch& l) {
  using R = std::invoke_result_t<F&, launch&>;
  if constexpr (outcome::is_basic_result_v<R>) {
    return f(l);
  } else {
    return result<R>(f(l));
  }
}
/// run_kernel inside a composed unit (docs/design.md, "Composed units"):
/// the same checks and enqueue, one event recorded after it (later steps on
/// other streams wait on it through the buffers' stamps), and the keep-alive
/// with the output handed to the unit, which waits once for all its steps.
/// Never the batch path: the enqueue runs now, in step order.
/// Inside a recording: invalid_argument for a step on a stream of another
/// device than the recording's. (What cannot be recorded at all, cuRAND, is
/// refused by its actor before it gets here.)
result<void> check_recordable(const unit_capture& c, std::string_view library, const stream& s);
/// Inside a recording, after a step's enqueue (`failed`: its error, or null):
/// not_supported naming `library` when the capture was invalidated (a call
/// that cannot be captured), else nothing.
std::optional<gpu_error> capture_refusal(const unit_capture& c, std::string_view library,
                                         const gpu_error* failed);

/// What both unit paths do before their own ending: the checks of `l`'s
/// device, `how` and `output`, then the enqueue, with the device current.
/// Errors are returned unfailed: the caller ends `l` with them.
template <class O, class Enqueue>
auto checked_enqueue(launch& l, completion how, const O& output, Enqueue& enqueue)
    -> decltype(call_enqueue(enqueue, l)) {
  BOOST_OUTCOME_TRY(l.begin());
  BOOST_OUTCOME_TRY(check_completion(how));
  BOOST_OUTCOME_TRY(declare_output(l, output));
  BOOST_OUTCOME_TRY(l.make_current());
  return call_enqueue(enqueue, l);
}

/// run_kernel inside a recording (graph.hpp, docs/design.md "Recorded units"):
/// the same checks and enqueue on the recording's stream, which is captured,
/// so nothing runs; the buffers touched and the keep-alive with the output
/// go to the recording, which keeps them as long as its graph.
template <class O, class Enqueue>
result<O> record_in_unit(unit_capture& c, std::string_view library, const stream& s, completion how,
                         O output, Enqueue& enqueue) {
  BOOST_OUTCOME_TRY(check_recordable(c, library, s));
  launch l(c.on, library, c);
  auto keep = checked_enqueue(l, how, output, enqueue);
  if (auto refused = capture_refusal(c, library, keep ? nullptr : &keep.error()))
    return l.fail(std::move(*refused));
  if (!keep) return l.fail(keep.error());
  using both = std::pair<typename enqueue_keep<Enqueue>::type, O>;
  c.keeps.push_back(std::make_shared<both>(std::move(keep).value(), output));
  l.end_recorded();
  return output;
}

/// Inside a composed unit, before a step's enqueue on `s`: enqueues the
/// unit's pending transfers on `s` (flush_pending), and records the event of
/// the previous stage's run when `s` is another stream (the run ends there;
/// if that record fails, the run's stream is waited for before the error).
result<void> begin_unit_step(unit_recorder& u, const stream& s);
/// Inside a composed unit, after a step's enqueue on `l`: the event of the
/// run `l`'s step belongs to. The previous stage's, when it is on the same
/// stream and not recorded yet (the record, made later, follows this
/// enqueue); else a new event, whose record is deferred until the run ends
/// (unit_recorder::close_runs, the next step on another stream, or anyone
/// who meets it in a buffer's stamp: pooled_event::settle).
result<std::shared_ptr<pooled_event>> join_unit_run(unit_recorder& u, launch& l);

template <class O, class Enqueue>
result<O> enqueue_in_unit(unit_recorder& u, std::string_view library, stream s, completion how,
                          O output, Enqueue& enqueue) {
  static_assert(std::is_copy_constructible_v<O>, "a unit keeps a copy of each step's output");
  if (u.capture) return record_in_unit(*u.capture, library, s, how, std::move(output), enqueue);
  BOOST_OUTCOME_TRY(begin_unit_step(u, s));
  launch l(std::move(s), library);
  auto keep = checked_enqueue(l, how, output, enqueue);
  if (!keep) return l.fail(keep.error());
  auto done = join_unit_run(u, l);
  if (!done) return l.fail(done.error());
  using both = std::pair<typename enqueue_keep<Enqueue>::type, O>;
  // The stage first: a deferred event in a buffer's stamp must be one the
  // unit records (close_runs, ~unit_recorder), whatever throws after.
  // Out of host memory here, the keep-alive (still in `keep` until the
  // allocation succeeded) goes with the exception: the stream is waited
  // for first. The room for the stage is made before it is built, so that
  // no temporary holding the keep-alive dies before the catch.
  try {
    u.room_for_stage();
    auto kept = std::make_shared<both>(std::move(keep).value(), output);
    u.stages.push_back({l.get_stream(), std::move(done).value(), std::move(kept)});
  } catch (...) {
    l.wait_untracked();
    throw;
  }
  l.hand_over();
  l.stamp(u.stages.back().done);
  return output;
}

/// A unit's leading transfer given no stream (resolve_transfer said so): not
/// enqueued now but kept in the unit, with its enqueue function and output,
/// until the unit's next enqueuing step knows its stream (flush_pending).
/// Yields `output` (the transfer's value does not depend on its stream).
template <class O, class Enqueue>
result<O> defer_in_unit(unit_recorder& u, device dev, std::string_view library, completion how,
                        O output, Enqueue enqueue) {
  static_assert(std::is_copy_constructible_v<O>, "a unit keeps a copy of each step's output");
  // Once enqueued, `held` (with the keep-alive in `kept`) is the stage's
  // keep-alive: no second allocation for it.
  struct held {
    completion how;
    O output;
    Enqueue enqueue;
    std::optional<typename enqueue_keep<Enqueue>::type> kept;
  };
  auto run = [](void* p, launch& l) -> result<void> {
    auto& h = *static_cast<held*>(p);
    auto keep = checked_enqueue(l, h.how, h.output, h.enqueue);
    if (!keep) return keep.error();
    try {
      h.kept.emplace(std::move(keep).value());
    } catch (...) {
      l.wait_untracked();
      throw;
    }
    return outcome::success();
  };
  u.pending.push_back({u.step, std::move(dev), library,
                       std::make_shared<held>(held{how, output, std::move(enqueue), {}}), run});
  return output;
}
}  // namespace detail

/// Validates, enqueues and awaits one GPU operation; yields `output` on success.
///
/// `enqueue(launch&)` runs once, before the coroutine resumes: on the calling
/// thread, or, when the stream is busy with event_poll work, in the stream's
/// batch on a launch thread of the device (device_options::launch_threads)
/// or an io thread, while this coroutine is suspended; so it must not assume
/// which thread runs it. It returns the keep-alive (input refs, descriptors,
/// workspace...) or a result of it; a
/// pre-launch error it returns comes back without any further GPU call. The
/// keep-alive lives in this coroutine's frame until the work finishes; if
/// the wait ends early (timeout, cancellation) it is parked with the device,
/// together with `output`, and both are released only once the GPU is done.
/// `how` out of range (an unknown strategy value, a negative timeout, spin
/// or backoff) is invalid_argument before any GPU call. Errors are tagged with
/// `library`. gpu_ref outputs are validated and ordered as writes.
/// Inside a step of compose() (compose.hpp) it only enqueues: the unit
/// waits once for all its steps, and `output` is final when it has.
/// Never blocks the calling thread on the GPU, except where enqueued work
/// could not be tracked (no event could be made: docs/design.md, "Work that
/// no event tracks").
template <class O, class Enqueue>
asio::awaitable<result<O>> run_kernel(std::string_view library, stream s, completion how, O output,
                                      Enqueue enqueue) {
  if (auto* unit = detail::unit_of(co_await asio::this_coro::executor))
    co_return detail::enqueue_in_unit(*unit, library, std::move(s), how, std::move(output),
                                      enqueue);
  launch l(std::move(s), library);
  if (auto ok = l.begin(); !ok) co_return l.fail(ok.error());
  if (auto ok = check_completion(how); !ok) co_return l.fail(ok.error());
  if (auto ok = detail::declare_output(l, output); !ok) co_return l.fail(ok.error());
  // A stream with event_poll work in flight: join its batch (one drain runs
  // the queued enqueues back to back and one event covers them all; see
  // docs/history/performance.md). An idle stream launches at once (latency),
  // unless this thread prefers batching (prefer_batching: a worker's ring
  // thread with other requests to serve hands the launch to the stream's
  // launch thread).
  if (how.kind == strategy::event_poll && how.timeout == no_timeout &&
      (detail::stream_busy(l.get_stream()) || detail::batching_preferred())) {
    using keep_t = typename detail::enqueue_keep<Enqueue>::type;
    std::optional<keep_t> kept;
    auto body = [&](launch& ln) -> result<void> {
      auto k = detail::call_enqueue(enqueue, ln);
      if (!k) return k.error();
      kept.emplace(std::move(k).value());
      return outcome::success();
    };
    using body_t = decltype(body);
    const detail::deferred_enqueue what{
        &body, [](void* ctx, launch& ln) { return (*static_cast<body_t*>(ctx))(ln); }};
    detail::deferred_status status;
    result<void> waited = outcome::success();
    try {
      waited = co_await detail::async_deferred(l, what, &status, how, library, asio::use_awaitable);
    } catch (...) {
      if (status.enqueued && status.ev && kept)
        detail::park_with_output(l, status.ev, std::move(*kept), std::move(output));
      l.fail(make_error(errc::cancelled, "run_kernel: wait abandoned by an exception"));
      throw;
    }
    // An exception of the enqueue (run by the drain, on another thread
    // maybe) failed only this operation of the batch and leaves here, as it
    // leaves through the call on the inline path.
    if (status.thrown) std::rethrow_exception(status.thrown);
    if (!waited) {
      // Any error of the wait (timeout, cancellation, stop(), a fault): the
      // GPU may still use what the enqueue was given (see below).
      if (status.enqueued && status.ev && kept)
        detail::park_with_output(l, status.ev, std::move(*kept), std::move(output));
      co_return l.fail(waited.error());
    }
    l.succeed();
    co_return std::move(output);
  }
  if (auto ok = l.make_current(); !ok) co_return l.fail(ok.error());
  auto keep = detail::call_enqueue(enqueue, l);
  if (!keep) co_return l.fail(keep.error());
  auto done = l.commit(how.kind == strategy::blocking_sync);
  if (!done) {
    // No event tracks the work: commit waited for the stream (a dead
    // context runs nothing more), so the keep-alive can go.
    co_return l.fail(done.error());
  }
  auto keep_in_frame = std::move(keep).value();
  // Work that is already done (an empty or very short enqueue) needs no wait:
  // one query here saves the trip through the executor (see docs/history/performance.md).
  if (detail::already_done(*done.value())) {
    l.succeed();
    co_return std::move(output);
  }
  result<void> waited = outcome::success();
  try {
    waited = co_await detail::async_wait_event(l.get_stream(), done.value(), how, library,
                                               asio::use_awaitable);
  } catch (...) {
    // The coroutine is being torn down (e.g. cancelled before resuming):
    // the kernel may still run, so its keep-alive must outlive it.
    detail::park_with_output(l, done.value(), std::move(keep_in_frame), std::move(output));
    l.fail(make_error(errc::cancelled, "run_kernel: wait abandoned by an exception"));
    throw;
  }
  if (!waited) {
    // Whatever ended the wait, the GPU may still be using the keep-alives
    // (a pinned staging block the DMA reads, a workspace): they are parked
    // until its event completes (at once after a fault: a dead context runs
    // nothing more).
    detail::park_with_output(l, done.value(), std::move(keep_in_frame), std::move(output));
    co_return l.fail(waited.error());
  }
  l.succeed();
  co_return std::move(output);
}

/// run_kernel on the stream's device default completion strategy.
template <class O, class Enqueue>
asio::awaitable<result<O>> run_kernel(std::string_view library, stream s, O output,
                                      Enqueue enqueue) {
  completion how = s ? s.get_device().options().default_completion : completion{};
  return run_kernel(library, std::move(s), how, std::move(output), std::move(enqueue));
}

// ---- Completion tokens (docs/design.md, "Completion tokens") ----

namespace detail {
/// What run_kernel's token overloads take for `enqueue`: a function of launch&.
template <class F>
concept enqueue_function = std::invocable<F&, launch&>;
/// What they take for `output`: anything but a completion strategy, so that the
/// overload without a strategy can never take one for its output.
template <class O>
concept kernel_output = !std::derived_from<O, completion>;
}  // namespace detail

/// run_kernel through any Asio completion token: completes with
/// void(result<O>) on the handler's associated executor. Runs on the
/// handler's executor when it has one of its own, else on the executor of the
/// stream's device. The handler's cancellation slot reaches the wait
/// (terminal, partial or total: errc::cancelled, the keep-alive parked as
/// above). `library` and whatever `enqueue` refers to must outlive the
/// handler call. Costs one co_spawn on top of the awaitable.
template <detail::kernel_output O, detail::enqueue_function Enqueue, result_token<O> Token>
auto run_kernel(std::string_view library, stream s, completion how, O output, Enqueue enqueue,
                Token&& token) {
  auto ex = s ? s.get_device().get_executor() : asio::any_io_executor{};
  return async_from(std::move(ex),
                    run_kernel(library, std::move(s), how, std::move(output), std::move(enqueue)),
                    std::forward<Token>(token));
}

/// run_kernel through a completion token, on the stream's device default completion strategy.
template <detail::kernel_output O, detail::enqueue_function Enqueue, result_token<O> Token>
auto run_kernel(std::string_view library, stream s, O output, Enqueue enqueue, Token&& token) {
  auto ex = s ? s.get_device().get_executor() : asio::any_io_executor{};
  return async_from(std::move(ex),
                    run_kernel(library, std::move(s), std::move(output), std::move(enqueue)),
                    std::forward<Token>(token));
}

}  // namespace atomr::cuda
