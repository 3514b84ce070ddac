// blas_actor on the GPU: every operation against a double-precision CPU
// reference, random inputs (never zero), outputs filled with NaN first.
#include <atomr/cuda.hpp>
#include <atomr/cuda/blas_actor.hpp>

#include "gpu_fixture.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::gpu_fixture;

namespace {

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, half>)
    return __float2half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bfloat16>)
    return __float2bfloat16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, half>)
    return static_cast<double>(__half2float(v));
  else if constexpr (std::is_same_v<T, bfloat16>)
    return static_cast<double>(__bfloat162float(v));
  else
    return static_cast<double>(v);
}

/// Uniform in [-1, 1) with |v| >= 1/64: never zero, also after rounding to f16/bf16.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  auto f = atomr::cuda::test::random_floats(n, seed);
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    double v = f[i];
    if (std::fabs(v) < 1.0 / 64) v = v < 0 ? -0.5 : 0.5;
    out[i] = from_double<T>(v);
  }
  return out;
}

template <class T>
T nan_value() {
  return from_double<T>(std::numeric_limits<double>::quiet_NaN());
}

/// Tolerance of the issue: 1e-5 for f32 (no TF32) and f64, 1e-2 for f16/bf16.
template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> || std::is_same_v<T, double> ? 1e-5 : 1e-2;
}

struct blas_fixture : gpu_fixture {
  blas_actor blas = blas_actor::create(dev).value();

  template <class T>
  gpu_ref<T> put(const std::vector<T>& v) {
    auto r = alloc<T>(v.size());
    auto up = run(upload(std::span<const T>(v), r));
    REQUIRE(up);
    return r;
  }
  template <class T>
  gpu_ref<T> nan_buffer(std::size_t n) {
    auto r = alloc<T>(n);
    REQUIRE(run(fill_bytes(r, 0xFF)));
    return r;
  }
  template <class T>
  std::vector<T> get(const gpu_ref<T>& r) {
    std::vector<T> out(r.size());
    auto d = run(download(r, std::span<T>(out)));
    REQUIRE(d);
    return out;
  }
};

struct gemm_case {
  blas_op ta = blas_op::n, tb = blas_op::n;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;  // actual (non-zero) leading dimensions
  double alpha = 1, beta = 0;
};

gemm_case make_case(blas_op ta, blas_op tb, int m, int n, int k, int pad, double alpha,
                    double beta) {
  gemm_case c{ta, tb, m, n, k, 0, 0, 0, alpha, beta};
  c.lda = (ta == blas_op::n ? m : k) + pad;
  c.ldb = (tb == blas_op::n ? k : n) + pad;
  c.ldc = m + pad;
  return c;
}

std::size_t a_size(const gemm_case& c) {
  return static_cast<std::size_t>(c.lda) * (c.ta == blas_op::n ? c.k : c.m);
}
std::size_t b_size(const gemm_case& c) {
  return static_cast<std::size_t>(c.ldb) * (c.tb == blas_op::n ? c.n : c.k);
}
std::size_t c_size(const gemm_case& c) {
  return static_cast<std::size_t>(c.ldc) * c.n;
}

/// op(X)[r][col] of a column-major X with leading dimension ld.
template <class T>
double at(const T* x, int ld, blas_op o, int r, int col) {
  return o == blas_op::n ? to_double(x[static_cast<std::size_t>(col) * ld + r])
                         : to_double(x[static_cast<std::size_t>(r) * ld + col]);
}

/// ||out - ref|| / ||ref|| over C's m x n entries; padding of C must be unchanged.
template <class T>
double gemm_error(const gemm_case& c, const T* a, const T* b, const T* c0, const T* out,
                  bool beta_reads_c0) {
  double num = 0, den = 0;
  for (int j = 0; j < c.n; ++j) {
    for (int i = 0; i < c.m; ++i) {
      double acc = 0;
      for (int p = 0; p < c.k; ++p) acc += at(a, c.lda, c.ta, i, p) * at(b, c.ldb, c.tb, p, j);
      const std::size_t idx = static_cast<std::size_t>(j) * c.ldc + i;
      double ref = c.alpha * acc + (beta_reads_c0 ? c.beta * to_double(c0[idx]) : 0.0);
      double d = to_double(out[idx]) - ref;
      num += d * d;
      den += ref * ref;
    }
    for (int i = c.m; i < c.ldc; ++i) {
      const std::size_t idx = static_cast<std::size_t>(j) * c.ldc + i;
      if (!std::isnan(to_double(out[idx])) && to_double(out[idx]) != to_double(c0[idx]))
        return std::numeric_limits<double>::infinity();  // wrote outside C
    }
  }
  return std::sqrt(num / den);
}

