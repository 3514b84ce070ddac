// blas_actor argument checks: pure functions, no GPU. Every bad argument is
// invalid_argument and the message names the operation and the argument.
#include <atomr/cuda/blas_actor.hpp>

#include "io_fixture.hpp"

#include <doctest/doctest.h>

#include <climits>
#include <limits>
#include <string>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;

namespace {

template <class T>
void check_bad(const result<T>& r, const std::string& op, const std::string& arg) {
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  const auto& m = r.error().message();
  CAPTURE(m);
  CHECK(m.find(op + ": " + arg + " ") != std::string::npos);
}

constexpr std::int64_t big = std::int64_t{INT_MAX} + 1;

}  // namespace

TEST_CASE("check_gemm accepts good shapes and computes tight leading dimensions") {
  gemm_params p{.m = 4, .n = 3, .k = 5};
  auto g = detail::check_gemm(p, 20, 15, 12);
  REQUIRE(g);
  CHECK(g.value().lda == 4);
  CHECK(g.value().ldb == 5);
  CHECK(g.value().ldc == 4);
  CHECK(g.value().a_elems == 20);
  CHECK(g.value().b_elems == 15);
  CHECK(g.value().c_elems == 12);

  // Transposed: A stored k x m, B stored n x k.
  p.transa = blas_op::t;
  p.transb = blas_op::t;
  g = detail::check_gemm(p, 20, 15, 12);
  REQUIRE(g);
  CHECK(g.value().lda == 5);
  CHECK(g.value().ldb == 3);

  // Non-tight leading dimensions: the last column need not be padded.
  p = gemm_params{.m = 4, .n = 3, .k = 5, .lda = 6, .ldb = 7, .ldc = 9};
  g = detail::check_gemm(p, 6 * 4 + 4, 7 * 2 + 5, 9 * 2 + 4);
  REQUIRE(g);
  CHECK(g.value().a_elems == 28);
  CHECK(g.value().b_elems == 19);
  CHECK(g.value().c_elems == 22);

  // Empty problems need nothing.
  g = detail::check_gemm(gemm_params{.m = 0, .n = 3, .k = 5}, 0, 15, 0);
  REQUIRE(g);
  CHECK(g.value().lda == 1);
  CHECK(g.value().a_elems == 0);
}

TEST_CASE("check_gemm names every bad argument") {
  check_bad(detail::check_gemm({.m = -1, .n = 1, .k = 1}, 9, 9, 9), "gemm", "m");
  check_bad(detail::check_gemm({.m = 1, .n = -2, .k = 1}, 9, 9, 9), "gemm", "n");
  check_bad(detail::check_gemm({.m = 1, .n = 1, .k = -3}, 9, 9, 9), "gemm", "k");
  check_bad(detail::check_gemm({.m = big, .n = 1, .k = 1}, 9, 9, 9), "gemm", "m");
  CHECK(detail::check_gemm({.m = big, .n = 1, .k = 1}, 9, 9, 9)
            .error()
            .message()
            .find("does not fit in int") != std::string::npos);
  check_bad(detail::check_gemm({.m = 4, .n = 1, .k = 1, .lda = 3}, 99, 99, 99), "gemm", "lda");
  CHECK(detail::check_gemm({.m = 4, .n = 1, .k = 1, .lda = 3}, 99, 99, 99)
            .error()
            .message()
            .find("lda (3) < max(1, m) (4)") != std::string::npos);
  // Transposed A: lda is checked against k.
  check_bad(
      detail::check_gemm({.transa = blas_op::t, .m = 2, .n = 2, .k = 5, .lda = 4}, 99, 99, 99),
      "gemm", "lda");
  check_bad(detail::check_gemm({.m = 2, .n = 2, .k = 5, .ldb = 4}, 99, 99, 99), "gemm", "ldb");
  check_bad(
      detail::check_gemm({.transb = blas_op::t, .m = 2, .n = 6, .k = 5, .ldb = 5}, 99, 99, 99),
      "gemm", "ldb");
  check_bad(detail::check_gemm({.m = 2, .n = 2, .k = 2, .ldc = 1}, 99, 99, 99), "gemm", "ldc");
  check_bad(detail::check_gemm({.m = 2, .n = 2, .k = 2, .ldc = -1}, 99, 99, 99), "gemm", "ldc");
  check_bad(detail::check_gemm({.m = 2, .n = 2, .k = 2, .lda = big}, 99, 99, 99), "gemm", "lda");
  check_bad(
      detail::check_gemm({.transa = static_cast<blas_op>(7), .m = 2, .n = 2, .k = 2}, 99, 99, 99),
      "gemm", "transa");
  check_bad(
      detail::check_gemm({.transb = static_cast<blas_op>(7), .m = 2, .n = 2, .k = 2}, 99, 99, 99),
      "gemm", "transb");
  // Buffer sizes.
  check_bad(detail::check_gemm({.m = 4, .n = 3, .k = 5}, 19, 15, 12), "gemm", "a");
  check_bad(detail::check_gemm({.m = 4, .n = 3, .k = 5}, 20, 14, 12), "gemm", "b");
  check_bad(detail::check_gemm({.m = 4, .n = 3, .k = 5}, 20, 15, 11), "gemm", "c");
  CHECK(detail::check_gemm({.m = 4, .n = 3, .k = 5}, 20, 15, 11).error().message() ==
        "gemm: c has 11 elements, needs 12");
  check_bad(detail::check_gemm({.m = 4, .n = 3, .k = 5, .ldc = 10}, 20, 15, 23), "gemm", "c");
}

