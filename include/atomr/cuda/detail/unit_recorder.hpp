// What a composed unit (compose.hpp) records while its steps enqueue, and the
// executor that tells run_kernel it runs inside one.
#pragma once

#include <atomr/cuda/detail/event_pool.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/stream.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/execution.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/require.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atomr::cuda {
class launch;
}

namespace atomr::cuda::detail {

struct unit_capture;
class device_impl;

/// The steps of one unit enqueued so far (docs/design.md, "Composed units").
/// Used by one coroutine at a time: the unit's, while it runs its steps.
struct unit_recorder {
  /// One run_kernel of a step: its stream, the event after it (what later
  /// steps on other streams wait on, and what the unit waits on), and the
  /// step's keep-alive with its output, held until the GPU is done.
  /// Consecutive stages on one stream share one event, recorded once after
  /// the last of them (a run; see close_runs()).
  struct stage {
    stream on;
    std::shared_ptr<pooled_event> done;
    std::shared_ptr<void> keep;
  };
  std::vector<stage> stages;
  /// A leading transfer step given no stream, not enqueued yet: it is
  /// enqueued by the unit's next step that enqueues anything, on that step's
  /// stream, just before it (or at the unit's end on a pooled stream).
  /// docs/design.md, "Where a unit's transfers run".
  struct pending_transfer {
    std::size_t step = 0;  ///< its step number (1-based)
    device dev;            ///< the device of its buffer
    std::string_view library;
    /// The transfer's enqueue function and output, owned; once enqueued,
    /// its keep-alive too: then the stage's keep-alive.
    std::shared_ptr<void> state;
    /// Runs its checks and enqueue on `l`, keeping the keep-alive in `state`.
    result<void> (*run)(void* state, launch& l) = nullptr;
  };
  std::vector<pending_transfer> pending;
  /// The step running now (1-based; set by the unit's coroutine), what a
  /// pending transfer remembers as its own.
  std::size_t step = 0;
  /// A pending transfer that failed when it was enqueued: its step and error
  /// (the unit reports it under that step, not the step that enqueued it).
  std::optional<std::pair<std::size_t, gpu_error>> pending_failure;
  /// A pageable download's copy out of its staging block: made once every
  /// stage finished, in order; dropped if the unit fails. (A plain record,
  /// not a std::function: its capture would not fit one's inline storage.)
  struct copy_out {
    std::shared_ptr<const void> block;  ///< what holds `from` (the staging block)
    const void* from = nullptr;
    void* to = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<copy_out> copies_out;
  /// Non-null while the unit is recorded into a CUDA graph (graph.hpp): the
  /// steps enqueue on the recording's stream and nothing runs.
  unit_capture* capture = nullptr;
  /// Isolated devices (docs/design.md, "Units on an isolated device"): the
  /// requests the unit's steps made instead of sending them, sent to the
  /// worker as one message at the unit's end (nothing is sent when a step
  /// fails first); the device they go to (one per unit), what they keep
  /// alive until the answer (arena blocks), and the worker incarnation
  /// whose arena those blocks are in (0: none).
  struct remote_request {
    std::uint16_t op = 0;  ///< a wire::op_code
    std::size_t step = 0;  ///< the step that made it (1-based)
    std::string payload;   ///< its arguments
  };
  std::vector<remote_request> remote_requests;
  std::shared_ptr<device_impl> remote_device;
  std::vector<std::shared_ptr<void>> remote_keep;
  std::uint64_t remote_incarnation = 0;
  /// What the unit's errors call it: "compose" or "record".
  const char* name = "compose";
  /// Set once the unit's end has parked or settled every stage.
  bool ended = false;

  unit_recorder() = default;
  unit_recorder(const unit_recorder&) = delete;
  unit_recorder& operator=(const unit_recorder&) = delete;
  /// Records any run's event still deferred (a unit abandoned midway: a
  /// buffer stamped with it must never meet an event that was not recorded).
  ~unit_recorder() {
    for (auto& st : stages)
      if (st.done) st.done->settle();  // errors: nothing more can be done here
  }

