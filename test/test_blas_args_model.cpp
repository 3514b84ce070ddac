// Randomised property test of blas_actor's pure argument checks (detail::check_*) against an
// independent 128-bit model of cuBLAS's indexing: what is accepted stays in bounds and fits.
#include <atomr/cuda/blas_actor.hpp>

#include "int128.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace atomr::cuda;

namespace {

// ------------------------------------------------------------------ arithmetic

// Everything the model computes is in 128 bits (int128.hpp).
using atomr::cuda::test::clamp64;
using atomr::cuda::test::i128;
using atomr::cuda::test::u128;

constexpr int cases = 200'000;  // per function
constexpr i128 int_max = INT_MAX;
constexpr i128 size_max = static_cast<i128>(std::numeric_limits<std::size_t>::max());
constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t i64_min = std::numeric_limits<std::int64_t>::min();

i128 wide(std::size_t v) {
  return static_cast<i128>(v);
}

i128 magnitude(i128 v) {
  return v < 0 ? -v : v;
}

std::string str(i128 v) {
  return atomr::cuda::test::dec(v);
}

std::string hex(std::uint64_t v) {
  char buf[24] = "0x";
  return std::string(buf, std::to_chars(buf + 2, std::end(buf), v, 16).ptr);
}

std::string str(blas_op o) {
  if (o == blas_op::n) return "n";
  if (o == blas_op::t) return "t";
  return std::to_string(static_cast<unsigned>(o));
}

// ------------------------------------------------------------------ the model

/// The model's judgement of one call: the arguments it finds at fault (none: valid).
class verdict {
public:
  void blame(std::string_view arg) {
    if (n_ < args_.size()) args_[n_++] = arg;
  }
  bool valid() const { return n_ == 0; }
  bool blames(std::string_view arg) const {
    return std::find(args_.begin(), args_.begin() + n_, arg) != args_.begin() + n_;
  }
  std::string list() const {
    std::string s = "{";
    for (std::size_t i = 0; i < n_; ++i) s += (i ? ", " : "") + std::string(args_[i]);
    return s + "}";
  }

private:
  std::array<std::string_view, 16> args_{};
  std::size_t n_ = 0;
};

/// cuBLAS's dimensions are int: 0 <= v <= INT_MAX.
bool fits_dim(std::int64_t v) {
  return v >= 0 && v <= int_max;
}

/// x as a cuBLAS dimension, or -1 with `name` blamed.
i128 dim_or_blame(verdict& v, std::int64_t x, std::string_view name) {
  if (fits_dim(x)) return x;
  v.blame(name);
  return -1;
}

/// A leading dimension as cuBLAS needs it: at least max(1, rows of the stored matrix) and an
/// int; the header's 0 asks for exactly that minimum. -1: not valid for these rows.
i128 model_ld(std::int64_t ld, i128 rows) {
  const i128 least = std::max<i128>(1, rows);
  if (ld == 0) return least;
  if (ld < least || ld > int_max) return -1;
  return ld;
}

/// A leading dimension that is bad whatever the rows are (negative, or not an int).
bool ld_bad_anyway(std::int64_t ld) {
  return ld < 0 || ld > int_max;
}

/// How many elements a column-major rows x cols matrix with leading dimension ld occupies from
/// its first element: up to element (rows-1, cols-1), at (rows-1) + (cols-1)*ld. None if empty.
i128 matrix_extent(i128 rows, i128 cols, i128 ld) {
  if (rows == 0 || cols == 0) return 0;
  return (rows - 1) + (cols - 1) * ld + 1;
}

/// How many elements n entries taken every |inc|-th occupy (BLAS visits the same ones, last to
/// first, for a negative inc).
i128 vector_extent(i128 n, i128 inc) {
  if (n == 0) return 0;
  return (n - 1) * magnitude(inc) + 1;
}

/// An increment for cuBLAS: not 0, and its magnitude an int (so that -inc is one too).
bool inc_ok(std::int64_t inc, bool negative_ok) {
  if (inc == 0) return false;
  if (inc < 0 && !negative_ok) return false;
  return magnitude(inc) <= int_max;
}

/// inc for cuBLAS, or 0 with `name` blamed.
i128 inc_or_blame(verdict& v, std::int64_t inc, bool negative_ok, std::string_view name) {
  if (inc_ok(inc, negative_ok)) return inc;
  v.blame(name);
  return 0;
}

/// gemm's shape as the header states it: op(A) m x k, op(B) k x n, C m x n, the stored A being
/// m x k (k x m transposed) and the stored B k x n (n x k transposed). -1: cannot be judged.
struct gemm_model {
  verdict v;
  bool ta = false, tb = false;
  i128 m = -1, n = -1, k = -1;
  i128 a_rows = -1, a_cols = -1, b_rows = -1, b_cols = -1;
  i128 lda = -1, ldb = -1, ldc = -1;
  i128 a = -1, b = -1, c = -1;  // elements each stored matrix occupies
};

gemm_model model_gemm_shape(const gemm_params& p) {
  gemm_model w;
  const unsigned ta = static_cast<unsigned>(p.transa), tb = static_cast<unsigned>(p.transb);
  if (ta > 1) w.v.blame("transa");
  if (tb > 1) w.v.blame("transb");
  w.ta = ta == 1;
  w.tb = tb == 1;
  w.m = dim_or_blame(w.v, p.m, "m");
  w.n = dim_or_blame(w.v, p.n, "n");
  w.k = dim_or_blame(w.v, p.k, "k");
  // One stored matrix: its rows and columns known when its op and both dimensions are.
  const auto stored = [&](bool op_ok, bool t, i128 r, i128 c, std::int64_t ld_in, i128& rows,
                          i128& cols, i128& ld, i128& extent, std::string_view name) {
    if (ld_bad_anyway(ld_in)) w.v.blame(name);
    if (!op_ok || r < 0 || c < 0) return;
    rows = t ? c : r;
    cols = t ? r : c;
    ld = model_ld(ld_in, rows);
    if (ld < 0) {
      if (!w.v.blames(name)) w.v.blame(name);
      return;
    }
    extent = matrix_extent(rows, cols, ld);
  };
  stored(ta <= 1, w.ta, w.m, w.k, p.lda, w.a_rows, w.a_cols, w.lda, w.a, "lda");
  stored(tb <= 1, w.tb, w.k, w.n, p.ldb, w.b_rows, w.b_cols, w.ldb, w.b, "ldb");
  i128 c_rows = -1, c_cols = -1;
  stored(true, false, w.m, w.n, p.ldc, c_rows, c_cols, w.ldc, w.c, "ldc");
  return w;
}

/// A buffer of `size` elements must hold `extent` of them (when the extent can be judged).
void need(verdict& v, std::string_view name, std::size_t size, i128 extent) {
  if (extent >= 0 && wide(size) < extent) v.blame(name);
}

/// gemm_strided_batched: the shape, the count and the resolved strides; -1 cannot be judged.
struct batched_model {
  gemm_model s;
  i128 count = -1, sa = -1, sb = -1, sc = -1;
  i128 a = -1, b = -1, c = -1;  // elements all batches of each occupy
};

batched_model model_batched_shape(const gemm_params& p, const batch_params& bp) {
  batched_model w;
  w.s = model_gemm_shape(p);
  verdict& v = w.s.v;
  w.count = dim_or_blame(v, bp.count, "batch.count");
  // tight_stride: ld * (columns of the stored matrix); any other stride must be >= 0.
  const auto resolve = [&](std::int64_t stride, i128 ld, i128 cols, std::string_view name) {
    if (stride == tight_stride) return ld >= 0 && cols >= 0 ? ld * cols : i128{-1};
    if (stride < 0) {
      v.blame(name);
      return i128{-1};
    }
    return i128{stride};
  };
  w.sa = resolve(bp.stride_a, w.s.lda, w.s.a_cols, "batch.stride_a");
  w.sb = resolve(bp.stride_b, w.s.ldb, w.s.b_cols, "batch.stride_b");
  w.sc = resolve(bp.stride_c, w.s.ldc, w.s.n, "batch.stride_c");
  // The header: C's stride keeps the batches of C apart, >= one C's span. Only two or more
  // non-empty Cs can collide, so one batch (or an empty C) takes any stride.
  if (w.count > 1 && w.s.c > 0 && w.sc >= 0 && w.sc < w.s.c) v.blame("batch.stride_c");
  // Batch i starts at i * stride: all of them occupy (count-1)*stride + one matrix's extent.
  // Beyond SIZE_MAX no buffer can hold them; the stride (times the count) is then at fault too.
  const auto all = [&](i128 one, i128 stride, std::string_view stride_name) {
    if (one < 0 || stride < 0 || w.count < 0) return i128{-1};
    const i128 total = w.count == 0 || one == 0 ? 0 : (w.count - 1) * stride + one;
    if (total > size_max) v.blame(stride_name);
    return total;
  };
  w.a = all(w.s.a, w.sa, "batch.stride_a");
  w.b = all(w.s.b, w.sb, "batch.stride_b");
  w.c = all(w.s.c, w.sc, "batch.stride_c");
  return w;
}

/// gemv: A stored m x n, x of n elements and y of m (swapped with trans = t).
struct gemv_model {
  verdict v;
  bool t = false;
  i128 m = -1, n = -1, lda = -1, incx = 0, incy = 0;
  i128 a = -1, x = -1, y = -1;
};

gemv_model model_gemv_shape(const gemv_params& p) {
  gemv_model w;
  const unsigned t = static_cast<unsigned>(p.trans);
  if (t > 1) w.v.blame("trans");
  w.t = t == 1;
  w.m = dim_or_blame(w.v, p.m, "m");
  w.n = dim_or_blame(w.v, p.n, "n");
  if (ld_bad_anyway(p.lda)) w.v.blame("lda");
  if (w.m >= 0) {
    w.lda = model_ld(p.lda, w.m);
    if (w.lda < 0 && !w.v.blames("lda")) w.v.blame("lda");
  }
  w.incx = inc_or_blame(w.v, p.incx, true, "incx");
  w.incy = inc_or_blame(w.v, p.incy, true, "incy");
  if (w.m >= 0 && w.n >= 0 && w.lda > 0) w.a = matrix_extent(w.m, w.n, w.lda);
  if (t <= 1 && w.m >= 0 && w.n >= 0) {
    const i128 nx = w.t ? w.m : w.n, ny = w.t ? w.n : w.m;
    if (w.incx != 0) w.x = vector_extent(nx, w.incx);
    if (w.incy != 0) w.y = vector_extent(ny, w.incy);
  }
  return w;
}

/// Level 1 over n elements: x every incx-th, y every incy-th (y absent for one-vector ops).
struct level1_model {
  verdict v;
  i128 n = -1, incx = 0, incy = 0;
  i128 x = -1, y = -1;
};

level1_model model_two_vectors(std::int64_t n, std::int64_t incx, std::size_t xs, std::int64_t incy,
                               std::size_t ys) {
  level1_model w;
  w.n = dim_or_blame(w.v, n, "n");
  w.incx = inc_or_blame(w.v, incx, true, "incx");
  w.incy = inc_or_blame(w.v, incy, true, "incy");
  if (w.n >= 0 && w.incx != 0) w.x = vector_extent(w.n, w.incx);
  if (w.n >= 0 && w.incy != 0) w.y = vector_extent(w.n, w.incy);
  need(w.v, "x", xs, w.x);
  need(w.v, "y", ys, w.y);
  return w;
}

/// scal, nrm2, asum, iamax: incx > 0 (the header: BLAS does nothing otherwise), n >= min_n.
level1_model model_one_vector(std::int64_t n, std::int64_t incx, std::size_t xs,
                              std::int64_t min_n) {
  level1_model w;
  w.n = dim_or_blame(w.v, n, "n");
  if (w.n >= 0 && n < min_n) {
    w.n = -1;
    w.v.blame("n");
  }
  w.incx = inc_or_blame(w.v, incx, false, "incx");
  if (fits_dim(n) && w.incx != 0) w.x = vector_extent(n, w.incx);
  need(w.v, "x", xs, w.x);
  return w;
}

// ------------------------------------------------------------------ what cuBLAS would do

/// Highest index touched so far in one buffer, and whether any touch fell outside it.
struct buffer_touches {
  i128 size;
  i128 highest = -1;
  bool outside = false;
  void at(i128 index) {
    if (index < 0 || index >= size) outside = true;
    highest = std::max(highest, index);
  }
};

/// Property 1, on the values a gemm plan hands cuBLAS: each one valid for cuBLAS (dimensions
/// and strides >= 0, ld >= max(1, stored rows)), and the last element of each operand in its
/// buffer. An operand counts as touched whenever its own two dimensions are non-zero (cuBLAS
/// touches less: nothing when m or n is 0), so the check is conservative. Empty: safe.
std::string gemm_safety(bool ta, bool tb, const detail::gemm_plan& g, i128 count, i128 sa, i128 sb,
                        i128 sc, std::size_t as, std::size_t bs, std::size_t cs) {
  const i128 m = g.m, n = g.n, k = g.k;
  if (m < 0 || n < 0 || k < 0 || count < 0) return "negative dimension or count for cuBLAS";
  if (sa < 0 || sb < 0 || sc < 0) return "negative stride for cuBLAS";
  if (g.lda < std::max<i128>(1, ta ? k : m)) return "lda below cuBLAS's minimum";
  if (g.ldb < std::max<i128>(1, tb ? n : k)) return "ldb below cuBLAS's minimum";
  if (g.ldc < std::max<i128>(1, m)) return "ldc below cuBLAS's minimum";
  if (count == 0) return {};
  const i128 last = count - 1;
  if (m > 0 && k > 0) {
    const i128 top = last * sa + (ta ? (k - 1) + (m - 1) * g.lda : (m - 1) + (k - 1) * g.lda);
    if (top >= wide(as)) return "A touched at " + str(top) + ", a has " + str(wide(as));
  }
  if (k > 0 && n > 0) {
    const i128 top = last * sb + (tb ? (n - 1) + (k - 1) * g.ldb : (k - 1) + (n - 1) * g.ldb);
    if (top >= wide(bs)) return "B touched at " + str(top) + ", b has " + str(wide(bs));
  }
  if (m > 0 && n > 0) {
    const i128 one = (m - 1) + (n - 1) * g.ldc;
    const i128 top = last * sc + one;
    if (top >= wide(cs)) return "C touched at " + str(top) + ", c has " + str(wide(cs));
    // Batch i's C lies in [i*sc, i*sc + one]: a stride past one C keeps them apart.
    if (count > 1 && sc <= one) return "batches of C may overlap (stride_c " + str(sc) + ")";
  }
  return {};
}

/// The same, element by element, for small problems: every (batch, i, j, l) of
/// C_b(i,j) += op(A_b)(i,l) op(B_b)(l,j) indexed as column-major BLAS does, and each element of
/// C written by one batch only. False when too big to walk.
bool gemm_walk(bool ta, bool tb, const detail::gemm_plan& g, i128 count, i128 sa, i128 sb, i128 sc,
               std::size_t as, std::size_t bs, std::size_t cs, std::string& problem) {
  const i128 m = g.m, n = g.n, k = g.k;
  if (m > 6 || n > 6 || k > 6 || count > 3 || m * n * std::max<i128>(k, 1) * count > 400)
    return false;
  buffer_touches a{wide(as)}, b{wide(bs)}, c{wide(cs)};
  // Which batch wrote each element of C (only where C is small enough to map).
  const i128 c_top =
      count > 0 && m > 0 && n > 0 ? (count - 1) * sc + (m - 1) + (n - 1) * g.ldc : -1;
  std::vector<int> writer;
  if (c_top >= 0 && c_top < 4096) writer.assign(static_cast<std::size_t>(c_top) + 1, -1);
  for (i128 batch = 0; batch < count; ++batch)
    for (i128 j = 0; j < n; ++j)
      for (i128 i = 0; i < m; ++i) {
        const i128 ci = batch * sc + i + j * g.ldc;
        c.at(ci);
        if (!writer.empty()) {
          int& w = writer[static_cast<std::size_t>(ci)];
          if (w >= 0 && w != static_cast<int>(batch))
            problem = "C element " + str(ci) + " written by batches " + std::to_string(w) +
                      " and " + str(batch);
          w = static_cast<int>(batch);
        }
        for (i128 l = 0; l < k; ++l) {
          a.at(batch * sa + (ta ? l + i * g.lda : i + l * g.lda));
          b.at(batch * sb + (tb ? j + l * g.ldb : l + j * g.ldb));
        }
      }
  if (a.outside) problem = "walk: A touched at " + str(a.highest) + ", a has " + str(a.size);
  if (b.outside) problem = "walk: B touched at " + str(b.highest) + ", b has " + str(b.size);
  if (c.outside) problem = "walk: C touched at " + str(c.highest) + ", c has " + str(c.size);
  return true;
}

/// BLAS's walk over n entries with step inc: entry i at kx + i*inc, kx = 0 for inc > 0 and
/// (1-n)*inc for inc < 0 (the same elements, last to first).
void vector_walk(i128 n, i128 inc, buffer_touches& t) {
  const i128 kx = inc > 0 ? 0 : (1 - n) * inc;
  for (i128 i = 0; i < n; ++i) t.at(kx + i * inc);
}

/// Property 1 for a vector cuBLAS walks: inc != 0 and the farthest entry inside the buffer.
std::string vector_safety(std::string_view name, i128 n, i128 inc, std::size_t size) {
  if (n < 0) return "negative n for cuBLAS";
  if (inc == 0) return std::string(name) + ": increment 0 for cuBLAS";
  if (n == 0) return {};
  const i128 top = (n - 1) * magnitude(inc);
  if (top >= wide(size))
    return std::string(name) + " touched at " + str(top) + ", has " + str(wide(size));
  return {};
}

// ------------------------------------------------------------------ random cases

/// Random arguments biased to the edges. Each case draws a "wildness": how often an argument is
/// drawn from the bad side (negative, too big for int, one below a minimum...) instead of the
/// good side (0, 1, small, exact minimums, the largest valid values).
class gen {
public:
  explicit gen(std::uint64_t seed) : rng_(seed) {}

