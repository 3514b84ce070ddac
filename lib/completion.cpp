// The three completion strategies. Each is one heap object per wait that
// completes the handler exactly once (first of: GPU done, fault, deadline,
// cancellation), then releases it on the handler's own executor.
#include "device_impl.hpp"
#include "poll_hub.hpp"

#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <boost/asio/append.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/system_executor.hpp>

#include <optional>
#include <string>

namespace atomr::cuda {

std::string_view to_string(strategy s) noexcept {
  switch (s) {
    case strategy::event_poll:
      return "event_poll";
    case strategy::host_fn:
      return "host_fn";
    case strategy::blocking_sync:
      return "blocking_sync";
  }
  return "unknown";
}

result<void> check_completion(const completion& how) {
  switch (how.kind) {
    case strategy::event_poll:
    case strategy::host_fn:
    case strategy::blocking_sync:
      break;
    default:
      return make_error(errc::invalid_argument,
                        "completion: strategy value " +
                            std::to_string(static_cast<unsigned>(how.kind)) +
                            " is not event_poll, host_fn or blocking_sync");
  }
  auto negative = [](std::string_view field, std::chrono::nanoseconds v) {
    return make_error(errc::invalid_argument, "completion: " + std::string(field) + " (" +
                                                  std::to_string(v.count()) + " ns) is negative");
  };
  if (how.timeout.count() < 0) return negative("timeout", how.timeout);
  if (how.spin.count() < 0) return negative("spin", how.spin);
  if (how.max_backoff.count() < 0) return negative("max_backoff", how.max_backoff);
  return outcome::success();
}

namespace detail {
namespace {

class wait_op : public watched_wait, public std::enable_shared_from_this<wait_op> {
public:
  wait_op(std::shared_ptr<device_impl> d, stream s, shared_event ev, const completion& how,
          std::string_view library, wait_handler h, clock::time_point start = clock::now())
      : dev_(std::move(d)),
        stream_(std::move(s)),
        ev_(std::move(ev)),
        how_(how),
        library_(library),
        handler_(std::move(h)),
        ex_(asio::get_associated_executor(handler_, dev_->executor)),
        start_(start) {
    const auto left = clock::time_point::max() - start_;
    deadline_ = how.timeout >= left
                    ? clock::time_point::max()
                    : start_ + std::chrono::duration_cast<clock::duration>(how.timeout);
  }

  /// Common start: validation, cancellation hook, the event; then the strategy.
  void start() {
    keep_foreign_work();
    if (auto ok = dev_->check_accepting(); !ok) return (void)finish(ok.error().tagged(library_));
    if (auto ok = check_completion(how_); !ok) return (void)finish(ok.error().tagged(library_));
    if (!stream_ || stream_.state()->owner != dev_.get())
      return (void)finish(
          make_error(errc::invalid_argument, "async_wait: the stream is not of this device"));
    if (auto st = dev_->make_current(); st != cudaSuccess)
      return (void)finish(fault(st, "cudaSetDevice"));
    if (!ev_) {
      auto ev = record_event(*dev_, stream_.native_handle(), library_,
                             how_.kind == strategy::blocking_sync);
      if (!ev) return (void)finish(ev.error());
      ev_ = std::move(ev).value();
    }
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) {
      slot.assign([w = weak_from_this()](asio::cancellation_type t) {
        using ct = asio::cancellation_type;
        if ((t & (ct::terminal | ct::partial | ct::total)) == ct::none) return;
        if (auto op = w.lock())
          op->finish(make_error(errc::cancelled, std::string(op->library_) +
                                                     ": wait cancelled; the GPU work goes on"));
      });
    }
    launch();
  }

  clock::time_point deadline() const noexcept override { return deadline_; }
  bool polls_for_faults() const noexcept override { return false; }

  /// Monitor tick: device failure and deadline. Returns true once finished.
  bool on_tick(clock::time_point now) override {
    if (done_.load()) return true;
    if (auto ok = dev_->check_accepting(); !ok) return finish(ok.error().tagged(library_)), true;
    if (now >= deadline_) return finish(timeout_error()), true;
    if (polls_for_faults()) {
      auto q = cudaEventQuery(ev_->native_handle());
      if (q != cudaSuccess && q != cudaErrorNotReady)
        return finish(fault(q, "cudaEventQuery")), true;
    }
    return done_.load();
  }

protected:
  virtual void launch() = 0;
  /// Runs on the handler's executor just before the handler (host_fn re-checks there).
  virtual void before_deliver(result<void>&) {}

