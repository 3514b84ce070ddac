// The isolated device's transfers (docs/design.md, "Isolated device"): what
// copy.hpp's templates call when a buffer belongs to an isolated device.
// Each checks its arguments in this process, then sends one request per
// arena piece to the worker and waits for its answers.
#pragma once

#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/error.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace atomr::cuda {
namespace asio = boost::asio;
class stream;
enum class health_state : std::uint8_t;
}  // namespace atomr::cuda

namespace atomr::cuda::detail {

struct buffer_state;
class device_impl;

/// True when `st` is a buffer of an isolated device (a handle to worker memory).
bool is_remote(const buffer_state* st) noexcept;

/// One view of a buffer: the state, and the element offset and count.
struct remote_view {
  std::shared_ptr<buffer_state> st;
  std::size_t offset = 0;
  std::size_t count = 0;
};

/// A pageable upload's data, copied at the call into blocks of the arena (or,
/// when the arena is full, into host memory, copied into the arena later).
struct remote_staging;

/// The upload's checks and its copy of `src` (`bytes` long), at the call.
/// `on`: the options' stream, which must be one of dst's device if given.
result<std::shared_ptr<remote_staging>> remote_stage_upload(const remote_view& dst, const void* src,
                                                            std::size_t bytes, const stream& on);
/// Sends a staged upload and waits for the worker's answers.
asio::awaitable<result<void>> remote_upload(std::shared_ptr<remote_staging> staged,
                                            std::optional<completion> how);
/// Device to pageable host memory; `dst` is written only on success.
asio::awaitable<result<void>> remote_download(remote_view src, void* dst, std::size_t bytes,
                                              const stream& on, std::optional<completion> how);
/// Device to device, in the worker.
asio::awaitable<result<void>> remote_copy(remote_view src, remote_view dst, const stream& on,
                                          std::optional<completion> how);
/// cudaMemsetAsync of every byte of `dst`, in the worker.
asio::awaitable<result<void>> remote_fill(remote_view dst, unsigned char value, const stream& on,
                                          std::optional<completion> how);

/// Tests only (a worker started with "--test-faults" in
/// isolation_options::worker_args): injects a fault into the worker of the
/// isolated device `dev`. `kind` is a fault the worker runs as a request
/// (illegal_address = 4: a kernel writes to address 0x10; hang_kernel = 6: a
/// kernel that never ends): the awaitable yields that request's result. Any
/// other kind (abort = 1, SIGKILL = 2, hang of the whole process = 3, clean
/// exit = 5) is sent as is and the awaitable yields at once.
asio::awaitable<result<void>> inject_isolated_fault(std::shared_ptr<device_impl> dev,
                                                    std::uint16_t kind,
                                                    completion how = completion{});

/// Tests: the device's last 64 changes of health, oldest first.
std::vector<health_state> health_history(const device_impl& d);

/// The errors of operations an isolated device does not offer: pinned host
/// buffers and run_kernel (its enqueue is code of the service process).
gpu_error isolated_not_supported(std::string_view what);

}  // namespace atomr::cuda::detail