  void next_case() {
    static constexpr unsigned levels[] = {0, 3, 10, 40};
    wild_ = levels[pick(std::size(levels))];
  }
  unsigned pick(std::size_t n) { return static_cast<unsigned>(rng_() % n); }
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_);
  }
  std::int64_t any() { return static_cast<std::int64_t>(rng_()); }
  bool wild() { return pick(100) < wild_; }

  /// The edges of int32 and int64.
  std::int64_t edge() {
    static constexpr std::int64_t values[] = {0,
                                              1,
                                              -1,
                                              2,
                                              -2,
                                              INT_MAX - 1,
                                              INT_MAX,
                                              std::int64_t{INT_MAX} + 1,
                                              std::int64_t{INT_MAX} + 2,
                                              -std::int64_t{INT_MAX},
                                              INT_MIN,
                                              std::int64_t{INT_MIN} - 1,
                                              std::int64_t{UINT_MAX},
                                              std::int64_t{1} << 32,
                                              std::int64_t{1} << 62,
                                              i64_max - 1,
                                              i64_max,
                                              i64_min + 1,
                                              i64_min};
    return values[pick(std::size(values))];
  }

  blas_op op() {
    if (wild() && pick(3) == 0) return static_cast<blas_op>(between(2, 255));
    return pick(2) ? blas_op::t : blas_op::n;
  }

  /// A dimension or count: mostly 0, 1 and small; sometimes the largest int.
  std::int64_t dim() {
    if (wild()) {
      const unsigned w = pick(4);
      if (w == 0) return edge();
      if (w == 1) return -between(1, 3);
      if (w == 2) return between(INT_MAX - 2, std::int64_t{INT_MAX} + 2);
      return any();
    }
    const unsigned c = pick(16);
    if (c < 2) return 0;
    if (c < 4) return 1;
    if (c == 4) return between(0, 40);
    if (c == 5) return INT_MAX;
    if (c == 6) return between(0, INT_MAX);
    return between(0, 6);
  }

  /// A leading dimension for a stored matrix of `rows` rows (-1: rows not valid): 0 (tight),
  /// the minimum, one below or above it, INT_MAX...
  std::int64_t ld(i128 rows) {
    const std::int64_t least = rows >= 1 && rows <= int_max ? static_cast<std::int64_t>(rows) : 1;
    if (wild()) {
      const unsigned w = pick(5);
      if (w == 0) return least - 1;
      if (w == 1) return -between(1, 3);
      if (w == 2) return edge();
      if (w == 3) return between(0, least + 2);
      return any();
    }
    const unsigned c = pick(10);
    if (c < 4) return 0;
    if (c < 6) return least;
    if (c == 6) return least + 1;
    if (c == 7) return least + between(0, 7);
    if (c == 8) return INT_MAX;
    return least + between(0, 2);
  }

  /// An increment: mostly +-1 and small, sometimes the largest int; 0 and the edges when wild.
  std::int64_t inc(bool negative_ok) {
    if (wild()) {
      const unsigned w = pick(4);
      if (w == 0) return 0;
      if (w == 1) return edge();
      if (w == 2) return -between(1, 3);
      return any();
    }
    const unsigned c = pick(10);
    std::int64_t v = between(1, 3);
    if (c < 4) v = 1;
    if (c == 4) v = between(1, 6);
    if (c == 5) v = between(1, 40);
    if (c == 6) v = INT_MAX;
    if (c == 7) v = between(1, INT_MAX);
    return negative_ok && pick(2) ? -v : v;
  }

  /// A buffer's element count around the `extent` it needs (-1: unknown): exactly it, one
  /// less, one more, 0, SIZE_MAX...
  std::size_t size(i128 extent) {
    const i128 e = extent >= 0 ? extent : between(0, 64);
    i128 v = e + between(0, 2);
    if (wild()) {
      const unsigned w = pick(5);
      if (w == 0) v = e - 1;
      if (w == 1) v = 0;
      if (w == 2) v = between(0, 64);
      if (w == 3) v = e - between(1, 3);
      if (w == 4) v = static_cast<i128>(rng_() >> pick(64));
    } else {
      const unsigned c = pick(8);
      if (c < 4) v = e;
      if (c == 4) v = e + 1;
      if (c == 5) v = e + between(0, 100);
      if (c == 6) v = size_max - between(0, 1);
    }
    return static_cast<std::size_t>(std::clamp<i128>(v, 0, size_max));
  }

  /// A batch stride around one matrix's extent `one` and the tight stride `tight` (-1: unknown).
  std::int64_t stride(i128 one, i128 tight) {
    const i128 o = one >= 0 ? one : between(0, 20);
    const i128 t = tight >= 0 ? tight : o;
    if (wild()) {
      const unsigned w = pick(5);
      if (w == 0) return clamp64(o - 1);
      if (w == 1) return -between(2, 5);
      if (w == 2) return edge();
      if (w == 3) return any();
      return between(0, 2);
    }
    const unsigned c = pick(10);
    if (c < 3) return tight_stride;
    if (c == 3) return clamp64(o);
    if (c == 4) return clamp64(o + between(1, 5));
    if (c == 5) return 0;  // one matrix for every batch (C: only with one batch or an empty C)
    if (c == 6) return clamp64(t);
    if (c == 7) return clamp64(t + between(0, 3));
    if (c == 8) return between(0, i64_max);
    return clamp64(o + between(0, 1));
  }

  /// gemm's parameters, leading dimensions drawn around the stored matrices' rows.
  gemm_params gemm() {
    gemm_params p;
    p.transa = op();
    p.transb = op();
    p.m = dim();
    p.n = dim();
    p.k = dim();
    const auto rows = [](std::int64_t r) { return fits_dim(r) ? i128{r} : i128{-1}; };
    p.lda = ld(rows(p.transa == blas_op::t ? p.k : p.m));
    p.ldb = ld(rows(p.transb == blas_op::t ? p.n : p.k));
    p.ldc = ld(rows(p.m));
    p.alpha = static_cast<double>(between(-2, 2));
    p.beta = static_cast<double>(between(-1, 1));
    return p;
  }

