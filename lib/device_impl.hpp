// Private: the state behind a device handle. Not installed.
#pragma once

#include <atomr/cuda/detail/event_pool.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/stream.hpp>

#include "poll_hub.hpp"

#include <boost/asio/any_completion_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <thread>
#include <vector>

namespace atomr::cuda::detail {

using clock = std::chrono::steady_clock;

struct stream_state {
  stream_state(std::shared_ptr<device_impl> d, cudaStream_t s, std::uint64_t i)
      : dev(std::move(d)), native(s), id(i), batch_queue(std::make_shared<deferred_queue>()) {}
  stream_state(const stream_state&) = delete;
  stream_state& operator=(const stream_state&) = delete;
  ~stream_state();

  std::shared_ptr<device_impl> dev;  // null for the device's own streams (no cycle)
  device_impl* owner = nullptr;      // always set
  cudaStream_t native;
  std::uint64_t id;
  /// event_poll waits on this stream not finished yet (queued for a batch,
  /// enqueuing, or in the poll hub). Non-zero: run_kernel joins the stream's
  /// batch. An atomic here, not a look into the hub under its lock: every
  /// operation asks, from every io thread.
  std::atomic<std::uint32_t> polled{0};
  /// Operations waiting for this stream's next batch (poll_hub::defer).
  const std::shared_ptr<deferred_queue> batch_queue;
};

/// A wait that the device's monitor must watch: for deadlines, for a fault
/// found elsewhere, and (host_fn) for a fault its callback will never report.
class watched_wait {
public:
  virtual ~watched_wait() = default;
  /// Called on the monitor strand; returns true once the wait has finished.
  virtual bool on_tick(clock::time_point now) = 0;
  /// The deadline, or clock::time_point::max().
  virtual clock::time_point deadline() const noexcept = 0;
  /// True if the monitor must query this wait's event for errors on every tick.
  virtual bool polls_for_faults() const noexcept = 0;
};

/// GPU work whose waiter gave up (timeout, cancellation): its keep-alive is
/// released only when `done` has completed (or the context is gone).
struct parked_work {
  shared_event done;
  std::shared_ptr<void> keep_alive;
};

/// Work for the blocking_sync thread.
struct blocking_item {
  shared_event ev;
  std::function<void(cudaError_t)> on_done;  // runs on the worker thread
};

/// The blocking_sync thread's queue. Shared by the device and the thread:
/// an item may hold the device's last reference, so the device can be
/// destroyed on the worker thread itself, which then still needs its queue.
struct blocking_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<blocking_item> items;
  bool stop = false;
  /// The thread runs: set when it is started, cleared as it returns
  /// (device_statistics::blocking_threads).
  std::atomic<bool> running{false};
};

class pinned_pool;
class poll_hub;
class remote_device;

/// One host function queued with cudaLaunchHostFunc (host_fn waits): what
/// its callback needs, allocated at launch and owned by CUDA until it runs.
/// `work` counts as outstanding work of the device's executor, so that
/// io_context::run() does not return (and the context is not destroyed by
/// a user who waits for run()) while the callback, which posts to that
/// executor, may still come. It is dropped early only when the device is
/// poisoned (a dead context may never run the callback) or the context is
/// shut down; a callback that then finds no work touches no executor.
struct host_fn_gate;
struct host_ticket {
  /// Its own reference: the trampoline holds the gate's lock while the
  /// completion is posted, and the posted handler may drop the device (and
  /// the device's reference to the gate) before the lock is released.
  std::shared_ptr<host_fn_gate> gate;
  std::shared_ptr<void> op;  // the wait (a host_fn_op)
  void (*complete)(std::shared_ptr<void>& op, asio::any_io_executor& work) = nullptr;
  std::optional<asio::any_io_executor> work;  // outstanding_work.tracked
};

/// The host functions of one device not yet run, with the ones that ran
/// after their work was dropped (freed at context shutdown, off the CUDA
/// callback thread: dropping a wait can release the device itself).
struct host_fn_gate {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<host_ticket*> pending;               // guarded by mu
  std::vector<std::unique_ptr<host_ticket>> late;  // guarded by mu
};