gemm_params params_of(const gemm_case& c) {
  return gemm_params{c.ta, c.tb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc, c.alpha, c.beta};
}

std::vector<gemm_case> gemm_cases() {
  return {
      make_case(blas_op::n, blas_op::n, 37, 29, 41, 0, 1.0, 0.0),
      make_case(blas_op::t, blas_op::n, 33, 20, 17, 3, 0.75, -1.25),
      make_case(blas_op::n, blas_op::t, 16, 45, 24, 5, -1.5, 0.5),
      make_case(blas_op::t, blas_op::t, 64, 31, 50, 2, 2.0, 1.75),
  };
}

/// Runs every gemm case for T on `blas` and checks it against the reference.
template <class T>
void check_gemm_cases(blas_fixture& f, const blas_actor& blas, double tol) {
  std::uint64_t seed = 11;
  for (const auto& c : gemm_cases()) {
    CAPTURE(static_cast<int>(c.ta));
    CAPTURE(static_cast<int>(c.tb));
    CAPTURE(c.alpha);
    CAPTURE(c.beta);
    auto ha = random_values<T>(a_size(c), seed++);
    auto hb = random_values<T>(b_size(c), seed++);
    auto a = f.put(ha);
    auto b = f.put(hb);
    std::vector<T> hc0;
    gpu_ref<T> cref;
    if (c.beta == 0) {
      // beta == 0: C is not read, so NaN in it must not show.
      cref = f.template nan_buffer<T>(c_size(c));
      hc0.assign(c_size(c), nan_value<T>());
    } else {
      // beta != 0: C is an input; its padding is NaN and must stay so.
      hc0 = random_values<T>(c_size(c), seed++);
      for (int j = 0; j < c.n; ++j)
        for (int i = c.m; i < c.ldc; ++i)
          hc0[static_cast<std::size_t>(j) * c.ldc + i] = nan_value<T>();
      cref = f.put(hc0);
    }
    auto r = f.run(blas.gemm(params_of(c), a, b, cref));
    REQUIRE(r);
    auto out = f.get(cref);
    double err = gemm_error(c, ha.data(), hb.data(), hc0.data(), out.data(), c.beta != 0);
    CAPTURE(err);
    CHECK(err < tol);
  }
}

}  // namespace

TEST_CASE_FIXTURE(blas_fixture, "gemm f32, f64, f16 and bf16 against a double reference") {
  CHECK_FALSE(blas.tf32());
  SUBCASE("f32") {
    check_gemm_cases<float>(*this, blas, tolerance<float>());
  }
  SUBCASE("f64") {
    check_gemm_cases<double>(*this, blas, tolerance<double>());
  }
  SUBCASE("f16") {
    check_gemm_cases<half>(*this, blas, tolerance<half>());
  }
  SUBCASE("bf16") {
    check_gemm_cases<bfloat16>(*this, blas, tolerance<bfloat16>());
  }
}

TEST_CASE_FIXTURE(blas_fixture, "gemm f32 with TF32 math, switched on and off") {
  auto tf = blas_actor::create(dev, {.tf32 = true}).value();
  CHECK(tf.tf32());
  check_gemm_cases<float>(*this, tf, 1e-2);
  REQUIRE(tf.set_tf32(false));
  CHECK_FALSE(tf.tf32());
  check_gemm_cases<float>(*this, tf, 1e-5);
}

