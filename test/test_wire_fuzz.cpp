// Every parser of a message between a service and its isolated device's worker, fuzzed with fixed
// seeds: valid encodings cut at every length and with flipped bytes, random bytes, hostile sizes.
#include "../lib/remote.hpp"
#include "../lib/worker/actor_wire.hpp"
#include "../lib/worker/protocol.hpp"
#include "../lib/worker/ring.hpp"
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

namespace wire = atomr::cuda::detail::wire;
namespace cu = atomr::cuda;
using bytes = std::vector<char>;
using rng_t = std::mt19937_64;

// The reference decoders below compare whole objects bytewise: no padding in them.
static_assert(std::has_unique_object_representations_v<wire::unit_head>);
static_assert(std::has_unique_object_representations_v<wire::unit_entry>);
static_assert(std::has_unique_object_representations_v<wire::actor_head>);
static_assert(std::has_unique_object_representations_v<wire::ref_arg>);

/// A copy of `n` bytes at `p` in an allocation of exactly that size (so that
/// AddressSanitizer sees any read past its end).
bytes exact(const char* p, std::size_t n) {
  return bytes(p, p + n);
}
bytes exact(std::string_view s) {
  return exact(s.data(), s.size());
}

bytes random_bytes(rng_t& rng, std::size_t n) {
  bytes b(n);
  for (auto& c : b) c = static_cast<char>(rng());
  return b;
}

/// 1 to 4 bytes changed at random.
bytes flipped(rng_t& rng, const bytes& in) {
  bytes b = exact(in.data(), in.size());
  if (b.empty()) return b;
  const int flips = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < flips; ++i) b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
  return b;
}

template <class T>
void put(bytes& b, std::size_t at, T v) {
  if (at + sizeof v <= b.size()) std::memcpy(b.data() + at, &v, sizeof v);
}
template <class T>
T get(const bytes& b, std::size_t at) {
  T v{};
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

/// A trivially copyable value of random bytes (its bools 0 or 1).
template <class T>
T random_pod(rng_t& rng) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto b = random_bytes(rng, sizeof(T));
  T v;
  std::memcpy(static_cast<void*>(&v), b.data(), sizeof v);
  if constexpr (std::is_same_v<T, cu::fft_shape>) v.normalize = (rng() & 1) != 0;
  return v;
}

/// A length field's hostile values around `exact_value`.
std::uint64_t hostile_length(rng_t& rng, std::uint64_t exact_value, std::uint64_t max) {
  const std::uint64_t picks[] = {0,
                                 1,
                                 exact_value - 1,
                                 exact_value + 1,
                                 exact_value + 2,
                                 max / 2,
                                 max / 2 + 1,
                                 max - 1,
                                 max,
                                 rng() % (max / 2 + 1) + max / 2};
  return picks[rng() % std::size(picks)] & max;
}

std::string hex(const bytes& b) {
  static const char digits[] = "0123456789abcdef";
  std::string out = std::to_string(b.size()) + " bytes:";
  for (std::size_t i = 0; i < b.size() && i < 160; ++i) {
    out += ' ';
    out += digits[static_cast<unsigned char>(b[i]) >> 4];
    out += digits[static_cast<unsigned char>(b[i]) & 15];
  }
  if (b.size() > 160) out += " ...";
  return out;
}

/// The inputs a parser was fed, and the first one a property failed for.
struct tally {
  std::size_t inputs = 0, accepted = 0, failures = 0;
  std::string first;
  void fail(std::string_view what, const bytes& input) {
    if (failures++ == 0) first = std::string(what) + " for " + hex(input);
  }
};

// ------------------------------------------------------------------- units

/// op_code::unit's payload by the reference: the head, then per request its
/// entry and its bytes, the sizes adding up exactly (checked in 64 bits).
std::optional<std::vector<wire::unit_request>> reference_unit(const bytes& p) {
  if (p.size() < sizeof(wire::unit_head)) return std::nullopt;
  const auto head = get<wire::unit_head>(p, 0);
  std::vector<wire::unit_request> out;
  std::uint64_t at = sizeof head;
  for (std::uint64_t i = 0; i < head.count; ++i) {
    if (at + sizeof(wire::unit_entry) > p.size()) return std::nullopt;
    const auto e = get<wire::unit_entry>(p, at);
    at += sizeof e;
    if (at + e.size > p.size()) return std::nullopt;
    out.push_back({e.op, e.step, exact(p.data() + at, e.size)});
    at += e.size;
  }
  if (at != p.size()) return std::nullopt;
  return out;
}

