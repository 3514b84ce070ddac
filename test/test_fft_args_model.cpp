// Randomised property test: the cuFFT argument checks (check_fft_shape, _size, _options, _call,
// check_no_overlap) and cuRAND's check_rng_count against an independent 128-bit reference model.
#include <atomr/cuda.hpp>
#include <atomr/cuda/fft_actor.hpp>
#if ATOMR_CUDA_HAS_CURAND
#include <atomr/cuda/rng_actor.hpp>
#endif

#include "../lib/device_impl.hpp"
#include "int128.hpp"
#include "io_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <complex>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using detail::fft_kind;

namespace {

// ---------------------------------------------------------------------------
// 128-bit arithmetic: every count of the model is exact, nothing can wrap.

using atomr::cuda::test::i128;
using atomr::cuda::test::u128;
constexpr i128 int_max = INT_MAX;
constexpr i128 ll_max = LLONG_MAX;
constexpr i128 size_max = SIZE_MAX;

std::string str(i128 v) {
  return atomr::cuda::test::dec(v);
}

std::string join(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// ---------------------------------------------------------------------------
// Random values, biased to the boundaries of the cuFFT plan API (int for
// cufftMakePlanMany, long long for cufftMakePlanMany64) and of size_t.

class source {
public:
  explicit source(std::uint64_t seed) : eng_(seed) {}

  std::uint64_t bits() { return eng_(); }
  /// Uniform in [0, hi].
  std::uint64_t upto(std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(0, hi)(eng_);
  }
  long long between(long long lo, long long hi) {
    return std::uniform_int_distribution<long long>(lo, hi)(eng_);
  }
  bool chance(unsigned percent) { return upto(99) < percent; }
  template <class T>
  T one_of(std::initializer_list<T> xs) {
    return xs.begin()[upto(xs.size() - 1)];
  }

  /// A value >= 1, most often a small size or one near a limit.
  long long positive() {
    switch (upto(9)) {
      case 0:
        return between(1, 16);
      case 1:
        return between(1, 4096);
      case 2: {  // 2^k - 1, 2^k, 2^k + 1
        const i128 v = (i128(1) << upto(62)) + between(-1, 1);
        return static_cast<long long>(std::max<i128>(v, 1));
      }
      case 3:
        return INT_MAX + between(-3, 3);
      case 4:
        return LLONG_MAX - between(0, 3);
      case 5:  // near square and cube roots of INT_MAX and LLONG_MAX, and 2^16
        return one_of({46340LL, 46341LL, 1290LL, 1291LL, 2097151LL, 2097152LL, 3037000499LL,
                       3037000500LL, 65535LL, 65536LL, 65537LL, 2147483648LL});
      case 6: {  // a random width
        const auto v = static_cast<long long>(bits() >> (1 + upto(62)));
        return v == 0 ? 1 : v;
      }
      case 7:
        return INT_MAX / between(1, 9) + between(-1, 1);
      default:
        return between(1, 64);
    }
  }
  /// A value <= 0.
  long long nonpositive() {
    return one_of({0LL, 0LL, -1LL, -2LL, LLONG_MIN, LLONG_MIN + 1, -LLONG_MAX, -INT_MAX - 1LL,
                   -static_cast<long long>(bits() >> 1)});
  }
  /// A size_t, most often near a limit.
  std::size_t size() {
    switch (upto(7)) {
      case 0:
        return upto(16);
      case 1:
        return SIZE_MAX - upto(3);
      case 2:
        return (std::size_t{1} << upto(63)) + upto(2) - 1;
      case 3:
        return std::size_t{INT_MAX} + upto(4) - 2;
      case 4:
        return std::size_t{LLONG_MAX} + upto(4) - 2;
      case 5:
        return bits() >> upto(63);
      default:
        return upto(4096);
    }
  }

private:
  std::mt19937_64 eng_;
};

/// Clamps a 128-bit value into [lo, hi].
i128 clamp(i128 v, i128 lo, i128 hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

// ---------------------------------------------------------------------------
// The reference model of one transform, from cuFFT's documented basic layout
// (inembed/onembed null): one transform has N = dims[0]*...*dims[rank-1]
// points; batch transforms are packed; a real-to-complex transform's complex
// side holds dims[rank-1]/2 + 1 values along the last dimension. The header
// asks for rank 1..3, dims > 0, batch > 0, r2c forward, c2r inverse and every
// element count within long long (cufftMakePlanMany64 takes long long).

std::string_view kind_name(fft_kind k) {
  return k == fft_kind::c2c ? "c2c" : k == fft_kind::r2c ? "r2c" : "c2r";
}
std::string_view op_of(fft_kind k) {
  return k == fft_kind::c2c   ? "fft_actor::c2c"
         : k == fft_kind::r2c ? "fft_actor::r2c"
                              : "fft_actor::c2r";
}

struct shape_model {
  std::vector<std::string> bad;  ///< every argument that is wrong (the library names one)
  i128 points = 0;               ///< N, one transform
  i128 real_count = 0;           ///< N * batch
  i128 complex_half = 0;         ///< (N / last) * (last/2 + 1) * batch
  i128 in = 0, out = 0;          ///< elements of the input and output buffers
  bool overflow = false;         ///< a count does not fit a long long
  bool ok() const { return bad.empty(); }
};

shape_model model_shape(const fft_shape& s, fft_kind kind) {
  shape_model m;
  if (s.rank < 1 || s.rank > 3) {
    m.bad.push_back("shape.rank");
    return m;  // the dims mean nothing without a rank
  }
  const int rank = s.rank;
  // Product of the leading dims while they are all > 0; capped just above
  // LLONG_MAX so that the next product still fits 128 bits.
  bool all_positive = true;
  i128 prefix = 1;
  for (int i = 0; i < rank; ++i) {
    const std::string arg = "shape.dims[" + std::to_string(i) + "]";
    if (s.dims[i] <= 0) {
      m.bad.push_back(arg);
      all_positive = false;
      continue;
    }
    if (!all_positive) continue;
    prefix *= s.dims[i];
    if (prefix > ll_max) {  // this dim makes the transform size overflow
      m.bad.push_back(arg);
      m.overflow = true;
      prefix = ll_max + 1;
    }
  }
  if (s.batch <= 0) m.bad.push_back("shape.batch");
  const auto dir = s.direction;
  if (dir != fft_direction::forward && dir != fft_direction::inverse)
    m.bad.push_back("shape.direction");
  else if (kind == fft_kind::r2c && dir != fft_direction::forward)
    m.bad.push_back("shape.direction");
  else if (kind == fft_kind::c2r && dir != fft_direction::inverse)
    m.bad.push_back("shape.direction");

  if (!all_positive || prefix > ll_max || s.batch <= 0) return m;
  i128 rows = 1;  // the dims before the last
  for (int i = 0; i + 1 < rank; ++i) rows *= s.dims[i];
  const i128 last = s.dims[rank - 1];
  m.points = rows * last;
  m.real_count = m.points * s.batch;
  m.complex_half = rows * (last / 2 + 1) * s.batch;
  const bool fits = m.real_count <= ll_max && (kind == fft_kind::c2c || m.complex_half <= ll_max);
  if (!fits) {
    m.bad.push_back("shape.batch");
    m.overflow = true;
  }
  switch (kind) {
    case fft_kind::c2c:
      m.in = m.out = m.real_count;
      break;
    case fft_kind::r2c:
      m.in = m.real_count;
      m.out = m.complex_half;
      break;
    case fft_kind::c2r:
      m.in = m.complex_half;
      m.out = m.real_count;
      break;
  }
  return m;
}

std::string describe(const fft_shape& s, fft_kind kind) {
  std::ostringstream o;
  o << kind_name(kind) << " rank=" << s.rank << " dims={" << s.dims[0] << ", " << s.dims[1] << ", "
    << s.dims[2] << "} batch=" << s.batch << " direction=" << static_cast<unsigned>(s.direction)
    << " normalize=" << s.normalize;
  return o.str();
}

/// Empty when `e` is invalid_argument and reads "op: <one of args> ...".
std::string check_rejection(const gpu_error& e, std::string_view op,
                            const std::vector<std::string>& args) {
  const std::string& m = e.message();
  if (e.code() != errc::invalid_argument)
    return "rejected with " + std::string(to_string(e.code())) + " (" + m + ")";
  const std::string head = std::string(op) + ": ";
  if (m.rfind(head, 0) != 0) return "message does not start with \"" + head + "\": " + m;
  for (const auto& a : args)
    if (m.compare(head.size(), a.size() + 1, a + " ") == 0) return {};
  return "message names none of the wrong arguments {" + join(args) + "}: " + m;
}

/// The checks a valid shape's layout must pass, besides equality with the
/// model: the values given to cuFFT fit the planner the library picks.
std::string check_layout(const detail::fft_layout& lay, const shape_model& m, const fft_shape& s) {
  if (lay.points != m.points || lay.in_elems != m.in || lay.out_elems != m.out)
    return "layout {points " + std::to_string(lay.points) + ", in " + std::to_string(lay.in_elems) +
           ", out " + std::to_string(lay.out_elems) + "} but the model says {" + str(m.points) +
           ", " + str(m.in) + ", " + str(m.out) + "}";
  if (m.points <= 0 || m.in <= 0 || m.out <= 0) return "an empty transform was accepted";
  if (m.in > ll_max || m.out > ll_max || m.real_count > ll_max)
    return "a count beyond long long was accepted";
  // The complex side never holds more than the real side, so choosing the
  // 32-bit planner by the real count keeps every value within int.
  if (m.complex_half > m.real_count) return "complex side larger than the real side";
  if (m.real_count <= int_max) {
    if (s.batch > int_max) return "batch does not fit the int planner";
    for (int i = 0; i < s.rank; ++i)
      if (s.dims[i] > int_max) return "a dim does not fit the int planner";
    if (m.in > int_max || m.out > int_max) return "a count does not fit the int planner";
  }
  return {};
}

// ---------------------------------------------------------------------------
// Shapes: as drawn, aimed at a limit, split from a product at a limit, or small.

/// Sets one of dims[0..rank) or the batch so that the real count (or, for a
/// real transform, the complex count) lands at `limit` + d.
void aim(source& g, fft_shape& s, fft_kind kind) {
  const int rank = s.rank;
  const i128 limit = g.one_of<i128>({int_max, ll_max, i128(1) << 32, i128(1) << 62, int_max + 1});
  const bool half = kind != fft_kind::c2c && g.chance(50);
  const int target = static_cast<int>(g.upto(static_cast<std::uint64_t>(rank)));  // rank = batch
  i128 others = 1;
  for (int i = 0; i < rank; ++i) {
    if (i == target) continue;
    const i128 d = (half && i == rank - 1) ? s.dims[i] / 2 + 1 : s.dims[i];
    if (d <= 0) return;
    others = std::min<i128>(others * d, ll_max + 1);
  }
  if (target != rank) {
    if (s.batch <= 0) return;
    others = std::min<i128>(others * s.batch, ll_max + 1);
  }
  if (others > limit) return;
  const i128 q = limit / others + g.between(-1, 1);
  i128 v = q;
  if (half && target == rank - 1) v = 2 * (q - 1) + g.between(0, 1);  // last/2 + 1 == q
  v = clamp(v, 1, ll_max);
  if (target == rank)
    s.batch = static_cast<long long>(v);
  else
    s.dims[target] = static_cast<long long>(v);
}

/// Distributes the prime factors of a limit over dims[0..rank) and the batch.
void split(source& g, fft_shape& s) {
  static const std::vector<long long> llmax_factors{7, 7, 73, 127, 337, 92737, 649657};
  const int which = static_cast<int>(g.upto(3));
  std::vector<long long> factors;
  if (which == 0) factors = llmax_factors;  // 2^63 - 1
  if (which == 1) factors.assign(63, 2);    // 2^63
  if (which == 2) factors.assign(31, 2);    // 2^31
  if (which == 3) factors = {INT_MAX};      // 2^31 - 1 (prime)
  std::array<i128, 4> slot{1, 1, 1, 1};     // dims[0..rank), then batch
  for (long long f : factors) {
    const auto k = g.upto(static_cast<std::uint64_t>(s.rank));
    slot[k == static_cast<std::uint64_t>(s.rank) ? 3 : k] *= f;
  }
  if (g.chance(40)) slot[g.upto(3)] += g.one_of({-1, 1});  // one piece off by one
  for (int i = 0; i < s.rank; ++i) s.dims[i] = static_cast<long long>(clamp(slot[i], 1, ll_max));
  s.batch = static_cast<long long>(clamp(slot[3], 1, ll_max));
}

fft_shape random_shape(source& g, fft_kind kind) {
  fft_shape s;
  s.rank = g.chance(93) ? static_cast<int>(g.between(1, 3))
                        : g.one_of({0, -1, 4, 5, INT_MIN, INT_MAX, -7});
  for (auto& d : s.dims) d = g.chance(94) ? g.positive() : g.nonpositive();
  s.batch = g.chance(94) ? g.positive() : g.nonpositive();
  const auto r = g.upto(99);
  if (r < 90)
    s.direction = g.chance(50) ? fft_direction::forward : fft_direction::inverse;
  else if (r < 95)  // the direction a real transform needs
    s.direction = kind == fft_kind::c2r ? fft_direction::inverse : fft_direction::forward;
  else
    s.direction = static_cast<fft_direction>(g.between(2, 255));
  s.normalize = g.chance(50);
  if (s.rank < 1 || s.rank > 3) return s;
  switch (g.upto(5)) {
    case 0:
    case 1:
      aim(g, s, kind);
      break;
    case 2:
      split(g, s);
      break;
    case 3:  // small and realistic: odd and even last dims
      for (int i = 0; i < s.rank; ++i) s.dims[i] = g.between(1, 64);
      s.batch = g.between(1, 16);
      break;
    default:
      break;  // as drawn
  }
  return s;
}

/// Counts of what the cases exercised, so that a generator gone blind fails.
struct coverage {
  long long accepted = 0, rejected = 0, int_plan = 0, plan64 = 0, at_int_max = 0,
            above_int_max_by_one = 0, at_ll_max = 0, odd_last_real = 0, overflow_rejects = 0;
};

void count(coverage& c, const shape_model& m, const fft_shape& s, fft_kind kind) {
  if (!m.ok()) {
    ++c.rejected;
    c.overflow_rejects += m.overflow;
    return;
  }
  ++c.accepted;
  (m.real_count <= int_max ? c.int_plan : c.plan64)++;
  if (m.real_count == int_max) ++c.at_int_max;
  if (m.real_count == int_max + 1) ++c.above_int_max_by_one;
  if (m.real_count == ll_max || m.complex_half == ll_max) ++c.at_ll_max;
  if (kind != fft_kind::c2c && s.dims[s.rank - 1] % 2 == 1) ++c.odd_last_real;
}

constexpr std::array<std::uint64_t, 4> seeds{1, 2, 0x5eed'f00d, 0xdead'beef'cafe'f00d};
constexpr int max_failures = 5;  // per test case: the first few tell the story

}  // namespace

TEST_CASE("fft model: check_fft_shape agrees with the reference model") {
  constexpr int per_seed = 50'000;
  coverage cov;
  int failures = 0;
  long long cases = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto seed : seeds) {
    source g(seed);
    for (int i = 0; i < per_seed && failures < max_failures; ++i) {
      const auto kind = static_cast<fft_kind>(g.upto(2));
      const auto op = op_of(kind);
      const fft_shape s = random_shape(g, kind);
      const auto m = model_shape(s, kind);
      count(cov, m, s, kind);
      ++cases;
      const auto r = detail::check_fft_shape(op, s, kind);
      std::string why;
      if (r && !m.ok())
        why = "accepted, the model rejects {" + join(m.bad) + "}";
      else if (r)
        why = check_layout(r.value(), m, s);
      else if (m.ok())
        why = "rejected (" + r.error().message() + "), the model accepts";
      else
        why = check_rejection(r.error(), op, m.bad);
      if (!why.empty()) {
        CAPTURE(seed);
        CAPTURE(i);
        INFO(describe(s, kind));
        FAIL_CHECK(why);
        ++failures;
      }
    }
  }
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0);
  MESSAGE("check_fft_shape: " << cases << " cases in " << ms.count() << " ms; accepted "
                              << cov.accepted << " (int plan " << cov.int_plan << ", 64-bit "
                              << cov.plan64 << "; count == INT_MAX " << cov.at_int_max
                              << ", == INT_MAX + 1 " << cov.above_int_max_by_one
                              << ", == LLONG_MAX " << cov.at_ll_max << ", odd last dim of a real "
                              << "transform " << cov.odd_last_real << "), rejected " << cov.rejected
                              << " (a count overflowing long long " << cov.overflow_rejects << ")");
  // The generator reaches both planners and the exact limits.
  if (failures == 0) {  // what the cases reached (an early stop skews it)
    CHECK(cov.accepted > 20'000);
    CHECK(cov.rejected > 20'000);
    CHECK(cov.int_plan > 1'000);
    CHECK(cov.plan64 > 1'000);
    CHECK(cov.at_int_max > 50);
    CHECK(cov.above_int_max_by_one > 50);
    CHECK(cov.at_ll_max > 50);
    CHECK(cov.odd_last_real > 1'000);
    CHECK(cov.overflow_rejects > 1'000);
  }
}

TEST_CASE("fft model: check_fft_size wants exactly the count, never a wrapped one") {
  constexpr int per_seed = 50'000;
  long long accepted = 0;
  int failures = 0;
  for (const auto seed : seeds) {
    source g(seed ^ 0x51'2e);
    for (int i = 0; i < per_seed && failures < max_failures; ++i) {
      const long long need = g.chance(85) ? g.positive() : g.nonpositive();
      std::size_t have = 0;
      switch (g.upto(4)) {
        case 0:  // exactly, or what a cast of a negative count would give
          have = static_cast<std::size_t>(need);
          break;
        case 1:
        case 2:
          have = static_cast<std::size_t>(clamp(i128(need) + g.between(-2, 2), 0, size_max));
          break;
        case 3:  // need cast to size_t, plus 2^32 half the time
          have = static_cast<std::size_t>(need) + (g.chance(50) ? 0 : std::size_t{1} << 32);
          break;
        default:
          have = g.size();
          break;
      }
      const auto op = g.one_of<std::string_view>({"fft_actor::c2c", "fft_actor::r2c", "op"});
      const auto arg = g.one_of<std::string_view>({"input", "output"});
      const bool ok = need >= 0 && i128(have) == i128(need);
      const auto r = detail::check_fft_size(op, arg, have, need);
      std::string why;
      if (r && !ok)
        why = "accepted, the model rejects";
      else if (!r && ok)
        why = "rejected (" + r.error().message() + "), the model accepts";
      else if (!r) {
        why = check_rejection(r.error(), op, {std::string(arg)});
        if (why.empty() &&
            r.error().message().find("needs exactly " + std::to_string(need)) == std::string::npos)
          why = "message does not give the count: " + r.error().message();
      }
      accepted += ok;
      if (!why.empty()) {
        CAPTURE(seed);
        CAPTURE(i);
        CAPTURE(have);
        CAPTURE(need);
        CAPTURE(op);
        CAPTURE(arg);
        FAIL_CHECK(why);
        ++failures;
      }
    }
  }
  if (failures == 0) {  // what the cases reached (an early stop skews it)
    CHECK(accepted > 10'000);
  }
}

TEST_CASE("fft model: check_no_overlap refuses exactly the intersecting ranges") {
  constexpr int per_seed = 50'000;
  long long overlaps = 0, touching = 0;
  int failures = 0;
  for (const auto seed : seeds) {
    source g(seed ^ 0x0e'71a9);
    for (int i = 0; i < per_seed && failures < max_failures; ++i) {
      // Both ranges lie in one allocation of `total` bytes (the contract:
      // views of one buffer, whose byte size fits size_t).
      const std::size_t total = g.chance(30) ? SIZE_MAX - g.upto(2) : g.size();
      const auto in_alloc = [&](std::size_t at, i128 want) {  // a length that fits after `at`
        return static_cast<std::size_t>(clamp(want, 0, i128(total) - i128(at)));
      };
      const std::size_t a = g.chance(20) ? total - g.upto(std::min<std::size_t>(total, 2))
                                         : g.upto(std::min<std::size_t>(total, g.size()));
      const std::size_t a_bytes = in_alloc(a, g.chance(20) ? i128(total) : i128(g.size()));
      i128 want_b = 0;
      switch (g.upto(4)) {
        case 0:
          want_b = i128(a) + a_bytes + g.between(-2, 2);  // just after a's range
          break;
        case 1:
          want_b = i128(a) + g.between(-2, 2);  // same start
          break;
        case 2:
          want_b = i128(a) - g.size() + g.between(-2, 2);  // ending near a's start
          break;
        case 3:
          want_b = i128(a) + (a_bytes / 2);  // inside
          break;
        default:
          want_b = g.upto(total);
          break;
      }
      const auto b = static_cast<std::size_t>(clamp(want_b, 0, i128(total)));
      i128 want_len = 0;
      switch (g.upto(3)) {
        case 0:
          want_len = a_bytes;
          break;
        case 1:
          want_len = i128(a) - i128(b) + g.between(-1, 1);  // up to a's start
          break;
        case 2:
          want_len = g.upto(8);
          break;
        default:
          want_len = g.size();
          break;
      }
      const std::size_t b_bytes = in_alloc(b, want_len);
      const bool same = g.chance(85);
      // [a, a + a_bytes) and [b, b + b_bytes) intersect.
      const i128 lo = std::max<i128>(a, b);
      const i128 hi = std::min<i128>(i128(a) + a_bytes, i128(b) + b_bytes);
      const bool overlap = a_bytes > 0 && b_bytes > 0 && lo < hi;
      overlaps += same && overlap;
      touching += same && a_bytes > 0 && b_bytes > 0 && lo == hi;
      const bool ok = !same || !overlap;
      const auto r = detail::check_no_overlap("fft_actor::c2c", same, a, a_bytes, b, b_bytes);
      std::string why;
      if (r && !ok)
        why = "accepted overlapping ranges";
      else if (!r && ok)
        why = "rejected (" + r.error().message() + "), the ranges do not overlap";
      else if (!r)
        why = check_rejection(r.error(), "fft_actor::c2c", {"output"});
      if (!why.empty()) {
        CAPTURE(seed);
        CAPTURE(i);
        CAPTURE(same);
        CAPTURE(a);
        CAPTURE(a_bytes);
        CAPTURE(b);
        CAPTURE(b_bytes);
        FAIL_CHECK(why);
        ++failures;
      }
    }
  }
  if (failures == 0) {  // what the cases reached (an early stop skews it)
    CHECK(overlaps > 10'000);
    CHECK(touching > 5'000);
  }
}

TEST_CASE("fft model: check_fft_options") {
  constexpr int per_seed = 25'000;
  int failures = 0;
  for (const auto seed : seeds) {
    source g(seed ^ 0x0b7);
    for (int i = 0; i < per_seed && failures < max_failures; ++i) {
      fft_options o;
      o.plan_cache_size = g.chance(50) ? g.upto(3) : g.size();
      o.max_lanes = g.chance(50) ? static_cast<std::size_t>(g.between(0, 70)) : g.size();
      if (g.chance(30)) o.streams = static_cast<stream_policy>(g.upto(3));
      std::vector<std::string> bad;
      if (o.plan_cache_size < 1) bad.push_back("plan_cache_size");
      if (o.max_lanes > 64) bad.push_back("max_lanes");
      const auto r = detail::check_fft_options(o);
      std::string why;
      if (r && !bad.empty())
        why = "accepted, the model rejects {" + join(bad) + "}";
      else if (!r && bad.empty())
        why = "rejected (" + r.error().message() + "), the model accepts";
      else if (!r)
        why = check_rejection(r.error(), "fft_actor::create", bad);
      if (!why.empty()) {
        CAPTURE(seed);
        CAPTURE(i);
        CAPTURE(o.plan_cache_size);
        CAPTURE(o.max_lanes);
        FAIL_CHECK(why);
        ++failures;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// check_fft_call on fake buffers (a device state marked healthy, no CUDA call).

namespace {

struct fake_devices : io_fixture {
  std::shared_ptr<detail::device_impl> impl =
      std::make_shared<detail::device_impl>(ioc.get_executor(), 4351, device_options{});
  std::shared_ptr<detail::device_impl> other =
      std::make_shared<detail::device_impl>(ioc.get_executor(), 4352, device_options{});
  device dev{impl};

  fake_devices() {
    impl->health.store(health_state::healthy);
    other->health.store(health_state::healthy);
  }
  ~fake_devices() {
    impl->poison(make_error(errc::context_poisoned, "test teardown"));
    other->poison(make_error(errc::context_poisoned, "test teardown"));
  }

  template <element T>
  std::shared_ptr<detail::buffer_state> allocation(std::size_t n,
                                                   const std::shared_ptr<detail::device_impl>& on) {
    ++on->live_buffers;  // the state's destructor counts it down
    return std::make_shared<detail::buffer_state>(on, nullptr, n, dtype_of<T>,
                                                  on->generation.load());
  }
};

struct call_coverage {
  long long accepted = 0, accepted_64 = 0, accepted_adjacent = 0, overlap_rejects = 0;
};

/// How one buffer argument is made.
enum class ref_kind { normal, empty, foreign };

std::string_view name(ref_kind k) {
  return k == ref_kind::normal ? "normal" : k == ref_kind::empty ? "empty" : "foreign";
}

/// A count near `want` (the model's) when it is known, within what an
/// allocation of T can hold.
template <class T>
std::size_t count_near(source& g, i128 want) {
  const i128 max = size_max / sizeof(T);
  if (want > 0 && g.chance(90)) {
    const auto d = g.upto(9);
    return static_cast<std::size_t>(clamp(want + (d == 0 ? -1 : d == 1 ? 1 : 0), 0, max));
  }
  return static_cast<std::size_t>(clamp(g.size(), 0, max));
}

template <element In, element Out>
void call_cases(fake_devices& f, fft_kind kind, std::uint64_t seed, int n, call_coverage& cov,
                int& failures) {
  constexpr bool same_type = std::is_same_v<In, Out>;
  const auto op = op_of(kind);
  source g(seed);
  for (int i = 0; i < n && failures < max_failures; ++i) {
    const fft_shape s = random_shape(g, kind);
    const auto m = model_shape(s, kind);
    const std::size_t in_n = count_near<In>(g, m.ok() ? m.in : 0);
    const std::size_t out_n = count_near<Out>(g, m.ok() ? m.out : 0);
    const auto pick_ref = [&] {
      const auto r = g.upto(99);
      return r < 95 ? ref_kind::normal : r < 97 ? ref_kind::empty : ref_kind::foreign;
    };
    const ref_kind in_k = pick_ref(), out_k = pick_ref();
    bool same = same_type && in_k == ref_kind::normal && out_k == ref_kind::normal && g.chance(40);
    std::size_t in_off = 0, out_off = 0;
    if (same) {
      switch (g.upto(3)) {
        case 0:  // output right after the input, give or take
          out_off = static_cast<std::size_t>(clamp(i128(in_n) + g.between(-2, 2), 0, size_max));
          break;
        case 1:  // input right after the output
          in_off = static_cast<std::size_t>(clamp(i128(out_n) + g.between(-2, 2), 0, size_max));
          break;
        case 2:
          in_off = out_off = g.upto(3);
          break;
        default:
          in_off = g.upto(64);
          out_off = g.upto(64);
          break;
      }
      const i128 end = std::max(i128(in_off) + in_n, i128(out_off) + out_n);
      if (end > size_max / sizeof(In)) same = false;  // no such allocation
    }
    if (!same) {
      in_off = i128(in_n) + 2 <= size_max / sizeof(In) ? g.upto(2) : 0;
      out_off = i128(out_n) + 2 <= size_max / sizeof(Out) ? g.upto(2) : 0;
    }
    // The views, within their allocations (what subspan guarantees).
    gpu_ref<In> in;
    gpu_ref<Out> out;
    std::shared_ptr<detail::buffer_state> shared;
    if (same) {
      const i128 end = std::max(i128(in_off) + in_n, i128(out_off) + out_n);
      shared = f.allocation<In>(static_cast<std::size_t>(end), f.impl);
      in = gpu_ref<In>(shared, in_off, in_n);
      out = gpu_ref<Out>(shared, out_off, out_n);
    } else {
      if (in_k != ref_kind::empty)
        in = gpu_ref<In>(
            f.allocation<In>(in_off + in_n, in_k == ref_kind::foreign ? f.other : f.impl), in_off,
            in_n);
      if (out_k != ref_kind::empty)
        out = gpu_ref<Out>(
            f.allocation<Out>(out_off + out_n, out_k == ref_kind::foreign ? f.other : f.impl),
            out_off, out_n);
    }

    // The model of the whole call: every wrong argument.
    std::vector<std::string> bad = m.bad;
    const i128 in_lo = i128(in_off) * sizeof(In), in_hi = in_lo + i128(in_n) * sizeof(In);
    const i128 out_lo = i128(out_off) * sizeof(Out), out_hi = out_lo + i128(out_n) * sizeof(Out);
    const bool overlap =
        same && in_n > 0 && out_n > 0 && std::max(in_lo, out_lo) < std::min(in_hi, out_hi);
    if (in_k != ref_kind::normal || (m.ok() && i128(in_n) != m.in)) bad.push_back("input");
    if (out_k != ref_kind::normal || (m.ok() && i128(out_n) != m.out) || overlap)
      bad.push_back("output");

    const auto r = detail::check_fft_call(op, s, kind, in, out, f.dev);
    std::string why;
    if (r && !bad.empty()) {
      why = "accepted, the model rejects {" + join(bad) + "}";
    } else if (r) {
      why = check_layout(r.value(), m, s);
      // What cuFFT will touch: m.in elements from in's start, m.out from
      // out's, inside their allocations, byte counts without wrapping, and
      // apart when they share one.
      if (why.empty() && (i128(in.size()) != m.in || i128(out.size()) != m.out))
        why = "buffer sizes differ from what cuFFT reads and writes";
      if (why.empty() && (i128(in.size_bytes()) != i128(in_n) * sizeof(In) ||
                          i128(out.size_bytes()) != i128(out_n) * sizeof(Out)))
        why = "a byte count wrapped";
      if (why.empty() && same && std::max(in_lo, out_lo) < std::min(in_hi, out_hi))
        why = "input and output overlap";
    } else if (bad.empty()) {
      why = "rejected (" + r.error().message() + "), the model accepts";
    } else {
      why = check_rejection(r.error(), op, bad);
    }
    if (r) {
      ++cov.accepted;
      cov.accepted_64 += m.real_count > int_max;
      cov.accepted_adjacent += same && (in_hi == out_lo || out_hi == in_lo);
    }
    cov.overlap_rejects += overlap && m.ok() && !r;
    if (!why.empty()) {
      CAPTURE(seed);
      CAPTURE(i);
      INFO(describe(s, kind));
      INFO("input: " << name(in_k) << " offset " << in_off << " count " << in_n << " ("
                     << sizeof(In) << "-byte elements); output: " << name(out_k) << " offset "
                     << out_off << " count " << out_n << " (" << sizeof(Out)
                     << "-byte elements); same allocation " << same);
      FAIL_CHECK(why);
      ++failures;
    }
  }
}

}  // namespace

TEST_CASE_FIXTURE(fake_devices, "fft model: check_fft_call on every transform type") {
  using c32 = std::complex<float>;
  using c64 = std::complex<double>;
  constexpr int per_type = 25'000;
  call_coverage cov;
  int failures = 0;
  for (const auto seed : {seeds[0], seeds[3]}) {
    call_cases<c32, c32>(*this, fft_kind::c2c, seed ^ 1, per_type, cov, failures);
    call_cases<c64, c64>(*this, fft_kind::c2c, seed ^ 2, per_type, cov, failures);
    call_cases<float, c32>(*this, fft_kind::r2c, seed ^ 3, per_type, cov, failures);
    call_cases<double, c64>(*this, fft_kind::r2c, seed ^ 4, per_type, cov, failures);
    call_cases<c32, float>(*this, fft_kind::c2r, seed ^ 5, per_type, cov, failures);
    call_cases<c64, double>(*this, fft_kind::c2r, seed ^ 6, per_type, cov, failures);
  }
  MESSAGE("check_fft_call: " << 12 * per_type << " cases; accepted " << cov.accepted
                             << " (beyond the int planner " << cov.accepted_64
                             << ", in and out adjacent in one allocation " << cov.accepted_adjacent
                             << "), refused for overlap " << cov.overlap_rejects);
  if (failures == 0) {  // what the cases reached (an early stop skews it)
    CHECK(cov.accepted > 30'000);
    CHECK(cov.accepted_64 > 1'000);
    CHECK(cov.accepted_adjacent > 200);
    CHECK(cov.overlap_rejects > 1'000);
  }
}

#if ATOMR_CUDA_HAS_CURAND
// ---------------------------------------------------------------------------
// cuRAND's count rule (curandGenerate* documentation): a quasi-random
// generator makes a multiple of its dimensions; a pseudo-random one makes
// normal and log-normal values in pairs (Box-Muller), so an even count; no
// generator makes 0 values.

TEST_CASE("rng model: check_rng_count agrees with the reference model") {
  constexpr int per_seed = 50'000;
  long long accepted = 0;
  int failures = 0;
  for (const auto seed : seeds) {
    source g(seed ^ 0x1'2a9d);
    for (int i = 0; i < per_seed && failures < max_failures; ++i) {
      const auto k = static_cast<rng_kind>(g.upto(7));
      const bool quasi = k == rng_kind::sobol32 || k == rng_kind::scrambled_sobol32 ||
                         k == rng_kind::sobol64 || k == rng_kind::scrambled_sobol64;
      unsigned dims = 1;
      switch (g.upto(3)) {
        case 0:
          dims = static_cast<unsigned>(g.between(1, 20000));
          break;
        case 1:
          dims = g.one_of<unsigned>({1, 2, 3, 19999, 20000});
          break;
        case 2:
          dims = g.one_of<unsigned>({0, 20001, UINT_MAX, 1u << 31});
          break;
        default:
          dims = 1;
          break;
      }
      std::size_t count = 0;
      if (g.chance(60) && dims > 0) {  // near a multiple of the dimensions
        const std::size_t most = SIZE_MAX / dims;
        const std::size_t mult = g.chance(30) ? most - g.upto(std::min<std::size_t>(most, 1))
                                              : g.upto(std::min<std::size_t>(most, 1000));
        count = static_cast<std::size_t>(clamp(i128(mult) * dims + g.between(-1, 1), 0, size_max));
      } else {
        count = g.size();
      }
      const bool pairs = g.chance(50);
      const auto op = g.one_of<std::string_view>({"uniform", "normal", "log_normal", "poisson"});
      const bool ok =
          count != 0 && (quasi ? dims != 0 && count % dims == 0 : !pairs || count % 2 == 0);
      const auto r = detail::check_rng_count(op, k, dims, count, pairs);
      std::string why;
      if (r && !ok)
        why = "accepted, the model rejects";
      else if (!r && ok)
        why = "rejected (" + r.error().message() + "), the model accepts";
      else if (!r)
        why = check_rejection(r.error(), op, {"out"});
      accepted += ok;
      if (!why.empty()) {
        CAPTURE(seed);
        CAPTURE(i);
        const std::string_view generator = to_string(k);
        CAPTURE(generator);
        CAPTURE(dims);
        CAPTURE(count);
        CAPTURE(pairs);
        CAPTURE(op);
        FAIL_CHECK(why);
        ++failures;
      }
    }
  }
  if (failures == 0) {  // what the cases reached (an early stop skews it)
    CHECK(accepted > 20'000);
  }
}
#endif
