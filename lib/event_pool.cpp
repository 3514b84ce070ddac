#include <atomr/cuda/detail/event_pool.hpp>

namespace atomr::cuda::detail {

pooled_event::~pooled_event() {
  pool_->give_back(ev_);
}

event_pool::~event_pool() {
  std::lock_guard lk(mu_);
  if (abandoned_) return;
  for (auto ev : free_) cudaEventDestroy(ev);  // teardown: errors deliberately ignored
}

cudaError_t event_pool::acquire(shared_event& out) {
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lk(mu_);
    if (!free_.empty()) {
      ev = free_.back();
      free_.pop_back();
    }
  }
  if (!ev) {
    auto st = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync);
    if (st != cudaSuccess) return st;
    std::lock_guard lk(mu_);
    ++created_;
  }
  out = std::make_shared<pooled_event>(ev, shared_from_this());
  return cudaSuccess;
}

void event_pool::give_back(cudaEvent_t ev) noexcept {
  std::lock_guard lk(mu_);
  free_.push_back(ev);
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
