// Transfers between host and device memory, and fills, each an awaitable.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/pinned.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>

#include <concepts>
#include <cstring>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>

namespace atomr::cuda {

/// Where and how a transfer runs. Defaults: the device's default completion
/// strategy, and the device's main stream, except in a step of compose() or
/// record() (docs/design.md, "Composed units", "Where a unit's transfers
/// run"): there the stream of the unit's previous step; a unit's leading
/// transfers go on the stream of the unit's first step that is not such a
/// transfer, just before it (one of the device's pooled streams when there
/// is none).
struct transfer_options {
  /// The stream to run on; empty: the default described above.
  stream on{};
  /// How to wait; unset: the device's default completion strategy.
  std::optional<completion> how{};
};

namespace detail {
/// The stream and strategy of a transfer of `ref` (see transfer_options);
/// `unit`: the unit whose step the transfer is, or null. An empty stream:
/// a leading transfer of a composed unit, to be deferred (defer_in_unit).
template <element T>
result<std::pair<stream, completion>> resolve_transfer(const gpu_ref<T>& ref,
                                                       const transfer_options& o,
                                                       const unit_recorder* unit = nullptr) {
  if (!ref.state()) return make_error(errc::invalid_argument, "transfer: empty gpu_ref");
  device d(ref.state()->dev);
  const completion how = o.how.value_or(d.options().default_completion);
  if (o.on) return std::pair{o.on, how};
  if (unit) {
    // Back to back on the previous step's stream: a download there needs no
    // cross-stream wait for the data it moves, and a unit's transfers do not
    // queue behind other coroutines' transfers on one shared stream.
    if (!unit->stages.empty() && stream_of(unit->stages.back().on, ref.state()->dev.get()))
      return std::pair{unit->stages.back().on, how};
    // A leading transfer (nothing enqueued yet): it will go on the stream of
    // the unit's next enqueuing step, so that step does not wait for it
    // across streams. A recording has one stream: nothing to defer there.
    if (unit->stages.empty() && !unit->capture) return std::pair{stream{}, how};
    BOOST_OUTCOME_TRY(auto pooled, d.acquire_stream(stream_policy::pooled));
    return std::pair{std::move(pooled), how};
  }
  return std::pair{d.main_stream(), how};
}

inline result<void> same_size(std::string_view what, std::size_t src, std::size_t dst) {
  if (src == dst) return outcome::success();
  return make_error(errc::invalid_argument, std::string(what) + ": source has " +
                                                std::to_string(src) + " elements, destination " +
                                                std::to_string(dst));
}

/// invalid_argument when `src` and `dst` are views of one allocation whose
/// element ranges overlap (src == dst included): cudaMemcpyAsync requires
/// disjoint ranges.
template <element T>
result<void> disjoint(const gpu_ref<T>& src, const gpu_ref<T>& dst) {
  if (!src.state() || src.state() != dst.state() || src.empty() || dst.empty())
    return outcome::success();
  const std::size_t s0 = src.offset(), s1 = s0 + src.size();
  const std::size_t d0 = dst.offset(), d1 = d0 + dst.size();
  if (s1 <= d0 || d1 <= s0) return outcome::success();
  return make_error(errc::invalid_argument, "copy: source [" + std::to_string(s0) + ", " +
                                                std::to_string(s1) + ") and destination [" +
                                                std::to_string(d0) + ", " + std::to_string(d1) +
                                                ") overlap in one allocation");
}

inline result<void> memcpy_status(cudaError_t st) {
  if (st == cudaSuccess) return outcome::success();
  return classify(st, "cudaMemcpyAsync");
}
}  // namespace detail

namespace detail {
/// not_supported for a transfer of pageable memory inside a recording
/// (graph.hpp): its host copy, made at the call or after the wait, would not
/// be part of the graph.
inline gpu_error pageable_not_recordable(std::string_view what) {
  return make_error(errc::not_supported,
                    std::string(what) +
                        " of pageable host memory cannot be recorded into a CUDA graph (its "
                        "host copy is not a graph node): use a pinned_buffer");
}

/// The pinned upload; `staged`: its source is the staging copy of a pageable
/// upload, which a recording refuses.
template <element T>
asio::awaitable<result<gpu_ref<T>>> upload_pinned(pinned_buffer<T> src, gpu_ref<T> dst,
                                                  transfer_options o, bool staged) {
  BOOST_OUTCOME_CO_TRY(same_size("upload", src.size(), dst.size()));
  auto* unit = detail::unit_of(co_await asio::this_coro::executor);
  BOOST_OUTCOME_CO_TRY(auto where, resolve_transfer(dst, o, unit));
  // By value: a deferred transfer runs after this coroutine has returned.
  auto enqueue = [src = std::move(src), dst, staged](launch& l) -> result<pinned_buffer<T>> {
    if (staged && l.recording()) return pageable_not_recordable("upload");
    BOOST_OUTCOME_TRY(T * p, l.write(dst));
    BOOST_OUTCOME_TRY(detail::memcpy_status(cudaMemcpyAsync(
        p, src.data(), dst.size_bytes(), cudaMemcpyHostToDevice, l.native_stream())));
    return src;
  };
  if (!where.first)
    co_return defer_in_unit(*unit, device(dst.state()->dev), "cuda", where.second, dst,
                            std::move(enqueue));
  co_return co_await run_kernel("cuda", std::move(where.first), where.second, dst,
                                std::move(enqueue));
}
}  // namespace detail

/// Copies pinned host memory to the device (cudaMemcpyAsync, DMA). Yields
/// `dst`. Recorded into a CUDA graph (graph.hpp), it is a copy node that
/// reads `src` at every replay.
template <element T>
asio::awaitable<result<gpu_ref<T>>> upload(pinned_buffer<T> src, gpu_ref<T> dst,
                                           transfer_options o = {}) {
  return detail::upload_pinned(std::move(src), std::move(dst), std::move(o), false);
}

namespace detail {
/// An awaitable that yields `e` at once (an error found before any coroutine
/// had to start).
template <class R>
asio::awaitable<result<R>> ready_error(gpu_error e) {
  co_return e;
}

/// A view as an isolated device's transfers take it.
template <element T>
remote_view view_of(const gpu_ref<T>& r) {
  return {r.state(), r.offset(), r.size()};
}

/// The pageable upload's staging, done on the calling thread at the call:
/// checks, then a pinned block from the device's pool holding a copy of `src`.
template <element T>
result<pinned_buffer<T>> stage_upload(std::span<const T> src, const gpu_ref<T>& dst,
                                      transfer_options& o) {
  BOOST_OUTCOME_TRY(same_size("upload", src.size(), dst.size()));
  BOOST_OUTCOME_TRY(resolve_transfer(dst, o));  // its checks; the stream is chosen when it runs
  BOOST_OUTCOME_TRY(auto staging, device(dst.state()->dev).allocate_pinned<T>(src.size()));
  std::memcpy(static_cast<void*>(staging.data()), src.data(), src.size_bytes());
  return staging;
}
}  // namespace detail

/// Copies pageable host memory to the device: staged through a pinned buffer
/// from the device's pool (a host memcpy on the calling thread, then DMA).
/// The copy into the pinned buffer happens in this call, before it returns,
/// so `src` may be reused (or destroyed) at once, even before the returned
/// awaitable is awaited. Yields `dst`.
template <element T>
asio::awaitable<result<gpu_ref<T>>> upload(std::span<const T> src, gpu_ref<T> dst,
                                           transfer_options o = {}) {
  if (detail::is_remote(dst.state().get())) {
    // Checked and copied into the arena here, at the call, as in process.
    if (auto ok = detail::same_size("upload", src.size(), dst.size()); !ok)
      return detail::ready_error<gpu_ref<T>>(ok.error());
    auto staged =
        detail::remote_stage_upload(detail::view_of(dst), src.data(), src.size_bytes(), o.on);
    if (!staged) return detail::ready_error<gpu_ref<T>>(staged.error());
    return [](std::shared_ptr<detail::remote_staging> s, gpu_ref<T> d,
              std::optional<completion> how) -> asio::awaitable<result<gpu_ref<T>>> {
      BOOST_OUTCOME_CO_TRY(co_await detail::remote_upload(std::move(s), how));
      co_return d;
    }(std::move(staged).value(), std::move(dst), o.how);
  }
  auto staged = detail::stage_upload(src, dst, o);
  if (!staged) return detail::ready_error<gpu_ref<T>>(staged.error());
  return detail::upload_pinned(std::move(staged).value(), std::move(dst), std::move(o), true);
}

/// The same for any contiguous range of T (std::vector<T>, std::array, a
/// std::span<T>...).
template <std::ranges::contiguous_range R, element T>
requires std::same_as<std::remove_cv_t<std::ranges::range_value_t<R>>, T>
    asio::awaitable<result<gpu_ref<T>>> upload(const R& src, gpu_ref<T> dst,
                                               transfer_options o = {}) {
  return upload(std::span<const T>(std::ranges::data(src), std::ranges::size(src)), std::move(dst),
                std::move(o));
}

/// Copies device memory into pinned host memory (cudaMemcpyAsync, DMA). Yields `dst`.
template <element T>
asio::awaitable<result<pinned_buffer<T>>> download(gpu_ref<T> src, pinned_buffer<T> dst,
                                                   transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("download", src.size(), dst.size()));
  auto* unit = detail::unit_of(co_await asio::this_coro::executor);
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(src, o, unit));
  // By value: a deferred transfer runs after this coroutine has returned.
  auto enqueue = [src, dst](launch& l) -> result<gpu_ref<T>> {
    BOOST_OUTCOME_TRY(const T* p, l.read(src));
    BOOST_OUTCOME_TRY(detail::memcpy_status(cudaMemcpyAsync(
        dst.data(), p, src.size_bytes(), cudaMemcpyDeviceToHost, l.native_stream())));
    return src;
  };
  if (!where.first)
    co_return detail::defer_in_unit(*unit, device(src.state()->dev), "cuda", where.second,
                                    std::move(dst), std::move(enqueue));
  co_return co_await run_kernel("cuda", std::move(where.first), where.second, std::move(dst),
                                std::move(enqueue));
}

