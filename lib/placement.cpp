// placement: device_set (docs/design.md, "Several devices").
#include "device_impl.hpp"

#include <atomr/cuda/placement.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace atomr::cuda {

namespace detail {

std::optional<std::size_t> choose_device(placement_policy policy,
                                         std::span<const device_load> loads, std::size_t cursor) {
  const std::size_t n = loads.size();
  if (n == 0) return std::nullopt;
  if (policy == placement_policy::round_robin) {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = (cursor + k) % n;
      if (loads[i].accepting) return i;
    }
    return std::nullopt;
  }
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& l = loads[i];
    if (!l.accepting) continue;
    if (!best) {
      best = i;
      continue;
    }
    const auto& b = loads[*best];
    if (l.in_flight < b.in_flight || (l.in_flight == b.in_flight && l.free_bytes > b.free_bytes))
      best = i;
  }
  return best;
}

struct device_set_state {
  std::vector<device> devices;
  std::vector<int> ordinals;
  std::vector<char> peers;  // n * n, peers[i * n + j]
  placement_policy policy = placement_policy::round_robin;
  std::chrono::nanoseconds memory_refresh{};
  mutable std::atomic<std::size_t> cursor{0};
  mutable std::mutex mu;  // guards the free-memory cache
  mutable std::vector<std::size_t> free_bytes;
  mutable std::vector<std::chrono::steady_clock::time_point> read_at;

  /// Device i's load; its free memory read again when older than memory_refresh.
  device_load load(std::size_t i, bool with_memory) const {
    device_load l;
    const auto& d = devices[i];
    l.accepting = d.accepting();
    if (!d.impl()) return l;
    l.in_flight = d.impl()->in_flight.load();
    if (!with_memory || !l.accepting) return l;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(mu);
      if (now - read_at[i] < memory_refresh) {
        l.free_bytes = free_bytes[i];
        return l;
      }
    }
    const auto s = d.statistics();  // cudaMemGetInfo, or the worker's last heartbeat
    std::lock_guard lk(mu);
    free_bytes[i] = s.free_bytes;
    read_at[i] = now;
    l.free_bytes = s.free_bytes;
    return l;
  }
};

}  // namespace detail

result<device_set> device_set::open(const asio::any_io_executor& ex,
                                    const device_set_options& options) {
  auto st = std::make_shared<detail::device_set_state>();
  st->policy = options.policy;
  st->memory_refresh = options.memory_refresh;
  if (options.policy != placement_policy::round_robin &&
      options.policy != placement_policy::least_loaded)
    return make_error(errc::invalid_argument, "device_set: unknown placement policy");
  std::vector<int> ordinals = options.ordinals;
  const bool isolated = options.device.isolation.enabled;
  if (ordinals.empty()) {
    if (isolated)
      return make_error(errc::invalid_argument,
                        "device_set: an isolated set lists its ordinals (the service process "
                        "makes no CUDA call to count them)");
    int n = 0;
    if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess || n <= 0) {
      cudaGetLastError();
      return make_error(errc::device_unavailable,
                        std::string("device_set: no CUDA device (") + cudaGetErrorString(e) + ")");
    }
    for (int i = 0; i < n; ++i) ordinals.push_back(i);
  }
  for (std::size_t i = 0; i < ordinals.size(); ++i) {
    if (ordinals[i] < 0)
      return make_error(errc::invalid_argument,
                        "device_set: ordinal " + std::to_string(ordinals[i]) + " is negative");
    if (std::find(ordinals.begin(), ordinals.begin() + static_cast<std::ptrdiff_t>(i),
                  ordinals[i]) != ordinals.begin() + static_cast<std::ptrdiff_t>(i))
      return make_error(errc::invalid_argument,
                        "device_set: ordinal " + std::to_string(ordinals[i]) + " listed twice");
  }
  const std::size_t n = ordinals.size();
  st->ordinals = ordinals;
  for (int o : ordinals) st->devices.emplace_back(ex, o, options.device);
  st->free_bytes.assign(n, 0);
  st->read_at.assign(n, std::chrono::steady_clock::time_point{});
  st->peers.assign(n * n, 0);
  if (!isolated) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        if (i == j || !st->devices[i].accepting() || !st->devices[j].accepting()) continue;
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, ordinals[i], ordinals[j]) != cudaSuccess) {
          cudaGetLastError();
          continue;
        }
        if (!can) continue;
        if (options.enable_peer_access) {
          if (st->devices[i].impl()->make_current() != cudaSuccess) {
            cudaGetLastError();
            continue;
          }
          const auto e = cudaDeviceEnablePeerAccess(ordinals[j], 0);
          if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
            cudaGetLastError();
            continue;
          }
          cudaGetLastError();  // already enabled is not an error here
        }
        st->peers[i * n + j] = 1;
      }
  }
  return device_set(std::move(st));
}

std::size_t device_set::size() const noexcept {
  return st_ ? st_->devices.size() : 0;
}

device device_set::operator[](std::size_t i) const {
  if (!st_ || i >= st_->devices.size()) return device{};
  return st_->devices[i];
}

result<device> device_set::by_ordinal(int ordinal) const {
  if (st_)
    for (std::size_t i = 0; i < st_->ordinals.size(); ++i)
      if (st_->ordinals[i] == ordinal) return st_->devices[i];
  return make_error(errc::invalid_argument,
                    "device_set: no device of ordinal " + std::to_string(ordinal) + " in the set");
}

std::vector<device_load> device_set::loads() const {
  std::vector<device_load> out;
  if (!st_) return out;
  for (std::size_t i = 0; i < st_->devices.size(); ++i) out.push_back(st_->load(i, true));
  return out;
}

result<std::size_t> device_set::pick_index() const {
  if (!st_ || st_->devices.empty())
    return make_error(errc::invalid_argument, "device_set: empty set");
  const bool memory = st_->policy == placement_policy::least_loaded;
  std::vector<device_load> l;
  l.reserve(st_->devices.size());
  for (std::size_t i = 0; i < st_->devices.size(); ++i) l.push_back(st_->load(i, memory));
  const auto cursor = st_->cursor.fetch_add(1, std::memory_order_relaxed);
  if (auto i = detail::choose_device(st_->policy, l, cursor % l.size())) return *i;
  std::string why = "device_set: no device accepts work (";
  for (std::size_t i = 0; i < st_->devices.size(); ++i) {
    if (i) why += ", ";
    why += "ordinal " + std::to_string(st_->ordinals[i]) + ": " +
           std::string(to_string(st_->devices[i].health()));
  }
  return make_error(errc::device_unavailable, why + ")");
}

result<device> device_set::pick() const {
  BOOST_OUTCOME_TRY(auto i, pick_index());
  return st_->devices[i];
}

bool device_set::peer(std::size_t i, std::size_t j) const noexcept {
  if (!st_) return false;
  const std::size_t n = st_->devices.size();
  if (i >= n || j >= n) return false;
  return st_->peers[i * n + j] != 0;
}

}  // namespace atomr::cuda