namespace {
template <class T>
void check_batched(blas_fixture& f, double tol) {
  const int count = 3;
  auto c = make_case(blas_op::t, blas_op::n, 19, 23, 13, 1, 1.25, -0.5);
  // A broadcast (stride 0), B tight, C with a gap between batches.
  const std::int64_t sa = 0, sb = static_cast<std::int64_t>(b_size(c)),
                     sc = static_cast<std::int64_t>(c_size(c)) + 7;
  auto ha = random_values<T>(a_size(c), 101);
  auto hb = random_values<T>(b_size(c) * count, 102);
  auto hc0 = random_values<T>(static_cast<std::size_t>(sc) * count, 103);
  for (int bi = 0; bi < count; ++bi)
    for (int j = 0; j < c.n; ++j)
      for (int i = c.m; i < c.ldc; ++i)
        hc0[static_cast<std::size_t>(bi * sc) + static_cast<std::size_t>(j) * c.ldc + i] =
            nan_value<T>();
  auto a = f.put(ha);
  auto b = f.put(hb);
  auto cref = f.put(hc0);
  auto r = f.run(f.blas.gemm_strided_batched(
      params_of(c), {.count = count, .stride_a = sa, .stride_b = sb, .stride_c = sc}, a, b, cref));
  REQUIRE(r);
  auto out = f.get(cref);
  for (int bi = 0; bi < count; ++bi) {
    CAPTURE(bi);
    const std::size_t oc = static_cast<std::size_t>(bi * sc);
    double err = gemm_error(c, ha.data(), hb.data() + static_cast<std::size_t>(bi * sb),
                            hc0.data() + oc, out.data() + oc, true);
    CHECK(err < tol);
    // The gap after each C is untouched.
    for (std::size_t i = c_size(c); i < static_cast<std::size_t>(sc); ++i)
      CHECK(to_double(out[oc + i]) == to_double(hc0[oc + i]));
  }
}
}  // namespace

TEST_CASE_FIXTURE(blas_fixture, "strided-batched gemm") {
  SUBCASE("f32") {
    check_batched<float>(*this, 1e-5);
  }
  SUBCASE("f64") {
    check_batched<double>(*this, 1e-5);
  }
  SUBCASE("f16") {
    check_batched<half>(*this, 1e-2);
  }
  SUBCASE("bf16") {
    check_batched<bfloat16>(*this, 1e-2);
  }
}

namespace {
template <class T>
void check_gemv(blas_fixture& f) {
  for (blas_op t : {blas_op::n, blas_op::t}) {
    CAPTURE(static_cast<int>(t));
    const int m = 45, n = 31, lda = 48, incx = 2, incy = 3;
    const double alpha = -0.75, beta = 1.5;
    const int xl = t == blas_op::n ? n : m, yl = t == blas_op::n ? m : n;
    auto ha = random_values<T>(static_cast<std::size_t>(lda) * n, 201);
    auto hx = random_values<T>(static_cast<std::size_t>(xl) * incx, 202);
    auto hy = random_values<T>(static_cast<std::size_t>(yl) * incy, 203);
    auto a = f.put(ha);
    auto x = f.put(hx);
    auto y = f.put(hy);
    auto r = f.run(f.blas.gemv({.trans = t,
                                .m = m,
                                .n = n,
                                .lda = lda,
                                .incx = incx,
                                .incy = incy,
                                .alpha = alpha,
                                .beta = beta},
                               a, x, y));
    REQUIRE(r);
    auto out = f.get(y);
    double num = 0, den = 0;
    for (int i = 0; i < yl; ++i) {
      double acc = 0;
      for (int p = 0; p < xl; ++p) {
        double aij = t == blas_op::n ? ha[static_cast<std::size_t>(p) * lda + i]
                                     : ha[static_cast<std::size_t>(i) * lda + p];
        acc += aij * hx[static_cast<std::size_t>(p) * incx];
      }
      const std::size_t yi = static_cast<std::size_t>(i) * incy;
      double ref = alpha * acc + beta * hy[yi];
      num += (out[yi] - ref) * (out[yi] - ref);
      den += ref * ref;
      // Between the strided elements nothing changes.
      for (int g = 1; g < incy; ++g) CHECK(out[yi + g] == hy[yi + g]);
    }
    CHECK(std::sqrt(num / den) < 1e-5);
  }
}
}  // namespace

TEST_CASE_FIXTURE(blas_fixture, "gemv, both transposes, strided vectors") {
  SUBCASE("f32") {
    check_gemv<float>(*this);
  }
  SUBCASE("f64") {
    check_gemv<double>(*this);
  }
}

