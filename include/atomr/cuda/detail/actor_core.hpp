// What every library actor shares: its lanes (each a stream, a library
// handle bound to it, the state tied to that handle, and the lock that
// serialises the enqueues on it), made on demand, and the argument checks.
#pragma once

#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/run_kernel.hpp>
#include <atomr/cuda/stream.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace atomr::cuda::detail {

/// The most lanes one actor may hold (each actor's options::max_lanes).
inline constexpr std::size_t max_lanes_limit = 64;
/// The lanes an actor may grow to (max_lanes = 0) on a device without launch
/// threads (device_options::launch_threads = 0).
inline constexpr std::size_t fallback_max_lanes = 8;

/// How an actor's lanes get their streams, and how many there may be.
struct lane_policy {
  stream_policy streams = stream_policy::per_actor_fresh;
  std::size_t max_lanes = 1;
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

/// An actor's max_lanes option: 0 (the default count) or 1 to 64, else
/// invalid_argument naming `op`. Pure: no CUDA call.
inline result<void> check_max_lanes(std::string_view op, std::size_t max_lanes) {
  if (max_lanes > max_lanes_limit)
    return bad_argument(
        op, "max_lanes",
        "(" + std::to_string(max_lanes) + ") is more than " + std::to_string(max_lanes_limit));
  return outcome::success();
}

/// The lanes an actor gets for its `streams` and `max_lanes` options on a
/// device opened with `dev` (docs/design.md, "One actor, several lanes").
/// Pure: no CUDA call; `max_lanes` is assumed checked.
///  - max_lanes 0 means the device's launch_threads (each lane's stream then
///    has a launch thread of its own), or 8 without launch threads.
///  - No `streams`: each lane gets a fresh stream of its own (per_actor_fresh),
///    except with max_lanes = 1 (the device's policy, as before lanes) and on
///    a device whose policy is single (one lane on the main stream).
///  - single and per_actor_shared give every lane the same stream, so they
///    allow one lane; pooled allows at most stream_pool_size (more lanes
///    would share streams, which adds handles but no launching in parallel).
inline lane_policy resolve_lanes(std::optional<stream_policy> streams, std::size_t max_lanes,
                                 const device_options& dev) noexcept {
  lane_policy p;
  p.max_lanes = max_lanes != 0           ? max_lanes
                : dev.launch_threads > 0 ? dev.launch_threads
                                         : fallback_max_lanes;
  p.max_lanes = std::clamp<std::size_t>(p.max_lanes, 1, max_lanes_limit);
  if (streams)
    p.streams = *streams;
  else if (p.max_lanes == 1 || dev.streams == stream_policy::single)
    p.streams = dev.streams;
  else
    p.streams = stream_policy::per_actor_fresh;
  switch (p.streams) {
    case stream_policy::single:
    case stream_policy::per_actor_shared:
      p.max_lanes = 1;
      break;
    case stream_policy::pooled:
      p.max_lanes = std::min(p.max_lanes, std::max<std::size_t>(1, dev.stream_pool_size));
      break;
    case stream_policy::per_actor_fresh:
      break;
  }
  return p;
}

/// What every lane has: its stream and the lock that serialises the
/// enqueues on its library handle. The lock is held only around the
/// synchronous library calls inside run_kernel (never across a co_await),
/// so the next request enqueues while the previous kernel runs. An Asio
/// strand cannot be held by a coroutine across the enqueue (awaitables
/// resume on their own executor), and the enqueue never blocks on the GPU,
/// so the lock is held for microseconds.
struct lane_base {
  explicit lane_base(stream s) noexcept : strm(std::move(s)) {}
  lane_base(const lane_base&) = delete;
  lane_base& operator=(const lane_base&) = delete;

  const stream strm;
  std::mutex mu;
  /// Guarded by mu: the lane's handle could not be pointed back at `strm`
  /// after a recording (lane_hold), so the lane refuses every operation.
  bool stuck = false;
};

/// The error of an operation on a stuck lane (lane_base::stuck).
inline gpu_error stuck_lane_error() {
  return make_error(errc::library,
                    "this lane's library handle could not be pointed back at its stream after a "
                    "recording; the lane refuses further work (create a new actor)");
}

/// Holds a lane's lock for one enqueue (lane_base::mu). When the enqueue is
/// on another stream than the lane's (inside a recording, launch::recording()
/// and graph.hpp; or a unit's step that follows its previous step's stream,
/// unit_step_stream) it also points the lane's library handle at that stream
/// (`lane.bind(l)`) and back at the lane's own (`lane.unbind()`) before the
/// lock is released, so that the step's calls go there and no other
/// coroutine's do (docs/design.md, "Recorded units"). A lane whose
/// `leaves_bound(l)` says so keeps its handle on a unit step's stream after
/// the step (the next step of that kind on that stream then costs no call)
/// and points it back only when an enqueue on its own stream comes
/// (`lane.to_own()`; docs/design.md, "A cuDNN handle stays on the stream it
/// was last pointed at"). Check status() before using the handle.
template <class Lane>
class lane_hold {
public:
  lane_hold(Lane& lane, launch& l) : lane_(lane), lock_(lane.mu) {
    if (lane.stuck) {
      status_ = stuck_lane_error();
    } else if (l.recording() || l.native_stream() != lane.strm.native_handle()) {
      status_ = lane.bind(l);
      bound_ = status_.has_value() && !leaves_bound(lane, l);
    } else if constexpr (requires { lane.to_own(); }) {
      status_ = lane.to_own();
    }
  }
  lane_hold(const lane_hold&) = delete;
  lane_hold& operator=(const lane_hold&) = delete;
  /// `lane.unbind()` returns false when the handle could not be pointed back:
  /// the lane is then stuck.
  ~lane_hold() {
    if (bound_ && !lane_.unbind()) lane_.stuck = true;
  }
  /// The error of pointing the handle at the recording's stream, if any.
  const result<void>& status() const noexcept { return status_; }

private:
  static bool leaves_bound(Lane& lane, launch& l) {
    if constexpr (requires { lane.leaves_bound(l); })
      return lane.leaves_bound(l);
    else
      return false;
  }