TEST_CASE("check_gemm_batched: counts, strides and spans") {
  gemm_params p{.m = 2, .n = 3, .k = 4};
  auto b = detail::check_gemm_batched(p, {.count = 5}, 5 * 8, 5 * 12, 5 * 6);
  REQUIRE(b);
  CHECK(b.value().count == 5);
  CHECK(b.value().stride_a == 8);
  CHECK(b.value().stride_b == 12);
  CHECK(b.value().stride_c == 6);
  CHECK(b.value().g.a_elems == 40);

  // Broadcast A (stride 0), padded C.
  b = detail::check_gemm_batched(p, {.count = 3, .stride_a = 0, .stride_c = 10}, 8, 36, 26);
  REQUIRE(b);
  CHECK(b.value().g.a_elems == 8);
  CHECK(b.value().g.c_elems == 26);

  // Count 0 needs nothing.
  CHECK(detail::check_gemm_batched(p, {.count = 0}, 1, 1, 1));

  constexpr const char* op = "gemm_strided_batched";
  check_bad(detail::check_gemm_batched(p, {.count = -1}, 99, 99, 99), op, "batch.count");
  check_bad(detail::check_gemm_batched(p, {.count = big}, 99, 99, 99), op, "batch.count");
  check_bad(detail::check_gemm_batched(p, {.count = 2, .stride_a = -5}, 99, 99, 99), op,
            "batch.stride_a");
  check_bad(detail::check_gemm_batched(p, {.count = 2, .stride_b = -2}, 99, 99, 99), op,
            "batch.stride_b");
  check_bad(detail::check_gemm_batched(p, {.count = 2, .stride_c = 5}, 99, 99, 99), op,
            "batch.stride_c");
  check_bad(detail::check_gemm_batched(p, {.count = 2, .stride_c = 0}, 99, 99, 99), op,
            "batch.stride_c");
  check_bad(detail::check_gemm_batched(
                p, {.count = 3, .stride_a = std::numeric_limits<std::int64_t>::max()}, 99, 99, 99),
            op, "batch.stride_a");
  check_bad(detail::check_gemm_batched(p, {.count = 5}, 39, 60, 30), op, "a");
  check_bad(detail::check_gemm_batched(p, {.count = 5}, 40, 59, 30), op, "b");
  check_bad(detail::check_gemm_batched(p, {.count = 5}, 40, 60, 29), op, "c");
  check_bad(
      detail::check_gemm_batched({.m = 2, .n = 3, .k = 4, .lda = 1}, {.count = 5}, 99, 99, 99), op,
      "lda");
}

