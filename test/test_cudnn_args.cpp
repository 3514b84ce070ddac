// cudnn_actor on the CPU: every argument check with good and bad values, the
// output-size arithmetic against hand-computed values, and creation on an
// unusable device; no CUDA call is made. The per-call buffer checks of an
// actor's operations are covered on an isolated device with a silent worker
// (test_isolated_cpu.cpp) and on the GPU (test_gpu_cudnn.cpp).
#include <atomr/cuda.hpp>
#include <atomr/cuda/cudnn_actor.hpp>

#include "../lib/device_impl.hpp"
#include "io_fixture.hpp"

#include <doctest/doctest.h>

#include <climits>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;

namespace {

// The error is invalid_argument and its message names `op` and `arg`.
template <class R>
void check_bad(const R& r, std::string_view op, std::string_view arg) {
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  const auto& m = r.error().message();
  CAPTURE(m);
  // The argument named right after the operation, not anywhere in the text.
  CHECK(m.rfind(std::string(op) + ": " + std::string(arg) + " ", 0) == 0);
}

constexpr auto conv_op = "cudnn_actor::conv2d_forward";
constexpr auto pool_op = "cudnn_actor::pooling_forward";

}  // namespace

TEST_CASE("cudnn output sizes match hand-computed values") {
  // (in + 2 pad - ((f - 1) d + 1)) / stride + 1
  CHECK(detail::conv_output_dim(5, 0, 3, 1, 1) == 3);
  CHECK(detail::conv_output_dim(5, 1, 3, 1, 1) == 5);
  CHECK(detail::conv_output_dim(7, 1, 3, 2, 1) == 4);   // (7 + 2 - 3) / 2 + 1
  CHECK(detail::conv_output_dim(8, 1, 3, 2, 1) == 4);   // (8 + 2 - 3) / 2 + 1 = 3 + 1
  CHECK(detail::conv_output_dim(9, 0, 3, 1, 2) == 5);   // dilated span 5
  CHECK(detail::conv_output_dim(10, 2, 3, 3, 2) == 4);  // (10 + 4 - 5) / 3 + 1
  CHECK(detail::conv_output_dim(1, 0, 1, 1, 1) == 1);
  CHECK(detail::conv_output_dim(2, 0, 3, 1, 1) == 0);  // does not fit
  CHECK(detail::conv_output_dim(3, 0, 2, 1, 3) == 0);  // dilated span 4 > 3
  // (in + 2 pad - window) / stride + 1
  CHECK(detail::pooling_output_dim(4, 0, 2, 2) == 2);
  CHECK(detail::pooling_output_dim(5, 0, 2, 2) == 2);
  CHECK(detail::pooling_output_dim(5, 1, 3, 2) == 3);
  CHECK(detail::pooling_output_dim(6, 1, 3, 1) == 6);
  CHECK(detail::pooling_output_dim(1, 0, 2, 1) == 0);
}

TEST_CASE("cudnn tensor shapes: extents, layout, overflow") {
  const auto op = "cudnn_actor::softmax_forward";
  CHECK(detail::check_tensor_shape(op, "shape", {2, 3, 4, 5}).value() == 120);
  CHECK(detail::check_tensor_shape(op, "shape", {2, 3, 4, 5, tensor_layout::nhwc}).value() == 120);
  for (std::int64_t v : {0LL, -1LL, static_cast<long long>(INT_MAX) + 1}) {
    check_bad(detail::check_tensor_shape(op, "shape", {v, 1, 1, 1}), op, "shape.n");
    check_bad(detail::check_tensor_shape(op, "shape", {1, v, 1, 1}), op, "shape.c");
    check_bad(detail::check_tensor_shape(op, "shape", {1, 1, v, 1}), op, "shape.h");
    check_bad(detail::check_tensor_shape(op, "shape", {1, 1, 1, v}), op, "shape.w");
  }
  tensor_shape bad_layout{1, 1, 1, 1, static_cast<tensor_layout>(9)};
  check_bad(detail::check_tensor_shape(op, "shape", bad_layout), op, "shape.layout");
  const std::int64_t big = INT_MAX;
  check_bad(detail::check_tensor_shape(op, "shape", {big, big, big, big}), op, "shape");
  CHECK(to_string(tensor_layout::nhwc) == "nhwc");
}