/// Copies device memory into pageable host memory, staged through a pinned
/// buffer. `dst` is written only on success, after the GPU finished; after a
/// timeout or cancellation it is left untouched. As a step of compose(),
/// `dst` is written when the unit's wait has ended successfully.
template <element T>
asio::awaitable<result<void>> download(gpu_ref<T> src, std::span<T> dst, transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("download", src.size(), dst.size()));
  if (!src.state()) co_return make_error(errc::invalid_argument, "download: empty gpu_ref");
  if (detail::is_remote(src.state().get()))
    co_return co_await detail::remote_download(detail::view_of(src), dst.data(), dst.size_bytes(),
                                               o.on, o.how);
  if (auto* unit = detail::unit_of(co_await asio::this_coro::executor); unit && unit->capture)
    co_return detail::pageable_not_recordable("download");
  BOOST_OUTCOME_CO_TRY(auto staging, device(src.state()->dev).allocate_pinned<T>(src.size()));
  BOOST_OUTCOME_CO_TRY(auto got,
                       co_await download(std::move(src), std::move(staging), std::move(o)));
  if (auto* unit = detail::unit_of(co_await asio::this_coro::executor)) {
    // A step of compose(): the DMA is only enqueued; the copy out of the
    // staging block runs when the unit's wait has ended.
    unit->copies_out.push_back({got.block(), got.data(), dst.data(), dst.size_bytes()});
    co_return outcome::success();
  }
  std::memcpy(static_cast<void*>(dst.data()), got.data(), dst.size_bytes());
  co_return outcome::success();
}

