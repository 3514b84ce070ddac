// Randomised property test of cudnn_actor's argument checks (detail::check_*) against an
// independent overflow-free (__int128) model of cuDNN's rules and the header's contract.
#include <atomr/cuda/cudnn_actor.hpp>

#include "int128.hpp"

#include <doctest/doctest.h>

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace atomr::cuda;

namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;
using atomr::cuda::test::clamp64;
using atomr::cuda::test::dec;
using atomr::cuda::test::i128;
using atomr::cuda::test::u128;

constexpr i64 k_int_max = INT_MAX;  // cuDNN's legacy descriptors take int extents
constexpr i128 k_i64_max = std::numeric_limits<i64>::max();
constexpr i128 k_size_max = std::numeric_limits<std::size_t>::max();

#ifdef CUDNN_BN_MIN_EPSILON
constexpr double k_bn_min_epsilon = CUDNN_BN_MIN_EPSILON;
#else
constexpr double k_bn_min_epsilon = 0.0;  // cuDNN 8 and 9
#endif

constexpr std::string_view conv_op = "cudnn_actor::conv2d_forward";
constexpr std::string_view pool_op = "cudnn_actor::pooling_forward";
constexpr std::string_view shape_op = "cudnn_actor::softmax_forward";
constexpr std::string_view act_op = "cudnn_actor::activation_forward";
constexpr std::string_view bn_op = "cudnn_actor::batchnorm_inference";
constexpr std::string_view create_op = "cudnn_actor::create";

std::string dbl(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g (bits 0x%016llx)", d,
                static_cast<unsigned long long>(std::bit_cast<u64>(d)));
  return buf;
}

// ---- the model's verdict -------------------------------------------------------------------

/// Every argument a correct check may name in its error; empty: the arguments are valid.
struct verdict {
  std::vector<std::string> bad;
  void add(const std::string& name) {
    for (const auto& b : bad)
      if (b == name) return;
    bad.push_back(name);
  }
  bool valid() const { return bad.empty(); }
  bool has(std::string_view name) const {
    for (const auto& b : bad)
      if (b == name) return true;
    return false;
  }
  std::string list() const {
    std::string s;
    for (const auto& b : bad) s += (s.empty() ? "" : ", ") + b;
    return s.empty() ? "(none)" : s;
  }
};

/// An extent or factor cuDNN takes as an int that must be > 0.
bool positive_int(i128 v) {
  return v >= 1 && v <= k_int_max;
}
/// A padding: an int >= 0.
bool non_negative_int(i128 v) {
  return v >= 0 && v <= k_int_max;
}
bool need_positive(verdict& v, const std::string& name, i128 value) {
  if (positive_int(value)) return true;
  v.add(name);
  return false;
}
bool need_non_negative(verdict& v, const std::string& name, i128 value) {
  if (non_negative_int(value)) return true;
  v.add(name);
  return false;
}

/// A dense 4-D tensor as the legacy API takes it: n, c, h, w ints > 0, the layout nchw or nhwc,
/// and (the header's contract) the element count must be countable in an int64. Yields the exact
/// element count, or -1 when an extent is bad.
i128 model_tensor(verdict& v, const std::string& arg, const std::array<i128, 4>& e,
                  unsigned layout) {
  static constexpr const char* names[] = {"n", "c", "h", "w"};
  bool extents = true;
  for (std::size_t i = 0; i < e.size(); ++i)
    if (!need_positive(v, arg + "." + names[i], e[i])) extents = false;
  if (layout != static_cast<unsigned>(tensor_layout::nchw) &&
      layout != static_cast<unsigned>(tensor_layout::nhwc))
    v.add(arg + ".layout");
  if (!extents) return -1;
  const i128 count = e[0] * e[1] * e[2] * e[3];  // < 2^124
  if (count > k_i64_max) v.add(arg);
  return count;
}

/// How many windows of `reach` consecutive positions, starting every `step` positions from 0,
/// lie wholly inside `extent` positions (cuDNN's output size: floor((extent - reach) / step) + 1
/// when reach <= extent, else none). All arguments > 0.
i128 windows_inside(i128 extent, i128 reach, i128 step) {
  if (reach > extent) return 0;
  return (extent - reach) / step + 1;
}

// ---- convolution model ----------------------------------------------------------------------

struct conv_expect {
  verdict v;
  i128 oh = 0, ow = 0, x_elems = -1, filter_elems = -1, y_elems = -1;
};

/// cuDNN 2-D cross-correlation: x n x C x H x W, filter K x C/groups x R x S, padding, stride,
/// dilation, groups dividing C and K; output n x K x P x Q with P = the number of dilated filter
/// placements (span dilation * (R - 1) + 1) fitting the padded input H + 2 pad every stride rows.
conv_expect model_conv(const tensor_shape& x, const conv2d_params& p) {
  conv_expect r;
  verdict& v = r.v;
  r.x_elems = model_tensor(v, "x_shape", {x.n, x.c, x.h, x.w}, static_cast<unsigned>(x.layout));
  const bool n_ok = positive_int(x.n), c_ok = positive_int(x.c);
  const bool h_ok = positive_int(x.h), w_ok = positive_int(x.w);
  const bool k_ok = need_positive(v, "params.out_channels", p.out_channels);
  const bool r_ok = need_positive(v, "params.filter_h", p.filter_h);
  const bool s_ok = need_positive(v, "params.filter_w", p.filter_w);
  const bool ph_ok = need_non_negative(v, "params.pad_h", p.pad_h);
  const bool pw_ok = need_non_negative(v, "params.pad_w", p.pad_w);
  const bool sh_ok = need_positive(v, "params.stride_h", p.stride_h);
  const bool sw_ok = need_positive(v, "params.stride_w", p.stride_w);
  const bool dh_ok = need_positive(v, "params.dilation_h", p.dilation_h);
  const bool dw_ok = need_positive(v, "params.dilation_w", p.dilation_w);
  const bool g_ok = need_positive(v, "params.groups", p.groups);
  if (g_ok && c_ok && x.c % p.groups != 0) v.add("params.groups");
  if (g_ok && k_ok && p.out_channels % p.groups != 0) v.add("params.groups");
  if (h_ok && ph_ok && r_ok && sh_ok && dh_ok) {
    r.oh = windows_inside(i128{x.h} + 2 * i128{p.pad_h},
                          i128{p.dilation_h} * (i128{p.filter_h} - 1) + 1, p.stride_h);
    if (r.oh < 1) v.add("params.filter_h");
  }
  if (w_ok && pw_ok && s_ok && sw_ok && dw_ok) {
    r.ow = windows_inside(i128{x.w} + 2 * i128{p.pad_w},
                          i128{p.dilation_w} * (i128{p.filter_w} - 1) + 1, p.stride_w);
    if (r.ow < 1) v.add("params.filter_w");
  }
  if (k_ok && c_ok && g_ok && r_ok && s_ok) {
    r.filter_elems = i128{p.out_channels} * (x.c / p.groups) * p.filter_h * p.filter_w;
    if (r.filter_elems > k_i64_max) v.add("params");
  }
  if (n_ok && k_ok && r.oh >= 1 && r.ow >= 1)
    r.y_elems = model_tensor(v, "y_shape", {x.n, p.out_channels, r.oh, r.ow}, 0);
  return r;
}

// ---- pooling model --------------------------------------------------------------------------

struct pool_expect {
  verdict v;
  i128 oh = 0, ow = 0, y_elems = -1;
};