TEST_CASE("cudnn element types, exact sizes and overlap") {
  CHECK(detail::check_dtype("op", "x", dtype::f32));
  CHECK(detail::check_dtype("op", "x", dtype::f16));
  for (dtype t : {dtype::f64, dtype::bf16, dtype::c32, dtype::i32, dtype::u8})
    check_bad(detail::check_dtype("op", "x", t), "op", "x");
  CHECK(detail::check_exact_size("op", "y", 12, 12));
  check_bad(detail::check_exact_size("op", "y", 11, 12), "op", "y");
  check_bad(detail::check_exact_size("op", "y", 13, 12), "op", "y");
  CHECK(detail::check_exact_size("op", "y", 13, 12).error().message().find("needs exactly 12") !=
        std::string::npos);
  CHECK(detail::check_no_overlap("op", "y", false, 0, 64, 0, 64));
  CHECK(detail::check_no_overlap("op", "y", true, 0, 64, 64, 64));
  CHECK(detail::check_no_overlap("op", "y", true, 64, 64, 0, 64));
  check_bad(detail::check_no_overlap("op", "y", true, 0, 64, 63, 64), "op", "y");
  check_bad(detail::check_no_overlap("op", "y", true, 16, 8, 0, 64), "op", "y");
}

TEST_CASE("cudnn conv2d: parameters, groups and the layout of every operand") {
  const tensor_shape x{2, 6, 9, 8, tensor_layout::nhwc};
  conv2d_params p{.out_channels = 4,
                  .filter_h = 3,
                  .filter_w = 2,
                  .pad_h = 1,
                  .pad_w = 0,
                  .stride_h = 2,
                  .stride_w = 1,
                  .dilation_h = 2,
                  .dilation_w = 1,
                  .groups = 2};
  auto lay = detail::check_conv2d(conv_op, x, p).value();
  // h: (9 + 2 - 5) / 2 + 1 = 4; w: (8 - 2) / 1 + 1 = 7
  CHECK(lay.y == tensor_shape{2, 4, 4, 7, tensor_layout::nhwc});
  CHECK(lay.x_elems == 2 * 6 * 9 * 8);
  CHECK(lay.filter_elems == 4 * 3 * 3 * 2);
  CHECK(lay.bias_elems == 4);
  CHECK(lay.y_elems == 2 * 4 * 4 * 7);

  check_bad(detail::check_conv2d(conv_op, {0, 6, 9, 8}, p), conv_op, "x_shape.n");
  struct bad_field {
    std::int64_t conv2d_params::*field;
    std::int64_t value;
    const char* name;
  };
  const bad_field cases[] = {
      {&conv2d_params::out_channels, 0, "params.out_channels"},
      {&conv2d_params::filter_h, 0, "params.filter_h"},
      {&conv2d_params::filter_w, -2, "params.filter_w"},
      {&conv2d_params::pad_h, -1, "params.pad_h"},
      {&conv2d_params::pad_w, -1, "params.pad_w"},
      {&conv2d_params::stride_h, 0, "params.stride_h"},
      {&conv2d_params::stride_w, -1, "params.stride_w"},
      {&conv2d_params::dilation_h, 0, "params.dilation_h"},
      {&conv2d_params::dilation_w, 0, "params.dilation_w"},
      {&conv2d_params::groups, 0, "params.groups"},
      {&conv2d_params::groups, 4, "params.groups"},        // does not divide C = 6
      {&conv2d_params::out_channels, 5, "params.groups"},  // K = 5 not divisible by 2
      {&conv2d_params::filter_h, 7, "params.filter_h"},    // dilated 13 > 9 + 2
      {&conv2d_params::filter_w, 9, "params.filter_w"},    // 9 > 8
      {&conv2d_params::pad_w, static_cast<std::int64_t>(INT_MAX) + 1, "params.pad_w"},
  };
  for (const auto& c : cases) {
    CAPTURE(std::string(c.name));
    auto q = p;
    q.*c.field = c.value;
    check_bad(detail::check_conv2d(conv_op, x, q), conv_op, c.name);
  }
  // Groups = C: depthwise.
  auto dw = p;
  dw.groups = 6;
  dw.out_channels = 12;
  auto dl = detail::check_conv2d(conv_op, x, dw).value();
  CHECK(dl.filter_elems == 12 * 1 * 3 * 2);
}