private:
  std::mt19937_64 rng_;
  unsigned wild_ = 0;
};

// ------------------------------------------------------------------ judging

std::string describe(const gemm_params& p) {
  return "transa=" + str(p.transa) + " transb=" + str(p.transb) + " m=" + str(p.m) +
         " n=" + str(p.n) + " k=" + str(p.k) + " lda=" + str(p.lda) + " ldb=" + str(p.ldb) +
         " ldc=" + str(p.ldc);
}

std::string describe(const batch_params& b) {
  return "count=" + str(b.count) + " stride_a=" + str(b.stride_a) + " stride_b=" + str(b.stride_b) +
         " stride_c=" + str(b.stride_c);
}

std::string describe(const detail::gemm_plan& g) {
  return "plan{m=" + str(g.m) + " n=" + str(g.n) + " k=" + str(g.k) + " lda=" + str(g.lda) +
         " ldb=" + str(g.ldb) + " ldc=" + str(g.ldc) + " a_elems=" + str(wide(g.a_elems)) +
         " b_elems=" + str(wide(g.b_elems)) + " c_elems=" + str(wide(g.c_elems)) + "}";
}

std::string describe(const gemm_model& w) {
  return "model{m=" + str(w.m) + " n=" + str(w.n) + " k=" + str(w.k) + " lda=" + str(w.lda) +
         " ldb=" + str(w.ldb) + " ldc=" + str(w.ldc) + " a=" + str(w.a) + " b=" + str(w.b) +
         " c=" + str(w.c) + "}";
}

