// Private: the shared-memory request path between a service process and its
// GPU worker (docs/design.md, "Isolated device", "The request rings"). Not
// installed. Both ends are built from this tree, so the layout is native.
//
// The shared memory object of one worker incarnation starts with the ring
// region, followed by the arena (bulk data). The region holds:
//   - a control ring (alloc and release: no answer, consumed before any
//     request, so that a request never overtakes the allocation it names),
//   - `rings` request rings (service -> worker; a service thread uses one,
//     a worker thread consumes it),
//   - `rings` reply rings (worker thread -> the service's reader thread).
// Each ring is a bounded multi-producer multi-consumer queue of fixed-size
// slots with a sequence number per slot (the Vyukov scheme): lock-free, no
// pointer in shared memory. A consumer that found nothing for a while sets
// its `sleeping` word and sleeps on the ring's semaphore
// (boost::interprocess::interprocess_semaphore: a process-shared POSIX
// semaphore, i.e. a futex); a producer posts it only when that word is set,
// so a busy path makes no system call.
#pragma once

#include <boost/interprocess/sync/interprocess_semaphore.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>

namespace atomr::cuda::detail::wire {

inline constexpr std::size_t ring_slot_bytes = 256;
/// The payload one slot carries; larger messages take the socket.
inline constexpr std::size_t ring_payload = ring_slot_bytes - 24;
/// Slots per request or reply ring, and in the control ring (powers of 2).
inline constexpr std::size_t ring_slots = 1024;
inline constexpr std::size_t control_slots = 8192;
/// Request rings a service may ask for (isolation_options::rings).
inline constexpr std::size_t max_rings = 16;
inline constexpr std::uint64_t ring_magic = 0x61746f6d7272696eull;  // "atomrrin"

struct alignas(64) ring_slot {
  std::atomic<std::uint64_t> seq;
  std::uint64_t id;
  std::uint16_t op;    ///< call: an op_code; reply: 0 success, 1 error; control: a kind
  std::uint16_t arg;   ///< control: release_kind
  std::uint32_t size;  ///< payload bytes used
  char payload[ring_payload];
};
static_assert(sizeof(ring_slot) == ring_slot_bytes);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free &&
              std::atomic<std::uint32_t>::is_always_lock_free);

struct alignas(64) ring_head {
  // (sizeof is a multiple of 64: the slots follow it directly)
  alignas(64) std::atomic<std::uint64_t> enq;
  alignas(64) std::atomic<std::uint64_t> deq;
  alignas(64) std::atomic<std::uint32_t> sleeping;
  boost::interprocess::interprocess_semaphore wake{0};
};

/// One ring: its head, then `slots` slots.
class ring {
public:
  ring(ring_head* h, ring_slot* s, std::size_t n) noexcept : h_(h), s_(s), mask_(n - 1) {}
  ring() = default;

  /// Makes a fresh ring in zeroed shared memory (the service, before the spawn).
  static void init(ring_head* h, ring_slot* s, std::size_t n) {
    new (h) ring_head{};
    h->enq.store(0);
    h->deq.store(0);
    h->sleeping.store(0);
    for (std::size_t i = 0; i < n; ++i) {
      new (&s[i].seq) std::atomic<std::uint64_t>(i);
    }
  }

