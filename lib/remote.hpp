// Private: the service side of an isolated device (docs/design.md, "Isolated
// device"): its worker supervisor, the arena's allocator, and one awaitable
// request to the worker. Not installed.
#pragma once

#include "worker/actor_wire.hpp"
#include "worker/protocol.hpp"

#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/detail/worker_supervisor.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>

#include <boost/asio/awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atomr::cuda::detail {

class device_impl;

/// The arena of one worker incarnation, and its free space (first fit, 256
/// byte granules, neighbours merged). Thread-safe.
class arena_space : public std::enable_shared_from_this<arena_space> {
public:
  explicit arena_space(worker_arena a);
  /// A block of at least `bytes`, or nothing when no free range is that large.
  std::optional<std::size_t> take(std::size_t bytes);
  void give(std::size_t offset, std::size_t bytes);
  std::byte* data() const noexcept { return map_.data; }
  std::size_t size() const noexcept { return map_.size; }
  std::uint64_t incarnation() const noexcept { return map_.incarnation; }
  static std::size_t round(std::size_t bytes) noexcept { return (bytes + 255) & ~std::size_t{255}; }

private:
  worker_arena map_;
  std::mutex mu_;
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes
};

/// One block of an arena, given back when the last holder drops it: the
/// request that uses it (until its answer or its worker's end) and the
/// coroutine that fills or reads it.
class arena_block {
public:
  arena_block(std::shared_ptr<arena_space> a, std::size_t off, std::size_t bytes) noexcept
      : a_(std::move(a)), off_(off), bytes_(bytes) {}
  arena_block(const arena_block&) = delete;
  arena_block& operator=(const arena_block&) = delete;
  ~arena_block() { a_->give(off_, bytes_); }
  std::byte* data() const noexcept { return a_->data() + off_; }
  std::size_t offset() const noexcept { return off_; }
  std::size_t bytes() const noexcept { return bytes_; }
  std::uint64_t incarnation() const noexcept { return a_->incarnation(); }

private:
  std::shared_ptr<arena_space> a_;
  std::size_t off_, bytes_;
};

/// Calls `fn(where, from, n)` once for each run of `blocks` that lie back
/// to back in the arena: `where` is the run's first byte in the arena,
/// `from` the run's offset in the transfer of `bytes` bytes, which the
/// blocks hold in order (block i takes min(its size, what is left)). One
/// memcpy per run, not per block, because glibc's memcpy takes its
/// non-temporal path only above a size derived from the cache (151 MiB on
/// the H100 host): sixteen 16 MiB copies took 46 ms where one of 256 MiB
/// took 29 (docs/design.md, "Isolated device", the arena).
template <class Fn>
void for_each_run(const std::vector<std::shared_ptr<arena_block>>& blocks, std::size_t bytes,
                  Fn&& fn) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < blocks.size() && at < bytes;) {
    std::byte* const first = blocks[i]->data();
    std::size_t run = 0;
    // Extend the run while the next block starts where this one's bytes end.
    for (; i < blocks.size() && at + run < bytes && blocks[i]->data() == first + run; ++i)
      run += std::min(blocks[i]->bytes(), bytes - at - run);
    fn(first, at, run);
    at += run;
  }
}

/// The isolated device's link to its worker. Owned by the device_impl.
class remote_device {
public:
  explicit remote_device(device_impl& d) noexcept : dev_(d) {}
  remote_device(const remote_device&) = delete;
  remote_device& operator=(const remote_device&) = delete;

  /// Starts the first worker (asynchronously); device_unavailable when the
  /// executable is not found. `self` is the device's state (for the observer).
  result<void> start(const std::weak_ptr<device_impl>& self);
  /// Kills a running worker (synchronously) and drops the supervisor.
  void shutdown();
  void stop();

  /// The request's deadline, after which its worker counts as hung.
  std::chrono::steady_clock::time_point deadline(const completion& how) const;
  /// A block of the current worker's arena, at most `max_bytes` and at least
  /// min(bytes, a quarter of the arena); nothing while the arena is full.
  result<std::shared_ptr<arena_block>> try_block(std::size_t bytes);
  /// The largest piece one transfer request moves.
  std::size_t piece_bytes() const noexcept;

  /// A new handle (buffers) or actor id: never reused in this process.
  std::uint64_t next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  /// Sends an alloc (no answer); out_of_memory when too many wait for the worker.
  result<void> send_alloc(std::uint64_t handle, std::size_t count, std::uint32_t type);
  /// Tells the worker that the service dropped a buffer or an actor.
  void release(wire::release_kind k, std::uint64_t id);

