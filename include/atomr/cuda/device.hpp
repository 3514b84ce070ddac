// device: the stable per-ordinal owner of a GPU's state, created on an Asio executor.
#pragma once

#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/stream.hpp>
#include <atomr/cuda/supervision.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/deferred.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atomr::cuda {

template <element T>
class gpu_ref;
template <element T>
class pinned_buffer;

/// The CUDA libraries a device lets actors use.
struct library_set {
  bool cublas = true;  ///< blas_actor
  bool cudnn = true;   ///< cudnn_actor
  bool cufft = true;   ///< fft_actor
  bool curand = true;  ///< rng_actor
};

/// The isolated device mode (docs/design.md, "Isolated device"): the CUDA
/// context lives in a worker process (`atomr-cuda-worker`) that the device
/// starts, watches and restarts after a sticky fault, a crash or a hang; the
/// service process never initialises CUDA.
struct isolation_options {
  /// Off: the device runs in this process (the default).
  bool enabled = false;
  /// The worker executable; empty: $ATOMR_CUDA_WORKER, else the one built
  /// or installed with the library.
  std::string worker_executable;
  /// Restarts allowed after a fault, crash or hang; one more stops the device.
  restart_budget budget{};
  /// A heartbeat every `heartbeat`; no answer within `heartbeat_timeout`: hung.
  std::chrono::milliseconds heartbeat{100};
  std::chrono::milliseconds heartbeat_timeout{2000};  ///< see heartbeat
  /// An operation still unanswered `hang_margin` after its own deadline (its
  /// completion timeout; `max_op_time` for one without) is a hang: the
  /// worker is killed and restarted, and every pending operation fails with
  /// timeout. 1 ms to 1 hour each.
  std::chrono::milliseconds hang_margin{2000};
  std::chrono::milliseconds max_op_time{60000};  ///< see hang_margin
  /// From the worker's spawn to its hello (CUDA context creation included);
  /// longer is a failed start. 1 ms to 1 hour.
  std::chrono::milliseconds start_timeout{20000};
  /// Request rings in shared memory (docs/design.md, "The request rings"): a
  /// service thread puts its requests in one, a worker thread serves each. 1 to 16.
  std::size_t rings = 4;
  /// While calls are waiting for their replies, an io thread of the device's
  /// executor polls the reply rings too (a handler that defers itself),
  /// for up to `reply_spin` after the last reply it took: a reply then
  /// resumes its waiter on that thread without waking a sleeping one. 0:
  /// only the reply reader thread takes replies. 0 to 10 ms.
  std::chrono::microseconds reply_spin{200};
  /// Shared memory for bulk data (uploads, downloads), registered as pinned
  /// memory in the worker. Larger transfers go through it in pieces.
  /// 1 MiB to 16 GiB.
  std::size_t arena_bytes = std::size_t{256} << 20;
  /// More arguments for the worker (tests: "--test-faults").
  std::vector<std::string> worker_args;
};

/// Settings fixed when a device is first opened.
struct device_options {
  /// The strategy operations use unless told otherwise.
  completion default_completion = event_poll{};
  /// How acquire_stream() hands out streams by default.
  stream_policy streams = stream_policy::pooled;
  /// Number of streams under stream_policy::pooled.
  std::size_t stream_pool_size = 4;
  /// Which libraries actors may use on this device.
  library_set libraries{};
  /// Pinned host memory kept cached for reuse by transfers, in bytes.
  std::size_t pinned_cache_limit = std::size_t{1} << 30;
  /// event_poll: the most operations one batch of a busy stream launches
  /// under one event (docs/design.md, run_kernel); 0 counts as 1. Larger
  /// batches cost fewer events; smaller ones let completions be found while
  /// the GPU still runs the batch's later work.
  std::size_t max_batch = 128;
  /// event_poll: threads of this device that run busy streams' batches (the
  /// queued enqueues), so that an io thread resumes coroutines and finds
  /// completions while another thread makes the library calls
  /// (docs/design.md, "launch threads"). A stream is served by one of them,
  /// assigned in turn; they start when first needed, spin briefly when out of
  /// work, then sleep. 0: batches run on the device's executor (an io thread).
  /// At most 64.
  std::size_t launch_threads = 8;
  /// event_poll: while a launch thread is making a batch's library calls,
  /// the poller asks each stream's events at most once per this interval
  /// (its queries and those launches take the same driver locks;
  /// docs/design.md). Zero: on every turn. 0 to 1000 us.
  std::chrono::microseconds busy_poll_interval{0};
  /// event_poll: how long a launch thread that ran out of work keeps looking
  /// for more before it sleeps (waking a sleeping thread costs tens of
  /// microseconds; docs/design.md, "launch threads"). Spinning costs CPU only
  /// right after work, never on an idle device. 0 to 10000 us.
  std::chrono::microseconds launch_spin{50};
  /// Run the device in a supervised worker process (isolation_options::enabled).
  isolation_options isolation{};
};

/// invalid_argument naming the first option out of its documented range
/// (default_completion, launch_threads, busy_poll_interval, launch_spin and the
/// isolation options); no CUDA call. Opening a device checks its options with this first.
result<void> check_device_options(const device_options& o);

