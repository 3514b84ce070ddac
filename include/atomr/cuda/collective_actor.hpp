// collective_actor: NCCL collectives over several devices of this process, as awaitables.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/copy.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/placement.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace atomr::cuda {

/// How a reduction combines the ranks' elements (NCCL's ncclSum, ...).
enum class reduce_op : std::uint8_t {
  sum,
  prod,
  max,
  min,
  avg,  ///< the sum divided by the number of ranks (floating-point types only)
};

/// The enumerator's name ("sum", ...); "unknown" for any other value.
std::string_view to_string(reduce_op op) noexcept;

/// What a collective_call does.
enum class collective_kind : std::uint8_t {
  all_reduce,      ///< every rank gets the reduction of every rank's send buffer
  broadcast,       ///< every rank gets the root's buffer
  reduce,          ///< the root gets the reduction of every rank's send buffer
  all_gather,      ///< every rank gets every rank's send buffer, in rank order
  reduce_scatter,  ///< rank r gets the r-th block of the reduction
  send_recv,       ///< one rank's buffer copied to another rank's (ncclSend/ncclRecv)
};

/// The enumerator's name ("all_reduce", ...); "unknown" for any other value.
std::string_view to_string(collective_kind k) noexcept;

namespace detail {
/// One buffer of a collective, whatever its element type: the state, the
/// element offset and count (the isolated device's transfers use the same).
using collective_view = remote_view;

template <element T>
std::vector<collective_view> collective_views_of(std::span<const gpu_ref<T>> rs) {
  std::vector<collective_view> v;
  v.reserve(rs.size());
  for (const auto& r : rs) v.push_back(view_of(r));
  return v;
}
}  // namespace detail

/// One collective of a group (collective_actor::group), made by the
/// functions below; its element type is erased. Its buffers are held until
/// the group's GPU work has finished.
struct collective_call {
  collective_kind kind = collective_kind::all_reduce;  ///< what the call does
  dtype type = dtype::f32;                             ///< the buffers' element type
  reduce_op op = reduce_op::sum;  ///< all_reduce, reduce, reduce_scatter: the reduction
  int root = 0;                   ///< broadcast, reduce: the root rank; send_recv: the sending rank
  int peer = 0;                   ///< send_recv: the receiving rank
  /// Per rank (all_reduce, reduce, all_gather, reduce_scatter); one buffer
  /// (broadcast: the root's source; send_recv: the sender's).
  std::vector<detail::collective_view> send;
  /// Per rank (all_reduce, broadcast, all_gather, reduce_scatter); one
  /// buffer (reduce: the root's result; send_recv: the receiver's).
  std::vector<detail::collective_view> recv;
};