std::string describe(const detail::level1_plan& l) {
  return "plan{n=" + str(l.n) + " incx=" + str(l.incx) + " incy=" + str(l.incy) +
         " x_elems=" + str(wide(l.x_elems)) + " y_elems=" + str(wide(l.y_elems)) + "}";
}

/// Counts one function's outcomes and keeps the first failed property in full.
struct tally {
  tally(std::string_view f, std::uint64_t s) : function(f), seed(s) {}
  std::string_view function;
  std::uint64_t seed;
  std::uint64_t accepted = 0, rejected = 0, walked = 0, failures = 0;
  std::string first;
  std::map<std::string, std::uint64_t, std::less<>> named;  // rejections per argument named

  /// A failed property for case `i`; `context` (parameters, plan, message) built only here.
  template <class Context>
  void fail(int i, const std::string& problem, Context&& context) {
    if (failures++ == 0)
      first = std::string(function) + ", seed " + hex(seed) + ", case " + std::to_string(i) + ": " +
              problem + "\n  " + context();
  }

  /// Property 2 (and 3): a rejection is invalid_argument from this library, its message
  /// "op: arg why" names an argument the model finds at fault, and the model agrees.
  template <class T, class Context>
  void rejection(int i, const result<T>& r, std::string_view op, const verdict& v,
                 Context&& context) {
    ++rejected;
    const auto& e = r.error();
    const std::string& m = e.message();
    const std::string prefix = std::string(op) + ": ";
    std::string problem;
    if (e.code() != errc::invalid_argument) {
      problem = "error code is " + std::string(to_string(e.code())) + ", not invalid_argument";
    } else if (m.compare(0, prefix.size(), prefix) != 0) {
      problem = "message does not start with \"" + prefix + "\"";
    } else {
      const auto end = m.find(' ', prefix.size());
      const std::string arg =
          m.substr(prefix.size(), end == std::string::npos ? end : end - prefix.size());
      ++named[arg];
      if (v.valid())
        problem = "the library rejects what the model accepts";
      else if (!v.blames(arg))
        problem = "the library names " + arg + ", the model faults " + v.list();
    }
    if (!problem.empty())
      fail(i, problem, [&] { return context() + "\n  library: \"" + m + "\""; });
  }