TEST_CASE("check_gemv") {
  gemv_params p{.m = 4, .n = 3};
  auto g = detail::check_gemv(p, 12, 3, 4);
  REQUIRE(g);
  CHECK(g.value().lda == 4);
  p.trans = blas_op::t;
  g = detail::check_gemv(p, 12, 4, 3);
  REQUIRE(g);
  CHECK(g.value().x_elems == 4);
  CHECK(g.value().y_elems == 3);
  // Strided vectors, negative increments allowed.
  g = detail::check_gemv({.m = 4, .n = 3, .lda = 5, .incx = 2, .incy = -3}, 14, 5, 10);
  REQUIRE(g);
  CHECK(g.value().a_elems == 14);
  CHECK(g.value().x_elems == 5);
  CHECK(g.value().y_elems == 10);

  check_bad(detail::check_gemv({.m = -1, .n = 3}, 99, 99, 99), "gemv", "m");
  check_bad(detail::check_gemv({.m = 1, .n = big}, 99, 99, 99), "gemv", "n");
  check_bad(detail::check_gemv({.m = 4, .n = 3, .lda = 3}, 99, 99, 99), "gemv", "lda");
  check_bad(detail::check_gemv({.m = 4, .n = 3, .incx = 0}, 99, 99, 99), "gemv", "incx");
  check_bad(detail::check_gemv({.m = 4, .n = 3, .incy = 0}, 99, 99, 99), "gemv", "incy");
  check_bad(detail::check_gemv({.m = 4, .n = 3, .incy = big}, 99, 99, 99), "gemv", "incy");
  check_bad(detail::check_gemv({.trans = static_cast<blas_op>(2), .m = 1, .n = 1}, 9, 9, 9), "gemv",
            "trans");
  check_bad(detail::check_gemv({.m = 4, .n = 3}, 11, 3, 4), "gemv", "a");
  check_bad(detail::check_gemv({.m = 4, .n = 3}, 12, 2, 4), "gemv", "x");
  check_bad(detail::check_gemv({.m = 4, .n = 3}, 12, 3, 3), "gemv", "y");
  check_bad(detail::check_gemv({.trans = blas_op::t, .m = 4, .n = 3}, 12, 3, 3), "gemv", "x");
}

TEST_CASE("level-1 checks: axpy, dot, scal, nrm2, asum, iamax") {
  auto a = detail::check_axpy(5, 2, 9, -1, 5);
  REQUIRE(a);
  CHECK(a.value().x_elems == 9);
  CHECK(a.value().incy == -1);
  CHECK(detail::check_axpy(0, 1, 0, 1, 0));
  check_bad(detail::check_axpy(-1, 1, 9, 1, 9), "axpy", "n");
  check_bad(detail::check_axpy(big, 1, 9, 1, 9), "axpy", "n");
  check_bad(detail::check_axpy(5, 0, 9, 1, 9), "axpy", "incx");
  check_bad(detail::check_axpy(5, 1, 9, 0, 9), "axpy", "incy");
  check_bad(detail::check_axpy(5, 2, 8, 1, 9), "axpy", "x");
  check_bad(detail::check_axpy(5, 1, 9, 1, 4), "axpy", "y");

  CHECK(detail::check_dot(5, 1, 5, 1, 5));
  check_bad(detail::check_dot(-5, 1, 5, 1, 5), "dot", "n");
  check_bad(detail::check_dot(5, 0, 5, 1, 5), "dot", "incx");
  check_bad(detail::check_dot(5, 1, 5, 0, 5), "dot", "incy");
  check_bad(detail::check_dot(5, 1, 4, 1, 5), "dot", "x");
  check_bad(detail::check_dot(5, 1, 5, -3, 12), "dot", "y");

  for (const char* op : {"scal", "nrm2", "asum", "iamax"}) {
    CAPTURE(op);
    CHECK(detail::check_vector_op(op, 4, 3, 10));
    check_bad(detail::check_vector_op(op, -1, 1, 10), op, "n");
    check_bad(detail::check_vector_op(op, 4, 0, 10), op, "incx");
    check_bad(detail::check_vector_op(op, 4, -1, 10), op, "incx");
    check_bad(detail::check_vector_op(op, 4, 3, 9), op, "x");
  }
  CHECK(detail::check_vector_op("nrm2", 0, 1, 0));
  check_bad(detail::check_vector_op("iamax", 0, 1, 10, 1), "iamax", "n");
}