/// all_reduce: recv[r] = op over every rank of send[r] (send[r] and recv[r]
/// on rank r's device, all of one size; send[r] == recv[r] is in place).
template <element T>
collective_call all_reduce_call(std::span<const gpu_ref<T>> send, std::span<const gpu_ref<T>> recv,
                                reduce_op op = reduce_op::sum) {
  return {
      collective_kind::all_reduce,      dtype_of<T>, op, 0, 0, detail::collective_views_of(send),
      detail::collective_views_of(recv)};
}
/// broadcast: every recv[r] = src (src on the root's device, recv[r] on rank
/// r's, all of one size; src == recv[root] is in place).
template <element T>
collective_call broadcast_call(const gpu_ref<T>& src, std::span<const gpu_ref<T>> recv,
                               int root = 0) {
  return {collective_kind::broadcast,
          dtype_of<T>,
          reduce_op::sum,
          root,
          0,
          {detail::view_of(src)},
          detail::collective_views_of(recv)};
}
/// reduce: dst = op over every rank of send[r] (dst on the root's device).
template <element T>
collective_call reduce_call(std::span<const gpu_ref<T>> send, const gpu_ref<T>& dst,
                            reduce_op op = reduce_op::sum, int root = 0) {
  return {collective_kind::reduce,           dtype_of<T>,           op, root, 0,
          detail::collective_views_of(send), {detail::view_of(dst)}};
}
/// all_gather: recv[r] = send[0] | send[1] | ... (recv[r] holds ranks x
/// send[r].size() elements).
template <element T>
collective_call all_gather_call(std::span<const gpu_ref<T>> send,
                                std::span<const gpu_ref<T>> recv) {
  return {collective_kind::all_gather,
          dtype_of<T>,
          reduce_op::sum,
          0,
          0,
          detail::collective_views_of(send),
          detail::collective_views_of(recv)};
}
/// reduce_scatter: recv[r] = the r-th block (of recv[r].size() elements) of
/// op over every rank of send[r] (send[r] holds ranks x recv[r].size()).
template <element T>
collective_call reduce_scatter_call(std::span<const gpu_ref<T>> send,
                                    std::span<const gpu_ref<T>> recv,
                                    reduce_op op = reduce_op::sum) {
  return {
      collective_kind::reduce_scatter,  dtype_of<T>, op, 0, 0, detail::collective_views_of(send),
      detail::collective_views_of(recv)};
}
/// send_recv: dst (on rank `to`'s device) = src (on rank `from`'s); from ==
/// to copies within one rank.
template <element T>
collective_call send_recv_call(int from, int to, const gpu_ref<T>& src, const gpu_ref<T>& dst) {
  return {collective_kind::send_recv, dtype_of<T>,           reduce_op::sum, from, to,
          {detail::view_of(src)},     {detail::view_of(dst)}};
}

/// Settings of a collective_actor, fixed at create().
struct collective_options {
  /// How completion is awaited; unset: the first device's default strategy.
  std::optional<completion> how{};
};

/// A snapshot of a collective_actor's counts.
struct collective_statistics {
  std::size_t ranks = 0;     ///< devices in the communicator
  std::uint64_t groups = 0;  ///< groups enqueued (each collective call is one)
  std::uint64_t builds = 0;  ///< communicators made (ncclCommInitAll), the first included
  std::uint64_t aborts = 0;  ///< communicators aborted (ncclCommAbort) after an error or reset()
  std::uint64_t nccl_version = 0;  ///< ncclGetVersion, e.g. 22809 for 2.28.9
};

namespace detail {
struct collective_state;

/// The checks a group runs on one call before any NCCL call, given the
/// number of ranks (pure: no CUDA call, the views' states are not looked
/// at): kind, op and root in range; the op fits the type (avg: floating
/// point; prod, max, min: not complex); one buffer per rank where the kind
/// has one per rank; no buffer empty; sizes as the kind needs (all_reduce,
/// broadcast: one size; all_gather: recv = ranks x send; reduce_scatter:
/// send = ranks x recv; every rank the same). That each buffer exists, is
/// not stale and is on its rank's device is checked by the actor.
/// invalid_argument naming the call ("all_reduce: recv[1] has 8 elements,
/// send[1] 16"); not_supported for an op the type cannot take.
result<void> check_collective(const collective_call& c, std::size_t ranks);
}  // namespace detail

/// NCCL collectives over devices of this process (docs/design.md, "Several
/// devices"): one communicator of one rank per device (ncclCommInitAll),
/// each rank with a stream of its own on its device. A copyable handle;
/// thread-safe: groups are enqueued one at a time (a lock held only around
/// the enqueue, never while the GPU works), so every rank sees them in one
/// order.
///
/// A group is one ncclGroupStart/ncclGroupEnd around every rank's calls. Its
/// rank streams first wait for the earlier writes of every buffer it
/// touches, and the first rank's stream waits for the others' at the end:
/// the group is awaited like any operation, on the first device, with the
/// actor's strategy, and yields once every rank's part has finished (not
/// when it was enqueued). Its buffers are stamped with that completion, so
/// later operations on any stream are ordered after it.
///
/// Errors: bad arguments before any NCCL call (check_collective, plus each
/// buffer on its rank's device, not stale, not isolated); an NCCL error at
/// enqueue or reported asynchronously (ncclCommGetAsyncError) marks the
/// communicator broken: the next group (or reset()) aborts it
/// (ncclCommAbort) and makes a new one. A CUDA fault poisons the device as
/// for any operation. Not in a unit or a recording (not_supported: a unit
/// runs on one device), not on isolated devices (each is a process of its
/// own; spanning processes is NCCL's unique-id bootstrap, docs/design.md).
/// Two actors over the same devices must not run groups at the same time
/// (NCCL kernels of two communicators can wait on each other).
class collective_actor {
public:
  /// One rank per device, in this order (distinct, in-process, accepting
  /// work). invalid_argument for an empty list, a device twice, an empty
  /// handle; not_supported for an isolated device; the classified NCCL error
  /// when ncclCommInitAll fails.
  static result<collective_actor> create(std::vector<device> devices,
                                         collective_options options = {});
  /// One rank per device of `set`, in the set's order.
  static result<collective_actor> create(const device_set& set, collective_options options = {});