  gpu_error fault(cudaError_t st, std::string_view what) {
    auto e = classify(st, what).tagged(library_);
    dev_->note_error(e);
    if (e.code() != errc::context_poisoned) cudaGetLastError();
    return e;
  }

  gpu_error timeout_error() const {
    return make_error(errc::timeout, std::string(library_) + ": wait timed out after " +
                                         std::to_string(how_.timeout.count()) +
                                         " ns; the GPU work goes on");
  }

  /// First caller wins. `inline_ok` only from code already running on the
  /// handler's executor outside the initiating call (the poll loop).
  bool finish(result<void> r, bool inline_ok = false) {
    if (done_.exchange(true)) return false;
    if (counts_polled_) stream_.state()->polled.fetch_sub(1, std::memory_order_relaxed);
    auto deliver = [self = shared_from_this(), r = std::move(r)]() mutable {
      self->before_deliver(r);
      auto slot = asio::get_associated_cancellation_slot(self->handler_);
      if (slot.is_connected()) slot.clear();
      auto h = std::move(self->handler_);
      self->work_.reset();
      std::move(h)(std::move(r));
    };
    // The handler's executor is type-erased (no blocking.never), so a post is
    // made through the device's executor and the final hop is a dispatch.
    if (inline_ok)
      asio::dispatch(ex_, std::move(deliver));
    else
      asio::post(dev_->executor, [ex = ex_, deliver = std::move(deliver)]() mutable {
        asio::dispatch(ex, std::move(deliver));
      });
    return true;
  }

  /// Once per wait (start() may have taken it already for a foreign executor).
  void keep_work() {
    if (!work_) work_.emplace(asio::prefer(ex_, asio::execution::outstanding_work.tracked));
  }
  /// A handler bound to another executor than the device's (a callback on a
  /// second io_context) holds outstanding work there until it runs, as an
  /// Asio operation must: that io_context's run() must not return while the
  /// wait is pending. The device's own executor needs none (the poll hub
  /// keeps a post or a timer on it while it waits), so a coroutine or a
  /// callback on it costs one comparison and no atomic operation; any other
  /// executor (a strand of the same io_context too) takes the tracked work.
  /// A composed unit's executor that runs as the device's (its coroutine
  /// on the device's executor) counts as the device's: the same reason
  /// holds, and the unit's own co_spawn holds work on that executor until
  /// the unit's coroutine ends anyway; taking it again copied the unit's
  /// executor (too large for any_executor's inline storage) to the heap and
  /// touched the io_context's shared work count, once per unit.
  void keep_foreign_work() {
    if (ex_ == dev_->completion_executor) return;
    if (const auto* u = ex_.target<unit_executor>(); u && u->inner() == dev_->executor) return;
    keep_work();
  }

  std::shared_ptr<device_impl> dev_;
  stream stream_;
  shared_event ev_;
  completion how_;
  std::string_view library_;
  wait_handler handler_;
  asio::any_completion_executor ex_;
  std::optional<asio::any_completion_executor> work_;
  clock::time_point start_, deadline_;
  std::atomic<bool> done_{false};
  bool counts_polled_ = false;  // counted in stream_state::polled until finished
};

// ---------------------------------------------------------------- event_poll
// Handed to the device's poll_hub, which re-checks the event from the io
// executor: on every turn while the wait is young (spin), then from a timer
// whose period grows with the wait (1/64 of the time already waited,
// capped), so a long kernel costs little CPU and the added latency stays a
// small fraction of the wait. The hub queries only the oldest wait of each
// stream (work on a stream finishes in order).
class poll_op : public wait_op, public polled_wait {
public:
  template <class... A>
  explicit poll_op(A&&... a) : wait_op(std::forward<A>(a)...) {
    if (stream_) {
      stream_.state()->polled.fetch_add(1, std::memory_order_relaxed);
      counts_polled_ = true;
    }
  }