/// A counter that every operation writes, from every io thread: one cell per
/// thread slot, each on its own cache line, summed when read (statistics).
/// One shared atomic cost a cache-line transfer per operation at T = 8.
class sharded_counter {
public:
  void add(std::int64_t n) noexcept { cells_[slot()].v.fetch_add(n, std::memory_order_relaxed); }
  /// The sum of the cells: exact once writers are quiet, a statistic meanwhile.
  std::uint64_t load() const noexcept {
    std::int64_t sum = 0;
    for (const auto& c : cells_) sum += c.v.load(std::memory_order_relaxed);
    return sum < 0 ? 0 : static_cast<std::uint64_t>(sum);
  }

private:
  static constexpr std::size_t k_cells = 16;
  struct alignas(64) cell {
    std::atomic<std::int64_t> v{0};
  };
  static std::size_t slot() noexcept {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed) % k_cells;
    return mine;
  }
  std::array<cell, k_cells> cells_{};
};

class device_impl : public std::enable_shared_from_this<device_impl> {
public:
  device_impl(const asio::any_io_executor& ex, int ordinal, const device_options& o);
  ~device_impl();
  device_impl(const device_impl&) = delete;
  device_impl& operator=(const device_impl&) = delete;

  /// CUDA initialisation for this ordinal; sets health to healthy or unavailable.
  /// Isolated (options.isolation.enabled): starts the worker instead (health
  /// starting), and this process makes no CUDA call for the device.
  void init();
  /// The registry's key: isolated and in-process states of one ordinal differ.
  int registry_key() const noexcept;
  /// Instead of init(): leaves the device unavailable with `why` (bad options).
  void reject(gpu_error why);

  // --- state ---
  const asio::any_io_executor executor;
  /// `executor` as a handler's associated executor is compared with: a
  /// wait whose handler runs elsewhere holds outstanding work there (the
  /// device's own executor is kept busy by the poll hub while it waits).
  const asio::any_completion_executor completion_executor;
  const int ordinal;
  const device_options options;
  /// Set by init() (before the device is healthy, so before any other thread
  /// uses it) when this process sees one CUDA device: the current device of
  /// every thread is then this one, and make_current() asks nothing.
  bool only_device = false;

  // Read by every check of every operation: on a cache line of their own, so
  // that the counters below (written by every operation, from every io
  // thread) do not keep invalidating it.
  alignas(64) std::atomic<std::uint64_t> generation{1};
  std::atomic<health_state> health{health_state::unavailable};

  // statistics
  sharded_counter in_flight, completed, failed;  // per operation (launch)
  sharded_counter unit_events;                   // per run event of a composed unit
  alignas(64) std::atomic<std::uint64_t> faults{0}, oom{0}, live_buffers{0}, parked_count{0},
      ops_batched{0}, batches{0}, untracked_waits{0};
  alignas(64) char after_counters_ = 0;  // whatever follows starts on a new line

  cudaMemPool_t mem_pool = nullptr;
  std::shared_ptr<event_pool> events;
  std::shared_ptr<pinned_pool> pinned;
  std::shared_ptr<poll_hub> polls;  // event_poll waits
  std::shared_ptr<stream_state> main_stream, release_stream;
  /// Isolated devices only: the link to the worker process.
  std::shared_ptr<remote_device> remote;
  std::vector<std::shared_ptr<stream_state>> stream_pool;
  std::atomic<std::size_t> next_pooled{0};

  // --- errors and health ---
  /// Success while healthy; otherwise the error every new call gets.
  result<void> check_accepting() const;
  /// True in the states where work is accepted (healthy; isolated: starting).
  static bool accepts(health_state h) noexcept {
    return h == health_state::healthy || h == health_state::starting;
  }
  /// The first fault, re-issued as context_poisoned for a later caller.
  gpu_error fault_error() const;
  /// Counts the error, and poisons the device if it is a sticky fault.
  void note_error(const gpu_error& e);
  /// Marks the device poisoned by `e` (first caller wins): generation bump,
  /// waiters failed, observers woken. Never frees anything.
  void poison(const gpu_error& e);
  void stop();
  /// Isolated: the worker's state as the device's health (failed: poisoned
  /// with `why`, generation bump; restarting; healthy; stopped with `why`).
  void remote_health(health_state to, const std::optional<gpu_error>& why);
  /// Isolated: the worker runs but could not open the GPU.
  void remote_unavailable(gpu_error why);
  /// The last 64 changes of health, oldest first (observers may see quick
  /// changes as one; tests read the whole sequence here).
  std::vector<health_state> health_history() const;
  /// After a driver or library failure, asks CUDA whether the context is
  /// still alive (cudaStreamQuery on the main stream); poisons it if not.
  void probe_context();
  /// A driver or library failure (`e`) in a context that the probe then
  /// finds poisoned failed because of the fault (its own or another
  /// operation's): returned as context_poisoned, with both messages, so that
  /// the caller sees the one error that says to give up on this context (a
  /// worker restart, a new process) rather than a survivable one. Any other
  /// error is returned as it is.
  gpu_error blame_fault(gpu_error e);

