// A per-device pool of CUDA events, so the hot path never calls cudaEventCreate.
#pragma once

#include <cuda_runtime_api.h>

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
/// docs/performance.md, session 8), so it is made only where a thread blocks.
class pooled_event {
public:
  pooled_event(cudaEvent_t ev, bool blocking, std::shared_ptr<event_pool> pool) noexcept
      : ev_(ev), blocking_(blocking), pool_(std::move(pool)) {}
  pooled_event(const pooled_event&) = delete;
  pooled_event& operator=(const pooled_event&) = delete;
  ~pooled_event();

  cudaEvent_t native_handle() const noexcept { return ev_; }

private:
  cudaEvent_t ev_;
  bool blocking_;
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

private:
  friend class pooled_event;
  void give_back(cudaEvent_t ev, bool blocking) noexcept;

  int ordinal_;
  mutable std::mutex mu_;
  std::vector<cudaEvent_t> free_[2];  // [blocking]
  std::size_t created_ = 0;
  bool abandoned_ = false;
};

}  // namespace atomr::cuda::detail