  cudaStream_t polled_stream() const noexcept override { return stream_.native_handle(); }
  cudaEvent_t polled_event() const noexcept override { return ev_->native_handle(); }
  bool polled_done() const noexcept override { return done_.load(std::memory_order_relaxed); }
  clock::time_point polled_start() const noexcept override { return start_; }
  clock::duration polled_spin() const noexcept override {
    return std::chrono::duration_cast<clock::duration>(how_.spin);
  }
  clock::duration polled_max_backoff() const noexcept override {
    return std::chrono::duration_cast<clock::duration>(how_.max_backoff);
  }
  void polled_complete(cudaError_t st, bool run_here) override {
    if (st == cudaSuccess)
      finish(outcome::success(), run_here);
    else
      finish(fault(st, "cudaEventQuery"), run_here);
  }
  void polled_reject() override {
    auto ok = dev_->check_accepting();
    finish(ok ? make_error(errc::device_unavailable, "the device stopped")
              : ok.error().tagged(library_));
  }

private:
  void launch() override {
    // The device monitor ends the wait at its deadline (and on a fault found
    // elsewhere); the hub only looks at events.
    if (deadline_ != clock::time_point::max()) dev_->watch(shared_from_this());
    dev_->polls->add(std::static_pointer_cast<poll_op>(shared_from_this()));
  }
};

// ---------------------------------------------------------------- deferred
// run_kernel's batch path: the enqueue itself waits in the stream's queue in
// the hub; the drain runs the queued enqueues back to back (the library's
// host code stays hot in the caches), records one event for all of them and
// hands them to the hub as ordinary polled waits sharing that event. The
// stage decides who may finish the op while it is queued or enqueuing
// (never the canceller while the enqueue still uses the coroutine's frame).
class queued_op final : public poll_op {
public:
  queued_op(std::shared_ptr<device_impl> d, cuda::launch& l, deferred_enqueue what,
            deferred_status* status, const completion& how, std::string_view library,
            wait_handler h)
      // No deadline (the batch path is only taken without one); the wait
      // starts when the drain arms it (one clock read per batch).
      : poll_op(std::move(d), l.get_stream(), nullptr, how, library, std::move(h),
                clock::time_point{}),
        launch_(&l),
        what_(what),
        status_(status) {}

  void start_queued() {
    keep_foreign_work();
    if (auto ok = dev_->check_accepting(); !ok) return (void)finish(ok.error().tagged(library_));
    if (!stream_ || stream_.state()->owner != dev_.get())
      return (void)finish(
          make_error(errc::invalid_argument, "run_kernel: the stream is not of this device"));
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) {
      slot.assign([w = weak_from_this()](asio::cancellation_type t) {
        using ct = asio::cancellation_type;
        if ((t & (ct::terminal | ct::partial | ct::total)) == ct::none) return;
        if (auto op = w.lock()) static_cast<queued_op*>(op.get())->cancel();
      });
    }
    dev_->polls->defer(std::static_pointer_cast<queued_op>(shared_from_this()),
                       stream_.state()->batch_queue);
  }

  /// Drain: runs the enqueue unless the op was cancelled first; false when
  /// the op is finished (cancelled, rejected, or the enqueue failed).
  /// `current`: the result of making the device current on this thread
  /// (once per batch: every op of a batch is on one device).
  bool enqueue(cudaError_t current) {
    int expected = queued;
    if (!stage_.compare_exchange_strong(expected, enqueuing)) return false;
    result<void> r = outcome::success();
    if (auto ok = dev_->check_accepting(); !ok)
      r = ok.error().tagged(library_);
    else if (current != cudaSuccess)
      r = fault(current, "cudaSetDevice");
    else
      r = run_enqueue();
    if (r) {
      status_->enqueued = true;
      return true;
    }
    stage_.store(dropped);
    finish(std::move(r));
    return false;
  }

  /// Drain: the batch's event is recorded; stamps the buffers and starts
  /// waiting. False if a cancellation arrived meanwhile (finished now).
  bool arm(const shared_event& ev, clock::time_point now) {
    launch_->stamp(ev);
    status_->ev = ev;
    ev_ = ev;
    start_ = now;
    stage_.store(waiting);
    // Last use of the frame's launch and status above: from here on any
    // finish may resume the coroutine.
    if (cancel_requested_.load()) {
      finish(cancelled_error());
      return false;
    }
    return true;
  }