/// cuDNN 2-D pooling: windows (padding < window, as the header requires) placed every stride
/// positions over the padded input; y n x C x P x Q, itself a valid tensor.
pool_expect model_pool(const tensor_shape& x, const pooling_params& p) {
  pool_expect r;
  verdict& v = r.v;
  model_tensor(v, "x_shape", {x.n, x.c, x.h, x.w}, static_cast<unsigned>(x.layout));
  const auto mode = static_cast<unsigned>(p.mode);
  if (mode != static_cast<unsigned>(pooling_mode::max) &&
      mode != static_cast<unsigned>(pooling_mode::average_include_padding) &&
      mode != static_cast<unsigned>(pooling_mode::average_exclude_padding))
    v.add("params.mode");
  const bool wh_ok = need_positive(v, "params.window_h", p.window_h);
  const bool ww_ok = need_positive(v, "params.window_w", p.window_w);
  const bool ph_ok = need_non_negative(v, "params.pad_h", p.pad_h);
  const bool pw_ok = need_non_negative(v, "params.pad_w", p.pad_w);
  if (wh_ok && ph_ok && p.pad_h >= p.window_h) v.add("params.pad_h");
  if (ww_ok && pw_ok && p.pad_w >= p.window_w) v.add("params.pad_w");
  const bool sh_ok = need_positive(v, "params.stride_h", p.stride_h);
  const bool sw_ok = need_positive(v, "params.stride_w", p.stride_w);
  if (positive_int(x.h) && wh_ok && ph_ok && sh_ok) {
    r.oh = windows_inside(i128{x.h} + 2 * i128{p.pad_h}, p.window_h, p.stride_h);
    if (r.oh < 1) v.add("params.window_h");
  }
  if (positive_int(x.w) && ww_ok && pw_ok && sw_ok) {
    r.ow = windows_inside(i128{x.w} + 2 * i128{p.pad_w}, p.window_w, p.stride_w);
    if (r.ow < 1) v.add("params.window_w");
  }
  if (positive_int(x.n) && positive_int(x.c) && r.oh >= 1 && r.ow >= 1)
    r.y_elems = model_tensor(v, "y_shape", {x.n, x.c, r.oh, r.ow}, 0);
  return r;
}

// ---- comparing the library with the model ---------------------------------------------------

/// What is wrong with a rejection: it must be invalid_argument, "op: arg why", naming an
/// argument the model finds bad. Empty when it is right.
template <class E>
std::string rejection_problem(const E& e, std::string_view op, const verdict& want) {
  const std::string m(e.message());
  if (want.valid()) return "rejected valid arguments: " + m;
  if (e.code() != errc::invalid_argument) return "error code is not invalid_argument: " + m;
  const std::string head = std::string(op) + ": ";
  if (m.compare(0, head.size(), head) != 0)
    return "message does not start with \"" + head + "\": " + m;
  const auto space = m.find(' ', head.size());
  if (space == std::string::npos) return "message names no argument: " + m;
  const std::string named = m.substr(head.size(), space - head.size());
  if (!want.has(named))
    return "message names " + named + ", the model's bad arguments are " + want.list() + ": " + m;
  return {};
}

/// The first few mismatches become doctest failures carrying the seed, the iteration and every
/// argument; all are counted, and the count must end at 0.
class findings {
public:
  explicit findings(std::string fn) : fn_(std::move(fn)) {}
  void add(u64 seed, long iteration, const std::string& args, const std::string& problem) {
    ++count_;
    if (count_ > 10) return;
    const std::string where =
        fn_ + ": seed " + std::to_string(seed) + ", iteration " + std::to_string(iteration);
    INFO(where);
    INFO("arguments: " << args);
    FAIL_CHECK(problem);
  }
  void finish() const {
    INFO(fn_ << ": " << count_ << " mismatches in all");
    CHECK(count_ == 0);
  }

private:
  std::string fn_;
  long count_ = 0;
};

/// How often each outcome was seen: "ok", or the argument of a case with exactly one bad
/// argument. Checked at the end so the generators keep reaching every rule.
class coverage {
public:
  void note(const verdict& v) {
    if (v.valid())
      ++seen_["ok"];
    else if (v.bad.size() == 1)
      ++seen_[v.bad.front()];
  }
  /// Counts a named event (an accepted boundary case, say).
  void mark(const char* what) { ++seen_[what]; }
  void require(std::initializer_list<const char*> names, long at_least) const {
    for (const char* n : names) {
      const auto it = seen_.find(n);
      const long got = it == seen_.end() ? 0 : it->second;
      INFO("outcome " << n << " seen " << got << " times alone, want >= " << at_least);
      CHECK(got >= at_least);
    }
  }

private:
  std::map<std::string, long> seen_;
};

// ---- random arguments -----------------------------------------------------------------------

// Boundaries: small values and their negatives; 1290/1291, 46340/46341 and 55108/55109 around
// the cube root and square root of 2^31 and the fourth root of 2^63; 2^21 (cube 2^63); the
// factors 3577 * 42799 * 92737 * 649657 == INT64_MAX; INT_MAX and its neighbours and doubles;
// 3037000499/3037000500 around the square root of 2^63; the int and int64 extremes.
constexpr i64 k_max64 = std::numeric_limits<i64>::max(), k_min64 = std::numeric_limits<i64>::min();
// clang-format off
constexpr i64 k_edges[] = {0, 1, -1, 2, -2, 3, 7, 8, 255, 256, 32767, 32768, 65535, 65536, 1290,
    1291, 46340, 46341, 55108, 55109, 2097151, 2097152, 2097153, 3577, 42799, 92737, 649657,
    k_int_max - 1, k_int_max, k_int_max + 1, k_int_max + 2, 2 * k_int_max, 2 * k_int_max + 1,
    2 * k_int_max + 2, i64{1} << 32, 3037000499, 3037000500, INT_MIN, i64{INT_MIN} - 1,
    -k_int_max, k_max64 / 2, k_max64 - 1, k_max64, k_min64, k_min64 + 1};
// clang-format on

class rnd {
public:
  explicit rnd(u64 seed) : g_(seed) {}
  u64 bits() { return g_(); }
  /// Uniform in [lo, hi].
  i64 in(i64 lo, i64 hi) {
    const u64 span = static_cast<u64>(hi) - static_cast<u64>(lo);
    if (span == ~u64{0}) return static_cast<i64>(bits());
    return static_cast<i64>(static_cast<u64>(lo) + bits() % (span + 1));
  }
  bool one_in(u64 k) { return bits() % k == 0; }
  template <class T>
  T pick(std::initializer_list<T> l) {
    return l.begin()[in(0, static_cast<i64>(l.size()) - 1)];
  }
  /// 1 ... 2^max_bits - 1, every bit length equally likely (max_bits <= 62).
  i64 log_uniform(int max_bits) {
    const int b = static_cast<int>(in(0, max_bits));
    if (b == 0) return 1;
    const i64 lo = i64{1} << (b - 1);
    return in(lo, 2 * lo - 1);
  }
  /// A value at or near a boundary a check must get right, or anything at all.
  i64 edge() {
    switch (in(0, 7)) {
      case 0:
      case 1:
      case 2:
        return k_edges[in(0, static_cast<i64>(std::size(k_edges)) - 1)];
      case 3:
        return in(k_int_max - 4, k_int_max + 4);
      case 4:
        return log_uniform(31);
      case 5:
        return log_uniform(62);
      case 6:
        return -log_uniform(62);
      default:
        return static_cast<i64>(bits());
    }
  }
  /// Usually a valid extent of up to max_bits bits, sometimes an edge value.
  i64 extent(int max_bits) { return one_in(16) ? edge() : log_uniform(max_bits); }
  /// nchw or nhwc, rarely a value that is neither.
  tensor_layout layout() {
    if (one_in(64)) return static_cast<tensor_layout>(in(2, 255));
    return one_in(2) ? tensor_layout::nchw : tensor_layout::nhwc;
  }
  double real() {
    static const double specials[] = {0.0,
                                      -0.0,
                                      1.0,
                                      -1.0,
                                      6.0,
                                      1e-5,
                                      -1e-5,
                                      1e-300,
                                      std::numeric_limits<double>::denorm_min(),
                                      -std::numeric_limits<double>::denorm_min(),
                                      std::numeric_limits<double>::min(),
                                      std::numeric_limits<double>::max(),
                                      std::numeric_limits<double>::lowest(),
                                      std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity(),
                                      std::numeric_limits<double>::quiet_NaN(),
                                      -std::numeric_limits<double>::quiet_NaN(),
                                      std::numeric_limits<double>::signaling_NaN(),
                                      k_bn_min_epsilon,
                                      std::nextafter(k_bn_min_epsilon, 1.0),
                                      std::nextafter(k_bn_min_epsilon, -1.0)};
    switch (in(0, 3)) {
      case 0:
        return specials[in(0, static_cast<i64>(std::size(specials)) - 1)];
      case 1:
        return std::bit_cast<double>(bits());
      case 2:
        return std::ldexp(static_cast<double>(bits() >> 11), -53) * 20.0 - 10.0;
      default:
        return std::ldexp(static_cast<double>(bits() >> 11), static_cast<int>(in(-1140, -1000)));
    }
  }

private:
  std::mt19937_64 g_;
};

