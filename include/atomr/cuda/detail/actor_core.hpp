// What every library actor shares: its device, the one stream its library
// handle is bound to, and the lock that serialises enqueues.
#pragma once

#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <mutex>
#include <string>
#include <string_view>

namespace atomr::cuda::detail {

/// Serialisation is a mutex held only around the synchronous enqueue inside
/// run_kernel (never across a co_await), so the next request enqueues while
/// the previous kernel runs. An Asio strand cannot be held by a coroutine
/// across the enqueue (awaitables resume on their own executor), and the
/// enqueue never blocks on the GPU, so the lock is held for microseconds.
struct actor_core {
  actor_core(device d, stream s) : dev(std::move(d)), strm(std::move(s)) {}
  actor_core(const actor_core&) = delete;
  actor_core& operator=(const actor_core&) = delete;

  device dev;
  stream strm;
  std::mutex enqueue_mu;

  /// Fails fast (no GPU call) once the device no longer accepts work.
  result<void> accepting() const { return dev.status(); }
};

/// invalid_argument naming the operation and the argument: "gemm: lda (3) < m (4)".
inline gpu_error bad_argument(std::string_view op, std::string_view arg, std::string_view why) {
  std::string m(op);
  m += ": ";
  m += arg;
  m += ' ';
  m += why;
  return make_error(errc::invalid_argument, std::move(m));
}

/// Checks that `r` is usable, on `dev`, and holds at least `needed` elements.
template <element T>
result<void> check_ref(std::string_view op, std::string_view arg, const gpu_ref<T>& r,
                       const device& dev, std::size_t needed) {
  if (!r.state()) return bad_argument(op, arg, "is an empty gpu_ref");
  if (r.state()->dev != dev.impl()) return bad_argument(op, arg, "belongs to another device");
  if (auto ok = r.check(); !ok) return ok.error();
  if (r.size() < needed)
    return bad_argument(
        op, arg, "has " + std::to_string(r.size()) + " elements, needs " + std::to_string(needed));
  return outcome::success();
}

}  // namespace atomr::cuda::detail
