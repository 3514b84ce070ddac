// gpu_ref<T>: a cheap, copyable, generation-stamped handle to typed device memory.
#pragma once

#include <atomr/cuda/detail/buffer_state.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace atomr::cuda {

/// A view of `size()` elements of a device allocation. Copies share the
/// allocation, which lives until the last copy (and every GPU operation that
/// uses it) is gone. Every use validates the generation: after a sticky
/// fault or device stop the ref yields errc::stale_ref, never a dangling
/// pointer. Thread-safe to copy and pass between threads.
///
/// Lifetime: a gpu_ref holds its device, so like the device it must not
/// outlive the io_context the device was opened on (see device).
template <element T>
class gpu_ref {
public:
  using value_type = T;  ///< the element type

  /// An empty ref (no allocation, size 0); device::allocate makes real ones.
  gpu_ref() = default;
  /// A view of `count` elements from `offset` of the library's buffer state;
  /// used by device::allocate and subspan, not by users.
  gpu_ref(std::shared_ptr<detail::buffer_state> st, std::size_t offset, std::size_t count) noexcept
      : st_(std::move(st)), offset_(offset), count_(count) {}

  /// The number of elements in this view.
  std::size_t size() const noexcept { return count_; }
  /// size() * sizeof(T).
  std::size_t size_bytes() const noexcept { return count_ * sizeof(T); }
  /// True for a view of no elements (an empty ref included).
  bool empty() const noexcept { return count_ == 0; }
  /// Offset of this view, in elements, from the start of the allocation.
  std::size_t offset() const noexcept { return offset_; }

  /// The generation the allocation was made in (0 for an empty ref).
  std::uint64_t generation() const noexcept { return st_ ? st_->generation : 0; }
  /// Success if usable now; stale_ref otherwise (invalid_argument for an
  /// empty ref). Never touches the GPU.
  result<void> check() const { return detail::check_buffer(st_.get(), dtype_of<T>); }
  /// True when check() fails (a stale or an empty ref).
  bool stale() const noexcept { return !check(); }

  /// The elements [offset, offset + count) of this view; invalid_argument if out of range.
  result<gpu_ref> subspan(std::size_t offset, std::size_t count) const {
    if (offset > count_ || count > count_ - offset)
      return make_error(errc::invalid_argument, "subspan(" + std::to_string(offset) + ", " +
                                                    std::to_string(count) + ") of a view of " +
                                                    std::to_string(count_) + " elements");
    return gpu_ref(st_, offset_ + offset, count);
  }

  /// The raw device pointer, validated but NOT ordered against other streams:
  /// prefer run_kernel's launch::read / launch::write, which are.
  /// not_supported for a buffer of an isolated device (it lives in the
  /// worker process; there is no pointer in this one).
  result<T*> unsafe_data() const {
    BOOST_OUTCOME_TRY(check());
    if (st_->remote_handle != 0)
      return make_error(errc::not_supported,
                        "unsafe_data: the buffer lives in the isolated device's worker process");
    return static_cast<T*>(st_->ptr) + offset_;
  }

  /// The shared buffer state behind this view (the library's own use).
  const std::shared_ptr<detail::buffer_state>& state() const noexcept { return st_; }

private:
  std::shared_ptr<detail::buffer_state> st_;
  std::size_t offset_ = 0;
  std::size_t count_ = 0;
};

template <element T>
result<gpu_ref<T>> device::allocate(std::size_t count, const stream& on) {
  BOOST_OUTCOME_TRY(auto st, allocate_state(count, dtype_of<T>, on));
  return gpu_ref<T>(std::move(st), 0, count);
}

template <element T>
result<gpu_ref<T>> device::allocate(std::size_t count) {
  return allocate<T>(count, main_stream());
}

}  // namespace atomr::cuda
