// A per-device pool of CUDA events, so the hot path never calls cudaEventCreate.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace atomr::cuda::detail {

class event_pool;

/// One pooled event, returned to its pool when the last shared owner drops it.
/// Two kinds, both cudaEventDisableTiming: plain ones for the polled and
/// host_fn waits, and cudaEventBlockingSync ones for blocking_sync waits (the
/// waiting thread sleeps in cudaEventSynchronize instead of spinning). A
/// blocking-sync record costs GPU time the others do not need (measured:
/// docs/history/performance.md, session 8), so it is made only where a thread blocks.
class pooled_event {
public:
  pooled_event(cudaEvent_t ev, bool blocking, std::shared_ptr<event_pool> pool) noexcept
      : ev_(ev), blocking_(blocking), pool_(std::move(pool)) {}
  pooled_event(const pooled_event&) = delete;
  pooled_event& operator=(const pooled_event&) = delete;
  ~pooled_event();

  cudaEvent_t native_handle() const noexcept { return ev_; }

  // --- deferred records (a composed unit's run of steps on one stream,
  // docs/design.md "Composed units") ---
  /// Marks the event as to be recorded on `s` later (by settle()); until
  /// then buffers may be stamped with it. Before the event is shared.
  void defer_record(cudaStream_t s) noexcept { deferred_.store(s, std::memory_order_release); }
  /// Records a deferred event now, on its stream (any thread; the first
  /// caller records, later ones find it done). Whoever queries or waits on an
  /// event taken from a buffer's stamp calls this first: an event never
  /// recorded reads as complete. Nothing to do for an ordinary event.
  cudaError_t settle() noexcept {
    if (!deferred_.load(std::memory_order_acquire)) return cudaSuccess;
    return settle_slow();
  }
  /// For the unit, after a step's enqueue on the event's stream: true when
  /// the event is still deferred, so that its record (whenever it is made)
  /// comes after that enqueue and covers it; false once it was recorded.
  bool still_deferred() noexcept;

private:
  cudaError_t settle_slow() noexcept;

  cudaEvent_t ev_;
  bool blocking_;
  std::atomic<cudaStream_t> deferred_{nullptr};
  std::mutex record_mu_;  ///< serialises a deferred record with still_deferred()
  std::shared_ptr<event_pool> pool_;
};

using shared_event = std::shared_ptr<pooled_event>;

class event_pool : public std::enable_shared_from_this<event_pool> {
public:
  explicit event_pool(int ordinal) noexcept : ordinal_(ordinal) {}
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  ~event_pool();

  /// A free event of the kind asked for (blocking-sync or not), or a new one
  /// (cudaEventCreateWithFlags) when none is free. Never blocks on the GPU.
  /// Fails only if event creation fails.
  cudaError_t acquire(shared_event& out, bool blocking);

  /// After a sticky fault, events can no longer be destroyed safely; leak them.
  void abandon() noexcept;

  std::size_t created() const noexcept;

  /// Tests only (test/test_gpu_compose.cpp): the next `n` acquires fail as
  /// the driver fails when it is out of resources (cudaErrorMemoryAllocation).
  void fail_next_acquires(int n) noexcept { fail_next_.store(n, std::memory_order_relaxed); }
  /// Tests only: the next `n` deferred records (settle()) of this pool's
  /// events fail as cudaEventRecord fails when the driver is out of
  /// resources (cudaErrorMemoryAllocation), recording nothing.
  void fail_next_records(int n) noexcept { fail_records_.store(n, std::memory_order_relaxed); }

private:
  friend class pooled_event;
  void give_back(cudaEvent_t ev, bool blocking) noexcept;

  int ordinal_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_[2];  // [blocking]
  std::size_t created_ = 0;
  bool abandoned_ = false;
  std::atomic<int> fail_next_{0};
  std::atomic<int> fail_records_{0};
  bool take_failed_record() noexcept {
    return fail_records_.load(std::memory_order_relaxed) > 0 &&
           fail_records_.fetch_sub(1, std::memory_order_relaxed) > 0;
  }
};

}  // namespace atomr::cuda::detail