/// The largest factor f with product * f <= INT64_MAX (product > 0), moved by delta.
i64 fill_to_int64_max(i128 product, int delta) {
  if (product <= 0) return 1 + delta;
  return clamp64(k_i64_max / product + delta);
}
i128 floor_div2(i128 v) {
  return v >= 0 ? v / 2 : -((-v + 1) / 2);
}

std::string describe(const tensor_shape& s) {
  return "{n " + dec(s.n) + ", c " + dec(s.c) + ", h " + dec(s.h) + ", w " + dec(s.w) +
         ", layout " + dec(static_cast<int>(s.layout)) + "}";
}
std::string describe(const conv2d_params& p) {
  return "{out_channels " + dec(p.out_channels) + ", filter " + dec(p.filter_h) + " x " +
         dec(p.filter_w) + ", pad " + dec(p.pad_h) + " x " + dec(p.pad_w) + ", stride " +
         dec(p.stride_h) + " x " + dec(p.stride_w) + ", dilation " + dec(p.dilation_h) + " x " +
         dec(p.dilation_w) + ", groups " + dec(p.groups) + "}";
}
std::string describe(const pooling_params& p) {
  return "{mode " + dec(static_cast<int>(p.mode)) + ", window " + dec(p.window_h) + " x " +
         dec(p.window_w) + ", pad " + dec(p.pad_h) + " x " + dec(p.pad_w) + ", stride " +
         dec(p.stride_h) + " x " + dec(p.stride_w) + "}";
}

// ---- convolution cases ----------------------------------------------------------------------

struct conv_case {
  tensor_shape x;
  conv2d_params p;
};

conv_case random_conv(rnd& r) {
  conv_case cs;
  tensor_shape& x = cs.x;
  conv2d_params& p = cs.p;
  p.groups = r.one_in(3) ? r.log_uniform(3) : 1;
  x.n = r.log_uniform(4);
  x.c = clamp64(i128{p.groups} * r.log_uniform(5));
  p.out_channels = clamp64(i128{p.groups} * r.log_uniform(5));
  x.h = r.log_uniform(r.one_in(8) ? 31 : static_cast<int>(r.in(0, 10)));
  x.w = r.log_uniform(r.one_in(8) ? 31 : static_cast<int>(r.in(0, 10)));
  x.layout = r.layout();
  p.filter_h = r.log_uniform(3);
  p.filter_w = r.log_uniform(3);
  p.pad_h = r.in(0, 3);
  p.pad_w = r.in(0, 3);
  p.stride_h = r.log_uniform(2);
  p.stride_w = r.log_uniform(2);
  p.dilation_h = r.log_uniform(2);
  p.dilation_w = r.log_uniform(2);

  // One spatial dimension gets the targeted values.
  const bool rows = r.one_in(2);
  i64& in = rows ? x.h : x.w;
  i64& filter = rows ? p.filter_h : p.filter_w;
  i64& pad = rows ? p.pad_h : p.pad_w;
  i64& stride = rows ? p.stride_h : p.stride_w;
  i64& dilation = rows ? p.dilation_h : p.dilation_w;
  const auto reach = [&] { return i128{dilation} * (i128{filter} - 1) + 1; };

  switch (r.in(0, 10)) {
    case 0:
      break;
    case 1: {  // the padded input exactly as large as the dilated filter, or about that
      const i128 t = r.pick<i128>({-2, -1, 0, 1, 2, stride - 1, stride, stride + 1});
      if (r.one_in(2))
        in = clamp64(reach() - 2 * i128{pad} + t);
      else
        pad = clamp64(floor_div2(reach() - in + t));
      break;
    }
    case 2: {  // a huge (dilated) filter, padding just enough or one short; padding > filter
      filter = r.one_in(2) ? r.edge() : r.log_uniform(31);
      dilation = r.one_in(2) ? 1 : r.log_uniform(r.one_in(2) ? 31 : 3);
      in = r.log_uniform(31);
      pad = clamp64(floor_div2(reach() - in + 1) + r.in(-1, 1));
      break;
    }
    case 3: {  // an output extent at INT_MAX, one past it, or near
      stride = r.one_in(2) ? 1 : r.log_uniform(3);
      const i128 out = i128{k_int_max} + r.in(-2, 2);
      const i128 padded = (out - 1) * stride + reach() + r.in(0, stride - 1);
      if (r.one_in(3)) {
        pad = r.in(0, k_int_max);
        in = clamp64(padded - 2 * i128{pad});
      } else {
        in = r.one_in(2) ? k_int_max - r.in(0, 3) : r.log_uniform(31);
        pad = clamp64(floor_div2(padded - in + r.in(0, 1)));
      }
      break;
    }
    case 4: {  // x's element count at INT64_MAX or one past
      p.groups = 1;
      i64* e[] = {&x.n, &x.c, &x.h, &x.w};
      if (r.one_in(3)) {
        const i64 f[] = {3577, 42799, 92737, 649657};
        for (int i = 0; i < 4; ++i) *e[i] = f[(i + r.in(0, 3)) % 4];
        *e[r.in(0, 3)] += r.in(-1, 1);
      } else {
        const int k = static_cast<int>(r.in(0, 3));
        i128 prod = 1;
        for (int i = 0; i < 4; ++i)
          if (i != k) prod *= (*e[i] = r.log_uniform(31));
        *e[k] = fill_to_int64_max(prod, static_cast<int>(r.in(-1, 1)));
      }
      // Fit the filter inside: 1 x 1, no padding.
      p.filter_h = p.filter_w = 1;
      break;
    }
    case 5: {  // the filter's element count at INT64_MAX or one past; the input big enough
      p.groups = r.one_in(4) ? r.log_uniform(3) : 1;
      x.c = clamp64(i128{p.groups} * r.log_uniform(r.one_in(2) ? 28 : 8));
      p.out_channels = clamp64(i128{p.groups} * r.log_uniform(r.one_in(2) ? 28 : 8));
      i64& other = rows ? p.filter_w : p.filter_h;
      other = r.log_uniform(r.one_in(2) ? 31 : 4);
      filter = fill_to_int64_max(i128{p.out_channels} * (x.c / p.groups) * other,
                                 static_cast<int>(r.in(-1, 1)));
      dilation = 1;
      in = r.log_uniform(31);
      pad = clamp64(floor_div2(i128{filter} - in + 1));
      if (pad < 0) pad = 0;
      i64& other_in = rows ? x.w : x.h;
      i64& other_pad = rows ? p.pad_w : p.pad_h;
      (rows ? p.dilation_w : p.dilation_h) = 1;
      other_in = r.log_uniform(31);
      other_pad = clamp64(floor_div2(i128{other} - other_in + 1));
      if (other_pad < 0) other_pad = 0;
      break;
    }
    case 6: {  // y's element count at INT64_MAX or one past (out_channels completes it)
      p.groups = 1;
      x.c = r.log_uniform(3);
      x.h = r.log_uniform(31);
      x.w = r.log_uniform(31);
      p.filter_h = p.filter_w = p.stride_h = p.stride_w = p.dilation_h = p.dilation_w = 1;
      p.pad_h = r.one_in(2) ? 0 : r.log_uniform(31);
      p.pad_w = r.one_in(2) ? 0 : r.log_uniform(31);
      const i128 oh = i128{x.h} + 2 * i128{p.pad_h}, ow = i128{x.w} + 2 * i128{p.pad_w};
      p.out_channels = fill_to_int64_max(x.n * oh * ow, static_cast<int>(r.in(-1, 1)));
      break;
    }
    case 7: {  // degenerate geometry
      switch (r.in(0, 5)) {
        case 0:
          stride = r.pick<i64>({0, -1, std::numeric_limits<i64>::min()});
          break;
        case 1:
          dilation = r.pick<i64>({0, -1, std::numeric_limits<i64>::min()});
          break;
        case 2:
          pad = r.pick<i64>({-1, -2, std::numeric_limits<i64>::min()});
          break;
        case 3:  // filter larger than the input (padding included) by one
          dilation = 1;
          filter = clamp64(i128{in} + 2 * i128{pad} + 1);
          break;
        case 4:
          filter = r.pick<i64>({0, -1});
          break;
        default:  // padding far larger than the filter
          pad = r.log_uniform(31);
          break;
      }
      break;
    }
    case 8: {  // groups at the edge of dividing C and K
      switch (r.in(0, 5)) {
        case 0:
          p.groups = x.c;
          break;
        case 1:
          p.groups = x.c + r.pick<i64>({-1, 1});
          break;
        case 2:
          p.out_channels = clamp64(i128{p.groups} * r.log_uniform(5) + r.pick<i64>({-1, 1}));
          break;
        case 3:
          p.groups = r.pick<i64>({0, -1, -2, k_int_max, k_int_max + 1});
          break;
        case 4:  // depthwise
          p.groups = x.c;
          p.out_channels = clamp64(i128{x.c} * r.log_uniform(3));
          break;
        default:
          p.groups = r.log_uniform(31);
          x.c = clamp64(i128{p.groups} * r.in(1, 2));
          p.out_channels = p.groups;
          break;
      }
      break;
    }
    case 9: {  // every field an edge value
      i64* f[] = {&x.n,        &x.c,          &x.h,          &x.w,     &p.out_channels,
                  &p.filter_h, &p.filter_w,   &p.pad_h,      &p.pad_w, &p.stride_h,
                  &p.stride_w, &p.dilation_h, &p.dilation_w, &p.groups};
      for (i64* v : f) *v = r.edge();
      break;
    }
    default: {  // big but valid-looking extents everywhere
      x.n = r.extent(31);
      x.c = clamp64(i128{p.groups} * r.extent(16));
      x.h = r.extent(31);
      x.w = r.extent(31);
      break;
    }
  }
  // Sometimes one or two more fields get an edge value.
  if (r.one_in(4)) {
    i64* f[] = {&x.n,        &x.c,          &x.h,          &x.w,     &p.out_channels,
                &p.filter_h, &p.filter_w,   &p.pad_h,      &p.pad_w, &p.stride_h,
                &p.stride_w, &p.dilation_h, &p.dilation_w, &p.groups};
    for (i64 k = r.in(1, 2); k > 0; --k) *f[r.in(0, 13)] = r.edge();
  }
  return cs;
}