namespace {
template <class T>
void check_level1(blas_fixture& f) {
  const int n = 1000, incx = 2;
  auto hx = random_values<T>(static_cast<std::size_t>(n) * incx, 301);
  auto hy = random_values<T>(n, 302);
  hx[static_cast<std::size_t>(617) * incx] = T(3);  // the unique largest |x_i|
  auto x = f.put(hx);

  SUBCASE("axpy") {
    auto y = f.put(hy);
    REQUIRE(f.run(f.blas.axpy(n, 0.625, x, y, incx, 1)));
    auto out = f.get(y);
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      double ref = 0.625 * hx[static_cast<std::size_t>(i) * incx] + hy[i];
      num += (out[i] - ref) * (out[i] - ref);
      den += ref * ref;
    }
    CHECK(std::sqrt(num / den) < 1e-5);
  }
  SUBCASE("scal") {
    auto y = f.put(hy);
    REQUIRE(f.run(f.blas.scal(n, -1.75, y)));
    auto out = f.get(y);
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      double ref = -1.75 * hy[i];
      num += (out[i] - ref) * (out[i] - ref);
      den += ref * ref;
    }
    CHECK(std::sqrt(num / den) < 1e-5);
  }
  SUBCASE("dot") {
    auto y = f.put(hy);
    auto r = f.run(f.blas.dot(n, x, y, incx, 1));
    REQUIRE(r);
    double ref = 0;
    for (int i = 0; i < n; ++i) ref += double(hx[static_cast<std::size_t>(i) * incx]) * hy[i];
    CHECK(std::fabs(r.value() - ref) / std::fabs(ref) < 1e-5);
  }
  SUBCASE("nrm2") {
    auto r = f.run(f.blas.nrm2(n, x, incx));
    REQUIRE(r);
    double ref = 0;
    for (int i = 0; i < n; ++i)
      ref +=
          double(hx[static_cast<std::size_t>(i) * incx]) * hx[static_cast<std::size_t>(i) * incx];
    ref = std::sqrt(ref);
    CHECK(std::fabs(r.value() - ref) / ref < 1e-5);
  }
  SUBCASE("asum") {
    auto r = f.run(f.blas.asum(n, x, incx));
    REQUIRE(r);
    double ref = 0;
    for (int i = 0; i < n; ++i) ref += std::fabs(double(hx[static_cast<std::size_t>(i) * incx]));
    CHECK(std::fabs(r.value() - ref) / ref < 1e-5);
  }
  SUBCASE("iamax") {
    auto r = f.run(f.blas.iamax(n, x, incx));
    REQUIRE(r);
    CHECK(r.value() == 617);
    // Every element checked: the first half does not contain it.
    auto r2 = f.run(f.blas.iamax(617, x, incx));
    REQUIRE(r2);
    CHECK(r2.value() != 617);
  }
}
}  // namespace

TEST_CASE_FIXTURE(blas_fixture, "level-1 operations f32") {
  check_level1<float>(*this);
}
TEST_CASE_FIXTURE(blas_fixture, "level-1 operations f64") {
  check_level1<double>(*this);
}

namespace {
template <class T>
void check_invalid(const result<T>& r, const std::string& what) {
  INFO("expected an invalid_argument error containing: ", what);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CAPTURE(r.error().message());
  CHECK(r.error().message().find(what) != std::string::npos);
}
}  // namespace