TEST_CASE("cudnn pooling: window, padding, stride and output size") {
  const tensor_shape x{1, 3, 5, 6};
  pooling_params p{.mode = pooling_mode::average_exclude_padding,
                   .window_h = 3,
                   .window_w = 2,
                   .pad_h = 1,
                   .pad_w = 0,
                   .stride_h = 2,
                   .stride_w = 2};
  // h: (5 + 2 - 3) / 2 + 1 = 3; w: (6 - 2) / 2 + 1 = 3
  CHECK(detail::check_pooling(pool_op, x, p).value() == tensor_shape{1, 3, 3, 3});
  check_bad(detail::check_pooling(pool_op, {1, 3, 0, 6}, p), pool_op, "x_shape.h");
  auto q = p;
  q.mode = static_cast<pooling_mode>(7);
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.mode");
  q = p;
  q.window_h = 0;
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.window_h");
  q = p;
  q.window_w = -1;
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.window_w");
  q = p;
  q.pad_h = 3;  // not < window
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.pad_h");
  q = p;
  q.pad_w = -1;
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.pad_w");
  q = p;
  q.stride_h = 0;
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.stride_h");
  q = p;
  q.stride_w = 0;
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.stride_w");
  q = p;
  q.window_w = 7;
  q.pad_w = 0;
  check_bad(detail::check_pooling(pool_op, x, q), pool_op, "params.window_w");
  CHECK(to_string(pooling_mode::max) == "max");
}

TEST_CASE("cudnn activation, softmax, batchnorm epsilon and options") {
  const auto op = "cudnn_actor::activation_forward";
  for (auto m : {activation_mode::relu, activation_mode::sigmoid, activation_mode::tanh})
    CHECK(detail::check_activation(op, {m, 0.0}));
  CHECK(detail::check_activation(op, {activation_mode::elu, 1.0}));
  CHECK(detail::check_activation(op, {activation_mode::clipped_relu, 6.0}));
  check_bad(detail::check_activation(op, {activation_mode::elu, 0.0}), op, "params.coef");
  check_bad(detail::check_activation(op, {activation_mode::clipped_relu, -1.0}), op, "params.coef");
  check_bad(detail::check_activation(op, {activation_mode::clipped_relu, NAN}), op, "params.coef");
  check_bad(detail::check_activation(op, {activation_mode::relu, INFINITY}), op, "params.coef");
  check_bad(detail::check_activation(op, {static_cast<activation_mode>(42), 1.0}), op,
            "params.mode");
  CHECK(to_string(activation_mode::clipped_relu) == "clipped_relu");

  const auto sop = "cudnn_actor::softmax_forward";
  CHECK(detail::check_softmax(sop, softmax_algorithm::accurate));
  CHECK(detail::check_softmax(sop, softmax_algorithm::log));
  check_bad(detail::check_softmax(sop, static_cast<softmax_algorithm>(5)), sop, "algorithm");

  const auto bop = "cudnn_actor::batchnorm_inference";
  CHECK(detail::check_batchnorm_epsilon(bop, 1e-5));
  CHECK(detail::check_batchnorm_epsilon(bop, 1e-12));
  for (double e : {0.0, -1e-5, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::infinity()})
    check_bad(detail::check_batchnorm_epsilon(bop, e), bop, "epsilon");

  CHECK(detail::check_cudnn_options({}));
  check_bad(detail::check_cudnn_options({.algo_cache_size = 0}), "cudnn_actor::create",
            "algo_cache_size");
  CHECK(detail::check_cudnn_options({.convolution_api = conv_api::legacy}));
  check_bad(detail::check_cudnn_options({.convolution_api = static_cast<conv_api>(7)}),
            "cudnn_actor::create", "convolution_api");
  CHECK(to_string(conv_api::graph) == "graph");
  CHECK(to_string(conv_api::legacy) == "legacy");
}

TEST_CASE("cudnn conv keys distinguish shape, params, type, bias and alignment") {
  detail::conv_key a{{1, 2, 3, 4}, {}, dtype::f32, false};
  auto b = a;
  CHECK(a == b);
  b.x.layout = tensor_layout::nhwc;
  CHECK(a != b);
  b = a;
  b.p.groups = 2;
  CHECK(a != b);
  b = a;
  b.type = dtype::f16;
  CHECK(a != b);
  b = a;
  b.bias = true;
  CHECK(a != b);
  b = a;
  b.align_y = 4;
  CHECK(a != b);
}

TEST_CASE_FIXTURE(io_fixture,
                  "cudnn_actor::create on an unusable device yields device_unavailable") {
  device d(ioc.get_executor(), unusable_ordinal());
  auto a = cudnn_actor::create(d);
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::device_unavailable);
  // Bad options are reported first, without touching the device.
  check_bad(cudnn_actor::create(d, {.algo_cache_size = 0}), "cudnn_actor::create",
            "algo_cache_size");
}