  /// Properties 1 and 3 for an accepted case: `problem` holds what failed on the plan (unsafe,
  /// or different from the model's); the model must find the arguments valid too.
  template <class Context>
  void acceptance(int i, const verdict& v, std::string problem, Context&& context) {
    ++accepted;
    if (!v.valid())
      problem = "the library accepts what the model rejects (model faults " + v.list() + ")" +
                (problem.empty() ? "" : "; " + problem);
    if (!problem.empty()) fail(i, problem, context);
  }

  /// The verdict: no failed case, both sides reached, and every argument in `arguments`
  /// named by some rejection (each rule of the function was exercised).
  void finish(std::initializer_list<std::string_view> arguments) const {
    std::string seen;
    for (const auto& [arg, n] : named) seen += " " + arg + ":" + std::to_string(n);
    INFO(function << ": " << accepted << " accepted, " << rejected << " rejected, " << walked
                  << " walked element by element; rejections by argument:" << seen);
    CHECK_MESSAGE(failures == 0, failures << " failed cases; the first:\n" << first);
    CHECK(accepted > cases / 10);
    CHECK(rejected > cases / 10);
    for (const auto arg : arguments) {
      CAPTURE(arg);
      CHECK(named.find(arg) != named.end());
    }
  }
};

/// The model's gemm plan against the library's; empty when equal.
std::string plan_difference(const detail::gemm_plan& g, const gemm_model& w, i128 a, i128 b,
                            i128 c) {
  if (g.m != w.m || g.n != w.n || g.k != w.k || g.lda != w.lda || g.ldb != w.ldb ||
      g.ldc != w.ldc || wide(g.a_elems) != a || wide(g.b_elems) != b || wide(g.c_elems) != c)
    return "the plan differs from the model's: " + describe(g) + " vs " + describe(w) +
           " (all batches: a=" + str(a) + " b=" + str(b) + " c=" + str(c) + ")";
  return {};
}

/// Records `more` unless a problem was found already (the first is the most telling).
void also(std::string& problem, std::string more) {
  if (problem.empty()) problem = std::move(more);
}

}  // namespace

// ------------------------------------------------------------------ gemm

TEST_CASE("blas args model: check_gemm agrees with the model and stays in bounds") {
  tally t{"check_gemm", 0x6e3301};
  gen g(t.seed);
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    const gemm_params p = g.gemm();
    gemm_model w = model_gemm_shape(p);
    const std::size_t as = g.size(w.a), bs = g.size(w.b), cs = g.size(w.c);
    need(w.v, "a", as, w.a);
    need(w.v, "b", bs, w.b);
    need(w.v, "c", cs, w.c);
    // The op name only labels messages; gemm_fused passes its own.
    const bool own_name = g.pick(2) == 0;
    const std::string_view op = own_name ? "my_gemm" : "gemm";
    const auto r =
        own_name ? detail::check_gemm(p, as, bs, cs, op) : detail::check_gemm(p, as, bs, cs);
    const auto context = [&] {
      return describe(p) + " a_size=" + str(wide(as)) + " b_size=" + str(wide(bs)) +
             " c_size=" + str(wide(cs)) + " op=" + std::string(op);
    };
    if (!r) {
      t.rejection(i, r, op, w.v, context);
      continue;
    }
    const auto& plan = r.value();
    std::string problem = gemm_safety(w.ta, w.tb, plan, 1, 0, 0, 0, as, bs, cs);
    if (gemm_walk(w.ta, w.tb, plan, 1, 0, 0, 0, as, bs, cs, problem)) ++t.walked;
    if (w.v.valid()) also(problem, plan_difference(plan, w, w.a, w.b, w.c));
    t.acceptance(i, w.v, problem, [&] { return context() + "\n  library: " + describe(plan); });
  }
  t.finish({"transa", "transb", "m", "n", "k", "lda", "ldb", "ldc", "a", "b", "c"});
  CHECK(t.walked > cases / 10);
}