TEST_CASE_FIXTURE(blas_fixture, "every operation rejects bad arguments before any GPU call") {
  auto a = alloc<float>(64), b = alloc<float>(64), c = alloc<float>(64);
  auto d = alloc<double>(64), e = alloc<double>(64);
  auto h = alloc<half>(64);
  auto hb = alloc<bfloat16>(64);
  const auto before = dev.statistics().ops_completed + dev.statistics().ops_failed;

  check_invalid(run(blas.gemm({.m = 8, .n = 8, .k = 8, .lda = 4}, a, b, c)), "gemm: lda");
  check_invalid(run(blas.gemm({.m = 9, .n = 8, .k = 8}, a, b, c)), "gemm: a has 64");
  check_invalid(run(blas.gemm({.m = 8, .n = 8, .k = 8}, d, e, alloc<double>(8))), "gemm: c");
  check_invalid(run(blas.gemm({.m = -1, .n = 8, .k = 8}, h, h, alloc<half>(64))), "gemm: m");
  check_invalid(run(blas.gemm({.m = 8, .n = 8, .k = 9}, hb, hb, alloc<bfloat16>(64))), "gemm: a");
  check_invalid(run(blas.gemm({.m = 8, .n = 8, .k = 8}, a, b, gpu_ref<float>{})), "gemm: c has 0");
  // C may not alias A.
  check_invalid(run(blas.gemm({.m = 4, .n = 4, .k = 4}, a.subspan(0, 16).value(), b,
                              a.subspan(8, 16).value())),
                "gemm: c overlaps a");

  check_invalid(run(blas.gemm_strided_batched({.m = 4, .n = 4, .k = 4}, {.count = 2, .stride_c = 8},
                                              a, b, c)),
                "gemm_strided_batched: batch.stride_c");
  check_invalid(run(blas.gemm_strided_batched({.m = 4, .n = 4, .k = 4}, {.count = 5}, d, e,
                                              alloc<double>(80))),
                "gemm_strided_batched: a");
  check_invalid(run(blas.gemm_strided_batched({.m = 4, .n = 4, .k = 4}, {.count = -1}, h, h,
                                              alloc<half>(16))),
                "gemm_strided_batched: batch.count");
  check_invalid(run(blas.gemm_strided_batched({.m = 4, .n = 4, .k = 4}, {.stride_a = -3}, hb, hb,
                                              alloc<bfloat16>(16))),
                "gemm_strided_batched: batch.stride_a");

  check_invalid(run(blas.gemv({.m = 8, .n = 8, .incx = 0}, a, b, c)), "gemv: incx");
  check_invalid(run(blas.gemv({.m = 8, .n = 8}, d, alloc<double>(7), e)), "gemv: x");
  check_invalid(run(blas.axpy(65, 1.0, a, b)), "axpy: x");
  check_invalid(run(blas.axpy(8, 1.0, d, e, 1, 0)), "axpy: incy");
  check_invalid(run(blas.axpy(8, 1.0, a, a)), "axpy: y overlaps x");
  check_invalid(run(blas.scal(8, 2.0, a, -1)), "scal: incx");
  check_invalid(run(blas.scal(-8, 2.0, d)), "scal: n");
  check_invalid(run(blas.dot(33, a, b, 2)), "dot: x");
  check_invalid(run(blas.dot(8, d, e, 1, 0)), "dot: incy");
  check_invalid(run(blas.nrm2(8, a, 0)), "nrm2: incx");
  check_invalid(run(blas.nrm2(65, d)), "nrm2: x");
  check_invalid(run(blas.asum(-1, a)), "asum: n");
  check_invalid(run(blas.asum(8, d, 10)), "asum: x");  // needs 1 + 7 * 10 = 71 of 64
  check_invalid(run(blas.iamax(0, a)), "iamax: n");
  check_invalid(run(blas.iamax(8, d, -1)), "iamax: incx");

  // Nothing reached run_kernel.
  CHECK(dev.statistics().ops_completed + dev.statistics().ops_failed == before);
}

TEST_CASE_FIXTURE(blas_fixture, "a stopped device fails fast") {
  auto a = alloc<float>(16);
  dev.stop();
  auto r = run(blas.gemm({.m = 4, .n = 4, .k = 4}, a, a, a));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::device_unavailable);
  auto s = run(blas.nrm2(4, a));
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::device_unavailable);
  CHECK(blas.set_tf32(true).error().code() == errc::device_unavailable);
}

TEST_CASE_FIXTURE(blas_fixture, "several blas_actors on a 4-thread io_context") {
  constexpr int actors = 4, jobs = 64, n = 48;
  std::vector<blas_actor> pool;
  for (int i = 0; i < actors; ++i)
    pool.push_back(blas_actor::create(dev, {.streams = stream_policy::per_actor_fresh}).value());

  std::vector<float> ha = random_values<float>(n * n, 401), hb = random_values<float>(n * n, 402);
  std::vector<double> errors(jobs, -1.0);
  std::atomic<int> left{jobs};
  for (int j = 0; j < jobs; ++j) {
    asio::co_spawn(
        ioc,
        [&, j]() -> asio::awaitable<void> {
          const blas_actor& act = pool[static_cast<std::size_t>(j % actors)];
          auto a = dev.allocate<float>(n * n).value();
          auto b = dev.allocate<float>(n * n).value();
          auto c = dev.allocate<float>(n * n).value();
          if (co_await upload(std::span<const float>(ha), a) &&
              co_await upload(std::span<const float>(hb), b) && co_await fill_bytes(c, 0xFF)) {
            const double alpha = 1.0 + j;
            auto r = co_await act.gemm({.m = n, .n = n, .k = n, .alpha = alpha}, a, b, c);
            std::vector<float> out(n * n);
            if (r && co_await download(c, std::span<float>(out))) {
              for (auto& v : out) v = static_cast<float>(v / alpha);
              errors[static_cast<std::size_t>(j)] =
                  atomr::cuda::test::gemm_rel_error(ha, hb, out, n);
            }
          }
          if (--left == 0) ioc.stop();
        },
        asio::detached);
  }
  ioc.restart();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { ioc.run_for(limit); });
  for (auto& t : threads) t.join();
  CHECK(left.load() == 0);
  for (int j = 0; j < jobs; ++j) {
    CAPTURE(j);
    CHECK(errors[static_cast<std::size_t>(j)] >= 0.0);
    CHECK(errors[static_cast<std::size_t>(j)] < 1e-5);
  }
}