/// Independently of the model: what an accepted convolution hands cuDNN must fit its ints,
/// every count must be the exact product of its extents, and every dilated filter placement the
/// output asks for must lie inside the padded input.
std::string conv_safety(const tensor_shape& x, const conv2d_params& p,
                        const detail::conv2d_layout& lay) {
  const auto ext = [](i64 v) { return positive_int(v); };
  if (!ext(x.n) || !ext(x.c) || !ext(x.h) || !ext(x.w)) return "x extent does not fit an int";
  if (!ext(lay.y.n) || !ext(lay.y.c) || !ext(lay.y.h) || !ext(lay.y.w))
    return "y extent does not fit an int: " + describe(lay.y);
  if (!ext(p.out_channels) || !ext(p.filter_h) || !ext(p.filter_w) || !ext(p.stride_h) ||
      !ext(p.stride_w) || !ext(p.dilation_h) || !ext(p.dilation_w) || !ext(p.groups) ||
      !non_negative_int(p.pad_h) || !non_negative_int(p.pad_w))
    return "a parameter does not fit an int";
  if (x.c % p.groups != 0 || p.out_channels % p.groups != 0) return "groups divide not C and K";
  if (lay.y.n != x.n || lay.y.c != p.out_channels || lay.y.layout != x.layout)
    return "y is not n x out_channels in x's layout: " + describe(lay.y);
  if (lay.x_elems != i128{x.n} * x.c * x.h * x.w) return "x_elems is not n*c*h*w";
  if (lay.y_elems != i128{lay.y.n} * lay.y.c * lay.y.h * lay.y.w) return "y_elems is not y's count";
  if (lay.filter_elems != i128{p.out_channels} * (x.c / p.groups) * p.filter_h * p.filter_w)
    return "filter_elems is not K*C/groups*R*S";
  if (lay.bias_elems != p.out_channels) return "bias_elems is not K";
  const i128 last_h = (i128{lay.y.h} - 1) * p.stride_h + i128{p.dilation_h} * (p.filter_h - 1);
  const i128 last_w = (i128{lay.y.w} - 1) * p.stride_w + i128{p.dilation_w} * (p.filter_w - 1);
  if (last_h >= i128{x.h} + 2 * i128{p.pad_h} || last_w >= i128{x.w} + 2 * i128{p.pad_w})
    return "the last output reads past the padded input";
  return {};
}

// ---- pooling cases --------------------------------------------------------------------------

struct pool_case {
  tensor_shape x;
  pooling_params p;
};