  Lane& lane_;
  std::lock_guard<std::mutex> lock_;
  result<void> status_ = outcome::success();
  bool bound_ = false;
};

/// Up to `limit` lanes of one actor, made on demand (docs/design.md, "One
/// actor, several lanes"). The first lane is installed when the actor is
/// created; pick() adds one when a thread is given an index not made yet. Lanes are
/// never removed before the set is destroyed, so a reference to one stays
/// valid as long as the set. Thread-safe.
template <class Lane>
class lane_set {
public:
  explicit lane_set(std::size_t limit) noexcept
      : limit_(std::clamp<std::size_t>(limit, 1, max_lanes_limit)) {}
  lane_set(const lane_set&) = delete;
  lane_set& operator=(const lane_set&) = delete;

  /// Installs the first lane; called once, before the set is shared.
  Lane& install_first(std::unique_ptr<Lane> lane) noexcept {
    slots_[0] = std::move(lane);
    count_.store(1, std::memory_order_release);
    return *slots_[0];
  }

  /// Lanes made so far (at least 1 once installed).
  std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }
  std::size_t limit() const noexcept { return limit_; }
  /// True once making a lane failed: no more are tried.
  bool growth_stopped() const noexcept { return stopped_.load(std::memory_order_relaxed); }
  Lane& first() const noexcept { return *slots_[0]; }
  Lane& at(std::size_t i) const noexcept { return *slots_[i]; }

  /// The lane for one operation. Lanes in use: one per thread that has
  /// submitted to this set, up to the limit (so one io thread keeps one
  /// lane, as before lanes). With a `key` (the buffer the operation writes)
  /// the lane is chosen by the key among the lanes in use: the operations
  /// on one buffer go to one stream, so a coroutine that reuses its buffers
  /// keeps feeding one stream (its operations join that stream's batches,
  /// as with an actor per coroutine group), and two operations writing one
  /// buffer are also in stream order. Without a key: the thread's own lane
  /// (each thread is given the next index in turn). A lane is made
  /// (`make(index)` -> result<std::unique_ptr<Lane>>, under a creation
  /// lock: a few ms, once per lane) when an index not made yet is chosen. A
  /// lane that could not be made stops the growth (the error is dropped: the
  /// existing lanes serve). Never blocks, except while a lane is made.
  template <class Make>
  Lane& pick(Make&& make, const void* key = nullptr) {
    const std::size_t mine = thread_index();
    std::size_t want = mine;
    if (key) {
      const std::size_t spread = lanes_spread();
      const std::size_t in_use = std::clamp<std::size_t>(
          spread ? spread : assigned_.load(std::memory_order_relaxed), 1, limit_);
      auto h = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key) >> 4);
      h *= 0x9E3779B97F4A7C15ull;
      want = static_cast<std::size_t>(h >> 32) % in_use;
    }
    std::size_t n = size();
    if (want < n) return *slots_[want];
    if (!growth_stopped()) {
      std::lock_guard grow(grow_mu_);
      n = size();
      while (n <= want && !growth_stopped()) {
        auto made = make(n);
        if (made && made.value()) {
          slots_[n] = std::move(made).value();
          count_.store(n + 1, std::memory_order_release);
          ++n;
        } else {
          stopped_.store(true, std::memory_order_relaxed);
        }
      }
    }
    n = size();
    return *slots_[want < n ? want : want % n];
  }

  /// Calls f(lane) for every lane made so far, each under its lock.
  template <class F>
  void for_each_locked(F&& f) const {
    const std::size_t n = size();
    for (std::size_t i = 0; i < n; ++i) {
      Lane& l = *slots_[i];
      std::lock_guard lk(l.mu);
      f(l);
    }
  }

private:
  /// This thread's lane index in this set: remembered per thread for the
  /// last few sets it used (a small cache keyed by the set's process-unique
  /// id; a thread that uses more sets than it holds is given a new index).
  std::size_t thread_index() noexcept {
    struct entry {
      std::uint64_t set = 0;
      std::size_t index = 0;
    };
    thread_local std::array<entry, 8> cache{};
    thread_local std::size_t next_victim = 0;
    for (const auto& e : cache)
      if (e.set == id_) return e.index;
    const std::size_t index = assigned_.fetch_add(1, std::memory_order_relaxed) % limit_;
    cache[next_victim++ % cache.size()] = {id_, index};
    return index;
  }
  static std::uint64_t next_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  const std::uint64_t id_ = next_id();
  std::array<std::unique_ptr<Lane>, max_lanes_limit> slots_{};  // [0, count_) are set
  std::atomic<std::size_t> assigned_{0};                        // threads given a lane index so far
  std::atomic<std::size_t> count_{0};
  const std::size_t limit_;
  std::mutex grow_mu_;  // held while a lane is made
  std::atomic<bool> stopped_{false};
};

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