TEST_CASE_FIXTURE(blas_fixture, "gemm repeated on the same buffers is recorded and replayed") {
  // The first call runs cuBLAS directly, the second records it into a CUDA
  // graph and launches that, later identical calls launch it again. Every
  // run reads the buffers' new contents (A and C re-uploaded each time).
  auto c = gemm_cases()[1];  // transposed A, padding, alpha 0.75, beta -1.25
  auto a = alloc<float>(a_size(c));
  auto b = put(random_values<float>(b_size(c), 7));
  auto hb = get(b);
  auto cbuf = alloc<float>(c_size(c));
  std::uint64_t seed = 200;
  auto once = [&](const blas_actor& actor, const gemm_case& gc) {
    auto ha = random_values<float>(a_size(gc), ++seed);
    auto hc0 = random_values<float>(c_size(gc), ++seed);
    REQUIRE(run(upload(std::span<const float>(ha), a)));
    REQUIRE(run(upload(std::span<const float>(hc0), cbuf)));
    REQUIRE(run(actor.gemm(params_of(gc), a, b, cbuf)));
    auto out = get(cbuf);
    CAPTURE(seed);
    CHECK(gemm_error(gc, ha.data(), hb.data(), hc0.data(), out.data(), true) < 1e-5);
  };
  auto rec = blas_actor::create(dev, {.cuda_graph_cache = 16}).value();
  for (int i = 0; i < 4; ++i) once(rec, c);
  auto s = rec.statistics();
  CHECK(s.gemm_graph_failures == 0);
  CHECK(s.gemm_graph_records == 1);
  CHECK(s.gemm_graph_launches == 3);
  CHECK(s.gemm_graphs_cached == 1);
  // alpha and beta are part of what was recorded: other values are another call.
  auto c2 = c;
  c2.alpha = -2.0;
  c2.beta = 0.5;
  for (int i = 0; i < 3; ++i) once(rec, c2);
  CHECK(rec.statistics().gemm_graph_records == 2);
  CHECK(rec.statistics().gemm_graph_launches == 5);
  // So is the math mode: with TF32 on, the f32 call is recorded anew.
  REQUIRE(rec.set_tf32(true));
  auto ha = random_values<float>(a_size(c), 1);
  REQUIRE(run(upload(std::span<const float>(ha), a)));
  REQUIRE(run(rec.gemm(params_of(c), a, b, cbuf)));
  REQUIRE(run(rec.gemm(params_of(c), a, b, cbuf)));
  CHECK(rec.statistics().gemm_graph_records == 3);
  REQUIRE(rec.set_tf32(false));
  once(rec, c);  // the pedantic recording again
  CHECK(rec.statistics().gemm_graph_records == 3);
  CHECK(rec.statistics().gemm_graph_launches == 7);

  // Recording off (the default), and a call pattern wider than the cache:
  // nothing recorded.
  auto off = blas_actor::create(dev).value();
  for (int i = 0; i < 3; ++i) once(off, c);
  CHECK(off.statistics().gemm_graph_records == 0);
  auto small = blas_actor::create(dev, {.cuda_graph_cache = 2}).value();
  auto c3 = c;
  c3.alpha = 3.0;
  for (int round = 0; round < 3; ++round)
    for (const auto& gc : {c, c2, c3}) once(small, gc);
  CHECK(small.statistics().gemm_graph_records == 0);
  CHECK(small.statistics().gemm_graph_launches == 0);
}

TEST_CASE_FIXTURE(blas_fixture, "many recorded gemm calls: every one is kept, none allocates") {
  // 300 distinct n = 256 calls (alpha differs), each made twice: the second
  // is recorded. Recorded with cuBLAS's default workspace, cuBLAS put a
  // memory allocation into such graphs and about a thousand copies could not
  // be instantiated (docs/design.md); with the actor's own workspace every
  // recording succeeds. Results are checked for the first and last call.
  const auto c = make_case(blas_op::n, blas_op::n, 256, 256, 256, 0, 1.0, 0.0);
  auto ha = random_values<float>(a_size(c), 31);
  auto hb = random_values<float>(b_size(c), 32);
  auto a = put(ha);
  auto b = put(hb);
  auto cbuf = alloc<float>(c_size(c));
  std::vector<float> zeros(c_size(c), 0.0f);
  auto actor = blas_actor::create(dev, {.cuda_graph_cache = 512}).value();
  constexpr int calls = 300;
  for (int j = 0; j < calls; ++j) {
    auto gc = c;
    gc.alpha = 1.0 + j / 64.0;
    for (int twice = 0; twice < 2; ++twice) REQUIRE(run(actor.gemm(params_of(gc), a, b, cbuf)));
    if (j == 0 || j == calls - 1) {
      auto out = get(cbuf);
      CAPTURE(j);
      CHECK(gemm_error(gc, ha.data(), hb.data(), zeros.data(), out.data(), false) < 1e-5);
    }
  }
  const auto s = actor.statistics();
  CHECK(s.gemm_graph_failures == 0);
  CHECK(s.gemm_graph_records == calls);
  CHECK(s.gemm_graph_launches == calls);
  CHECK(s.gemm_graphs_cached == calls);
}