pool_case random_pool(rnd& r) {
  pool_case cs;
  tensor_shape& x = cs.x;
  pooling_params& p = cs.p;
  x.n = r.log_uniform(4);
  x.c = r.log_uniform(6);
  x.h = r.log_uniform(r.one_in(8) ? 31 : static_cast<int>(r.in(0, 10)));
  x.w = r.log_uniform(r.one_in(8) ? 31 : static_cast<int>(r.in(0, 10)));
  x.layout = r.layout();
  p.mode = r.one_in(64) ? static_cast<pooling_mode>(r.in(3, 255))
                        : static_cast<pooling_mode>(r.in(0, 2));
  p.window_h = r.log_uniform(3);
  p.window_w = r.log_uniform(3);
  p.pad_h = r.in(0, p.window_h - 1);
  p.pad_w = r.in(0, p.window_w - 1);
  p.stride_h = r.log_uniform(2);
  p.stride_w = r.log_uniform(2);

  const bool rows = r.one_in(2);
  i64& in = rows ? x.h : x.w;
  i64& window = rows ? p.window_h : p.window_w;
  i64& pad = rows ? p.pad_h : p.pad_w;
  i64& stride = rows ? p.stride_h : p.stride_w;

  switch (r.in(0, 9)) {
    case 0:
      break;
    case 1: {  // the padded input exactly one window, or about that
      const i128 t = r.pick<i128>({-2, -1, 0, 1, 2, stride - 1, stride, stride + 1});
      in = clamp64(i128{window} - 2 * i128{pad} + t);
      break;
    }
    case 2:  // padding at the window's size, one below, one above
      pad = clamp64(i128{window} + r.in(-1, 1));
      break;
    case 3: {  // huge windows, padding up to window - 1: outputs reach INT_MAX and beyond
      window = r.one_in(2) ? r.in(k_int_max - 3, k_int_max) : r.log_uniform(31);
      pad = r.one_in(2) ? window - 1 : r.in(0, window - 1);
      in = r.one_in(2) ? r.in(k_int_max - 3, k_int_max) : r.log_uniform(31);
      stride = r.one_in(2) ? 1 : r.log_uniform(2);
      break;
    }
    case 4: {  // an output extent at INT_MAX, one past it, or near
      stride = r.one_in(2) ? 1 : r.log_uniform(3);
      window = r.log_uniform(r.one_in(2) ? 31 : 3);
      pad = r.in(0, window - 1);
      const i128 out = i128{k_int_max} + r.in(-2, 2);
      in = clamp64((out - 1) * stride + window - 2 * i128{pad} + r.in(0, stride - 1));
      break;
    }
    case 5: {  // y's element count at INT64_MAX or one past (channels complete it)
      p.window_h = r.log_uniform(r.one_in(2) ? 31 : 2);
      p.window_w = r.log_uniform(r.one_in(2) ? 31 : 2);
      p.pad_h = r.one_in(2) ? p.window_h - 1 : 0;
      p.pad_w = r.one_in(2) ? p.window_w - 1 : 0;
      p.stride_h = p.stride_w = 1;
      x.h = r.log_uniform(31);
      x.w = r.log_uniform(31);
      const i128 oh = windows_inside(i128{x.h} + 2 * i128{p.pad_h}, p.window_h, 1);
      const i128 ow = windows_inside(i128{x.w} + 2 * i128{p.pad_w}, p.window_w, 1);
      x.c = fill_to_int64_max(x.n * oh * ow, static_cast<int>(r.in(-1, 1)));
      if (x.c <= 0 || r.one_in(4)) x.c = r.log_uniform(31);
      break;
    }
    case 6: {  // x's element count at INT64_MAX or one past
      i64* e[] = {&x.n, &x.c, &x.h, &x.w};
      const int k = static_cast<int>(r.in(0, 3));
      i128 prod = 1;
      for (int i = 0; i < 4; ++i)
        if (i != k) prod *= (*e[i] = r.log_uniform(31));
      *e[k] = fill_to_int64_max(prod, static_cast<int>(r.in(-1, 1)));
      p.window_h = p.window_w = 1;
      p.pad_h = p.pad_w = 0;
      break;
    }
    case 7:  // degenerate window, stride or padding
      switch (r.in(0, 3)) {
        case 0:
          window = r.pick<i64>({0, -1, std::numeric_limits<i64>::min()});
          break;
        case 1:
          stride = r.pick<i64>({0, -1, std::numeric_limits<i64>::min()});
          break;
        case 2:
          pad = r.pick<i64>({-1, std::numeric_limits<i64>::min()});
          break;
        default:  // a window larger than the padded input by one
          window = clamp64(i128{in} + 2 * i128{pad} + 1);
          break;
      }
      break;
    case 8: {  // every field an edge value
      i64* f[] = {&x.n,        &x.c,     &x.h,     &x.w,        &p.window_h,
                  &p.window_w, &p.pad_h, &p.pad_w, &p.stride_h, &p.stride_w};
      for (i64* v : f) *v = r.edge();
      break;
    }
    default:
      x.n = r.extent(31);
      x.c = r.extent(31);
      x.h = r.extent(31);
      x.w = r.extent(31);
      break;
  }
  if (r.one_in(4)) {
    i64* f[] = {&x.n,        &x.c,     &x.h,     &x.w,        &p.window_h,
                &p.window_w, &p.pad_h, &p.pad_w, &p.stride_h, &p.stride_w};
    for (i64 k = r.in(1, 2); k > 0; --k) *f[r.in(0, 9)] = r.edge();
  }
  return cs;
}

/// Independently of the model: y is a valid tensor (int extents, count in an int64) of x's n, c
/// and layout, and every window the output asks for lies inside the padded input.
std::string pool_safety(const tensor_shape& x, const pooling_params& p, const tensor_shape& y) {
  if (!positive_int(x.n) || !positive_int(x.c) || !positive_int(x.h) || !positive_int(x.w))
    return "x extent does not fit an int";
  if (!positive_int(y.n) || !positive_int(y.c) || !positive_int(y.h) || !positive_int(y.w))
    return "y extent does not fit an int: " + describe(y);
  if (i128{y.n} * y.c * y.h * y.w > k_i64_max)
    return "y's element count overflows an int64 (tensor_shape::elements): " + describe(y);
  if (!positive_int(p.window_h) || !positive_int(p.window_w) || !positive_int(p.stride_h) ||
      !positive_int(p.stride_w) || !non_negative_int(p.pad_h) || !non_negative_int(p.pad_w))
    return "a parameter does not fit an int";
  if (y.n != x.n || y.c != x.c || y.layout != x.layout)
    return "y is not n x c in x's layout: " + describe(y);
  const i128 last_h = (i128{y.h} - 1) * p.stride_h + p.window_h;
  const i128 last_w = (i128{y.w} - 1) * p.stride_w + p.window_w;
  if (last_h > i128{x.h} + 2 * i128{p.pad_h} || last_w > i128{x.w} + 2 * i128{p.pad_w})
    return "the last window reaches past the padded input";
  return {};
}