TEST_CASE("blas args model: check_gemm_fused adds the epilogue and its bias") {
  // The bias epilogues, and no other value of the enum's byte, take a bias.
  for (unsigned e = 0; e < 256; ++e) {
    CAPTURE(e);
    CHECK(detail::epilogue_has_bias(static_cast<gemm_epilogue>(e)) == (e == 0 || e == 3 || e == 4));
  }
  tally t{"check_gemm_fused", 0x6e3302};
  gen g(t.seed);
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    const gemm_params p = g.gemm();
    const unsigned eu = g.wild() && g.pick(3) == 0 ? static_cast<unsigned>(g.between(5, 255))
                                                   : static_cast<unsigned>(g.between(0, 4));
    const auto e = static_cast<gemm_epilogue>(eu);
    gemm_model w = model_gemm_shape(p);
    const std::size_t as = g.size(w.a), bs = g.size(w.b), cs = g.size(w.c);
    // One bias value per row of C for the bias epilogues, none for relu and gelu.
    const bool with_bias = eu == 0 || eu == 3 || eu == 4;
    std::size_t bias;
    if (g.wild())
      bias = g.size(w.m);  // anything around m
    else
      bias = with_bias ? static_cast<std::size_t>(std::max<i128>(w.m, 0)) : 0;
    if (eu > 4) w.v.blame("epilogue");
    need(w.v, "a", as, w.a);
    need(w.v, "b", bs, w.b);
    need(w.v, "c", cs, w.c);
    if (eu <= 4 && !with_bias && bias != 0) w.v.blame("bias");
    if (eu <= 4 && with_bias && w.m >= 0 && wide(bias) != w.m) w.v.blame("bias");
    const auto r = detail::check_gemm_fused(p, e, as, bs, bias, cs);
    const auto context = [&] {
      return describe(p) + " epilogue=" + std::to_string(eu) + " a_size=" + str(wide(as)) +
             " b_size=" + str(wide(bs)) + " bias_size=" + str(wide(bias)) +
             " c_size=" + str(wide(cs));
    };
    if (!r) {
      t.rejection(i, r, "gemm_fused", w.v, context);
      continue;
    }
    const auto& plan = r.value();
    std::string problem = gemm_safety(w.ta, w.tb, plan, 1, 0, 0, 0, as, bs, cs);
    if (gemm_walk(w.ta, w.tb, plan, 1, 0, 0, 0, as, bs, cs, problem)) ++t.walked;
    // The epilogue reads bias[row] for every row of C, and no bias at all without one.
    if (eu > 4) also(problem, "an unknown epilogue reached cuBLASLt");
    if (with_bias && wide(bias) < plan.m) also(problem, "bias shorter than m");
    if (!with_bias && bias != 0) also(problem, "a bias passed to an epilogue without one");
    if (w.v.valid()) also(problem, plan_difference(plan, w, w.a, w.b, w.c));
    t.acceptance(i, w.v, problem, [&] { return context() + "\n  library: " + describe(plan); });
  }
  t.finish({"epilogue", "bias", "m", "lda", "ldc", "a", "b", "c"});
}

TEST_CASE("blas args model: check_gemm_batched keeps every batch in bounds and C's apart") {
  tally t{"check_gemm_batched", 0x6e3303};
  gen g(t.seed);
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    const gemm_params p = g.gemm();
    // Counts 0 and 1 (any C stride), a few (C's stride matters), or anything.
    batch_params bp;
    const unsigned kind = g.pick(8);
    bp.count = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? g.dim() : g.between(2, 4);
    // Strides drawn around one matrix's extent and its tight stride.
    const gemm_model shape = model_gemm_shape(p);
    const auto tight = [](i128 ld, i128 cols) { return ld >= 0 && cols >= 0 ? ld * cols : -1; };
    bp.stride_a = g.stride(shape.a, tight(shape.lda, shape.a_cols));
    bp.stride_b = g.stride(shape.b, tight(shape.ldb, shape.b_cols));
    bp.stride_c = g.stride(shape.c, tight(shape.ldc, shape.n));
    batched_model w = model_batched_shape(p, bp);
    const std::size_t as = g.size(w.a), bs = g.size(w.b), cs = g.size(w.c);
    need(w.s.v, "a", as, w.a);
    need(w.s.v, "b", bs, w.b);
    need(w.s.v, "c", cs, w.c);
    const auto r = detail::check_gemm_batched(p, bp, as, bs, cs);
    const auto context = [&] {
      return describe(p) + " " + describe(bp) + " a_size=" + str(wide(as)) +
             " b_size=" + str(wide(bs)) + " c_size=" + str(wide(cs));
    };
    if (!r) {
      t.rejection(i, r, "gemm_strided_batched", w.s.v, context);
      continue;
    }
    const auto& plan = r.value();
    const auto& gp = plan.g;
    std::string problem = gemm_safety(w.s.ta, w.s.tb, gp, plan.count, plan.stride_a, plan.stride_b,
                                      plan.stride_c, as, bs, cs);
    if (gemm_walk(w.s.ta, w.s.tb, gp, plan.count, plan.stride_a, plan.stride_b, plan.stride_c, as,
                  bs, cs, problem))
      ++t.walked;
    if (w.s.v.valid()) {
      also(problem, plan_difference(gp, w.s, w.a, w.b, w.c));
      if (plan.count != w.count || plan.stride_a != w.sa || plan.stride_b != w.sb ||
          plan.stride_c != w.sc)
        also(problem, "count or strides differ from the model's: count=" + str(plan.count) +
                          " strides " + str(plan.stride_a) + "/" + str(plan.stride_b) + "/" +
                          str(plan.stride_c) + " vs model count=" + str(w.count) + " strides " +
                          str(w.sa) + "/" + str(w.sb) + "/" + str(w.sc));
    }
    t.acceptance(i, w.s.v, problem, [&] {
      return context() + "\n  library: " + describe(gp) + " count=" + str(plan.count) +
             " strides " + str(plan.stride_a) + "/" + str(plan.stride_b) + "/" + str(plan.stride_c);
    });
  }
  t.finish({"batch.count", "batch.stride_a", "batch.stride_b", "batch.stride_c", "m", "ldb", "a",
            "b", "c"});
  CHECK(t.walked > cases / 20);
}