TEST_CASE_FIXTURE(blas_fixture,
                  "f32 gemm through cuBLASLt and through cublasSgemm, aligned or not") {
  // Every case on an actor with cuBLASLt (the default) and one without; then
  // the second case with A, B and C one element into their buffers (4-byte
  // alignment: a plan of its own, with algorithms that accept it).
  auto with_lt = blas_actor::create(dev).value();
  auto without = blas_actor::create(dev, {.lt_matmul = false}).value();
  check_gemm_cases<float>(*this, with_lt, tolerance<float>());
  check_gemm_cases<float>(*this, without, tolerance<float>());
  const auto cases = gemm_cases().size();
  auto s = with_lt.statistics();
  CHECK(s.gemm_lt_calls == cases);
  CHECK(s.gemm_lt_plans == cases);
  CHECK(s.gemm_lt_fallbacks == 0);
  CHECK(without.statistics().gemm_lt_calls == 0);
  CHECK(without.statistics().gemm_lt_plans == 0);
  // The same shapes again: the plans are reused.
  check_gemm_cases<float>(*this, with_lt, tolerance<float>());
  CHECK(with_lt.statistics().gemm_lt_plans == cases);
  CHECK(with_lt.statistics().gemm_lt_calls == 2 * cases);

  const auto c = gemm_cases()[1];  // transposed A, padding, beta != 0
  auto ha = random_values<float>(a_size(c) + 1, 61);
  auto hb = random_values<float>(b_size(c) + 1, 62);
  auto hc0 = random_values<float>(c_size(c) + 1, 63);
  auto a = put(ha).subspan(1, a_size(c)).value();
  auto b = put(hb).subspan(1, b_size(c)).value();
  auto whole_c = put(hc0);
  auto cv = whole_c.subspan(1, c_size(c)).value();
  for (const blas_actor* actor : {&with_lt, &without}) {
    REQUIRE(run(upload(std::span<const float>(hc0), whole_c)));
    REQUIRE(run(actor->gemm(params_of(c), a, b, cv)));
    auto out = get(whole_c);
    CHECK(out[0] == hc0[0]);  // the element before C is untouched
    CHECK(gemm_error(c, ha.data() + 1, hb.data() + 1, hc0.data() + 1, out.data() + 1, true) <
          tolerance<float>());
  }
  CHECK(with_lt.statistics().gemm_lt_plans == cases + 1);
  CHECK(with_lt.statistics().gemm_lt_calls == 2 * cases + 1);
  // An empty product goes to cublasSgemm (C = beta * C there).
  REQUIRE(run(with_lt.gemm({.m = 0, .n = 0, .k = 0}, a, b, cv)));
  CHECK(with_lt.statistics().gemm_lt_fallbacks == 1);
}

// ------------------------------------------------------------------ gemm_fused