/// Runs one convolution through the library and the model and records any mismatch.
void run_conv(findings& bad, coverage& cov, u64 seed, long it, const conv_case& cs) {
  const auto& x = cs.x;
  const auto& p = cs.p;
  const conv_expect want = model_conv(x, p);
  cov.note(want.v);
  const auto got = detail::check_conv2d(conv_op, x, p);
  std::string problem;
  if (got) {
    const auto& lay = got.value();
    problem = conv_safety(x, p, lay);
    if (!problem.empty())
      problem = "UNSAFE accept: " + problem;
    else if (!want.v.valid())
      problem = "accepted, the model finds bad: " + want.v.list();
    else if (lay.y.h != want.oh || lay.y.w != want.ow)
      problem = "output " + dec(lay.y.h) + " x " + dec(lay.y.w) + ", the model's " + dec(want.oh) +
                " x " + dec(want.ow);
    else if (lay.x_elems != want.x_elems || lay.filter_elems != want.filter_elems ||
             lay.bias_elems != p.out_channels || lay.y_elems != want.y_elems)
      problem = "counts x " + dec(lay.x_elems) + " filter " + dec(lay.filter_elems) + " y " +
                dec(lay.y_elems) + ", the model's " + dec(want.x_elems) + ", " +
                dec(want.filter_elems) + ", " + dec(want.y_elems);
    if (problem.empty()) {
      if (lay.y.h == k_int_max || lay.y.w == k_int_max) cov.mark("ok: y extent INT_MAX");
      if (lay.y.h == 1 || lay.y.w == 1) cov.mark("ok: y extent 1");
      if (std::max({lay.x_elems, lay.filter_elems, lay.y_elems}) > k_i64_max / 2)
        cov.mark("ok: a count > INT64_MAX / 2");
      if (p.pad_h >= p.filter_h || p.pad_w >= p.filter_w) cov.mark("ok: padding >= filter");
    }
  } else {
    problem = rejection_problem(got.error(), conv_op, want.v);
  }
  // The pure output-size helper, on its documented domain (int arguments, stride and
  // dilation > 0): the model's size where the filter fits, else <= 0.
  if (problem.empty() && positive_int(x.h) && non_negative_int(p.pad_h) &&
      positive_int(p.filter_h) && positive_int(p.stride_h) && positive_int(p.dilation_h)) {
    const i64 d = detail::conv_output_dim(x.h, p.pad_h, p.filter_h, p.stride_h, p.dilation_h);
    if (want.oh >= 1 ? d != want.oh : d > 0)
      problem = "conv_output_dim " + dec(d) + ", the model's " + dec(want.oh);
  }
  if (!problem.empty()) bad.add(seed, it, "x " + describe(x) + ", params " + describe(p), problem);
}

/// Runs one pooling through the library and the model and records any mismatch.
void run_pool(findings& bad, coverage& cov, u64 seed, long it, const pool_case& cs) {
  const auto& x = cs.x;
  const auto& p = cs.p;
  const pool_expect want = model_pool(x, p);
  cov.note(want.v);
  const auto got = detail::check_pooling(pool_op, x, p);
  std::string problem;
  if (got) {
    const tensor_shape& y = got.value();
    problem = pool_safety(x, p, y);
    if (!problem.empty())
      problem = "UNSAFE accept: " + problem;
    else if (!want.v.valid())
      problem = "accepted, the model finds bad: " + want.v.list();
    else if (y.h != want.oh || y.w != want.ow)
      problem = "output " + dec(y.h) + " x " + dec(y.w) + ", the model's " + dec(want.oh) + " x " +
                dec(want.ow);
    else if (y.elements() != want.y_elems)
      problem = "y count " + dec(y.elements()) + ", the model's " + dec(want.y_elems);
    if (problem.empty()) {
      if (y.h == k_int_max || y.w == k_int_max) cov.mark("ok: y extent INT_MAX");
      if (y.h == 1 || y.w == 1) cov.mark("ok: y extent 1");
      if (want.y_elems > k_i64_max / 2) cov.mark("ok: y count > INT64_MAX / 2");
      if (p.pad_h == p.window_h - 1 || p.pad_w == p.window_w - 1) cov.mark("ok: pad window - 1");
    }
  } else {
    problem = rejection_problem(got.error(), pool_op, want.v);
  }
  if (problem.empty() && positive_int(x.w) && non_negative_int(p.pad_w) &&
      positive_int(p.window_w) && positive_int(p.stride_w)) {
    const i64 d = detail::pooling_output_dim(x.w, p.pad_w, p.window_w, p.stride_w);
    if (want.ow >= 1 ? d != want.ow : d > 0)
      problem = "pooling_output_dim " + dec(d) + ", the model's " + dec(want.ow);
  }
  if (!problem.empty()) bad.add(seed, it, "x " + describe(x) + ", params " + describe(p), problem);
}

constexpr u64 k_seeds[] = {0x5eed'c0de'0001, 0x0dd5'ca1e'2024, 0xbad'a11'0ca7e};

}  // namespace

TEST_CASE("cudnn args model: check_tensor_shape against the model") {
  findings bad("check_tensor_shape");
  coverage cov;
  constexpr long per_seed = 60'000;
  for (const u64 seed : k_seeds) {
    rnd r(seed);
    for (long it = 0; it < per_seed; ++it) {
      tensor_shape s;
      i64* e[] = {&s.n, &s.c, &s.h, &s.w};
      switch (r.in(0, 4)) {
        case 0:
          for (i64* v : e) *v = r.extent(static_cast<int>(r.in(1, 31)));
          break;
        case 1:
          for (i64* v : e) *v = r.edge();
          break;
        case 2: {  // the count at INT64_MAX, or one past
          const int k = static_cast<int>(r.in(0, 3));
          i128 prod = 1;
          for (int i = 0; i < 4; ++i)
            if (i != k) prod *= (*e[i] = r.log_uniform(static_cast<int>(r.in(1, 31))));
          *e[k] = fill_to_int64_max(prod, static_cast<int>(r.in(-1, 1)));
          break;
        }
        case 3: {  // exact factorizations of INT64_MAX and 2^63, one factor moved by one
          const bool pow2 = r.one_in(2);
          const i64 f[] = {3577, 42799, 92737, 649657};
          for (int i = 0; i < 4; ++i) *e[i] = pow2 ? (i == 0 ? 32768 : 65536) : f[i];
          if (r.one_in(2)) *e[r.in(0, 3)] += r.in(-1, 1);
          for (int i = 3; i > 0; --i) std::swap(*e[i], *e[r.in(0, i)]);
          break;
        }
        default:  // int-sized extents: counts from 2^0 to 2^124
          for (i64* v : e)
            *v = r.one_in(2) ? r.in(k_int_max - 2, k_int_max + 1) : r.log_uniform(31);
          break;
      }
      s.layout = r.layout();
      verdict want;
      const i128 count =
          model_tensor(want, "shape", {s.n, s.c, s.h, s.w}, static_cast<unsigned>(s.layout));
      cov.note(want);
      const auto got = detail::check_tensor_shape(shape_op, "shape", s);
      std::string problem;
      if (got) {
        if (!want.valid())
          problem = "accepted, the model finds bad: " + want.list();
        else if (got.value() != count)
          problem = "count " + dec(got.value()) + ", the model's " + dec(count);
        else if (s.elements() != got.value())
          problem = "tensor_shape::elements() disagrees";
        else if (count == k_i64_max)
          cov.mark("ok: count INT64_MAX");
      } else {
        problem = rejection_problem(got.error(), shape_op, want);
      }
      if (!problem.empty()) bad.add(seed, it, "shape " + describe(s), problem);
    }
  }
  bad.finish();
  cov.require({"ok", "shape", "shape.n", "shape.c", "shape.h", "shape.w", "shape.layout"}, 500);
  cov.require({"ok: count INT64_MAX"}, 100);
}