/// The device's health. In process it moves only forward: healthy ->
/// poisoned or stopped. An isolated device starts in `starting` and, after
/// a fault, goes poisoned -> restarting -> healthy (a new worker) or stopped
/// (the restart budget is spent).
enum class health_state : std::uint8_t {
  healthy,      ///< serving
  poisoned,     ///< a sticky fault hit the context; every call fails with the fault
  stopped,      ///< stop() was called (or, isolated, the restart budget is spent)
  unavailable,  ///< no usable GPU at this ordinal (see device::status())
  starting,     ///< isolated: the first worker is starting; operations wait for it
  restarting,   ///< isolated: a new worker is starting; operations fail at once
};

/// The enumerator's name ("healthy", ...); "unknown" for any other value.
std::string_view to_string(health_state h) noexcept;

/// A snapshot of a device's statistics.
struct device_statistics {
  std::size_t free_bytes = 0;        ///< cudaMemGetInfo, at the time of the snapshot
  std::size_t total_bytes = 0;       ///< cudaMemGetInfo
  std::uint64_t ops_in_flight = 0;   ///< operations started and not yet finished
  std::uint64_t ops_completed = 0;   ///< finished with success
  std::uint64_t ops_failed = 0;      ///< finished with an error (timeout and cancel included)
  std::uint64_t faults = 0;          ///< sticky faults seen (0 or 1 per device)
  std::uint64_t out_of_memory = 0;   ///< out_of_memory errors, from any library
  std::uint64_t live_buffers = 0;    ///< gpu_ref allocations not yet released
  std::uint64_t parked = 0;          ///< keep-alives waiting for abandoned GPU work
  std::uint64_t events_created = 0;  ///< CUDA events the device's event pool has made
  /// Operations that joined a busy stream's batch instead of launching at
  /// once, and the batches (drains) that launched them: one event each.
  std::uint64_t ops_batched = 0;
  std::uint64_t batches = 0;  ///< see ops_batched
  /// Events composed units recorded after their steps: one per run of
  /// consecutive steps on one stream (docs/design.md, "Composed units").
  std::uint64_t unit_events = 0;
  /// Times work was enqueued and no event could be made or recorded to
  /// track it, so the enqueuing thread waited for its stream before dropping
  /// the work's keep-alives (docs/design.md, "Work that no event tracks").
  std::uint64_t untracked_waits = 0;
  /// Times a launch thread found no work within launch_spin and slept.
  std::uint64_t launch_sleeps = 0;
  /// Threads of this device's own running now: in process, the launch
  /// threads started so far (each with the first stream assigned to it, at
  /// most launch_threads; stopped with the device's context); isolated, the
  /// reply reader (one, from open to the device's end). docs/design.md
  /// describes each.
  std::size_t library_threads = 0;
  /// The device's blocking_sync thread: 1 from the first blocking_sync wait
  /// to the device's end (or its io_context's), else 0 (docs/design.md,
  /// "Device"). Not in library_threads.
  std::size_t blocking_threads = 0;
  std::size_t pinned_cached_bytes = 0;  ///< pinned host memory held for reuse
  /// host_fn waits' host functions queued on the GPU and not yet run (each
  /// holds outstanding work of the device's executor until it has run).
  std::size_t host_fns_pending = 0;
  std::uint64_t generation = 0;  ///< device::generation()
  /// Isolated devices: worker restarts so far, restarts the budget still
  /// allows in its window, the worker's pid (0: none), operations sent to
  /// it and not answered, the worker process's threads now (its io thread,
  /// one per request ring, the device's launch threads and the CUDA
  /// driver's own, read from /proc; 0: no worker), and whether the device
  /// is isolated at all.
  bool isolated = false;
  std::uint64_t worker_restarts = 0;                ///< see isolated
  std::size_t restarts_left = 0;                    ///< see isolated
  int worker_pid = 0;                               ///< see isolated
  std::size_t worker_calls_pending = 0;             ///< see isolated
  std::size_t worker_threads = 0;                   ///< see isolated
  health_state health = health_state::unavailable;  ///< device::health()
};

namespace detail {
class device_impl;
struct buffer_state;
struct pinned_block;
}  // namespace detail

/// A GPU ordinal with its memory pool, streams, event pool, pinned-buffer
/// pool and fault state. A copyable handle: copies share one state, and
/// opening the same ordinal again while a handle lives returns that state
/// (the first opener's executor and options win).
///
/// Lifetime: the device must not outlive the io_context (execution context)
/// of the executor it was opened on; its timers and pollers run there. Every
/// copy, and everything that holds one (gpu_ref, streams from
/// acquire_stream(), library actors, coroutines still running), must be
/// destroyed before that io_context is: declare the io_context first.
///
/// Thread safety: all members may be called from any thread.
class device {
public:
  using executor_type = asio::any_io_executor;  ///< the executor type devices are opened on

