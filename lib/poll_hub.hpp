// Private: the device's one event poller for event_poll waits.
//
// Work on one stream finishes in order, so among the waits on a stream only
// the oldest needs its event queried: if it is not done, no later one is.
// One poller per device therefore costs one cudaEventQuery per busy stream
// per turn, however many coroutines are waiting (a poller per wait cost one
// query per wait per turn, which capped throughput with many waits in
// flight: docs/history/performance.md).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace atomr::cuda::detail {

namespace asio = boost::asio;

/// What the poller needs from a wait (implemented in completion.cpp).
class polled_wait {
public:
  using clock = std::chrono::steady_clock;
  virtual ~polled_wait() = default;
  virtual cudaStream_t polled_stream() const noexcept = 0;
  virtual cudaEvent_t polled_event() const noexcept = 0;
  /// Finished already (cancelled, timed out by the device monitor, failed).
  virtual bool polled_done() const noexcept = 0;
  virtual clock::time_point polled_start() const noexcept = 0;
  /// The wait's spin budget and longest pause (completion::spin, max_backoff).
  virtual clock::duration polled_spin() const noexcept = 0;
  virtual clock::duration polled_max_backoff() const noexcept = 0;
  /// Completes the wait with the event's status (success or a fault);
  /// `run_here`: the handler may run on this thread now (else it is posted).
  virtual void polled_complete(cudaError_t status, bool run_here) = 0;
  /// The device stopped accepting work: completes the wait with that error.
  virtual void polled_reject() = 0;
};

/// Enqueues a batch of deferred waits of one stream back to back, records
/// one event after them and adds them to the hub (completion.cpp).
void drain_deferred(std::vector<std::shared_ptr<polled_wait>>& batch);

/// A stream's operations that wait for its next batch (not enqueued yet),
/// with a lock of its own: every batched operation adds to it, from every io
/// thread, and the hub's lock (taken by every poll step) stayed out of that
/// path. Owned by the stream (stream_state::batch_queue).
struct deferred_queue {
  std::mutex mu;
  std::deque<std::shared_ptr<polled_wait>> items;  // in submission order; guarded by mu
  bool draining = false;                           // a drain is due or running; guarded by mu
  /// Known to the hub (set once, under the hub's lock, with `launcher`).
  std::atomic<bool> registered{false};
  std::size_t launcher = 0;  // which launch thread drains it
};

class poll_hub : public std::enable_shared_from_this<poll_hub> {
public:
  using clock = polled_wait::clock;

  /// `accepting` reports whether the device still accepts work; batches of
  /// deferred waits run on up to `launch_threads` threads of the hub (0: on `ex`).
  poll_hub(asio::any_io_executor ex, std::function<bool()> accepting, std::size_t max_batch,
           std::size_t launch_threads, clock::duration busy_poll_interval,
           clock::duration launch_spin);
  ~poll_hub();
  poll_hub(const poll_hub&) = delete;
  poll_hub& operator=(const poll_hub&) = delete;

  /// Adds a wait whose event is recorded; the poller starts if idle.
  void add(std::shared_ptr<polled_wait> w);
  /// The same for several waits on one stream, under one lock.
  void add_all(std::vector<std::shared_ptr<polled_wait>>& ws);

  /// Queues a wait whose work is not enqueued yet on its stream's queue `q`.
  /// A drain (on a launch thread, or posted to the executor) hands the queued
  /// waits, in order, to drain_deferred (one drain at a time per stream).
  void defer(std::shared_ptr<polled_wait> w, const std::shared_ptr<deferred_queue>& q);
  /// Drops every wait without completing it and stops the launch threads
  /// (context shutdown; later batches run on the executor).
  void clear();

  /// Times a launch thread out of work slept (device_statistics::launch_sleeps).
  std::uint64_t launch_sleeps() const;
  /// Launch threads started and not stopped (device_statistics::library_threads).
  std::size_t launch_threads_running() const;

  /// A thread that runs the batches of the lanes assigned to it (poll_hub.cpp).
  struct launcher;

  /// Test only: called, when set (before any hub runs), by a step that found
  /// the hub empty, after it let go of the hub's lock and before it lets go
  /// of the step lock: test/test_poll_hub.cpp adds a wait there. Null in use.
  static inline void (*empty_step_hook)(poll_hub&) = nullptr;

private:
  friend struct poll_hub_test_access;  // test/test_poll_hub.cpp: runs a step
  struct lane {
    cudaStream_t stream = nullptr;
    std::deque<std::shared_ptr<polled_wait>> waits;  // in the order their events were recorded
    /// How long recent waits on this stream took (moving average), or zero:
    /// past the spin budget the poller sleeps until just before that and
    /// spins across it, instead of waking on its backoff timer.
    clock::duration typical{};
    clock::time_point last_done{};   // when a wait of this lane last finished
    clock::time_point last_query{};  // when a step last asked this lane's events
  };
  lane& lane_locked(cudaStream_t s);
  void add_locked(std::shared_ptr<polled_wait> w);
  void register_queue(const std::shared_ptr<deferred_queue>& q);
  void post_drain(const std::shared_ptr<deferred_queue>& q);
  void run_drain(const std::shared_ptr<deferred_queue>& q);
  /// Takes every queued wait out of every stream's queue (rejection, clear()).
  std::vector<std::shared_ptr<polled_wait>> take_deferred();
  static void launcher_loop(const std::shared_ptr<launcher>& me,
                            const std::weak_ptr<poll_hub>& hub);
  void stop_launchers();
  /// `full` (timer steps): query up to 64 waits of each lane even past one
  /// that is not done (a safety net for waits registered in a different
  /// order than their events were recorded).
  void step(bool full);
  /// After a step released step_mu_: when another step was turned away
  /// meanwhile (again_) and waits remain, schedules one. Every exit of a step
  /// that took step_mu_ goes through here.
  void look_again();
  void schedule_locked(bool spin, clock::duration pause);

  asio::any_io_executor ex_;
  std::function<bool()> accepting_;
  mutable std::mutex mu_;           // lanes_, count_, step_queued_, timer_due_
  std::mutex step_mu_;              // one step at a time
  std::atomic<bool> again_{false};  // a step found step_mu_ taken: look once more
  std::vector<lane> lanes_;
  std::size_t count_ = 0;
  const std::size_t max_batch_;  // deferred enqueues per drain run (one event each)
  const std::size_t launch_threads_;
  const clock::duration busy_poll_interval_;
  const clock::duration launch_spin_;  // a launch thread out of work looks this long, then sleeps
  std::atomic<int> launching_{0};      // launch threads inside a drain now
  /// Started with the first queue assigned to them (under mu_, before the
  /// queue's `registered` is set: a drain reads its slot after that).
  std::vector<std::shared_ptr<launcher>> launchers_;
  std::size_t next_launcher_ = 0;                      // the next new queue's launcher
  std::atomic<bool> launchers_stopped_{false};         // after clear(): drains go to ex_
  std::vector<std::weak_ptr<deferred_queue>> queues_;  // registered; guarded by mu_
  bool step_queued_ = false;                           // a step is posted (runs soon)
  std::uint64_t clears_ = 0;  // clear() calls: a step's probes are void after one
  /// One run of consecutive waits of a lane that share an event (a batch).
  struct probe {
    cudaStream_t stream;
    cudaEvent_t ev;
    std::size_t waits;
    cudaError_t status;
  };
  std::vector<probe> probes_;                               // a step's scratch, guarded by step_mu_
  clock::time_point timer_due_ = clock::time_point::max();  // earliest armed timer
};

}  // namespace atomr::cuda::detail