  /// Drain: recording the batch's event failed after the enqueue.
  void fail_enqueued(const gpu_error& e) {
    stage_.store(dropped);
    finish(e);
  }

  void polled_reject() override {
    int expected = queued;
    if (stage_.compare_exchange_strong(expected, dropped) || expected == waiting)
      poll_op::polled_reject();
  }

  std::string_view library() const noexcept { return library_; }
  device_impl& dev() const noexcept { return *dev_; }
  cudaStream_t native_stream() const noexcept { return stream_.native_handle(); }

private:
  enum : int { queued, enqueuing, waiting, dropped };

  /// The enqueue; one that throws fails this operation alone, the exception
  /// kept for the awaiting coroutine to rethrow (deferred_status::thrown): left
  /// here, it would end a launch thread (std::terminate) or leave the drain
  /// with the batch's other operations unfinished and the stream's queue
  /// marked as draining for ever.
  result<void> run_enqueue() {
    try {
      return what_.fn(what_.ctx, *launch_);
    } catch (...) {
      status_->thrown = std::current_exception();
      return make_error(errc::invalid_argument,
                        std::string(library_) + ": the deferred enqueue threw an exception");
    }
  }

  void cancel() {
    int expected = queued;
    if (stage_.compare_exchange_strong(expected, dropped)) return (void)finish(cancelled_error());
    cancel_requested_.store(true);
    if (stage_.load() == waiting) finish(cancelled_error());
  }

  gpu_error cancelled_error() const {
    return make_error(errc::cancelled,
                      std::string(library_) + ": wait cancelled; the GPU work goes on");
  }

  cuda::launch* launch_;
  deferred_enqueue what_;
  deferred_status* status_;
  std::atomic<int> stage_{queued};
  std::atomic<bool> cancel_requested_{false};
};

// ---------------------------------------------------------------- host_fn
// cudaLaunchHostFunc: the callback (a CUDA thread, where no CUDA call is
// allowed) only hands its reference to the handler's executor. Host
// functions get no error status, so the event is re-checked before the
// handler runs, and the monitor polls the event for faults in case the
// callback never runs.
class host_fn_op final : public wait_op {
public:
  using wait_op::wait_op;
  bool polls_for_faults() const noexcept override { return true; }

private:
  void launch() override {
    keep_work();
    auto t = std::make_unique<host_ticket>();
    t->op = shared_from_this();
    t->complete = &callback;
    if (auto st = dev_->launch_host_fn(stream_.native_handle(), t); st != cudaSuccess) {
      finish(fault(st, "cudaLaunchHostFunc"));
      return;
    }
    dev_->watch(shared_from_this());
  }

  // On the CUDA callback thread, with outstanding work of the device's
  // executor in `work` (so the io_context is alive; device.cpp, host_ticket).
  static void callback(std::shared_ptr<void>& p, asio::any_io_executor& work) {
    auto self = std::static_pointer_cast<host_fn_op>(std::move(p));
    self->finish(outcome::success());
    // Never drop the last reference on this CUDA thread: releasing the op may
    // call into CUDA (stream or device teardown), which a host function must
    // not. The work goes with it and ends after it on an io thread.
    asio::post(work, [self = std::move(self), work]() mutable { self.reset(); });
  }

  void before_deliver(result<void>& r) override {
    if (!r) return;
    auto q = cudaEventQuery(ev_->native_handle());
    if (q != cudaSuccess && q != cudaErrorNotReady)
      r = fault(q, "cudaEventQuery (after host function)");
    else if (auto ok = dev_->check_accepting(); !ok)
      r = ok.error().tagged(library_);
  }
};

// ---------------------------------------------------------------- blocking_sync
// cudaEventSynchronize on the device's worker thread (blocking-sync events:
// it sleeps, not spins); the worker posts the result to the handler's executor.
class blocking_op final : public wait_op {
public:
  using wait_op::wait_op;

private:
  void launch() override {
    keep_work();
    dev_->submit_blocking({ev_, [self = shared_from_this()](cudaError_t st) {
                             auto* op = static_cast<blocking_op*>(self.get());
                             if (st == cudaSuccess)
                               op->finish(outcome::success());
                             else
                               op->finish(op->fault(st, "cudaEventSynchronize"));
                           }});
    dev_->watch(shared_from_this());
  }
};

}  // namespace