  worker_statistics worker_stats() const;
  const std::shared_ptr<worker_supervisor>& supervisor() const noexcept { return sup_; }

  /// Parked requests: abandoned by their waiter (timeout, cancellation),
  /// holding their arena blocks until the answer comes.
  std::atomic<std::uint64_t> abandoned{0};

private:
  void on_event(const worker_event& ev);

  device_impl& dev_;
  std::shared_ptr<worker_supervisor> sup_;
  std::atomic<std::uint64_t> next_id_{1};
  mutable std::mutex mu_;
  std::shared_ptr<arena_space> arena_;  // the current incarnation's
};

/// One request to the worker of `d`, awaited with `how`'s timeout
/// (the strategy itself does not apply: the worker waits for the GPU).
/// Yields the answer's bytes or its error. On timeout or cancellation the
/// request stays pending with the worker, and `keep` (its arena blocks) is
/// held until the answer or the worker's end. `incarnation` non-zero: the
/// worker whose arena the request's blocks are in (stale_ref on another).
asio::awaitable<result<std::vector<char>>> remote_call(device_impl& d, wire::op_code op,
                                                       std::string payload, completion how,
                                                       std::shared_ptr<void> keep,
                                                       std::uint64_t incarnation = 0);

struct unit_recorder;

/// Sends the requests a composed unit's steps made (unit_recorder::
/// remote_requests) as one message and awaits its answer with `how`: the
/// worker runs them as one unit. Its error names the failed step.
asio::awaitable<result<void>> send_remote_unit(unit_recorder& rec, completion how);
/// Sends a recording's requests (op_code::record): the worker records them
/// into a CUDA graph it keeps under `handle`. Yields the graph's node count.
asio::awaitable<result<std::uint64_t>> send_remote_record(unit_recorder& rec, std::uint64_t handle,
                                                          completion how);

/// A view's wire form.
wire::ref_arg ref_of(const buffer_state& st, std::size_t offset, std::size_t count);

/// A view's wire form; handle 0 for an empty gpu_ref (an argument left out).
template <class T>
wire::ref_arg view_of(const gpu_ref<T>& r) {
  return r.state() ? ref_of(*r.state(), r.offset(), r.size()) : wire::ref_arg{};
}

/// One library-actor operation (worker/actor_wire.hpp) as a request to the
/// worker of `d`, awaited with `how`'s timeout. The caller's frame holds
/// `refs` (the operation's gpu_refs) until the answer; they are not kept
/// with the pending request, which would keep the device (their owner)
/// alive from its own table. A release after a timeout may reach the worker
/// before the abandoned request, which then fails with stale_ref: nothing
/// reads freed memory. Yields the answer's bytes.
template <class P, class... Refs>
asio::awaitable<result<std::vector<char>>> remote_actor_call(device_impl& d, wire::actor_head h,
                                                             const P& params, completion how,
                                                             const Refs&... refs) {
  return remote_call(d, wire::op_code::actor, wire::actor_payload(h, params, {view_of(refs)...}),
                     how, nullptr);
}

/// The value an answer carries (dot, nrm2, asum, iamax).
template <class R>
result<R> reply_value(const std::vector<char>& p, std::string_view op) {
  if (p.size() != sizeof(R))
    return make_error(errc::library, std::string(op) + ": the worker's answer has " +
                                         std::to_string(p.size()) + " bytes, not " +
                                         std::to_string(sizeof(R)));
  R v;
  std::memcpy(&v, p.data(), sizeof v);
  return v;
}

/// The options every actor's twin shares (wire form): its streams and lanes.
inline wire::actor_settings lane_settings(const std::optional<stream_policy>& streams,
                                          std::size_t max_lanes) {
  wire::actor_settings s;
  s.has_streams = streams.has_value() ? 1 : 0;
  s.streams = static_cast<std::uint8_t>(streams.value_or(stream_policy::pooled));
  s.max_lanes = static_cast<std::uint32_t>(max_lanes);
  return s;
}

/// A request's head for actor `id`.
inline wire::actor_head actor_head_of(std::uint64_t id, wire::actor_kind k, wire::actor_op op,
                                      dtype t, const wire::actor_settings& s) {
  wire::actor_head h;
  h.actor = id;
  h.kind = static_cast<std::uint16_t>(k);
  h.op = static_cast<std::uint16_t>(op);
  h.type = static_cast<std::uint32_t>(t);
  h.settings = s;
  return h;
}

}  // namespace atomr::cuda::detail
