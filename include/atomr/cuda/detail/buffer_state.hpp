// The shared state behind gpu_ref: the allocation and its GPU access history.
#pragma once

#include <atomr/cuda/detail/event_pool.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace atomr::cuda::detail {

class device_impl;

/// The last GPU work on one stream that touched a buffer.
struct access_stamp {
  std::uint64_t stream_id = 0;
  shared_event done;  ///< recorded after that work
};

/// One stream-ordered allocation. Freed (cudaFreeAsync on the device's
/// release stream, after waiting on the GPU for every tracked access) when
/// the last gpu_ref drops it; leaked on purpose once the context is poisoned.
struct buffer_state {
  buffer_state(std::shared_ptr<device_impl> d, void* p, std::size_t n, dtype t,
               std::uint64_t gen) noexcept
      : dev(std::move(d)), ptr(p), count(n), type(t), generation(gen) {}
  buffer_state(const buffer_state&) = delete;
  buffer_state& operator=(const buffer_state&) = delete;
  ~buffer_state();

  const std::shared_ptr<device_impl> dev;
  void* const ptr;
  const std::size_t count;
  const dtype type;
  const std::uint64_t generation;
  /// Isolated devices: the worker's handle for this allocation (ptr is null).
  std::uint64_t remote_handle = 0;

  std::mutex mu;
  access_stamp last_write;          ///< guarded by mu
  std::vector<access_stamp> reads;  ///< reads since last_write, one per stream; guarded by mu
};

/// Success if the buffer may be used now; stale_ref (naming `what`) if it is
/// from an older generation or its device no longer accepts work.
result<void> check_buffer(const buffer_state* st, std::string_view what);
/// The same for a gpu_ref of `t` (named "gpu_ref<t>"); the name is only
/// built when the check fails (this runs several times per operation).
result<void> check_buffer(const buffer_state* st, dtype t);

}  // namespace atomr::cuda::detail