// ------------------------------------------------------------------ gemv

TEST_CASE("blas args model: check_gemv agrees with the model and stays in bounds") {
  tally t{"check_gemv", 0x6e3304};
  gen g(t.seed);
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    gemv_params p;
    p.trans = g.op();
    p.m = g.dim();
    p.n = g.dim();
    p.lda = g.ld(fits_dim(p.m) ? i128{p.m} : i128{-1});
    p.incx = g.inc(true);
    p.incy = g.inc(true);
    gemv_model w = model_gemv_shape(p);
    const std::size_t as = g.size(w.a), xs = g.size(w.x), ys = g.size(w.y);
    need(w.v, "a", as, w.a);
    need(w.v, "x", xs, w.x);
    need(w.v, "y", ys, w.y);
    const auto r = detail::check_gemv(p, as, xs, ys);
    const auto context = [&] {
      return "trans=" + str(p.trans) + " m=" + str(p.m) + " n=" + str(p.n) + " lda=" + str(p.lda) +
             " incx=" + str(p.incx) + " incy=" + str(p.incy) + " a_size=" + str(wide(as)) +
             " x_size=" + str(wide(xs)) + " y_size=" + str(wide(ys));
    };
    if (!r) {
      t.rejection(i, r, "gemv", w.v, context);
      continue;
    }
    const auto& l = r.value();
    std::string problem;
    const i128 m = l.m, n = l.n;
    const i128 nx = w.t ? m : n, ny = w.t ? n : m;
    if (m < 0 || n < 0) problem = "negative dimension for cuBLAS";
    if (l.lda < std::max<i128>(1, m)) also(problem, "lda below cuBLAS's minimum");
    // A's last element; x and y whenever they have entries (conservative: cuBLAS returns at
    // once when m or n is 0).
    if (problem.empty() && m > 0 && n > 0 && (m - 1) + (n - 1) * l.lda >= wide(as))
      problem = "A touched beyond a";
    also(problem, vector_safety("x", nx, l.incx, xs));
    also(problem, vector_safety("y", ny, l.incy, ys));
    if (problem.empty() && m <= 6 && n <= 6 && magnitude(l.incx) <= 8 && magnitude(l.incy) <= 8) {
      ++t.walked;
      buffer_touches a{wide(as)}, x{wide(xs)}, y{wide(ys)};
      for (i128 j = 0; j < n; ++j)
        for (i128 r2 = 0; r2 < m; ++r2) a.at(r2 + j * l.lda);
      vector_walk(nx, l.incx, x);
      vector_walk(ny, l.incy, y);
      if (a.outside || x.outside || y.outside) problem = "walk: an element outside its buffer";
    }
    if (w.v.valid() &&
        (l.m != w.m || l.n != w.n || l.lda != w.lda || l.incx != w.incx || l.incy != w.incy ||
         wide(l.a_elems) != w.a || wide(l.x_elems) != w.x || wide(l.y_elems) != w.y))
      also(problem, "the plan differs from the model's: model lda=" + str(w.lda) +
                        " a=" + str(w.a) + " x=" + str(w.x) + " y=" + str(w.y));
    t.acceptance(i, w.v, problem, [&] {
      return context() + "\n  library: plan{m=" + str(l.m) + " n=" + str(l.n) +
             " lda=" + str(l.lda) + " incx=" + str(l.incx) + " incy=" + str(l.incy) +
             " a_elems=" + str(wide(l.a_elems)) + " x_elems=" + str(wide(l.x_elems)) +
             " y_elems=" + str(wide(l.y_elems)) + "}";
    });
  }
  t.finish({"trans", "m", "n", "lda", "incx", "incy", "a", "x", "y"});
  CHECK(t.walked > cases / 20);
}

// ------------------------------------------------------------------ level 1

namespace {

/// axpy and dot share their rules; `check` is the function under test.
template <class Check>
void two_vector_property(std::string_view op, std::uint64_t seed, Check&& check) {
  tally t{op, seed};
  gen g(t.seed);
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    const std::int64_t n = g.dim(), incx = g.inc(true), incy = g.inc(true);
    // Sizes around what the model finds the vectors need.
    const level1_model probe = model_two_vectors(n, incx, 0, incy, 0);
    const std::size_t xs = g.size(probe.x), ys = g.size(probe.y);
    const level1_model w = model_two_vectors(n, incx, xs, incy, ys);
    const auto r = check(n, incx, xs, incy, ys);
    const auto context = [&] {
      return "n=" + str(n) + " incx=" + str(incx) + " x_size=" + str(wide(xs)) +
             " incy=" + str(incy) + " y_size=" + str(wide(ys));
    };
    if (!r) {
      t.rejection(i, r, op, w.v, context);
      continue;
    }
    const auto& l = r.value();
    std::string problem = vector_safety("x", l.n, l.incx, xs);
    also(problem, vector_safety("y", l.n, l.incy, ys));
    if (problem.empty() && l.n <= 64 && magnitude(l.incx) <= 8 && magnitude(l.incy) <= 8) {
      ++t.walked;
      buffer_touches x{wide(xs)}, y{wide(ys)};
      vector_walk(l.n, l.incx, x);
      vector_walk(l.n, l.incy, y);
      if (x.outside || y.outside) problem = "walk: an element outside its buffer";
    }
    if (w.v.valid() && (l.n != w.n || l.incx != w.incx || l.incy != w.incy ||
                        wide(l.x_elems) != w.x || wide(l.y_elems) != w.y))
      also(problem, "the plan differs from the model's: model x=" + str(w.x) + " y=" + str(w.y));
    t.acceptance(i, w.v, problem, [&] { return context() + "\n  library: " + describe(l); });
  }
  t.finish({"n", "incx", "incy", "x", "y"});
  CHECK(t.walked > cases / 20);
}

}  // namespace

TEST_CASE("blas args model: check_axpy agrees with the model, negative increments included") {
  two_vector_property("axpy", 0x6e3305, [](auto... a) { return detail::check_axpy(a...); });
}

TEST_CASE("blas args model: check_dot agrees with the model, negative increments included") {
  two_vector_property("dot", 0x6e3306, [](auto... a) { return detail::check_dot(a...); });
}

