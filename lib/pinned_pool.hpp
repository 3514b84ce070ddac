// Private: size-classed cache of pinned host blocks. Not installed.
#pragma once

#include <atomr/cuda/error.hpp>
#include <atomr/cuda/pinned.hpp>

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace atomr::cuda::detail {

class pinned_pool : public std::enable_shared_from_this<pinned_pool> {
public:
  explicit pinned_pool(std::size_t cache_limit) noexcept : limit_(cache_limit) {}
  pinned_pool(const pinned_pool&) = delete;
  pinned_pool& operator=(const pinned_pool&) = delete;
  ~pinned_pool();

  /// A block of at least `bytes` (rounded up to a power of two, 4 KiB at least):
  /// from the cache, else cudaHostAlloc (portable).
  result<std::shared_ptr<pinned_block>> acquire(std::size_t bytes);
  void give_back(void* data, std::size_t bytes) noexcept;
  /// After a sticky fault nothing is handed back to CUDA.
  void abandon() noexcept { abandoned_ = true; }
  std::size_t cached_bytes() const noexcept;

  static std::size_t size_class(std::size_t bytes) noexcept;

private:
  const std::size_t limit_;
  std::atomic<bool> abandoned_{false};
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
};

}  // namespace atomr::cuda::detail