/// download into any contiguous range of T with writable elements
/// (std::vector<T>, std::array...). The range must outlive the wait.
template <element T, std::ranges::contiguous_range R>
requires std::same_as<std::ranges::range_value_t<R>, T> &&
    (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>)
        asio::awaitable<result<void>> download(gpu_ref<T> src, R& dst, transfer_options o = {}) {
  return download(std::move(src), std::span<T>(std::ranges::data(dst), std::ranges::size(dst)),
                  std::move(o));
}

namespace detail {
/// copy() between buffers of two in-process devices: cudaMemcpyPeerAsync on
/// the destination device's stream, which first waits for the source's
/// earlier writes (events of the source device); the source is then stamped
/// with the copy's event, so later writers on its own device wait for it.
/// Direct over NVLink or PCIe where peer access is enabled (device_set
/// enables it at open), staged through host memory by the driver otherwise.
template <element T>
asio::awaitable<result<gpu_ref<T>>> copy_peer(gpu_ref<T> src, gpu_ref<T> dst, transfer_options o) {
  if (is_remote(src.state().get()) || is_remote(dst.state().get()))
    co_return make_error(errc::not_supported,
                         "copy: between two devices, neither may be isolated (each isolated "
                         "device is its own process): download, then upload");
  if (unit_of(co_await asio::this_coro::executor))
    co_return make_error(errc::not_supported,
                         "copy: a copy between two devices cannot be a step of a unit (a unit runs "
                         "on one device): await it alone");
  BOOST_OUTCOME_CO_TRY(auto where, resolve_transfer(dst, o));
  const int from = device(src.state()->dev).ordinal(), to = device(dst.state()->dev).ordinal();
  auto enqueue = [src, dst, from, to](launch& l) -> result<gpu_ref<T>> {
    BOOST_OUTCOME_TRY(const T* s, l.read_peer(src));
    BOOST_OUTCOME_TRY(T * d, l.write(dst));
    if (auto st = cudaMemcpyPeerAsync(d, to, s, from, dst.size_bytes(), l.native_stream());
        st != cudaSuccess)
      return classify(st, "cudaMemcpyPeerAsync");
    return src;
  };
  co_return co_await run_kernel("cuda", std::move(where.first), where.second, dst,
                                std::move(enqueue));
}
}  // namespace detail