bool same_requests(const std::vector<wire::unit_request>& a,
                   const std::vector<wire::unit_request>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].op != b[i].op || a[i].step != b[i].step || a[i].payload != b[i].payload) return false;
  return true;
}

/// parse_unit on `p` agrees with the reference (and fills nothing it did not read).
void check_unit(tally& t, const bytes& p) {
  ++t.inputs;
  wire::unit_head head;
  std::vector<wire::unit_request> got;
  const bool ok = wire::parse_unit(p, head, got);
  const auto want = reference_unit(p);
  if (ok != want.has_value()) return t.fail(ok ? "accepted a malformed unit" : "refused a unit", p);
  if (!ok) return;
  ++t.accepted;
  if (std::memcmp(&head, p.data(), sizeof head) != 0 || !same_requests(got, *want))
    t.fail("decoded other parts", p);
}

struct unit_model {
  wire::unit_head head;
  std::vector<wire::unit_request> requests;
};

unit_model random_unit(rng_t& rng) {
  unit_model u;
  u.head = random_pod<wire::unit_head>(rng);
  const std::size_t n = rng() % 8 == 0 ? rng() % 40 : rng() % 5;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t size = rng() % 8 == 0 ? rng() % 300 : rng() % 48;
    u.requests.push_back({static_cast<std::uint16_t>(rng()), static_cast<std::uint32_t>(rng()),
                          random_bytes(rng, size)});
  }
  u.head.count = static_cast<std::uint32_t>(u.requests.size());
  return u;
}

/// The encoding remote.cpp's unit_payload makes: the head, then each entry and its bytes.
std::string encode_unit(const unit_model& u) {
  std::string out(wire::bytes_of(u.head));
  for (const auto& q : u.requests) {
    wire::unit_entry e;
    e.op = q.op;
    e.step = q.step;
    e.size = static_cast<std::uint32_t>(q.payload.size());
    out.append(wire::bytes_of(e));
    out.append(q.payload.data(), q.payload.size());
  }
  return out;
}

/// Offsets of the length fields of a unit's encoding: the head's count, each entry's size.
std::vector<std::size_t> unit_length_fields(const unit_model& u) {
  std::vector<std::size_t> at = {offsetof(wire::unit_head, count)};
  std::size_t pos = sizeof(wire::unit_head);
  for (const auto& q : u.requests) {
    at.push_back(pos + offsetof(wire::unit_entry, size));
    pos += sizeof(wire::unit_entry) + q.payload.size();
  }
  return at;
}

// ------------------------------------------------------------------ actors

/// The parameter blocks the worker reads (worker_actors.hpp), by params_as.
template <class... P>
struct type_list {};
using actor_params =
    type_list<cu::gemm_params, wire::blas_batched_args, cu::gemv_params, wire::level1_args,
              cu::fft_shape, wire::conv_args, wire::activation_args, wire::softmax_args,
              wire::pooling_args, wire::batchnorm_args, wire::rng_args>;

/// Whether params_as<P> may yield the block `b`: its size is P's, and a bool
/// in P holds 0 or 1 (any other byte is not a bool: reading it is undefined).
template <class P>
bool valid_as(const bytes& b) {
  if (b.size() != sizeof(P)) return false;
  if constexpr (std::is_same_v<P, cu::fft_shape>)
    return static_cast<unsigned char>(b[offsetof(cu::fft_shape, normalize)]) <= 1;
  return true;
}

/// params_as<P> of every P agrees with valid_as, and yields the block's bytes.
template <class... P>
void check_params(tally& t, const wire::actor_request& q, const bytes& input, type_list<P...>) {
  auto one = [&](auto tag) {
    using T = decltype(tag);
    T v;
    const bool ok = q.params_as(v);
    if (ok != valid_as<T>(q.params))
      return t.fail(ok ? "params_as took a block it cannot hold" : "params_as refused", input);
    if (!ok) return;
    if (std::memcmp(&v, q.params.data(), sizeof v) != 0) t.fail("params_as changed bytes", input);
    if constexpr (std::is_same_v<T, cu::fft_shape>) {
      const bool n = v.normalize;  // a load UBSan checks
      if (n != (q.params[offsetof(cu::fft_shape, normalize)] != 0))
        t.fail("fft_shape::normalize", input);
    }
  };
  (one(P{}), ...);
}