  /// Enqueues `calls` as one NCCL group and waits for them.
  asio::awaitable<result<void>> group(std::vector<collective_call> calls) const;

  /// One all_reduce, as a group of one (all_reduce_call).
  template <element T>
  asio::awaitable<result<void>> all_reduce(std::vector<gpu_ref<T>> send,
                                           std::vector<gpu_ref<T>> recv,
                                           reduce_op op = reduce_op::sum) const {
    return group({all_reduce_call<T>(send, recv, op)});
  }
  /// One broadcast, as a group of one (broadcast_call).
  template <element T>
  asio::awaitable<result<void>> broadcast(gpu_ref<T> src, std::vector<gpu_ref<T>> recv,
                                          int root = 0) const {
    return group({broadcast_call<T>(src, recv, root)});
  }
  /// One reduce, as a group of one (reduce_call).
  template <element T>
  asio::awaitable<result<void>> reduce(std::vector<gpu_ref<T>> send, gpu_ref<T> dst,
                                       reduce_op op = reduce_op::sum, int root = 0) const {
    return group({reduce_call<T>(send, dst, op, root)});
  }
  /// One all_gather, as a group of one (all_gather_call).
  template <element T>
  asio::awaitable<result<void>> all_gather(std::vector<gpu_ref<T>> send,
                                           std::vector<gpu_ref<T>> recv) const {
    return group({all_gather_call<T>(send, recv)});
  }
  /// One reduce_scatter, as a group of one (reduce_scatter_call).
  template <element T>
  asio::awaitable<result<void>> reduce_scatter(std::vector<gpu_ref<T>> send,
                                               std::vector<gpu_ref<T>> recv,
                                               reduce_op op = reduce_op::sum) const {
    return group({reduce_scatter_call<T>(send, recv, op)});
  }
  /// One send_recv, as a group of one (send_recv_call).
  template <element T>
  asio::awaitable<result<void>> send_recv(int from, int to, gpu_ref<T> src, gpu_ref<T> dst) const {
    return group({send_recv_call<T>(from, to, src, dst)});
  }

  /// group() through an Asio completion token: void(result<void>).
  template <result_token<void> Token>
  auto group(std::vector<collective_call> calls, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [calls = std::move(calls)](const collective_actor& a) mutable {
                                    return a.group(std::move(calls));
                                  });
  }

  /// Aborts the communicator (ncclCommAbort) and makes a new one now, after
  /// waiting for nothing: NCCL work still running on it is torn down. The
  /// classified error when the new one cannot be made (the next group tries
  /// again).
  result<void> reset() const;

  std::size_t ranks() const noexcept;        ///< devices in the communicator
  device rank_device(std::size_t r) const;   ///< rank r's device (empty out of range)
  device get_device() const;                 ///< rank 0's device (where groups are awaited)
  collective_statistics statistics() const;  ///< a snapshot of the counts

private:
  explicit collective_actor(std::shared_ptr<detail::collective_state> st) noexcept
      : st_(std::move(st)) {}
  std::shared_ptr<detail::collective_state> st_;
};

}  // namespace atomr::cuda