/// Copies device memory to device memory (cudaMemcpyAsync). Yields `dst`.
/// Overlapping views of one allocation are refused (invalid_argument).
/// `src` and `dst` may belong to two devices of this process (a peer copy,
/// cudaMemcpyPeerAsync): it runs on the destination device's stream (or
/// `o.on`, which must then be one of the destination's), ordered after the
/// source's earlier writes; not as a step of a unit, not with an isolated
/// device (not_supported).
template <element T>
asio::awaitable<result<gpu_ref<T>>> copy(gpu_ref<T> src, gpu_ref<T> dst, transfer_options o = {}) {
  BOOST_OUTCOME_CO_TRY(detail::same_size("copy", src.size(), dst.size()));
  BOOST_OUTCOME_CO_TRY(detail::disjoint(src, dst));
  if (src.state() && dst.state() && src.state()->dev != dst.state()->dev)
    co_return co_await detail::copy_peer(std::move(src), std::move(dst), std::move(o));
  if (detail::is_remote(dst.state().get()) || detail::is_remote(src.state().get())) {
    if (!src.state() || !dst.state())
      co_return make_error(errc::invalid_argument, "copy: empty gpu_ref");
    BOOST_OUTCOME_CO_TRY(
        co_await detail::remote_copy(detail::view_of(src), detail::view_of(dst), o.on, o.how));
    co_return dst;
  }
  auto* unit = detail::unit_of(co_await asio::this_coro::executor);
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(dst, o, unit));
  // By value: a deferred transfer runs after this coroutine has returned.
  auto enqueue = [src, dst](launch& l) -> result<gpu_ref<T>> {
    BOOST_OUTCOME_TRY(const T* s, l.read(src));
    BOOST_OUTCOME_TRY(T * d, l.write(dst));
    BOOST_OUTCOME_TRY(detail::memcpy_status(
        cudaMemcpyAsync(d, s, dst.size_bytes(), cudaMemcpyDeviceToDevice, l.native_stream())));
    return src;
  };
  if (!where.first)
    co_return detail::defer_in_unit(*unit, device(dst.state()->dev), "cuda", where.second, dst,
                                    std::move(enqueue));
  co_return co_await run_kernel("cuda", std::move(where.first), where.second, dst,
                                std::move(enqueue));
}