/// parse_actor on `p` agrees with the reference: the head, `params` bytes and
/// `refs` views, the sizes adding up exactly.
void check_actor(tally& t, const bytes& p) {
  ++t.inputs;
  wire::actor_request q;
  const bool ok = wire::parse_actor(p, q);
  bool want = p.size() >= sizeof(wire::actor_head);
  wire::actor_head h{};
  if (want) {
    h = get<wire::actor_head>(p, 0);
    want = p.size() ==
           std::uint64_t{sizeof h} + h.params + std::uint64_t{h.refs} * sizeof(wire::ref_arg);
  }
  if (ok != want) return t.fail(ok ? "accepted a malformed actor request" : "refused one", p);
  if (!ok) return;
  ++t.accepted;
  if (std::memcmp(&q.head, &h, sizeof h) != 0 || q.params.size() != h.params ||
      !std::equal(q.params.begin(), q.params.end(), p.begin() + sizeof h) ||
      q.refs.size() != h.refs ||
      (h.refs && std::memcmp(q.refs.data(), p.data() + sizeof h + h.params,
                             h.refs * sizeof(wire::ref_arg)) != 0))
    return t.fail("decoded other parts", p);
  check_params(t, q, p, actor_params{});
}

/// actor_payload of up to six views (its views are an initializer_list).
template <class P>
std::string actor_payload_of(const wire::actor_head& h, const P& params,
                             const std::vector<wire::ref_arg>& r) {
  switch (r.size()) {
    case 0:
      return wire::actor_payload(h, params, {});
    case 1:
      return wire::actor_payload(h, params, {r[0]});
    case 2:
      return wire::actor_payload(h, params, {r[0], r[1]});
    case 3:
      return wire::actor_payload(h, params, {r[0], r[1], r[2]});
    case 4:
      return wire::actor_payload(h, params, {r[0], r[1], r[2], r[3]});
    case 5:
      return wire::actor_payload(h, params, {r[0], r[1], r[2], r[3], r[4]});
    default:
      return wire::actor_payload(h, params, {r[0], r[1], r[2], r[3], r[4], r[5]});
  }
}

/// Valid requests of parameter block P: round trip, every cut, flips, hostile sizes.
template <class P>
void fuzz_actor_params(tally& t, rng_t& rng, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    const auto h = random_pod<wire::actor_head>(rng);
    const auto params = random_pod<P>(rng);
    std::vector<wire::ref_arg> refs(rng() % 7);
    for (auto& r : refs) r = random_pod<wire::ref_arg>(rng);
    const bytes p = exact(actor_payload_of(h, params, refs));

    // Untouched: exactly the original fields.
    ++t.inputs;
    wire::actor_request q;
    if (!wire::parse_actor(p, q)) {
      t.fail("refused a valid request", p);
      continue;
    }
    ++t.accepted;
    P back;
    const bool same = q.head.actor == h.actor && q.head.kind == h.kind && q.head.op == h.op &&
                      q.head.type == h.type && q.head.option == h.option &&
                      std::memcmp(&q.head.settings, &h.settings, sizeof h.settings) == 0 &&
                      q.head.params == sizeof(P) && q.head.refs == refs.size() &&
                      q.params_as(back) && std::memcmp(&back, &params, sizeof back) == 0 &&
                      q.refs.size() == refs.size() &&
                      (refs.empty() ||
                       std::memcmp(q.refs.data(), refs.data(), refs.size() * sizeof refs[0]) == 0);
    if (!same) t.fail("a valid request decoded to other fields", p);
    check_params(t, q, p, actor_params{});

    for (std::size_t n = 0; n < p.size(); ++n) check_actor(t, exact(p.data(), n));
    auto longer = p;
    longer.push_back(static_cast<char>(rng()));
    check_actor(t, exact(longer.data(), longer.size()));
    for (int f = 0; f < 8; ++f) check_actor(t, flipped(rng, p));
    for (int f = 0; f < 4; ++f) {
      auto b = exact(p.data(), p.size());
      put(b, offsetof(wire::actor_head, params),
          static_cast<std::uint16_t>(hostile_length(rng, sizeof(P), 0xffff)));
      put(b, offsetof(wire::actor_head, refs),
          static_cast<std::uint16_t>(hostile_length(rng, refs.size(), 0xffff)));
      check_actor(t, b);
    }
  }
}

template <class... P>
void fuzz_actor_all(tally& t, rng_t& rng, int rounds, type_list<P...>) {
  (fuzz_actor_params<P>(t, rng, rounds), ...);
}

// ------------------------------------------------------------------ errors