TEST_CASE("cudnn args model: check_conv2d against the model") {
  findings bad("check_conv2d");
  coverage cov;
  // Hand-picked boundaries first (seed 0, iteration = index), then the random cases.
  const i64 big = k_int_max;
  const conv_case fixed[] = {
      // output height INT_MAX + 2 from a 1-row filter on INT_MAX rows padded by 1
      {{1, 1, big, 1}, {.pad_h = 1}},
      // output height exactly INT_MAX
      {{1, 1, big, 1}, {.filter_h = 3, .pad_h = 1}},
      // filter 2^20 x 2^20 x 2^12 x 2^12 = 2^64 elements; 2^63; 2^62 fits
      {{1, 1 << 20, 1, 1},
       {.out_channels = 1 << 20,
        .filter_h = 1 << 12,
        .filter_w = 1 << 12,
        .pad_h = 1 << 11,
        .pad_w = 1 << 11}},
      {{1, 1 << 20, 1, 1},
       {.out_channels = 1 << 20,
        .filter_h = 1 << 11,
        .filter_w = 1 << 12,
        .pad_h = 1 << 10,
        .pad_w = 1 << 11}},
      {{1, 1 << 20, 1, 1},
       {.out_channels = 1 << 20,
        .filter_h = 1 << 11,
        .filter_w = 1 << 11,
        .pad_h = 1 << 10,
        .pad_w = 1 << 10}},
      // dilated span (INT_MAX - 1) * 2 + 1 against INT_MAX + 2 * INT_MAX
      {{1, 1, big, 1}, {.filter_h = big, .pad_h = big, .dilation_h = 2}},
      {{1, 1, 1, 1}, {.filter_h = big, .pad_h = big, .dilation_h = 2}},
  };
  for (long i = 0; i < static_cast<long>(std::size(fixed)); ++i) run_conv(bad, cov, 0, i, fixed[i]);
  constexpr long per_seed = 70'000;
  for (const u64 seed : k_seeds) {
    rnd r(seed);
    for (long it = 0; it < per_seed; ++it) run_conv(bad, cov, seed, it, random_conv(r));
  }
  bad.finish();
  cov.require({"ok",
               "x_shape",
               "x_shape.n",
               "x_shape.c",
               "x_shape.h",
               "x_shape.w",
               "x_shape.layout",
               "params.out_channels",
               "params.filter_h",
               "params.filter_w",
               "params.pad_h",
               "params.pad_w",
               "params.stride_h",
               "params.stride_w",
               "params.dilation_h",
               "params.dilation_w",
               "params.groups",
               "params",
               "y_shape",
               "y_shape.h",
               "y_shape.w",
               "ok: y extent INT_MAX",
               "ok: y extent 1",
               "ok: a count > INT64_MAX / 2",
               "ok: padding >= filter"},
              500);
}

TEST_CASE("cudnn args model: check_pooling against the model") {
  findings bad("check_pooling");
  coverage cov;
  // Hand-picked boundaries first (seed 0, iteration = index), then the random cases. Padding
  // up to window - 1 makes the output larger than the input.
  const i64 big = k_int_max;
  const auto pool = [](i64 wh, i64 ww, i64 ph, i64 pw) {
    return pooling_params{
        .window_h = wh, .window_w = ww, .pad_h = ph, .pad_w = pw, .stride_h = 1, .stride_w = 1};
  };
  const pool_case fixed[] = {
      // y height INT_MAX + 1 (2 rows, window INT_MAX, padding INT_MAX - 1): an int-overflowing
      // extent (cuDNN would get -2^31)
      {{1, 1, 2, 1}, pool(big, 1, big - 1, 0)},
      // y height exactly INT_MAX
      {{1, 1, 1, 1}, pool(big, 1, big - 1, 0)},
      // y 4 x 1 x 2^31 x 2^31: elements() would be 2^64 (wraps to 0)
      {{4, 1, 2, 2}, pool(big, big, big - 1, big - 1)},
      // y 4 x 1 x INT_MAX x INT_MAX: int extents, about 2^64 elements; with 2 images it fits
      {{4, 1, 1, 1}, pool(big, big, big - 1, big - 1)},
      {{2, 1, 1, 1}, pool(big, big, big - 1, big - 1)},
  };
  for (long i = 0; i < static_cast<long>(std::size(fixed)); ++i) run_pool(bad, cov, 0, i, fixed[i]);
  constexpr long per_seed = 70'000;
  for (const u64 seed : k_seeds) {
    rnd r(seed);
    for (long it = 0; it < per_seed; ++it) run_pool(bad, cov, seed, it, random_pool(r));
  }
  bad.finish();
  cov.require({"ok",
               "x_shape",
               "x_shape.n",
               "x_shape.c",
               "x_shape.h",
               "x_shape.w",
               "x_shape.layout",
               "params.mode",
               "params.window_h",
               "params.window_w",
               "params.pad_h",
               "params.pad_w",
               "params.stride_h",
               "params.stride_w",
               "y_shape",
               "y_shape.h",
               "y_shape.w",
               "ok: y extent INT_MAX",
               "ok: y extent 1",
               "ok: y count > INT64_MAX / 2",
               "ok: pad window - 1"},
              500);
}