  /// Room for one more stage, made before the stage is built (so that no
  /// temporary holding a step's keep-alive dies between its allocation and
  /// the caller's catch): the capacity doubles when full, and compose()
  /// reserves one per step up front, so a unit allocates its stages once.
  void room_for_stage() {
    if (stages.size() == stages.capacity()) stages.reserve(stages.empty() ? 4 : 2 * stages.size());
  }

  /// Records every stage's event that is still deferred, on its stream.
  /// Returns the first error (a cudaEventRecord failure: out of resources,
  /// or the context is gone); a run whose record failed is waited for on
  /// this thread first (docs/design.md, "Work that no event tracks").
  result<void> close_runs();
};

/// Enqueues every pending transfer of `u` (in order) on `on` when it is of
/// the transfer's device, else on one of that device's pooled streams; each
/// becomes a stage. A failure ends there: u.pending_failure names the step,
/// the transfers after it are dropped unstarted, and the error is returned.
result<void> flush_pending(unit_recorder& u, const stream& on);

/// An executor that runs as `inner` does and carries the unit whose step the
/// coroutines on it belong to. run_kernel finds it through
/// `co_await asio::this_coro::executor`: the unit is a property of the
/// coroutine's own executor, so no other coroutine (on this thread or
/// another) can enqueue into it by accident.
class unit_executor {
public:
  unit_executor(asio::any_io_executor inner, unit_recorder* rec) noexcept
      : inner_(std::move(inner)), rec_(rec) {}

  unit_recorder* recorder() const noexcept { return rec_; }
  /// The executor it runs as.
  const asio::any_io_executor& inner() const noexcept { return inner_; }

  template <class Property>
  requires asio::can_query<const asio::any_io_executor&, const Property&>::value decltype(auto)
  query(const Property& p) const {
    return asio::query(inner_, p);
  }
  template <class Property>
  requires asio::can_require<const asio::any_io_executor&, const Property&>::value unit_executor
  require(const Property& p)
  const { return unit_executor(asio::any_io_executor(asio::require(inner_, p)), rec_); }
  template <class Property>
  requires asio::can_prefer<const asio::any_io_executor&, const Property&>::value unit_executor
  prefer(const Property& p)
  const { return unit_executor(asio::any_io_executor(asio::prefer(inner_, p)), rec_); }
  template <class F>
  void execute(F&& f) const {
    inner_.execute(std::forward<F>(f));
  }
  friend bool operator==(const unit_executor& a, const unit_executor& b) noexcept {
    return a.rec_ == b.rec_ && a.inner_ == b.inner_;
  }
  friend bool operator!=(const unit_executor& a, const unit_executor& b) noexcept {
    return !(a == b);
  }

private:
  asio::any_io_executor inner_;
  unit_recorder* rec_;
};

/// The unit whose step runs on `ex`, or null.
inline unit_recorder* unit_of(const asio::any_io_executor& ex) noexcept {
  auto* u = ex.target<unit_executor>();
  return u ? u->recorder() : nullptr;
}

/// True when `s` is a stream of the device whose state is `d` (compared
/// without making a device handle: a unit's steps ask it on every step).
bool stream_of(const stream& s, const device_impl* d) noexcept;
/// True when `a` and `b` are streams of one device (both non-empty).
bool same_device(const stream& a, const stream& b) noexcept;

/// The stream of a step that may run on any stream of its device (an actor
/// operation that uses no workspace or plan of its lane: cuDNN's activation,
/// softmax, pooling, batch normalisation): inside a unit, the stream of the
/// unit's previous step when that is on `own`'s device, so the two steps
/// share one run and need no cross-stream wait (docs/design.md, "A unit's
/// workspace-free steps follow its previous step"); else `own`, the lane's.
/// The lane's handle is pointed at it for the call (lane_hold); a cuDNN
/// lane's stays there until an operation on its own stream comes.
inline stream unit_step_stream(const unit_recorder* unit, const stream& own) {
  if (!unit || unit->capture || unit->stages.empty()) return own;
  const stream& prev = unit->stages.back().on;
  return same_device(prev, own) ? prev : own;
}

}  // namespace atomr::cuda::detail