void check_error(tally& t, const bytes& p) {
  ++t.inputs;
  std::int32_t code = 0, native = 0;
  std::string lib = "untouched", msg = "untouched";
  const bool ok = wire::decode_error(p, code, native, lib, msg);
  const std::int64_t len = p.size() >= 12 ? get<std::int32_t>(p, 8) : -1;
  const bool want = p.size() >= 12 && len >= 0 && static_cast<std::uint64_t>(len) <= p.size() - 12;
  if (ok != want) return t.fail(ok ? "accepted a malformed error" : "refused an error", p);
  if (!ok) return;
  ++t.accepted;
  const auto n = static_cast<std::size_t>(len);
  if (code != get<std::int32_t>(p, 0) || native != get<std::int32_t>(p, 4) ||
      lib != std::string(p.data() + 12, n) || msg != std::string(p.begin() + 12 + n, p.end()))
    t.fail("decoded other parts", p);
}

// ------------------------------------------------------------ fixed blocks

/// read_pod<T> takes the value at the start of `p` iff it holds one.
template <class T>
void check_pod(tally& t, const bytes& p) {
  ++t.inputs;
  T v;
  std::memset(static_cast<void*>(&v), 0x5a, sizeof v);
  const bool ok = wire::read_pod(p, v);
  if (ok != (p.size() >= sizeof(T))) return t.fail("read_pod disagrees on the size", p);
  if (!ok) return;
  ++t.accepted;
  if (std::memcmp(&v, p.data(), sizeof v) != 0) t.fail("read_pod changed bytes", p);
}

template <class T>
void fuzz_pod(tally& t, rng_t& rng, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    const T v = random_pod<T>(rng);
    const bytes p = exact(wire::bytes_of(v));
    ++t.inputs;
    T back;
    if (!wire::read_pod(p, back) || std::memcmp(&back, &v, sizeof v) != 0)
      t.fail("a value did not round-trip", p);
    for (std::size_t n = 0; n <= p.size() + 2; ++n) {
      auto b = p;
      b.resize(n, static_cast<char>(rng()));
      check_pod<T>(t, exact(b.data(), n));
    }
    check_pod<T>(t, flipped(rng, p));
    check_pod<T>(t, random_bytes(rng, rng() % (2 * sizeof(T) + 1)));
  }
}

/// remote.hpp's reply_value<R>: the answer's bytes are exactly one R.
template <class R>
void fuzz_reply_value(tally& t, rng_t& rng, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    const R v = random_pod<R>(rng);
    const bytes p = exact(wire::bytes_of(v));
    for (std::size_t n = 0; n <= p.size() + 3; ++n) {
      ++t.inputs;
      auto grown = p;
      grown.resize(n, static_cast<char>(rng()));
      const bytes b = exact(grown.data(), n);
      const auto r = cu::detail::reply_value<R>(b, "fuzz");
      if (r.has_value() != (n == sizeof(R))) {
        t.fail("reply_value disagrees on the size", b);
        continue;
      }
      if (!r.has_value()) {
        if (r.error().code() != cu::errc::library) t.fail("reply_value's error", b);
        continue;
      }
      ++t.accepted;
      const R got = r.value();
      if (std::memcmp(&got, &v, sizeof v) != 0) t.fail("reply_value changed bytes", b);
    }
  }
}

// ------------------------------------------------------------------- rings

/// `n` slots and their head in allocations of exactly that size.
struct small_ring {
  explicit small_ring(std::size_t slots) : n(slots) {
    head = static_cast<wire::ring_head*>(
        ::operator new (sizeof(wire::ring_head), std::align_val_t{alignof(wire::ring_head)}));
    slot = static_cast<wire::ring_slot*>(
        ::operator new (n * sizeof(wire::ring_slot), std::align_val_t{alignof(wire::ring_slot)}));
    std::memset(static_cast<void*>(slot), 0, n * sizeof(wire::ring_slot));
    wire::ring::init(head, slot, n);
    r = wire::ring(head, slot, n);
  }
  ~small_ring() {
    head->~ring_head();
    ::operator delete (head, std::align_val_t{alignof(wire::ring_head)});
    ::operator delete (static_cast<void*>(slot), std::align_val_t{alignof(wire::ring_slot)});
  }
  small_ring(const small_ring&) = delete;
  small_ring& operator=(const small_ring&) = delete;

  std::size_t n;
  wire::ring_head* head;
  wire::ring_slot* slot;
  wire::ring r;
};

}  // namespace

