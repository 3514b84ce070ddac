// placement: a set of devices, and which one the next piece of work goes to.
#pragma once

#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace atomr::cuda {

/// How device_set::pick() chooses (docs/design.md, "Several devices").
enum class placement_policy : std::uint8_t {
  /// The devices in turn, skipping those that do not accept work.
  round_robin,
  /// The accepting device with the fewest operations in flight; ties go to
  /// the one with the most free memory (refreshed at most every
  /// device_set_options::memory_refresh), then to the lowest index.
  least_loaded,
};

/// How a device_set is opened.
struct device_set_options {
  /// The CUDA ordinals, in the set's order; empty: every device
  /// cudaGetDeviceCount reports (an isolated set must list them: the service
  /// process makes no CUDA call then). Each at most once.
  std::vector<int> ordinals{};
  /// Every device's options (isolation included).
  device_options device{};
  /// How pick() chooses (round robin by default).
  placement_policy policy = placement_policy::round_robin;
  /// least_loaded: how old a device's free-memory figure may be before a
  /// pick reads it again (cudaMemGetInfo, a few us each).
  std::chrono::nanoseconds memory_refresh = std::chrono::milliseconds(10);
  /// Enable peer access between every pair of in-process devices whose
  /// topology allows it (cudaDeviceEnablePeerAccess), at open.
  bool enable_peer_access = true;
};

/// What least_loaded compares, per device.
struct device_load {
  bool accepting = false;       ///< device::accepting()
  std::uint64_t in_flight = 0;  ///< device_statistics::ops_in_flight
  std::size_t free_bytes = 0;   ///< device_statistics::free_bytes (possibly older)
};

namespace detail {
/// The index `policy` picks among `loads` (no CUDA call): round_robin the
/// first accepting one at or after `cursor` (wrapping), least_loaded as its
/// enumerator says. Nothing when no device accepts work.
std::optional<std::size_t> choose_device(placement_policy policy,
                                         std::span<const device_load> loads, std::size_t cursor);
struct device_set_state;
}  // namespace detail

/// Several devices of this process, each independent (its own streams,
/// event pool, poller and launch threads: nothing is shared between them),
/// and the placement of work over them. A copyable handle; thread-safe.
class device_set {
public:
  /// Opens every device of `options.ordinals` (or all of them) on `ex`.
  /// invalid_argument for an ordinal listed twice or out of range, or an
  /// isolated set without ordinals; device_unavailable when no device
  /// exists. A device that fails to open is in the set as unavailable
  /// (pick() skips it), so that ordinals keep their places.
  static result<device_set> open(const asio::any_io_executor& ex,
                                 const device_set_options& options = {});

  /// An empty set: pick() yields invalid_argument.
  device_set() noexcept = default;

  std::size_t size() const noexcept;  ///< devices in the set
  /// The i-th device (set order); an empty handle for i out of range.
  device operator[](std::size_t i) const;
  /// The device of CUDA ordinal `ordinal` in the set (explicit placement);
  /// invalid_argument when the set has none.
  result<device> by_ordinal(int ordinal) const;
  /// The device the policy picks for the next piece of work;
  /// device_unavailable (naming each device's state) when none accepts work.
  result<device> pick() const;
  /// pick()'s index, for callers that keep per-device things (actors).
  result<std::size_t> pick_index() const;
  /// Which pairs may copy directly (cudaDeviceCanAccessPeer, and enabled
  /// at open): peer(i, j) for set indices; false for i == j (a same-device
  /// copy needs no peer access) and for isolated devices.
  bool peer(std::size_t i, std::size_t j) const noexcept;
  /// Each device's load as pick() sees it now.
  std::vector<device_load> loads() const;

private:
  explicit device_set(std::shared_ptr<detail::device_set_state> st) noexcept : st_(std::move(st)) {}
  std::shared_ptr<detail::device_set_state> st_;
};

/// One actor per device of a set, made with the same options; pick() places
/// an operation by the set's policy. `Actor` is blas_actor, cudnn_actor,
/// fft_actor or rng_actor (anything with `static result<Actor>
/// create(device, Options)`). An actor is made on first use of its device.
template <class Actor, class Options>
class placed_actors {
public:
  /// Over the devices of `set`; each actor is made with `options` at the
  /// first use of its device (no CUDA call here).
  placed_actors(device_set set, Options options)
      : set_(std::move(set)),
        options_(std::move(options)),
        slots_(std::make_shared<std::vector<slot>>(set_.size())) {}

  /// The actor of the device the policy picks now.
  result<Actor> pick() const {
    BOOST_OUTCOME_TRY(auto i, set_.pick_index());
    return at(i);
  }
  /// The actor of the set's i-th device (made now if it is the first use).
  result<Actor> at(std::size_t i) const {
    if (i >= slots_->size())
      return make_error(errc::invalid_argument, "placed_actors: no device " + std::to_string(i));
    auto& s = (*slots_)[i];
    std::lock_guard lk(s.mu);
    if (!s.actor) {
      BOOST_OUTCOME_TRY(auto made, Actor::create(set_[i], options_));
      s.actor.emplace(std::move(made));
    }
    return *s.actor;
  }
  /// The set the actors are placed over.
  const device_set& devices() const noexcept { return set_; }

private:
  struct slot {
    std::mutex mu;
    std::optional<Actor> actor;
  };
  device_set set_;
  Options options_;
  std::shared_ptr<std::vector<slot>> slots_;
};

}  // namespace atomr::cuda
