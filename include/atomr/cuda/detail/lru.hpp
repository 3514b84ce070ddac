// A bounded least-recently-used cache, shared by the library actors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <utility>

namespace atomr::cuda::detail {

/// A bounded least-recently-used map with hit, miss and eviction counts.
/// Not thread-safe (each actor guards it with its enqueue lock). Key needs
/// operator<. An evicted Value is destroyed by the cache (so a shared_ptr
/// Value lives on in whoever else holds it).
template <class Key, class Value>
class lru {
public:
  /// `capacity` >= 1 (0 is treated as 1).
  explicit lru(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  /// The value for `k`, now most recently used, or nullptr; counts a hit or a miss.
  Value* find(const Key& k) {
    auto it = index_.find(k);
    if (it == index_.end()) {
      ++misses_;
      return nullptr;
    }
    ++hits_;
    items_.splice(items_.begin(), items_, it->second);
    return &it->second->second;
  }

  /// Inserts (or replaces) `k` as the most recently used entry, evicting the
  /// least recently used ones beyond the capacity. Does not count a hit or miss.
  Value& insert(Key k, Value v) {
    if (auto it = index_.find(k); it != index_.end()) {
      it->second->second = std::move(v);
      items_.splice(items_.begin(), items_, it->second);
      return it->second->second;
    }
    items_.emplace_front(std::move(k), std::move(v));
    index_.emplace(items_.front().first, items_.begin());
    while (items_.size() > capacity_) {
      index_.erase(items_.back().first);
      items_.pop_back();
      ++evictions_;
    }
    return items_.front().second;
  }

  /// True if `k` is cached; no counting, no reordering.
  bool contains(const Key& k) const { return index_.count(k) != 0; }
  /// Drops `k`'s entry, if any (not counted as an eviction).
  bool erase(const Key& k) {
    auto it = index_.find(k);
    if (it == index_.end()) return false;
    items_.erase(it->second);
    index_.erase(it);
    return true;
  }
  /// Drops every entry (counts stay).
  void clear() {
    index_.clear();
    items_.clear();
  }

  std::size_t size() const noexcept { return items_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }
  std::uint64_t hits() const noexcept { return hits_; }
  std::uint64_t misses() const noexcept { return misses_; }
  std::uint64_t evictions() const noexcept { return evictions_; }
  /// Keys from most to least recently used.
  template <class F>
  void for_each_key(F&& f) const {
    for (const auto& [k, v] : items_) f(k);
  }

private:
  using list_t = std::list<std::pair<Key, Value>>;
  std::size_t capacity_;
  list_t items_;  // most recently used first
  std::map<Key, typename list_t::iterator> index_;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t evictions_ = 0;
};

}  // namespace atomr::cuda::detail