  /// Opens the ordinal, or fails with device_unavailable (the CUDA message
  /// included) when there is no usable GPU. Blocks while CUDA initialises
  /// (first call in the process: tens to hundreds of ms).
  static result<device> open(const executor_type& ex, int ordinal = 0,
                             const device_options& options = {});

  /// As open(), but never fails: without a GPU the device is health_state::
  /// unavailable and every operation on it yields device_unavailable.
  explicit device(const executor_type& ex, int ordinal = 0, const device_options& options = {});

  /// An empty handle (no device): every member is safe to call; status()
  /// and every operation on it yield invalid_argument, health() is
  /// unavailable. Assign an opened device to use it.
  device() noexcept = default;

  /// Wraps the library's state; used by the library, not by users.
  explicit device(std::shared_ptr<detail::device_impl> impl) noexcept : impl_(std::move(impl)) {}

  /// False for an empty handle.
  explicit operator bool() const noexcept { return impl_ != nullptr; }

  /// The executor given at open (an empty executor for an empty handle).
  executor_type get_executor() const noexcept;
  /// The CUDA ordinal (-1 for an empty handle).
  int ordinal() const noexcept;
  /// The options the device was first opened with.
  const device_options& options() const noexcept;

  /// The device's health now.
  health_state health() const noexcept;
  /// True while the device takes new work (healthy; isolated: also starting).
  bool accepting() const noexcept;
  /// True for a device opened with isolation_options::enabled.
  bool isolated() const noexcept;
  /// Bumped by a sticky fault or stop(); refs from older generations are stale.
  std::uint64_t generation() const noexcept;
  /// Success while accepting; otherwise the reason (the first fault, stop, or
  /// the error that made the device unavailable).
  result<void> status() const;
  /// The first sticky fault, if any.
  std::optional<gpu_error> fault() const;

  /// Statistics; calls cudaMemGetInfo (does not wait for the GPU).
  device_statistics statistics() const;

  /// A stream by the given policy. `owner` names the requester for
  /// per_actor_shared ("cublas", ...). Fails with device_unavailable when not
  /// accepting, or with the CUDA error of cudaStreamCreateWithFlags.
  result<stream> acquire_stream(stream_policy policy, std::string_view owner = {});
  /// A stream by the device's default policy.
  result<stream> acquire_stream() { return acquire_stream(options().streams); }
  /// The device's main stream (the one stream_policy::single hands out). Always
  /// a handle; work on it fails with the device's status while not accepting.
  stream main_stream() const;

  /// Allocates `count` elements from the device's stream-ordered pool
  /// (cudaMallocFromPoolAsync on `on`). The memory is usable at once by work
  /// on any stream; ordering is tracked per buffer. Does not wait.
  /// Fails with the device's status while it does not accept work,
  /// invalid_argument for a count of 0 (or too large to count in bytes) or a
  /// stream of another device, and the classified error of
  /// cudaMallocFromPoolAsync (out_of_memory when the pool cannot grow).
  template <element T>
  result<gpu_ref<T>> allocate(std::size_t count, const stream& on);
  /// As allocate(count, on), on the device's main stream.
  template <element T>
  result<gpu_ref<T>> allocate(std::size_t count);

  /// A pinned host buffer of `count` elements from the device's pool
  /// (cudaHostAlloc on a miss; this pins pages and can take milliseconds).
  template <element T>
  result<pinned_buffer<T>> allocate_pinned(std::size_t count);

  /// Stops the device: generation bump, waits fail with device_unavailable,
  /// later calls fail at once. Does not wait for the GPU.
  void stop();

  /// Completes (signature void(health_state)) with the new health the next
  /// time it changes, or at once if the device is not healthy (isolated:
  /// stopped or unavailable; from starting, poisoned and restarting it waits
  /// for the next change, as a new worker follows).
  /// An empty handle completes at once with health_state::unavailable.
  /// Cancellable through the handler's cancellation slot (any type): it
  /// then completes at once with the health of that moment, so it may be
  /// raced against a timer with `||`. Without a token it returns a deferred
  /// operation (asio::deferred), on every Boost from 1.81.
  template <class Token = asio::deferred_t>
  auto async_wait_health_change(Token&& token = {}) {
    return asio::async_initiate<Token, void(health_state)>(
        [](auto handler, std::shared_ptr<detail::device_impl> impl) {
          add_health_observer(impl,
                              asio::any_completion_handler<void(health_state)>(std::move(handler)));
        },
        token, impl_);
  }

  /// The shared state behind this handle (the library's own use).
  const std::shared_ptr<detail::device_impl>& impl() const noexcept { return impl_; }
  friend bool operator==(const device& a, const device& b) noexcept { return a.impl_ == b.impl_; }

private:
  static void add_health_observer(const std::shared_ptr<detail::device_impl>& impl,
                                  asio::any_completion_handler<void(health_state)> h);
  result<std::shared_ptr<detail::buffer_state>> allocate_state(std::size_t count, dtype t,
                                                               const stream& on);
  result<std::shared_ptr<detail::pinned_block>> allocate_pinned_block(std::size_t bytes);

  std::shared_ptr<detail::device_impl> impl_;
};

}  // namespace atomr::cuda
