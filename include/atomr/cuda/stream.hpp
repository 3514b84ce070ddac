// stream: a CUDA stream that belongs to one device, and the stream policies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string_view>

namespace atomr::cuda {

class device;

namespace detail {
class device_impl;
struct stream_state;
}  // namespace detail

/// How a device hands out streams to actors and callers.
enum class stream_policy : std::uint8_t {
  single,            ///< everyone shares the device's one stream
  pooled,            ///< round robin over a fixed pool (device_options::stream_pool_size)
  per_actor_shared,  ///< one stream per owner name ("cublas", ...), shared by its actors
  per_actor_fresh,   ///< a new stream for every request, destroyed with its last handle
};

/// The enumerator's name ("single", "pooled", ...); "unknown" for any other value.
std::string_view to_string(stream_policy p) noexcept;

/// A handle to a non-blocking CUDA stream of one device. Copies share the
/// stream; an owned stream is destroyed (cudaStreamDestroy, which does not
/// wait) with its last handle. Thread-safe to copy and to use from several
/// threads, as CUDA streams are.
class stream {
public:
  /// An empty handle (false); streams come from a device (main_stream, acquire_stream).
  stream() = default;
  /// Wraps the library's state; used by device and the actors, not by users.
  explicit stream(std::shared_ptr<detail::stream_state> st) noexcept : st_(std::move(st)) {}

  /// The raw stream; valid while any handle lives.
  cudaStream_t native_handle() const noexcept;
  /// A process-unique number; never reused, unlike raw stream handles.
  std::uint64_t id() const noexcept;
  /// The device this stream belongs to.
  device get_device() const;
  /// True unless the handle is empty.
  explicit operator bool() const noexcept { return st_ != nullptr; }

  /// The shared state behind this handle (the library's own use).
  const std::shared_ptr<detail::stream_state>& state() const noexcept { return st_; }

private:
  std::shared_ptr<detail::stream_state> st_;
};

}  // namespace atomr::cuda