void drain_deferred(std::vector<std::shared_ptr<polled_wait>>& batch) {
  std::vector<std::shared_ptr<queued_op>> ok;
  ok.reserve(batch.size());
  const cudaError_t current =
      static_cast<queued_op&>(*batch.front()).dev().make_current();  // batch: one device
  for (auto& w : batch) {
    auto op = std::static_pointer_cast<queued_op>(std::move(w));
    if (op->enqueue(current)) ok.push_back(std::move(op));
  }
  batch.clear();
  if (ok.empty()) return;
  auto& first = *ok.front();
  auto ev = record_event(first.dev(), first.native_stream(), first.library());
  if (!ev) {
    wait_untracked(first.dev(), first.native_stream());  // their keep-alives go next
    for (auto& op : ok) op->fail_enqueued(ev.error());
    return;
  }
  first.dev().batches.fetch_add(1, std::memory_order_relaxed);
  first.dev().ops_batched.fetch_add(ok.size(), std::memory_order_relaxed);
  std::vector<std::shared_ptr<polled_wait>> waits;
  waits.reserve(ok.size());
  const auto now = clock::now();
  for (auto& op : ok)
    if (op->arm(ev.value(), now)) waits.push_back(std::move(op));
  first.dev().polls->add_all(waits);
}

bool stream_busy(const stream& s) noexcept {
  return s && s.state()->polled.load(std::memory_order_relaxed) > 0;
}

namespace {
thread_local bool t_prefer_batching = false;  // prefer_batching()
}  // namespace
void prefer_batching(bool on) noexcept {
  t_prefer_batching = on;
}
bool batching_preferred() noexcept {
  return t_prefer_batching;
}

namespace {
thread_local std::size_t t_spread_lanes = 0;  // spread_lanes()
}  // namespace
void spread_lanes(std::size_t n) noexcept {
  t_spread_lanes = n;
}
std::size_t lanes_spread() noexcept {
  return t_spread_lanes;
}

void start_deferred(cuda::launch& l, deferred_enqueue what, deferred_status* status,
                    const completion& how, std::string_view library, wait_handler handler) {
  auto dev = l.get_stream().state()->owner->shared_from_this();
  auto op = std::make_shared<queued_op>(std::move(dev), l, what, status, how, library,
                                        std::move(handler));
  op->start_queued();
}

void start_wait(const stream& s, std::shared_ptr<pooled_event> ev, const completion& how,
                std::string_view library, wait_handler handler) {
  std::shared_ptr<device_impl> dev = s ? s.state()->owner->shared_from_this() : nullptr;
  if (!dev) {
    // No device, so no io executor to post through: hop via the system
    // executor, then dispatch to the handler's own executor (a rare misuse path).
    result<void> r = make_error(errc::invalid_argument, "async_wait: empty stream");
    // The handler's executor counts the hop as outstanding work.
    auto work = asio::prefer(asio::get_associated_executor(handler),
                             asio::execution::outstanding_work.tracked);
    asio::post(asio::system_executor(), [h = std::move(handler), r = std::move(r), work]() mutable {
      asio::dispatch(work, asio::append(std::move(h), std::move(r)));
    });
    return;
  }
  std::shared_ptr<wait_op> op;
  switch (how.kind) {
    case strategy::host_fn:
      op = std::make_shared<host_fn_op>(dev, s, std::move(ev), how, library, std::move(handler));
      break;
    case strategy::blocking_sync:
      op = std::make_shared<blocking_op>(dev, s, std::move(ev), how, library, std::move(handler));
      break;
    case strategy::event_poll:
    default:
      op = std::make_shared<poll_op>(dev, s, std::move(ev), how, library, std::move(handler));
      break;
  }
  op->start();
}

}  // namespace detail
}  // namespace atomr::cuda
