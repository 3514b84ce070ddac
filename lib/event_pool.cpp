#include <atomr/cuda/detail/event_pool.hpp>

namespace atomr::cuda::detail {

pooled_event::~pooled_event() {
  pool_->give_back(ev_, blocking_);
}

cudaError_t pooled_event::settle_slow() noexcept {
  std::lock_guard lk(record_mu_);
  auto* s = deferred_.load(std::memory_order_relaxed);
  if (!s) return cudaSuccess;  // another thread recorded it meanwhile
  const auto st = pool_->take_failed_record() ? cudaErrorMemoryAllocation : cudaEventRecord(ev_, s);
  deferred_.store(nullptr, std::memory_order_release);
  return st;
}

bool pooled_event::still_deferred() noexcept {
  // Under the lock: a record made after this returns true is made after the
  // caller's enqueue (which happened before the call), so it covers it.
  std::lock_guard lk(record_mu_);
  return deferred_.load(std::memory_order_relaxed) != nullptr;
}

event_pool::~event_pool() {
  std::lock_guard lk(mu_);
  if (abandoned_) return;
  for (auto& list : free_)
    for (auto ev : list) cudaEventDestroy(ev);  // teardown: errors deliberately ignored
}

cudaError_t event_pool::acquire(shared_event& out, bool blocking) {
  if (fail_next_.load(std::memory_order_relaxed) > 0 &&
      fail_next_.fetch_sub(1, std::memory_order_relaxed) > 0)
    return cudaErrorMemoryAllocation;
  cudaEvent_t ev = nullptr;
  auto& list = free_[blocking ? 1 : 0];
  {
    std::lock_guard lk(mu_);
    if (!list.empty()) {
      ev = list.back();
      list.pop_back();
    }
  }
  if (!ev) {
    const unsigned flags = cudaEventDisableTiming | (blocking ? cudaEventBlockingSync : 0u);
    auto st = cudaEventCreateWithFlags(&ev, flags);
    if (st != cudaSuccess) return st;
    std::lock_guard lk(mu_);
    ++created_;
  }
  out = std::make_shared<pooled_event>(ev, blocking, shared_from_this());
  return cudaSuccess;
}

void event_pool::give_back(cudaEvent_t ev, bool blocking) noexcept {
  std::lock_guard lk(mu_);
  free_[blocking ? 1 : 0].push_back(ev);
}

void event_pool::abandon() noexcept {
  std::lock_guard lk(mu_);
  abandoned_ = true;
}

std::size_t event_pool::created() const noexcept {
  std::lock_guard lk(mu_);
  return created_;
}

}  // namespace atomr::cuda::detail