namespace {

/// cuBLASLt's GELU: the tanh form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/// One gemm_fused call against the double-precision reference: relative L2
/// error. `pad`: elements added to every leading dimension; the rows of C in
/// its padding must come back untouched.
template <class T>
double fused_error(blas_fixture& f, gemm_epilogue e, blas_op ta, blas_op tb, int pad) {
  constexpr int m = 37, n = 29, k = 64;
  const int lda = (ta == blas_op::n ? m : k) + pad, ldb = (tb == blas_op::n ? k : n) + pad,
            ldc = m + pad;
  const auto av = random_values<T>(std::size_t(lda) * (ta == blas_op::n ? k : m), 21);
  const auto bv = random_values<T>(std::size_t(ldb) * (tb == blas_op::n ? n : k), 22);
  const auto cv = random_values<T>(std::size_t(ldc) * n, 23);
  const auto biasv = random_values<T>(m, 24);
  const bool with_bias = detail::epilogue_has_bias(e);
  auto a = f.put(av), b = f.put(bv), c = f.put(cv);
  auto bias = with_bias ? f.put(biasv) : gpu_ref<T>{};
  const double alpha = 0.75, beta = 0.5;
  auto r = f.run(f.blas.gemm_fused({.transa = ta,
                                    .transb = tb,
                                    .m = m,
                                    .n = n,
                                    .k = k,
                                    .lda = lda,
                                    .ldb = ldb,
                                    .ldc = ldc,
                                    .alpha = alpha,
                                    .beta = beta},
                                   e, a, b, bias, c));
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  const auto out = f.get(c);
  double num = 0, den = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double x = 0;
      for (int p = 0; p < k; ++p) {
        const double aip = to_double(ta == blas_op::n ? av[i + std::size_t(p) * lda]
                                                      : av[p + std::size_t(i) * lda]);
        const double bpj = to_double(tb == blas_op::n ? bv[p + std::size_t(j) * ldb]
                                                      : bv[j + std::size_t(p) * ldb]);
        x += aip * bpj;
      }
      x = alpha * x + beta * to_double(cv[i + std::size_t(j) * ldc]);
      if (with_bias) x += to_double(biasv[i]);
      if (e == gemm_epilogue::relu || e == gemm_epilogue::bias_relu) x = std::max(x, 0.0);
      if (e == gemm_epilogue::gelu || e == gemm_epilogue::bias_gelu) x = gelu_tanh(x);
      const double d = to_double(out[i + std::size_t(j) * ldc]) - x;
      num += d * d;
      den += x * x;
    }
  std::size_t padding_changed = 0;
  for (int j = 0; j < n; ++j)
    for (int i = m; i < ldc; ++i) {
      const auto at = i + std::size_t(j) * ldc;
      padding_changed += std::memcmp(&out[at], &cv[at], sizeof(T)) != 0;
    }
  CHECK(padding_changed == 0);
  return std::sqrt(num / den);
}

template <class T>
void check_fused_all(blas_fixture& f) {
  for (auto e : {gemm_epilogue::bias, gemm_epilogue::relu, gemm_epilogue::gelu,
                 gemm_epilogue::bias_relu, gemm_epilogue::bias_gelu})
    for (auto ta : {blas_op::n, blas_op::t})
      for (auto tb : {blas_op::n, blas_op::t})
        for (int pad : {0, 8}) {
          CAPTURE(to_string(e));
          CAPTURE(static_cast<int>(ta));
          CAPTURE(static_cast<int>(tb));
          CAPTURE(pad);
          CHECK(fused_error<T>(f, e, ta, tb, pad) < tolerance<T>());
        }
}

}  // namespace

TEST_CASE_FIXTURE(blas_fixture,
                  "gemm_fused: every epilogue, f32, f16 and bf16, packed and padded leading "
                  "dimensions, against a double reference") {
  SUBCASE("f32") {
    check_fused_all<float>(*this);
  }
  SUBCASE("f16") {
    check_fused_all<half>(*this);
  }
  SUBCASE("bf16") {
    check_fused_all<bfloat16>(*this);
  }
  const auto s = blas.statistics();
  CHECK(s.gemm_lt_calls > 0);
}

TEST_CASE_FIXTURE(blas_fixture, "gemm_fused: bad arguments answer before any GPU call") {
  auto a = alloc<float>(64), b = alloc<float>(64), c = alloc<float>(64), bias = alloc<float>(8);
  const gemm_params p{.m = 8, .n = 8, .k = 8};
  const auto before = dev.statistics();
  auto wrong_bias = run(blas.gemm_fused(p, gemm_epilogue::bias_relu, a, b, alloc<float>(7), c));
  REQUIRE_FALSE(wrong_bias);
  CHECK(wrong_bias.error().code() == errc::invalid_argument);
  auto extra_bias = run(blas.gemm_fused(p, gemm_epilogue::relu, a, b, bias, c));
  REQUIRE_FALSE(extra_bias);
  CHECK(extra_bias.error().code() == errc::invalid_argument);
  auto aliased = run(blas.gemm_fused(p, gemm_epilogue::bias, a, b, c.subspan(0, 8).value(), c));
  REQUIRE_FALSE(aliased);
  CHECK(aliased.error().code() == errc::invalid_argument);
  const auto after = dev.statistics();
  CHECK(after.ops_completed == before.ops_completed);
  CHECK(after.ops_failed == before.ops_failed);
}