TEST_CASE("blas args model: check_vector_op (scal, nrm2, asum, iamax) agrees with the model") {
  tally t{"check_vector_op", 0x6e3307};
  gen g(t.seed);
  static constexpr std::string_view ops[] = {"scal", "nrm2", "asum", "iamax"};
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    const unsigned which = g.pick(std::size(ops));
    const std::string_view op = ops[which];
    // What the actor passes (iamax needs an element), or an arbitrary minimum.
    std::int64_t min_n = which == 3 ? 1 : 0;
    if (g.pick(8) == 0) min_n = g.pick(2) ? g.edge() : g.between(-3, 8);
    const std::int64_t n = g.dim(), incx = g.inc(false);
    const std::size_t xs = g.size(model_one_vector(n, incx, 0, min_n).x);
    const level1_model w = model_one_vector(n, incx, xs, min_n);
    const bool default_min = min_n == 0 && g.pick(2) == 0;
    const auto r = default_min ? detail::check_vector_op(op, n, incx, xs)
                               : detail::check_vector_op(op, n, incx, xs, min_n);
    const auto context = [&] {
      return "op=" + std::string(op) + " n=" + str(n) + " incx=" + str(incx) +
             " x_size=" + str(wide(xs)) + " min_n=" + str(min_n) +
             (default_min ? " (defaulted)" : "");
    };
    if (!r) {
      t.rejection(i, r, op, w.v, context);
      continue;
    }
    const auto& l = r.value();
    std::string problem = vector_safety("x", l.n, l.incx, xs);
    if (l.incx <= 0) also(problem, "incx not > 0");
    // iamax answers a 1-based int index, so n must fit (it does: n is an int) and be >= min_n.
    if (l.n < min_n) also(problem, "n below min_n");
    if (problem.empty() && l.n <= 64 && l.incx <= 8) {
      ++t.walked;
      buffer_touches x{wide(xs)};
      vector_walk(l.n, l.incx, x);
      if (x.outside) problem = "walk: an element outside x";
    }
    if (w.v.valid() && (l.n != w.n || l.incx != w.incx || wide(l.x_elems) != w.x))
      also(problem, "the plan differs from the model's: model x=" + str(w.x));
    t.acceptance(i, w.v, problem, [&] { return context() + "\n  library: " + describe(l); });
  }
  t.finish({"n", "incx", "x"});
  CHECK(t.walked > cases / 20);
}

// ------------------------------------------------------------------ check_disjoint

TEST_CASE("blas args model: check_disjoint rejects exactly the overlapping ranges") {
  // Ranges of one allocation, so begin + count never passes SIZE_MAX (the callers pass a
  // view's offset and at most its size). Near SIZE_MAX, at 0, adjacent, off by one, nested.
  tally t{"check_disjoint", 0x6e3308};
  gen g(t.seed);
  struct names {
    std::string_view op, out, in;
  };
  static constexpr names uses[] = {{"gemm", "c", "a"},          {"gemm", "c", "b"},
                                   {"gemm_fused", "c", "bias"}, {"gemv", "y", "x"},
                                   {"axpy", "y", "x"},          {"gemm_strided_batched", "c", "a"}};
  const auto count = [&]() -> i128 {
    const unsigned c = g.pick(6);
    if (c == 0) return 0;
    if (c == 1) return 1;
    if (c == 2) return size_max - g.between(0, 1);  // clamped below to what fits
    if (c == 3) return g.between(0, i64_max);
    return g.between(2, 12);
  };
  for (int i = 0; i < cases; ++i) {
    g.next_case();
    const names& u = uses[g.pick(std::size(uses))];
    i128 oc = count(), ic = count();
    const unsigned where = g.pick(4);
    i128 ob = g.between(0, 40);
    if (where == 0) ob = g.between(0, 3);
    if (where == 1) ob = size_max - g.between(0, 16);
    if (where == 2) ob = g.between(0, i64_max);
    // The input's start relative to the output's: just past its end, on its last element,
    // ending just before or on its first, the same start, near it, near SIZE_MAX, or small.
    const unsigned rel = g.pick(8);
    i128 ib = g.between(0, 40);
    if (rel == 0) ib = ob + oc;
    if (rel == 1) ib = ob + oc - 1;
    if (rel == 2) ib = ob - ic;
    if (rel == 3) ib = ob - ic + 1;
    if (rel == 4) ib = ob;
    if (rel == 5) ib = ob + g.between(-3, 3);
    if (rel == 6) ib = size_max - g.between(0, 16);
    // Keep both ranges inside [0, SIZE_MAX]: clamp the starts, then the counts.
    ob = std::clamp<i128>(ob, 0, size_max);
    ib = std::clamp<i128>(ib, 0, size_max);
    oc = std::min(oc, size_max - ob);
    ic = std::min(ic, size_max - ib);
    // The model: some element lies in both [ob, ob+oc) and [ib, ib+ic).
    const i128 lo = std::max(ob, ib), hi = std::min(ob + oc, ib + ic);
    const bool overlap = lo < hi;
    verdict v;
    if (overlap) v.blame(u.out);
    const auto r = detail::check_disjoint(
        u.op, u.out, static_cast<std::size_t>(ob), static_cast<std::size_t>(oc), u.in,
        static_cast<std::size_t>(ib), static_cast<std::size_t>(ic));
    const auto context = [&] {
      return "op=" + std::string(u.op) + " out=" + std::string(u.out) + " [" + str(ob) + ", +" +
             str(oc) + ") in=" + std::string(u.in) + " [" + str(ib) + ", +" + str(ic) + ")";
    };
    // Element by element where small: every element of the output against the input's range.
    if (oc <= 16) {
      ++t.walked;
      bool shared = false;
      for (i128 e = ob; e < ob + oc; ++e) shared = shared || (e >= ib && e - ib < ic);
      if (shared != overlap) t.fail(i, "the model disagrees with the element walk", context);
    }
    if (!r) {
      t.rejection(i, r, u.op, v, context);
      if (r.error().message().find("overlaps " + std::string(u.in)) == std::string::npos)
        t.fail(i, "the message does not name the input",
               [&] { return context() + "\n  library: \"" + r.error().message() + "\""; });
      continue;
    }
    t.acceptance(i, v, overlap ? "overlapping ranges accepted" : "", context);
  }
  t.finish({"c", "y"});
}
