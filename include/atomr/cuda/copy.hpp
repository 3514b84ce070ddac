// Transfers between host and device memory, and fills, each an awaitable.
#pragma once

#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/pinned.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>

namespace atomr::cuda {

/// Where and how a transfer runs. Defaults: the device's main stream and its
/// default completion strategy.
struct transfer_options {
  stream on{};
  std::optional<completion> how{};
};

namespace detail {
template <element T>
result<std::pair<stream, completion>> resolve_transfer(const gpu_ref<T>& ref,
                                                       const transfer_options& o) {
  if (!ref.state()) return make_error(errc::invalid_argument, "transfer: empty gpu_ref");
  device d(ref.state()->dev);
  return std::pair{o.on ? o.on : d.main_stream(), o.how.value_or(d.options().default_completion)};
}

inline result<void> same_size(std::string_view what, std::size_t src, std::size_t dst) {
  if (src == dst) return outcome::success();
  return make_error(errc::invalid_argument, std::string(what) + ": source has " +
                                                std::to_string(src) + " elements, destination " +
                                                std::to_string(dst));
}

inline result<void> memcpy_status(cudaError_t st) {
  if (st == cudaSuccess) return outcome::success();
  return classify(st, "cudaMemcpyAsync");
}
}  // namespace detail

/// Copies pinned host memory to the device (cudaMemcpyAsync, DMA). Yields `dst`.
template <element T>
asio::awaitable<result<gpu_ref<T>>> upload(pinned_buffer<T> src, gpu_ref<T> dst,
                                           transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("upload", src.size(), dst.size()));
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(dst, o));
  co_return co_await run_kernel(
      "cuda", where.first, where.second, dst, [&](launch& l) -> result<pinned_buffer<T>> {
        BOOST_OUTCOME_TRY(T * p, l.write(dst));
        BOOST_OUTCOME_TRY(detail::memcpy_status(cudaMemcpyAsync(
            p, src.data(), dst.size_bytes(), cudaMemcpyHostToDevice, l.native_stream())));
        return src;
      });
}

/// Copies pageable host memory to the device: staged through a pinned buffer
/// from the device's pool (a host memcpy on the calling thread, then DMA).
/// `src` may be reused as soon as this returns or suspends. Yields `dst`.
template <element T>
asio::awaitable<result<gpu_ref<T>>> upload(std::span<const T> src, gpu_ref<T> dst,
                                           transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("upload", src.size(), dst.size()));
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(dst, o));
  BOOST_OUTCOME_CO_TRY(auto staging, device(dst.state()->dev).allocate_pinned<T>(src.size()));
  std::memcpy(static_cast<void*>(staging.data()), src.data(), src.size_bytes());
  o.on = where.first;
  o.how = where.second;
  co_return co_await upload(std::move(staging), std::move(dst), std::move(o));
}

/// Copies device memory into pinned host memory (cudaMemcpyAsync, DMA). Yields `dst`.
template <element T>
asio::awaitable<result<pinned_buffer<T>>> download(gpu_ref<T> src, pinned_buffer<T> dst,
                                                   transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("download", src.size(), dst.size()));
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(src, o));
  co_return co_await run_kernel(
      "cuda", where.first, where.second, dst, [&](launch& l) -> result<gpu_ref<T>> {
        BOOST_OUTCOME_TRY(const T* p, l.read(src));
        BOOST_OUTCOME_TRY(detail::memcpy_status(cudaMemcpyAsync(
            dst.data(), p, src.size_bytes(), cudaMemcpyDeviceToHost, l.native_stream())));
        return src;
      });
}

/// Copies device memory into pageable host memory, staged through a pinned
/// buffer. `dst` is written only on success, after the GPU finished; after a
/// timeout or cancellation it is left untouched.
template <element T>
asio::awaitable<result<void>> download(gpu_ref<T> src, std::span<T> dst, transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("download", src.size(), dst.size()));
  if (!src.state()) co_return make_error(errc::invalid_argument, "download: empty gpu_ref");
  BOOST_OUTCOME_CO_TRY(auto staging, device(src.state()->dev).allocate_pinned<T>(src.size()));
  BOOST_OUTCOME_CO_TRY(auto got,
                       co_await download(std::move(src), std::move(staging), std::move(o)));
  std::memcpy(static_cast<void*>(dst.data()), got.data(), dst.size_bytes());
  co_return outcome::success();
}

/// Copies device memory to device memory (cudaMemcpyAsync). Yields `dst`.
template <element T>
asio::awaitable<result<gpu_ref<T>>> copy(gpu_ref<T> src, gpu_ref<T> dst, transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("copy", src.size(), dst.size()));
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(dst, o));
  co_return co_await run_kernel(
      "cuda", where.first, where.second, dst, [&](launch& l) -> result<gpu_ref<T>> {
        BOOST_OUTCOME_TRY(const T* s, l.read(src));
        BOOST_OUTCOME_TRY(T * d, l.write(dst));
        BOOST_OUTCOME_TRY(detail::memcpy_status(
            cudaMemcpyAsync(d, s, dst.size_bytes(), cudaMemcpyDeviceToDevice, l.native_stream())));
        return src;
      });
}

/// Sets every byte of `dst` to `value` (cudaMemsetAsync). Yields `dst`.
template <element T>
asio::awaitable<result<gpu_ref<T>>> fill_bytes(gpu_ref<T> dst, unsigned char value,
                                               transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(dst, o));
  co_return co_await run_kernel(
      "cuda", where.first, where.second, dst, [&](launch& l) -> result<std::tuple<>> {
        BOOST_OUTCOME_TRY(T * d, l.write(dst));
        if (auto st = cudaMemsetAsync(d, value, dst.size_bytes(), l.native_stream());
            st != cudaSuccess)
          return classify(st, "cudaMemsetAsync");
        return std::tuple<>{};
      });
}

}  // namespace atomr::cuda