TEST_CASE("check_disjoint") {
  CHECK(detail::check_disjoint("gemm", "c", 0, 10, "a", 10, 10));
  CHECK(detail::check_disjoint("gemm", "c", 20, 10, "a", 10, 10));
  CHECK(detail::check_disjoint("gemm", "c", 5, 0, "a", 0, 10));
  check_bad(detail::check_disjoint("gemm", "c", 0, 11, "a", 10, 10), "gemm", "c");
  check_bad(detail::check_disjoint("axpy", "y", 12, 10, "x", 10, 10), "axpy", "y");
  CHECK(detail::check_disjoint("axpy", "y", 12, 10, "x", 10, 10)
            .error()
            .message()
            .find("overlaps x") != std::string::npos);
}

TEST_CASE_FIXTURE(io_fixture, "blas_actor::create on an unusable device is device_unavailable") {
  device d(ioc.get_executor(), unusable_ordinal());
  auto a = blas_actor::create(d);
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::device_unavailable);
  CHECK(a.error().library() == "cublas");
  auto b = blas_actor::create(d, {.streams = stream_policy::per_actor_fresh, .tf32 = true});
  REQUIRE_FALSE(b);
  CHECK(b.error().code() == errc::device_unavailable);
}

TEST_CASE("check_gemm_fused: the epilogue and its bias, on top of gemm's checks") {
  const gemm_params p{.m = 37, .n = 29, .k = 64};
  const std::size_t a = 37 * 64, b = 64 * 29, c = 37 * 29;
  for (auto e : {gemm_epilogue::relu, gemm_epilogue::gelu}) {
    CAPTURE(to_string(e));
    CHECK(!detail::epilogue_has_bias(e));
    auto g = detail::check_gemm_fused(p, e, a, b, 0, c);
    REQUIRE(g);
    CHECK(g.value().m == 37);
    CHECK(g.value().ldc == 37);
    auto extra = detail::check_gemm_fused(p, e, a, b, 37, c);
    REQUIRE_FALSE(extra);
    CHECK(extra.error().code() == errc::invalid_argument);
    CHECK(extra.error().message().find("gemm_fused: bias") != std::string::npos);
    CHECK(extra.error().message().find("takes none") != std::string::npos);
  }
  for (auto e : {gemm_epilogue::bias, gemm_epilogue::bias_relu, gemm_epilogue::bias_gelu}) {
    CAPTURE(to_string(e));
    CHECK(detail::epilogue_has_bias(e));
    CHECK(detail::check_gemm_fused(p, e, a, b, 37, c));
    for (std::size_t wrong : {std::size_t{0}, std::size_t{29}, std::size_t{38}}) {
      CAPTURE(wrong);
      auto r = detail::check_gemm_fused(p, e, a, b, wrong, c);
      REQUIRE_FALSE(r);
      CHECK(r.error().code() == errc::invalid_argument);
      CHECK(r.error().message().find("needs m = 37") != std::string::npos);
    }
  }
  auto bad = detail::check_gemm_fused(p, static_cast<gemm_epilogue>(9), a, b, 0, c);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("gemm_fused: epilogue (9) is not a gemm_epilogue") !=
        std::string::npos);
  CHECK(to_string(static_cast<gemm_epilogue>(9)) == "unknown");
  // gemm's own checks, named for gemm_fused.
  auto small_c = detail::check_gemm_fused(p, gemm_epilogue::relu, a, b, 0, c - 1);
  REQUIRE_FALSE(small_c);
  CHECK(small_c.error().code() == errc::invalid_argument);
  CHECK(small_c.error().message().rfind("gemm_fused: c ", 0) == 0);
}