/// Sets every byte of `dst` to `value` (cudaMemsetAsync). Yields `dst`.
template <element T>
asio::awaitable<result<gpu_ref<T>>> fill_bytes(gpu_ref<T> dst, unsigned char value,
                                               transfer_options o = {}) {
  if (detail::is_remote(dst.state().get())) {
    BOOST_OUTCOME_CO_TRY(co_await detail::remote_fill(detail::view_of(dst), value, o.on, o.how));
    co_return dst;
  }
  auto* unit = detail::unit_of(co_await asio::this_coro::executor);
  BOOST_OUTCOME_CO_TRY(auto where, detail::resolve_transfer(dst, o, unit));
  // By value: a deferred transfer runs after this coroutine has returned.
  auto enqueue = [dst, value](launch& l) -> result<std::tuple<>> {
    BOOST_OUTCOME_TRY(T * d, l.write(dst));
    if (auto st = cudaMemsetAsync(d, value, dst.size_bytes(), l.native_stream()); st != cudaSuccess)
      return classify(st, "cudaMemsetAsync");
    return std::tuple<>{};
  };
  if (!where.first)
    co_return detail::defer_in_unit(*unit, device(dst.state()->dev), "cuda", where.second, dst,
                                    std::move(enqueue));
  co_return co_await run_kernel("cuda", std::move(where.first), where.second, dst,
                                std::move(enqueue));
}

// ---- Completion tokens (docs/design.md, "Completion tokens") ----
// Every transfer above also takes an Asio completion token as its last
// argument, after its transfer_options or in their place; it then completes
// with void(result<V>), V the value the awaitable yields, on the handler's
// associated executor. It runs on the handler's executor when it has one of
// its own, else on the executor of the gpu_ref's device (of the options'
// stream's device for an empty ref). Host memory passed as a span or range
// is read or written while the operation runs: it must stay valid until the
// handler is called. Each costs one co_spawn on top of the awaitable.

namespace detail {
template <class T>
struct is_pinned_buffer : std::false_type {};
template <class T>
struct is_pinned_buffer<pinned_buffer<T>> : std::true_type {};

/// Contiguous host elements that a transfer may use after the initiating call
/// returns: a span or a container passed as an lvalue (an rvalue container
/// would be gone by then), never a pinned_buffer (which has its own overloads).
template <class R>
concept borrowed_host_range = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::ranges::borrowed_range<R> && element<std::ranges::range_value_t<R>> &&
    !is_pinned_buffer<std::remove_cvref_t<R>>::value;

/// ... whose elements are of type T and may be written.
template <class R, class T>
concept writable_host_range_of =
    borrowed_host_range<R> && std::same_as<std::ranges::range_value_t<R>, T> &&
    !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// The executor a transfer on `ref` runs on when its handler has none: its device's.
template <element T>
asio::any_io_executor transfer_executor(const gpu_ref<T>& ref, const transfer_options& o) {
  if (ref.state()) return device(ref.state()->dev).get_executor();
  if (o.on) return o.on.get_device().get_executor();
  return {};
}
}  // namespace detail

/// upload from pinned memory through `token`: completes with void(result<gpu_ref<T>>).
template <element T, result_token<gpu_ref<T>> Token>
auto upload(pinned_buffer<T> src, gpu_ref<T> dst, transfer_options o, Token&& token) {
  auto ex = detail::transfer_executor(dst, o);
  return async_from(std::move(ex), upload(std::move(src), std::move(dst), std::move(o)),
                    std::forward<Token>(token));
}
/// upload from pinned memory through `token`, with the default transfer_options.
template <element T, result_token<gpu_ref<T>> Token>
auto upload(pinned_buffer<T> src, gpu_ref<T> dst, Token&& token) {
  return upload(std::move(src), std::move(dst), transfer_options{}, std::forward<Token>(token));
}

/// upload from pageable memory (a span, or an lvalue contiguous container) through
/// `token`: completes with void(result<gpu_ref<T>>). `src` is copied into the
/// staging buffer in this call, before it returns (the pageable upload stages
/// at the call).
template <detail::borrowed_host_range Src,
          result_token<gpu_ref<std::ranges::range_value_t<Src>>> Token>