TEST_CASE("wire fuzz: parse_unit refuses every unit whose sizes do not add up exactly") {
  rng_t rng(0x756e6974);
  tally t;
  for (int i = 0; i < 400; ++i) {
    const auto u = random_unit(rng);
    const bytes p = exact(encode_unit(u));
    // Untouched: exactly the original parts.
    ++t.inputs;
    wire::unit_head head;
    std::vector<wire::unit_request> got;
    if (!wire::parse_unit(p, head, got) || std::memcmp(&head, &u.head, sizeof head) != 0 ||
        !same_requests(got, u.requests))
      t.fail("a valid unit did not round-trip", p);
    // Every cut, one byte more, flips, and each length field made hostile.
    for (std::size_t n = 0; n < p.size(); ++n) check_unit(t, exact(p.data(), n));
    auto longer = p;
    longer.push_back(static_cast<char>(rng()));
    check_unit(t, exact(longer.data(), longer.size()));
    for (int f = 0; f < 16; ++f) check_unit(t, flipped(rng, p));
    const auto fields = unit_length_fields(u);
    for (int f = 0; f < 16; ++f) {
      auto b = exact(p.data(), p.size());
      const std::size_t at = fields[rng() % fields.size()];
      put(b, at,
          static_cast<std::uint32_t>(hostile_length(rng, get<std::uint32_t>(b, at), 0xffffffff)));
      check_unit(t, b);
    }
  }
  // Random bytes, and random heads over a few entries of random sizes.
  for (int i = 0; i < 20000; ++i) check_unit(t, random_bytes(rng, rng() % 200));
  for (int i = 0; i < 20000; ++i) {
    bytes b = exact(wire::bytes_of(wire::unit_head{static_cast<std::uint32_t>(rng() % 4), 0, 0}));
    for (std::uint64_t k = rng() % 4; k-- > 0;) {
      wire::unit_entry e;
      e.size = static_cast<std::uint32_t>(rng() % 24);
      const auto eb = wire::bytes_of(e);
      b.insert(b.end(), eb.begin(), eb.end());
      b.resize(b.size() + rng() % 24);
    }
    check_unit(t, exact(b.data(), b.size()));
  }
  // Hostile counts and sizes.
  // Hostile counts and sizes: a head, then entries each followed by `bytes` bytes, then `tail`.
  struct entry_spec {
    std::uint32_t size;
    std::size_t bytes;
  };
  auto unit_of = [](std::uint32_t count, std::initializer_list<entry_spec> entries,
                    std::size_t tail = 0) {
    std::string s(wire::bytes_of(wire::unit_head{count, 1, 0}));
    for (const auto& en : entries) {
      wire::unit_entry e;
      e.size = en.size;
      s.append(wire::bytes_of(e));
      s.append(en.bytes, 'x');
    }
    s.append(tail, 'y');
    return exact(s);
  };
  const std::uint32_t big = std::numeric_limits<std::uint32_t>::max();
  wire::unit_head head;
  std::vector<wire::unit_request> got;
  CHECK_FALSE(wire::parse_unit(bytes{}, head, got));
  CHECK_FALSE(wire::parse_unit(bytes(sizeof head - 1), head, got));
  CHECK(wire::parse_unit(unit_of(0, {}), head, got));
  CHECK(got.empty());
  CHECK_FALSE(wire::parse_unit(unit_of(0, {}, 1), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {}, sizeof(wire::unit_entry) - 1), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {{big, 0}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {{big, 100}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {{big - 15, 0}}), head, got));
  CHECK(wire::parse_unit(unit_of(1, {{100, 100}}), head, got));
  REQUIRE(got.size() == 1);
  CHECK(got[0].payload == bytes(100, 'x'));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {{101, 100}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {{99, 100}}), head, got));
  CHECK(wire::parse_unit(unit_of(2, {{4, 4}, {4, 4}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(2, {{4, 4}, {big, 4}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(2, {{4, 4}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(1, {{4, 4}, {4, 4}}), head, got));
  CHECK_FALSE(wire::parse_unit(unit_of(big, {}), head, got));
  // A count of 2^32 - 1 over 4096 empty entries: refused, having made no more
  // requests than the payload holds entries.
  bytes zeros = unit_of(big, {});
  zeros.resize(zeros.size() + 4096 * sizeof(wire::unit_entry));
  zeros = exact(zeros.data(), zeros.size());
  CHECK_FALSE(wire::parse_unit(zeros, head, got));
  CHECK(got.size() <= 4096);
  put(zeros, offsetof(wire::unit_head, count), std::uint32_t{4096});
  CHECK(wire::parse_unit(zeros, head, got));
  CHECK(got.size() == 4096);
  for (const auto& b : {unit_of(big, {}), zeros, unit_of(1, {{big, 100}})}) check_unit(t, b);

  INFO(t.first);
  CHECK(t.failures == 0);
  CHECK(t.inputs > 100000);
  CHECK(t.accepted > 400);
}

TEST_CASE("wire fuzz: parse_actor and params_as take exactly the head, the block and the views") {
  rng_t rng(0x6163746f72);
  tally t;
  fuzz_actor_all(t, rng, 60, actor_params{});
  for (int i = 0; i < 20000; ++i)
    check_actor(t, random_bytes(rng, rng() % 2 == 0 ? 64 + rng() % 8 : rng() % 400));
  // Random heads whose sizes are near what follows them.
  for (int i = 0; i < 20000; ++i) {
    auto h = random_pod<wire::actor_head>(rng);
    h.params = static_cast<std::uint16_t>(rng() % 80);
    h.refs = static_cast<std::uint16_t>(rng() % 8);
    bytes b = exact(wire::bytes_of(h));
    b.resize(b.size() + h.params + h.refs * sizeof(wire::ref_arg) + rng() % 5 - 2,
             static_cast<char>(rng()));
    check_actor(t, exact(b.data(), b.size()));
  }
  // Hostile sizes: the largest head, with and without what it announces.
  wire::actor_head h;
  h.params = 0xffff;
  h.refs = 0xffff;
  bytes b = exact(wire::bytes_of(h));
  wire::actor_request q;
  CHECK_FALSE(wire::parse_actor(b, q));
  b.resize(sizeof h + 0xffff + 0xffff * sizeof(wire::ref_arg));
  CHECK(wire::parse_actor(b, q));
  CHECK(q.params.size() == 0xffff);
  CHECK(q.refs.size() == 0xffff);
  b.pop_back();
  CHECK_FALSE(wire::parse_actor(b, q));
  h.params = 0;
  h.refs = 0;
  CHECK(wire::parse_actor(exact(wire::bytes_of(h)), q));
  CHECK(q.params.empty());
  CHECK(q.refs.empty());
  cu::gemm_params none;
  CHECK_FALSE(q.params_as(none));
  h.refs = 1;
  b = exact(wire::bytes_of(h));
  b.resize(b.size() + sizeof(wire::ref_arg) - 1);
  CHECK_FALSE(wire::parse_actor(b, q));
  CHECK_FALSE(wire::parse_actor(bytes(sizeof h - 1), q));
  CHECK_FALSE(wire::parse_actor(bytes{}, q));

  INFO(t.first);
  CHECK(t.failures == 0);
  CHECK(t.inputs > 100000);
  CHECK(t.accepted > 660);
}

TEST_CASE("wire fuzz: an fft_shape whose normalize byte is no bool is refused by params_as") {
  // fft_shape::normalize is a bool: a request carrying 2 there is not an
  // fft_shape, and the fft actor's `if (shape.normalize)` would read it
  // (undefined; UBSan: "load of value 2, which is not a valid value for type 'bool'").
  wire::actor_head h;
  h.kind = static_cast<std::uint16_t>(wire::actor_kind::fft);
  h.op = static_cast<std::uint16_t>(wire::actor_op::c2c);
  cu::fft_shape shape;
  shape.normalize = true;
  bytes p = exact(wire::actor_payload(h, shape, {{1, 0, 8}, {2, 0, 8}}));
  wire::actor_request q;
  REQUIRE(wire::parse_actor(p, q));
  cu::fft_shape back;
  REQUIRE(q.params_as(back));
  CHECK(back.normalize);
  for (unsigned v : {2u, 3u, 0x80u, 0xffu}) {
    p[sizeof h + offsetof(cu::fft_shape, normalize)] = static_cast<char>(v);
    REQUIRE(wire::parse_actor(p, q));
    CAPTURE(v);
    CHECK_FALSE(q.params_as(back));
  }
}

TEST_CASE("wire fuzz: decode_error takes code, status, library and message, or refuses") {
  rng_t rng(0x6572726f72);
  tally t;
  for (int i = 0; i < 2000; ++i) {
    const auto code = static_cast<std::int32_t>(rng());
    const auto native = static_cast<std::int32_t>(rng());
    const auto lb = random_bytes(rng, rng() % 12);
    const auto mb = random_bytes(rng, rng() % 8 == 0 ? rng() % 2000 : rng() % 80);
    const std::string_view library(lb.data(), lb.size()), message(mb.data(), mb.size());
    const bytes p = exact(wire::encode_error(code, native, library, message));
    ++t.inputs;
    std::int32_t c = 0, n = 0;
    std::string l, m;
    if (!wire::decode_error(p, c, n, l, m) || c != code || n != native || l != library ||
        m != message)
      t.fail("a valid error did not round-trip", p);
    // A cut keeps the library whole or is refused; the message is the frame's rest.
    for (std::size_t k = 0; k < p.size(); ++k) check_error(t, exact(p.data(), k));
    for (int f = 0; f < 8; ++f) check_error(t, flipped(rng, p));
    for (int f = 0; f < 4; ++f) {
      auto b = exact(p.data(), p.size());
      put(b, 8,
          static_cast<std::int32_t>(
              static_cast<std::uint32_t>(hostile_length(rng, lb.size(), 0xffffffff))));
      check_error(t, b);
    }
  }
  for (int i = 0; i < 20000; ++i) check_error(t, random_bytes(rng, rng() % 64));
  for (std::int32_t len : {-1, std::numeric_limits<std::int32_t>::min(),
                           std::numeric_limits<std::int32_t>::max(), 0, 4, 5}) {
    bytes b(16, 'x');
    put(b, 8, len);
    check_error(t, b);
  }
  for (std::size_t n = 0; n < 12; ++n) check_error(t, bytes(n, '\0'));

  INFO(t.first);
  CHECK(t.failures == 0);
  CHECK(t.inputs > 100000);
  CHECK(t.accepted > 2000);
}

TEST_CASE(
    "wire fuzz: fixed blocks (read_pod, hello, pong, frames, reply values) are read only when "
    "whole") {
  rng_t rng(0x706f64);
  tally t;
  fuzz_pod<wire::hello_fixed>(t, rng, 200);
  fuzz_pod<wire::pong_payload>(t, rng, 200);
  fuzz_pod<wire::alloc_args>(t, rng, 200);
  fuzz_pod<wire::transfer_args>(t, rng, 200);
  fuzz_pod<wire::copy_args>(t, rng, 200);
  fuzz_pod<wire::fill_args>(t, rng, 200);
  fuzz_pod<wire::gemm_args>(t, rng, 200);
  fuzz_pod<wire::indirect_args>(t, rng, 200);
  fuzz_pod<wire::unit_head>(t, rng, 200);
  fuzz_pod<std::uint64_t>(t, rng, 200);  // release, replay, checksum_result
  fuzz_pod<std::uint16_t>(t, rng, 200);  // op_code::fault
  fuzz_reply_value<float>(t, rng, 200);
  fuzz_reply_value<double>(t, rng, 200);
  fuzz_reply_value<std::int64_t>(t, rng, 200);
  fuzz_reply_value<std::uint64_t>(t, rng, 200);

  // hello: the fixed part as the service reads it (read_pod's check), then
  // the message; frames: the header, then exactly `size` bytes.
  for (int i = 0; i < 500; ++i) {
    const auto pid = static_cast<std::int32_t>(rng());
    const auto status = static_cast<std::int32_t>(rng());
    const bool arena = rng() & 1;
    const auto mb = random_bytes(rng, rng() % 100);
    const std::string_view message(mb.data(), mb.size());
    const bytes p = exact(wire::hello_payload(pid, status, arena, message));
    ++t.inputs;
    wire::hello_fixed f;
    if (!wire::read_pod(p, f) || f.pid != pid || f.status != status ||
        f.arena_mapped != (arena ? 1 : 0) ||
        std::string_view(p.data() + sizeof f, p.size() - sizeof f) != message)
      t.fail("a hello did not round-trip", p);
    for (std::size_t n = 0; n < sizeof f; ++n)
      if (wire::read_pod(exact(p.data(), n), f)) t.fail("a cut hello was read", p);

    const auto k = static_cast<wire::kind>(1 + rng() % 10);
    const auto arg = static_cast<std::uint16_t>(rng());
    const std::uint64_t id = rng();
    const auto frame = wire::encode(k, arg, id, message);
    ++t.inputs;
    wire::header h;
    std::memcpy(&h, frame.data(), sizeof h);
    if (frame.size() != sizeof h + message.size() || h.size != message.size() ||
        h.type != static_cast<std::uint16_t>(k) || h.arg != arg || h.id != id ||
        !std::equal(message.begin(), message.end(),
                    reinterpret_cast<const char*>(frame.data()) + sizeof h) ||
        h.size > wire::max_payload)
      t.fail("a frame did not round-trip", p);
  }

  INFO(t.first);
  CHECK(t.failures == 0);
  CHECK(t.inputs > 50000);
}

TEST_CASE(
    "wire fuzz: a ring slot's size, however corrupted, never reads past the slot, and one past "
    "the slot marks its message oversized") {
  rng_t rng(0x72696e67);
  tally t;
  small_ring s(8);  // slot 7 ends its allocation: an unclamped read overflows it
  const std::uint64_t sizes[] = {0,
                                 1,
                                 wire::ring_payload - 1,
                                 wire::ring_payload,
                                 wire::ring_payload + 1,
                                 wire::ring_slot_bytes,
                                 0x7fffffffu,
                                 0x80000000u,
                                 0xffffffffu};
  std::uint64_t pos = 0;
  for (int i = 0; i < 20000; ++i, ++pos) {
    const auto pb = random_bytes(rng, rng() % (wire::ring_payload + 1));
    const std::string_view payload(pb.data(), pb.size());
    const std::uint64_t id = rng();
    const auto op = static_cast<std::uint16_t>(rng()), arg = static_cast<std::uint16_t>(rng());
    ++t.inputs;
    if (!s.r.push(id, op, arg, payload)) {
      t.fail("a push was refused", pb);
      break;
    }
    auto& slot = s.slot[pos & (s.n - 1)];
    // The producer's fields changed after it published the slot.
    std::uint32_t size = static_cast<std::uint32_t>(payload.size());
    if (rng() % 2) {
      size = static_cast<std::uint32_t>(rng() % 4 == 0 ? rng() : sizes[rng() % std::size(sizes)]);
      slot.size = size;
    }
    if (rng() % 4 == 0) slot.payload[rng() % wire::ring_payload] ^= 1;
    // A sequence number behind the consumer's: not published, nothing taken.
    if (rng() % 8 == 0) {
      const std::uint64_t behind[] = {0, pos, pos / 2};
      slot.seq.store(behind[rng() % std::size(behind)]);
      wire::ring_message none;
      if (s.r.pop(none) || s.r.ready()) t.fail("an unpublished slot was taken", pb);
      slot.seq.store(pos + 1);
    }
    wire::ring_message m;
    if (!s.r.pop(m)) {
      t.fail("a published slot was not taken", pb);
      break;
    }
    const bool over = size > wire::ring_payload;
    const std::size_t want = over ? 0 : size;
    if (m.id != id || m.op != op || m.arg != arg || m.oversized != over ||
        m.payload.size() != want || !std::equal(m.payload.begin(), m.payload.end(), slot.payload))
      t.fail("a slot was read otherwise", m.payload);
    ++t.accepted;
  }
  ++t.inputs;
  if (s.r.push(1, 1, 1, std::string(wire::ring_payload + 1, 'x')))
    t.fail("an oversized push was taken", {});
  wire::ring_message m;
  CHECK_FALSE(s.r.pop(m));

  INFO(t.first);
  CHECK(t.failures == 0);
  CHECK(t.accepted == 20000);
}

TEST_CASE(
    "wire fuzz: a ring slot whose sequence number was written ahead ends a push or a "
    "pop at once, where both spun for ever") {
  // `f` on a thread of its own, so that a spin fails the test instead of
  // hanging it: nullopt if it has not returned within 2 s (the thread is then
  // left spinning to the process's exit, holding what it uses).
  auto within = [](auto f) -> std::optional<bool> {
    auto result = std::make_shared<std::atomic<int>>(-1);
    std::thread([f, result] { result->store(f() ? 1 : 0); }).detach();
    for (int i = 0; i < 200 && result->load() < 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int r = result->load();
    return r < 0 ? std::nullopt : std::optional<bool>(r == 1);
  };
  for (const std::uint64_t ahead : {2ull, 9ull, 1ull << 40}) {
    CAPTURE(ahead);
    auto s = std::make_shared<small_ring>(8);
    REQUIRE(s->r.push(1, 1, 1, "x"));
    // The consumer's slot 0, published at seq 1, overwritten past it.
    s->slot[0].seq.store(ahead);
    CHECK(within([s] {
            wire::ring_message m;
            return s->r.pop(m);
          }) == std::optional<bool>(false));
    // The producer's slot 1, free at seq 1, overwritten past it.
    s->slot[1].seq.store(1 + ahead);
    CHECK(within([s] { return s->r.push(2, 1, 1, "y"); }) == std::optional<bool>(false));
  }
}
