#include "pinned_pool.hpp"

#include <bit>

namespace atomr::cuda::detail {

pinned_block::~pinned_block() {
  pool->give_back(data, bytes);
}

pinned_pool::~pinned_pool() {
  if (abandoned_) return;
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cudaFreeHost(p);  // teardown: errors deliberately ignored
}

std::size_t pinned_pool::size_class(std::size_t bytes) noexcept {
  return std::bit_ceil(bytes < 4096 ? std::size_t{4096} : bytes);
}

result<std::shared_ptr<pinned_block>> pinned_pool::acquire(std::size_t bytes) {
  if (bytes > (std::size_t{1} << 62))
    return make_error(errc::invalid_argument,
                      "pinned buffer of " + std::to_string(bytes) + " bytes is too large");
  const std::size_t cls = size_class(bytes);
  void* p = nullptr;
  {
    std::lock_guard lk(mu_);
    if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= cls;
    }
  }
  if (!p) {
    if (auto st = cudaHostAlloc(&p, cls, cudaHostAllocPortable); st != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so later launches are not blamed
      return classify(st, "cudaHostAlloc(" + std::to_string(cls) + " bytes)");
    }
  }
  return std::make_shared<pinned_block>(shared_from_this(), p, cls);
}

void pinned_pool::give_back(void* data, std::size_t bytes) noexcept {
  if (abandoned_) return;
  {
    std::lock_guard lk(mu_);
    if (cached_ + bytes <= limit_) {
      free_[bytes].push_back(data);
      cached_ += bytes;
      return;
    }
  }
  cudaFreeHost(data);
}

std::size_t pinned_pool::cached_bytes() const noexcept {
  std::lock_guard lk(mu_);
  return cached_;
}

}  // namespace atomr::cuda::detail