TEST_CASE("cudnn args model: check_exact_size and check_no_overlap against the model") {
  findings bad_size("check_exact_size");
  findings bad_overlap("check_no_overlap");
  coverage cov_size, cov_overlap;
  constexpr long per_seed = 60'000;
  for (const u64 seed : k_seeds) {
    rnd r(seed);
    for (long it = 0; it < per_seed; ++it) {
      // A buffer of `have` elements for a shape needing `need`: exactly, one off, or wrapped.
      const i64 need = r.one_in(2) ? r.edge() : r.log_uniform(static_cast<int>(r.in(0, 62)));
      std::size_t have = 0;
      switch (r.in(0, 4)) {
        case 0:
        case 1: {
          const i128 h = i128{need} + r.in(-1, 1);
          have = h < 0 || h > k_size_max ? static_cast<std::size_t>(r.bits())
                                         : static_cast<std::size_t>(h);
          break;
        }
        case 2:  // the two's complement image of a negative need, and its neighbours
          have = static_cast<std::size_t>(need) + static_cast<std::size_t>(r.in(-1, 1));
          break;
        case 3:
          have = r.pick<std::size_t>({0, 1, std::numeric_limits<std::size_t>::max(),
                                      std::size_t{1} << 63, (std::size_t{1} << 63) - 1,
                                      (std::size_t{1} << 32) - 1, std::size_t{1} << 32});
          break;
        default:
          have = static_cast<std::size_t>(r.bits() >> r.in(0, 63));
          break;
      }
      const std::string arg = r.pick<const char*>({"x", "y", "filter", "bias", "scale"});
      verdict want;
      if (!(need >= 0 && i128{need} == i128{have})) want.add(arg);
      cov_size.note(want);
      const auto got = detail::check_exact_size(conv_op, arg, have, need);
      std::string problem;
      if (got && !want.valid()) problem = "accepted, the model finds bad: " + want.list();
      if (!got) problem = rejection_problem(got.error(), conv_op, want);
      if (!problem.empty())
        bad_size.add(seed, it, arg + ": have " + dec(have) + ", need " + dec(need), problem);

      // Two byte ranges of one allocation (never wrapping past SIZE_MAX: offsets and sizes of
      // real ranges inside one allocation cannot).
      const bool same = !r.one_in(5);
      const auto length = [&]() -> std::size_t {
        switch (r.in(0, 3)) {
          case 0:
            return static_cast<std::size_t>(r.in(0, 2));
          case 1:
            return static_cast<std::size_t>(r.log_uniform(12));
          case 2:
            return static_cast<std::size_t>(r.log_uniform(62));
          default:
            return static_cast<std::size_t>(r.bits() >> r.in(0, 63));
        }
      };
      std::size_t a_bytes = length(), b_bytes = length();
      std::size_t a = 0, b = 0;
      const auto room = [](std::size_t at, std::size_t len) {
        return static_cast<std::size_t>(std::min<i128>(len, k_size_max - i128{at}));
      };
      switch (r.in(0, 4)) {
        case 0:  // small, often overlapping
          a = static_cast<std::size_t>(r.in(0, 256));
          b = static_cast<std::size_t>(r.in(0, 256));
          break;
        case 1: {  // b starts just before, at, or just after a's end (or the other way round)
          a = static_cast<std::size_t>(r.bits() >> r.in(1, 63));
          a_bytes = room(a, a_bytes);
          const i128 at = i128{a} + a_bytes + r.in(-1, 1);
          b = at < 0 || at > k_size_max ? a : static_cast<std::size_t>(at);
          if (r.one_in(2)) std::swap(a, b), std::swap(a_bytes, b_bytes);
          break;
        }
        case 2: {  // one range inside the other
          a = static_cast<std::size_t>(r.bits() >> r.in(1, 63));
          a_bytes = room(a, a_bytes);
          b = a + (a_bytes == 0 ? 0 : static_cast<std::size_t>(r.bits() % a_bytes));
          break;
        }
        case 3:  // at the top of the address range
          a = std::numeric_limits<std::size_t>::max() - a_bytes -
              static_cast<std::size_t>(r.in(0, 2) * (a_bytes > 0 ? 1 : 0));
          b = std::numeric_limits<std::size_t>::max() - b_bytes -
              static_cast<std::size_t>(r.in(0, 2) * (b_bytes > 0 ? 1 : 0));
          break;
        default:
          a = static_cast<std::size_t>(r.bits());
          b = static_cast<std::size_t>(r.bits());
          break;
      }
      a_bytes = room(a, a_bytes);
      b_bytes = room(b, b_bytes);
      const i128 a_end = i128{a} + a_bytes, b_end = i128{b} + b_bytes;
      verdict overlap;
      if (same && a_bytes > 0 && b_bytes > 0 && i128{a} < b_end && i128{b} < a_end)
        overlap.add("y");
      cov_overlap.note(overlap);
      const auto ov = detail::check_no_overlap(conv_op, "y", same, a, a_bytes, b, b_bytes);
      problem.clear();
      if (ov && !overlap.valid()) problem = "accepted overlapping ranges";
      if (!ov) problem = rejection_problem(ov.error(), conv_op, overlap);
      if (!problem.empty())
        bad_overlap.add(seed, it,
                        "same " + dec(same) + ", a " + dec(a) + " + " + dec(a_bytes) + ", b " +
                            dec(b) + " + " + dec(b_bytes),
                        problem);
    }
  }
  bad_size.finish();
  bad_overlap.finish();
  cov_size.require({"ok", "x", "y", "filter", "bias", "scale"}, 1000);
  cov_overlap.require({"ok", "y"}, 10'000);
}

TEST_CASE("cudnn args model: activation, softmax, batchnorm epsilon, dtype and options") {
  findings bad("scalar checks");
  coverage cov_act, cov_eps, cov_opt;
  const auto finite = [](double d) {  // exponent bits not all ones
    return ((std::bit_cast<u64>(d) >> 52) & 0x7ff) != 0x7ff;
  };
  constexpr long per_seed = 40'000;
  for (const u64 seed : k_seeds) {
    rnd r(seed);
    for (long it = 0; it < per_seed; ++it) {
      // Activation: a known mode; coef finite, and > 0 where it is elu's alpha or the ceiling.
      activation_params a;
      a.mode = r.one_in(8) ? static_cast<activation_mode>(r.in(5, 255))
                           : static_cast<activation_mode>(r.in(0, 4));
      a.coef = r.real();
      verdict va;
      const auto mode = static_cast<unsigned>(a.mode);
      const bool needs_positive =
          a.mode == activation_mode::elu || a.mode == activation_mode::clipped_relu;
      if (mode > static_cast<unsigned>(activation_mode::clipped_relu)) va.add("params.mode");
      if (!finite(a.coef) || (needs_positive && !(a.coef > 0.0))) va.add("params.coef");
      cov_act.note(va);
      const auto ga = detail::check_activation(act_op, a);
      std::string problem;
      if (ga && !va.valid()) problem = "accepted, the model finds bad: " + va.list();
      if (!ga) problem = rejection_problem(ga.error(), act_op, va);
      if (!problem.empty())
        bad.add(seed, it, "activation mode " + dec(mode) + ", coef " + dbl(a.coef), problem);

      // Batch norm epsilon: finite, > 0, >= CUDNN_BN_MIN_EPSILON.
      const double eps = r.real();
      verdict ve;
      if (!finite(eps) || !(eps > 0.0) || !(eps >= k_bn_min_epsilon)) ve.add("epsilon");
      cov_eps.note(ve);
      const auto ge = detail::check_batchnorm_epsilon(bn_op, eps);
      problem.clear();
      if (ge && !ve.valid()) problem = "accepted, the model finds bad: " + ve.list();
      if (!ge) problem = rejection_problem(ge.error(), bn_op, ve);
      if (!problem.empty()) bad.add(seed, it, "epsilon " + dbl(eps), problem);

      // Options: algo_cache_size >= 1, a known conv_api, max_lanes <= 64.
      cudnn_options o;
      o.algo_cache_size = r.one_in(3) ? r.pick<std::size_t>({0, 1, 2, SIZE_MAX})
                                      : static_cast<std::size_t>(r.bits() >> r.in(0, 63));
      o.convolution_api =
          r.one_in(8) ? static_cast<conv_api>(r.in(2, 255)) : static_cast<conv_api>(r.in(0, 1));
      o.max_lanes = r.one_in(2) ? static_cast<std::size_t>(r.in(0, 70))
                                : static_cast<std::size_t>(r.bits() >> r.in(0, 63));
      o.workspace_limit = static_cast<std::size_t>(r.bits() >> r.in(0, 63));
      o.cuda_graphs = r.one_in(2);
      verdict vo;
      if (o.algo_cache_size < 1) vo.add("algo_cache_size");
      if (static_cast<unsigned>(o.convolution_api) > static_cast<unsigned>(conv_api::legacy))
        vo.add("convolution_api");
      if (o.max_lanes > 64) vo.add("max_lanes");
      cov_opt.note(vo);
      const auto go = detail::check_cudnn_options(o);
      problem.clear();
      if (go && !vo.valid()) problem = "accepted, the model finds bad: " + vo.list();
      if (!go) problem = rejection_problem(go.error(), create_op, vo);
      if (!problem.empty())
        bad.add(seed, it,
                "algo_cache_size " + dec(o.algo_cache_size) + ", convolution_api " +
                    dec(static_cast<int>(o.convolution_api)) + ", max_lanes " + dec(o.max_lanes),
                problem);
    }
  }
  // Enumerations with one byte of representation: every value.
  for (unsigned v = 0; v < 256; ++v) {
    verdict vs;
    if (v != static_cast<unsigned>(softmax_algorithm::accurate) &&
        v != static_cast<unsigned>(softmax_algorithm::log))
      vs.add("algorithm");
    const auto gs = detail::check_softmax(shape_op, static_cast<softmax_algorithm>(v));
    std::string problem;
    if (gs && !vs.valid()) problem = "accepted, the model finds bad: " + vs.list();
    if (!gs) problem = rejection_problem(gs.error(), shape_op, vs);
    if (!problem.empty()) bad.add(0, v, "softmax algorithm " + dec(v), problem);

    verdict vd;
    if (v != static_cast<unsigned>(dtype::f32) && v != static_cast<unsigned>(dtype::f16))
      vd.add("x");
    const auto gd = detail::check_dtype(conv_op, "x", static_cast<dtype>(v));
    problem.clear();
    if (gd && !vd.valid()) problem = "accepted, the model finds bad: " + vd.list();
    if (!gd) problem = rejection_problem(gd.error(), conv_op, vd);
    if (!problem.empty()) bad.add(0, v, "dtype " + dec(v), problem);
  }
  bad.finish();
  cov_act.require({"ok", "params.mode", "params.coef"}, 1000);
  cov_eps.require({"ok", "epsilon"}, 1000);
  cov_opt.require({"ok", "algo_cache_size", "convolution_api", "max_lanes"}, 500);
}