  /// True once init() made the ordinal current (so CUDA knows it) and no
  /// sticky fault has hit it since: teardown may call CUDA for it.
  bool context_usable() const noexcept;
  std::atomic<bool> cuda_initialised{false};

  /// Makes this device current on the calling thread (cached per thread).
  cudaError_t make_current() const noexcept;

  // --- streams ---
  result<stream> acquire_stream(stream_policy p, std::string_view owner);
  result<std::shared_ptr<stream_state>> new_stream(bool owned_by_caller);

  // --- monitor: deadlines, fault watchdog, parked keep-alives ---
  void watch(std::shared_ptr<watched_wait> w);
  void park(shared_event done, std::shared_ptr<void> keep_alive);

  // --- host functions (host_fn waits) ---
  /// Queues `t` on `s` (cudaLaunchHostFunc); on failure `t` is returned to
  /// the caller (not queued) with the error.
  cudaError_t launch_host_fn(cudaStream_t s, std::unique_ptr<host_ticket>& t);
  /// Drops the outstanding work of every pending host function (poison, shutdown).
  void release_host_fn_work();
  std::size_t host_fns_pending() const;
  /// 1 while the blocking_sync thread runs, else 0.
  std::size_t blocking_threads_running() const noexcept { return bq_->running.load() ? 1 : 0; }
  const std::shared_ptr<host_fn_gate> host_fns = std::make_shared<host_fn_gate>();

  // --- blocking_sync worker ---
  void submit_blocking(blocking_item item);

  // --- health observers ---
  void add_observer(asio::any_completion_handler<void(health_state)> h);

  /// The executor's execution context is being destroyed: wait for parked
  /// work (teardown may block), then drop every list that could keep this
  /// state alive through a cycle (parked keep-alives hold buffers, which hold
  /// the device). Called by the context's device service, no io thread running.
  void on_context_shutdown();

private:
  void set_health(health_state from, health_state to);
  void arm_monitor();  // on strand
  void on_monitor_tick();
  static void blocking_loop(const std::shared_ptr<blocking_queue>& q, int ordinal);

  mutable std::mutex mu_;  // fault_, init_error_, observers_, per_owner_
  std::optional<gpu_error> fault_;
  gpu_error init_error_;
  /// One async_wait_health_change: its handler, taken once (by a change of
  /// health, its cancellation, or the context's shutdown).
  struct health_observer {
    std::mutex mu;
    std::optional<asio::any_completion_handler<void(health_state)>> handler;
    std::optional<asio::any_completion_handler<void(health_state)>> take() {
      std::lock_guard lk(mu);
      auto h = std::move(handler);
      handler.reset();
      return h;
    }
  };
  std::vector<std::shared_ptr<health_observer>> observers_;
  std::vector<health_state> history_;
  std::map<std::string, std::shared_ptr<stream_state>, std::less<>> per_owner_;

  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer monitor_timer_;
  // watch() runs on the caller's thread for every wait with a deadline: it
  // appends under watch_mu_ and posts to the strand only when the monitor
  // would tick too late for the new wait (docs/design.md, "Device", the
  // monitor). The strand's work (ticks, arming) takes watch_mu_ as well.
  std::mutex watch_mu_;
  /// When the armed monitor timer fires; time_point::max() when unarmed.
  clock::time_point monitor_at_ = clock::time_point::max();  // guarded by watch_mu_
  std::vector<std::weak_ptr<watched_wait>> watched_;  // guarded by watch_mu_; ops own themselves
  std::vector<parked_work> parked_;                   // on strand

  std::shared_ptr<blocking_queue> bq_ = std::make_shared<blocking_queue>();
  std::thread bthread_;  // started by the first submit_blocking
};

/// Records a pooled event on `s`; `blocking`: a blocking-sync event, for a
/// thread that will wait on it in cudaEventSynchronize (blocking_sync).
/// A caller that enqueued work and drops its keep-alives when this fails
/// calls wait_untracked first.
result<shared_event> record_event(device_impl& d, cudaStream_t s, std::string_view library,
                                  bool blocking = false);

/// Work was enqueued on `s` and no event can be made or recorded to track
/// it (the driver is out of resources): waits for `s` on this thread, so
/// that the keep-alives of that work can be dropped. A poisoned context
/// runs nothing more and is not waited for (nor counted in
/// untracked_waits). docs/design.md, "Work that no event tracks".
void wait_untracked(device_impl& d, cudaStream_t s) noexcept;

}  // namespace atomr::cuda::detail