auto upload(Src&& src, gpu_ref<std::ranges::range_value_t<Src>> dst, transfer_options o,
            Token&& token) {
  using T = std::ranges::range_value_t<Src>;
  auto ex = detail::transfer_executor(dst, o);
  std::span<const T> view(std::ranges::data(src), std::ranges::size(src));
  return async_from(std::move(ex), upload(view, std::move(dst), std::move(o)),
                    std::forward<Token>(token));
}
/// upload from pageable memory through `token`, with the default transfer_options.
template <detail::borrowed_host_range Src,
          result_token<gpu_ref<std::ranges::range_value_t<Src>>> Token>
auto upload(Src&& src, gpu_ref<std::ranges::range_value_t<Src>> dst, Token&& token) {
  return upload(std::forward<Src>(src), std::move(dst), transfer_options{},
                std::forward<Token>(token));
}

/// download to pinned memory through `token`: completes with void(result<pinned_buffer<T>>).
template <element T, result_token<pinned_buffer<T>> Token>
auto download(gpu_ref<T> src, pinned_buffer<T> dst, transfer_options o, Token&& token) {
  auto ex = detail::transfer_executor(src, o);
  return async_from(std::move(ex), download(std::move(src), std::move(dst), std::move(o)),
                    std::forward<Token>(token));
}
/// download to pinned memory through `token`, with the default transfer_options.
template <element T, result_token<pinned_buffer<T>> Token>
auto download(gpu_ref<T> src, pinned_buffer<T> dst, Token&& token) {
  return download(std::move(src), std::move(dst), transfer_options{}, std::forward<Token>(token));
}

/// download to pageable memory (a span, or an lvalue contiguous container) through
/// `token`: completes with void(result<void>); `dst` is written on success only,
/// before the handler runs.
template <element T, detail::writable_host_range_of<T> Dst, result_token<void> Token>
auto download(gpu_ref<T> src, Dst&& dst, transfer_options o, Token&& token) {
  auto ex = detail::transfer_executor(src, o);
  std::span<T> view(std::ranges::data(dst), std::ranges::size(dst));
  return async_from(std::move(ex), download(std::move(src), view, std::move(o)),
                    std::forward<Token>(token));
}
/// download to pageable memory through `token`, with the default transfer_options.
template <element T, detail::writable_host_range_of<T> Dst, result_token<void> Token>
auto download(gpu_ref<T> src, Dst&& dst, Token&& token) {
  return download(std::move(src), std::forward<Dst>(dst), transfer_options{},
                  std::forward<Token>(token));
}

/// copy through `token`: completes with void(result<gpu_ref<T>>) (dst).
template <element T, result_token<gpu_ref<T>> Token>
auto copy(gpu_ref<T> src, gpu_ref<T> dst, transfer_options o, Token&& token) {
  auto ex = detail::transfer_executor(dst, o);
  return async_from(std::move(ex), copy(std::move(src), std::move(dst), std::move(o)),
                    std::forward<Token>(token));
}
/// copy through `token`, with the default transfer_options.
template <element T, result_token<gpu_ref<T>> Token>
auto copy(gpu_ref<T> src, gpu_ref<T> dst, Token&& token) {
  return copy(std::move(src), std::move(dst), transfer_options{}, std::forward<Token>(token));
}

/// fill_bytes through `token`: completes with void(result<gpu_ref<T>>) (dst).
template <element T, result_token<gpu_ref<T>> Token>
auto fill_bytes(gpu_ref<T> dst, unsigned char value, transfer_options o, Token&& token) {
  auto ex = detail::transfer_executor(dst, o);
  return async_from(std::move(ex), fill_bytes(std::move(dst), value, std::move(o)),
                    std::forward<Token>(token));
}
/// fill_bytes through `token`, with the default transfer_options.
template <element T, result_token<gpu_ref<T>> Token>
auto fill_bytes(gpu_ref<T> dst, unsigned char value, Token&& token) {
  return fill_bytes(std::move(dst), value, transfer_options{}, std::forward<Token>(token));
}

}  // namespace atomr::cuda