  /// Copies one message in; false when the ring is full or the payload too
  /// large. Any thread of either process. The caller then wakes the consumer
  /// (wake() on the head it sleeps on).
  bool push(std::uint64_t id, std::uint16_t op, std::uint16_t arg, std::string_view payload) {
    if (payload.size() > ring_payload) return false;
    std::uint64_t pos = h_->enq.load(std::memory_order_relaxed);
    ring_slot* s;
    for (;;) {
      s = &s_[pos & mask_];
      const std::uint64_t seq = s->seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::int64_t>(seq - pos);
      if (dif == 0) {
        if (h_->enq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;  // full
      } else if (const auto now = h_->enq.load(std::memory_order_relaxed); now != pos) {
        pos = now;  // another producer took pos
      } else {
        return false;  // corrupted (see pop): refused as full, not spun on
      }
    }
    s->id = id;
    s->op = op;
    s->arg = arg;
    s->size = static_cast<std::uint32_t>(payload.size());
    if (!payload.empty()) std::memcpy(s->payload, payload.data(), payload.size());
    s->seq.store(pos + 1, std::memory_order_release);
    return true;
  }

  /// Takes one message out into `out` (its payload copied); false when empty.
  template <class Message>
  bool pop(Message& out) {
    std::uint64_t pos = h_->deq.load(std::memory_order_relaxed);
    ring_slot* s;
    for (;;) {
      s = &s_[pos & mask_];
      const std::uint64_t seq = s->seq.load(std::memory_order_acquire);
      const auto dif = static_cast<std::int64_t>(seq - (pos + 1));
      if (dif == 0) {
        if (h_->deq.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (dif < 0) {
        return false;  // empty
      } else if (const auto now = h_->deq.load(std::memory_order_relaxed); now != pos) {
        pos = now;  // another consumer took pos
      } else {
        // A slot ahead of a position nobody has taken: only a consumer that
        // claimed pos moves its slot past pos + 1, and that claim is ordered
        // before the slot's store we read, so the reload above would see it.
        // The other process wrote over the ring: nothing to take, and no
        // endless spin on a thread that must go on (the reader, an io thread).
        return false;
      }
    }
    out.id = s->id;
    out.op = s->op;
    out.arg = s->arg;
    // A size past the slot (the other process wrote over it) yields no bytes
    // and marks the message: its reader refuses it rather than take it as an
    // empty message.
    out.oversized = s->size > ring_payload;
    out.payload.assign(s->payload, s->payload + (out.oversized ? 0 : s->size));
    s->seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

  /// Whether a message is published at the consumer's position (a hint).
  bool ready() const noexcept {
    const std::uint64_t pos = h_->deq.load(std::memory_order_relaxed);
    return s_[pos & mask_].seq.load(std::memory_order_acquire) == pos + 1;
  }
  /// Messages claimed by producers so far (published or not).
  std::uint64_t claimed() const noexcept { return h_->enq.load(std::memory_order_acquire); }

  /// The consumer's sleep: announces it, looks once more, then waits on the
  /// semaphore until a producer posts or `max` passes. Returns at once when
  /// a message is ready.
  void sleep(std::chrono::microseconds max) {
    sleep_on(
        *h_, [this] { return ready(); }, max);
  }

  ring_head* head() const noexcept { return h_; }

  /// A producer's half of the sleep protocol (also used for a head shared
  /// by several rings).
  static void wake(ring_head& h) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (h.sleeping.load(std::memory_order_relaxed) != 0 &&
        h.sleeping.exchange(0, std::memory_order_acq_rel) != 0)
      h.wake.post();
  }
  /// A consumer's half: `has_work` is checked after announcing the sleep.
  template <class Check>
  static void sleep_on(ring_head& h, Check has_work, std::chrono::microseconds max) {
    h.sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!has_work()) {
      try {
        (void)h.wake.timed_wait(std::chrono::system_clock::now() + max);
      } catch (...) {
        // A semaphore error is treated as a timeout: the caller looks again.
      }
    }
    h.sleeping.store(0, std::memory_order_relaxed);
  }

private:
  ring_head* h_ = nullptr;
  ring_slot* s_ = nullptr;
  std::uint64_t mask_ = 0;
};

/// The region's first page.
struct region_header {
  std::uint64_t magic = 0;
  std::uint64_t rings = 0;
  /// The service's reader sleeps here (one for every reply ring).
  ring_head reader;
};

/// Where everything is in a region of `rings` request rings.
struct region_layout {
  std::size_t rings = 0;
  static constexpr std::size_t align(std::size_t n) { return (n + 4095) & ~std::size_t{4095}; }
  static constexpr std::size_t ring_bytes(std::size_t slots) {
    return align(sizeof(ring_head) + slots * sizeof(ring_slot));
  }
  std::size_t header_bytes() const { return align(sizeof(region_header)); }
  std::size_t control_at() const { return header_bytes(); }
  std::size_t request_at(std::size_t i) const {
    return control_at() + ring_bytes(control_slots) + i * ring_bytes(ring_slots);
  }
  std::size_t reply_at(std::size_t i) const {
    return request_at(rings) + i * ring_bytes(ring_slots);
  }
  /// The region's size; the arena starts here (page aligned).
  std::size_t bytes() const { return reply_at(rings); }
};

/// The rings of a mapped region (either process).
struct region_view {
  region_header* header = nullptr;
  ring control;
  ring requests[max_rings];
  ring replies[max_rings];
  std::size_t rings = 0;

  static ring at(std::byte* base, std::size_t off, std::size_t slots, bool init) {
    auto* h = reinterpret_cast<ring_head*>(base + off);
    auto* s = reinterpret_cast<ring_slot*>(base + off + sizeof(ring_head));
    if (init) ring::init(h, s, slots);
    return ring(h, s, slots);
  }

  /// Lays out (and with `init`, makes) the rings of the region at `base`.
  static region_view map(std::byte* base, std::size_t rings, bool init) {
    region_view v;
    const region_layout l{rings};
    v.rings = rings;
    v.header = reinterpret_cast<region_header*>(base);
    if (init) {
      new (v.header) region_header{};
      v.header->magic = ring_magic;
      v.header->rings = rings;
      v.header->reader.sleeping.store(0);
    }
    v.control = at(base, l.control_at(), control_slots, init);
    for (std::size_t i = 0; i < rings; ++i) {
      v.requests[i] = at(base, l.request_at(i), ring_slots, init);
      v.replies[i] = at(base, l.reply_at(i), ring_slots, init);
    }
    return v;
  }
};

/// A popped message.
struct ring_message {
  std::uint64_t id = 0;
  std::uint16_t op = 0;
  std::uint16_t arg = 0;
  /// The slot claimed more bytes than it holds: the payload is empty and the
  /// message must be refused (a request answered invalid_argument, a reply
  /// failed as malformed, a control message skipped).
  bool oversized = false;
  std::vector<char> payload;
};

}  // namespace atomr::cuda::detail::wire
