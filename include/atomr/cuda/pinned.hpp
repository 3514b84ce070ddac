// pinned_buffer<T>: page-locked host memory from a device's pool, for fast transfers.
#pragma once

#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>

#include <cstddef>
#include <memory>
#include <span>

namespace atomr::cuda {

namespace detail {
class pinned_pool;

/// One cudaHostAlloc block; returns to its pool when the last owner drops it.
struct pinned_block {
  pinned_block(std::shared_ptr<pinned_pool> p, void* d, std::size_t b) noexcept
      : pool(std::move(p)), data(d), bytes(b) {}
  pinned_block(const pinned_block&) = delete;
  pinned_block& operator=(const pinned_block&) = delete;
  ~pinned_block();

  std::shared_ptr<pinned_pool> pool;
  void* data;
  std::size_t bytes;  ///< capacity (a size class), at least what was asked for
};
}  // namespace detail

/// `size()` elements of pinned host memory. Copies share the block, which goes
/// back to the device's pool (not to the OS) when the last copy drops it.
/// Not synchronised: do not write it while a transfer reads it.
template <element T>
class pinned_buffer {
public:
  /// An empty buffer (no memory); device::allocate_pinned makes real ones.
  pinned_buffer() = default;
  /// `count` elements of the library's pinned block; used by
  /// device::allocate_pinned, not by users.
  pinned_buffer(std::shared_ptr<detail::pinned_block> b, std::size_t count) noexcept
      : block_(std::move(b)), count_(count) {}

  /// The first element (null for an empty buffer).
  T* data() const noexcept { return block_ ? static_cast<T*>(block_->data) : nullptr; }
  /// The number of elements.
  std::size_t size() const noexcept { return count_; }
  /// size() * sizeof(T).
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  /// The elements as a span.
  std::span<T> span() const noexcept { return {data(), count_}; }
  /// Element `i`, unchecked.
  T& operator[](std::size_t i) const noexcept { return data()[i]; }

  /// The shared block behind this buffer (the library's own use).
  const std::shared_ptr<detail::pinned_block>& block() const noexcept { return block_; }

private:
  std::shared_ptr<detail::pinned_block> block_;
  std::size_t count_ = 0;
};

template <element T>
result<pinned_buffer<T>> device::allocate_pinned(std::size_t count) {
  if (count > static_cast<std::size_t>(-1) / sizeof(T))
    return make_error(errc::invalid_argument, "allocate_pinned: element count overflows");
  BOOST_OUTCOME_TRY(auto b, allocate_pinned_block(count * sizeof(T)));
  return pinned_buffer<T>(std::move(b), count);
}

}  // namespace atomr::cuda
