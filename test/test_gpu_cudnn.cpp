// cudnn_actor on the GPU: conv2d against a naive CPU convolution in double on
// shapes covering stride, padding, dilation and groups, in both layouts and
// both element types (with and without bias); activation, softmax, pooling
// and batch normalization against CPU references; invalid_argument for every
// operation. Inputs are random (never zero); outputs are NaN-filled (every
// byte 0xFF) before every run.
#include <atomr/cuda/cudnn_actor.hpp>

#include "gpu_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::gpu_fixture;
using atomr::cuda::test::random_floats;

namespace {

/// Index of (n, c, h, w) in a dense tensor of shape s.
std::size_t at(const tensor_shape& s, std::int64_t n, std::int64_t c, std::int64_t h,
               std::int64_t w) {
  if (s.layout == tensor_layout::nchw)
    return static_cast<std::size_t>(((n * s.c + c) * s.h + h) * s.w + w);
  return static_cast<std::size_t>(((n * s.h + h) * s.w + w) * s.c + c);
}

/// The naive cross-correlation in double. The filter is K x C/g x R x S in
/// the layout of x (KCRS or KRSC).
std::vector<double> cpu_conv(const tensor_shape& xs, const conv2d_params& p,
                             const std::vector<double>& x, const std::vector<double>& f,
                             const std::vector<double>* bias, const tensor_shape& ys) {
  const std::int64_t cg = xs.c / p.groups, kg = p.out_channels / p.groups;
  const tensor_shape fs{p.out_channels, cg, p.filter_h, p.filter_w, xs.layout};
  std::vector<double> y(static_cast<std::size_t>(ys.elements()));
  for (std::int64_t n = 0; n < ys.n; ++n)
    for (std::int64_t k = 0; k < ys.c; ++k)
      for (std::int64_t oh = 0; oh < ys.h; ++oh)
        for (std::int64_t ow = 0; ow < ys.w; ++ow) {
          double acc = bias ? (*bias)[static_cast<std::size_t>(k)] : 0.0;
          const std::int64_t g = k / kg;
          for (std::int64_t c = 0; c < cg; ++c)
            for (std::int64_t r = 0; r < p.filter_h; ++r)
              for (std::int64_t s = 0; s < p.filter_w; ++s) {
                const std::int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
                const std::int64_t iw = ow * p.stride_w - p.pad_w + s * p.dilation_w;
                if (ih < 0 || ih >= xs.h || iw < 0 || iw >= xs.w) continue;
                acc += x[at(xs, n, g * cg + c, ih, iw)] * f[at(fs, k, c, r, s)];
              }
          y[at(ys, n, k, oh, ow)] = acc;
        }
  return y;
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, half>)
    return __float2half(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, half>)
    return static_cast<double>(__half2float(v));
  else
    return static_cast<double>(v);
}

/// Random values in [lo, hi), rounded to T and returned in double as stored.
template <class T>
std::vector<double> random_values(std::size_t n, std::uint64_t seed, double lo = -1,
                                  double hi = 1) {
  auto f = random_floats(n, seed);
  std::vector<double> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = to_double(from_double<T>(lo + (hi - lo) * (f[i] + 1.0) / 2.0));
  return out;
}

struct cudnn_fixture : gpu_fixture {
  cudnn_actor dnn = cudnn_actor::create(dev).value();

  template <class T>
  gpu_ref<T> up(const std::vector<double>& v) {
    std::vector<T> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = from_double<T>(v[i]);
    auto r = alloc<T>(v.size());
    REQUIRE(run(upload(std::span<const T>(h), r)));
    return r;
  }
  template <class T>
  std::vector<double> down(const gpu_ref<T>& r) {
    std::vector<T> h(r.size());
    REQUIRE(run(download(r, std::span<T>(h))));
    std::vector<double> out(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) out[i] = to_double(h[i]);
    return out;
  }
  template <class T>
  gpu_ref<T> nan_buffer(std::size_t n) {
    auto r = alloc<T>(n);
    REQUIRE(run(fill_bytes(r, 0xFF)));
    return r;
  }

  /// `a` uploaded into a fresh buffer `skip` elements in (a view at that offset).
  template <class T>
  gpu_ref<T> up_at(const std::vector<double>& v, std::size_t skip) {
    if (skip == 0) return up<T>(v);
    auto whole = up<T>(std::vector<double>(v.size() + skip, 0.0));
    auto view = whole.subspan(skip, v.size()).value();
    std::vector<T> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) h[i] = from_double<T>(v[i]);
    REQUIRE(run(upload(std::span<const T>(h), view)));
    return view;
  }

  /// One convolution on `a` against the CPU; every operand `skip` elements
  /// into its buffer (0: as allocated, 256-byte aligned).
  template <class T>
  void conv_case(tensor_shape xs, conv2d_params p, bool with_bias, double tol, const cudnn_actor& a,
                 std::size_t skip = 0) {
    auto lay = detail::check_conv2d("test", xs, p).value();
    auto x = random_values<T>(static_cast<std::size_t>(lay.x_elems), 11 + lay.x_elems);
    auto f = random_values<T>(static_cast<std::size_t>(lay.filter_elems), 23 + lay.filter_elems);
    auto b = random_values<T>(static_cast<std::size_t>(lay.bias_elems), 37);
    auto want = cpu_conv(xs, p, x, f, with_bias ? &b : nullptr, lay.y);
    auto y = up_at<T>(std::vector<double>(static_cast<std::size_t>(lay.y_elems), NAN), skip);
    auto r = run(a.conv2d_forward(xs, p, up_at<T>(x, skip), up_at<T>(f, skip),
                                  with_bias ? up<T>(b) : gpu_ref<T>{}, y));
    REQUIRE(r);
    CHECK(rel_error(down(y), want) < tol);
  }
  template <class T>
  void conv_case(tensor_shape xs, conv2d_params p, bool with_bias, double tol) {
    conv_case<T>(xs, p, with_bias, tol, dnn);
  }

  /// Every case in both layouts, both types, with and without bias, on `a`.
  void all_conv_cases(const cudnn_actor& a, std::size_t skip = 0);
};

struct conv_case_def {
  tensor_shape x;
  conv2d_params p;
};

const std::vector<conv_case_def> conv_cases = {
    // plain 3x3 with padding 1
    {{2, 3, 9, 10}, {.out_channels = 5, .filter_h = 3, .filter_w = 3, .pad_h = 1, .pad_w = 1}},
    // stride 2, asymmetric filter and padding
    {{1, 4, 11, 8},
     {.out_channels = 6,
      .filter_h = 3,
      .filter_w = 2,
      .pad_h = 2,
      .pad_w = 0,
      .stride_h = 2,
      .stride_w = 3}},
    // dilation 2 and groups 2
    {{2, 8, 12, 12},
     {.out_channels = 4,
      .filter_h = 3,
      .filter_w = 3,
      .pad_h = 1,
      .pad_w = 2,
      .dilation_h = 2,
      .dilation_w = 2,
      .groups = 2}},
    // depthwise (groups = C), stride and dilation together
    {{1, 6, 13, 9},
     {.out_channels = 12,
      .filter_h = 3,
      .filter_w = 3,
      .pad_h = 1,
      .pad_w = 1,
      .stride_h = 2,
      .stride_w = 1,
      .dilation_h = 1,
      .dilation_w = 2,
      .groups = 6}},
};

void cudnn_fixture::all_conv_cases(const cudnn_actor& a, std::size_t skip) {
  for (auto layout : {tensor_layout::nchw, tensor_layout::nhwc})
    for (const auto& c : conv_cases)
      for (bool bias : {false, true}) {
        auto xs = c.x;
        xs.layout = layout;
        CAPTURE(std::string(to_string(layout)));
        CAPTURE(c.p.groups);
        CAPTURE(bias);
        CAPTURE(skip);
        conv_case<float>(xs, c.p, bias, 1e-5, a, skip);
        conv_case<half>(xs, c.p, bias, 1e-2, a, skip);
      }
}

constexpr std::size_t conv_runs = 2 * 4 * 2 * 2;  // layouts x cases x bias x types

}  // namespace

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn conv2d equals a naive CPU convolution") {
  all_conv_cases(dnn);
  auto s = dnn.statistics();
  CHECK(s.algo_misses == conv_runs);
  CHECK(s.algos_cached == s.algo_misses);
  // Every shape got a plan on one API; the default asks for the graph API
  // first and the plain and strided shapes have graph engines.
  CHECK(s.graph_plans + s.legacy_plans == s.algo_misses);
  CHECK(s.graph_fallbacks == s.legacy_plans);
  CHECK(s.graph_plans >= 8);
  MESSAGE("graph API plans: " << s.graph_plans << ", legacy fallbacks: " << s.graph_fallbacks);
  // The same shapes again hit the cache (new buffers: a new variant pack).
  conv_case<float>(conv_cases[0].x, conv_cases[0].p, false, 1e-5);
  CHECK(dnn.statistics().algo_hits == s.algo_hits + 1);
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn conv2d on the legacy API equals the CPU convolution") {
  auto legacy = cudnn_actor::create(dev, {.convolution_api = conv_api::legacy}).value();
  all_conv_cases(legacy);
  auto s = legacy.statistics();
  CHECK(s.algo_misses == conv_runs);
  CHECK(s.legacy_plans == conv_runs);
  CHECK(s.graph_plans == 0);
  CHECK(s.graph_fallbacks == 0);
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn conv2d on operands that are not 16-byte aligned") {
  // One element in: f32 pointers 4-byte aligned, f16 ones 2-byte. Graph
  // engines are chosen for the alignment the pointers have, so these shapes
  // get plans of their own (an engine assuming 16 bytes would read out of
  // alignment and fault).
  all_conv_cases(dnn, 1);
  auto s = dnn.statistics();
  CHECK(s.algo_misses == conv_runs);
  CHECK(s.graph_plans + s.legacy_plans == conv_runs);
  all_conv_cases(dnn, 0);
  CHECK(dnn.statistics().algo_misses == 2 * conv_runs);
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn conv2d reruns on the same buffers with new contents") {
  // Same pointers each time: the first run executes the plan, the second
  // records it into a CUDA graph and launches that, later ones launch it
  // again. Every run must read the new contents and write the new output.
  const tensor_shape xs{2, 16, 14, 14, tensor_layout::nhwc};
  const conv2d_params p{.out_channels = 32, .filter_h = 3, .filter_w = 3, .pad_h = 1, .pad_w = 1};
  auto lay = detail::check_conv2d("test", xs, p).value();
  auto f = random_values<half>(static_cast<std::size_t>(lay.filter_elems), 5);
  auto df = up<half>(f);
  auto dx = nan_buffer<half>(static_cast<std::size_t>(lay.x_elems));
  auto dy = nan_buffer<half>(static_cast<std::size_t>(lay.y_elems));
  auto dy2 = nan_buffer<half>(static_cast<std::size_t>(lay.y_elems));
  std::uint64_t seed = 100;
  // One run into `out` with fresh contents of dx, checked against the CPU.
  auto run_into = [&](const gpu_ref<half>& out, const cudnn_actor& a) {
    auto x = random_values<half>(static_cast<std::size_t>(lay.x_elems), ++seed);
    std::vector<half> hx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) hx[i] = from_double<half>(x[i]);
    REQUIRE(run(upload(std::span<const half>(hx), dx)));
    REQUIRE(run(fill_bytes(out, 0xFF)));
    REQUIRE(run(a.conv2d_forward(xs, p, dx, df, gpu_ref<half>{}, out)));
    CAPTURE(seed);
    CHECK(rel_error(down(out), cpu_conv(xs, p, x, f, nullptr, lay.y)) < 1e-2);
  };
  for (int i = 0; i < 3; ++i) run_into(dy, dnn);
  auto s = dnn.statistics();
  CHECK(s.algo_misses == 1);
  CHECK(s.algo_hits == 2);
  CHECK(s.graph_plans == 1);
  CHECK(s.cuda_graph_failures == 0);
  CHECK(s.cuda_graph_records == 1);
  CHECK(s.cuda_graph_launches == 2);
  // Other pointers: executed directly; then the recorded ones again: replayed.
  run_into(dy2, dnn);
  CHECK(dnn.statistics().cuda_graph_launches == 2);
  run_into(dy, dnn);
  CHECK(dnn.statistics().cuda_graph_launches == 3);
  CHECK(dnn.statistics().cuda_graph_records == 1);
  // Alternating buffers never record; with cuda_graphs off nothing records.
  auto plain = cudnn_actor::create(dev, {.cuda_graphs = false}).value();
  for (int i = 0; i < 3; ++i) run_into(i % 2 ? dy2 : dy, dnn);
  for (int i = 0; i < 3; ++i) run_into(dy, plain);
  CHECK(dnn.statistics().cuda_graph_records == 1);
  CHECK(plain.statistics().cuda_graph_records == 0);
  CHECK(plain.statistics().cuda_graph_launches == 0);
  CHECK(plain.statistics().graph_plans == 1);
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn activations equal their CPU definitions") {
  const tensor_shape s{2, 3, 5, 7};
  const auto n = static_cast<std::size_t>(s.elements());
  auto x = random_values<float>(n, 5, -3, 3);
  auto gx = up<float>(x);
  const std::pair<activation_params, double (*)(double, double)> acts[] = {
      {{activation_mode::relu, 0}, [](double v, double) { return std::max(v, 0.0); }},
      {{activation_mode::sigmoid, 0}, [](double v, double) { return 1 / (1 + std::exp(-v)); }},
      {{activation_mode::tanh, 0}, [](double v, double) { return std::tanh(v); }},
      {{activation_mode::elu, 0.7},
       [](double v, double a) { return v > 0 ? v : a * (std::exp(v) - 1); }},
      {{activation_mode::clipped_relu, 1.5},
       [](double v, double c) { return std::min(std::max(v, 0.0), c); }},
  };
  for (const auto& [p, fn] : acts) {
    CAPTURE(std::string(to_string(p.mode)));
    std::vector<double> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = fn(x[i], p.coef);
    auto y = nan_buffer<float>(n);
    REQUIRE(run(dnn.activation_forward(s, p, gx, y)));
    CHECK(rel_error(down(y), want) < 1e-5);
    auto xh = up<half>(x);
    auto yh = nan_buffer<half>(n);
    REQUIRE(run(dnn.activation_forward(s, p, xh, yh)));
    CHECK(rel_error(down(yh), want) < 1e-2);
  }
}

TEST_CASE_FIXTURE(cudnn_fixture,
                  "cudnn: a lane sets its descriptors again only when the operation's type, shape "
                  "or parameters change; each kind keeps its own") {
  // One lane (one thread), so every call below uses the same lane's
  // descriptors: a key that left out the coefficient, the shape or the
  // pooling mode would give the numbers of the call before.
  const tensor_shape s{1, 4, 1, 4};
  const auto n = static_cast<std::size_t>(s.elements());
  auto x = random_values<float>(n, 77, -3, 3);
  auto gx = up<float>(x);
  const auto reused = [&] { return dnn.statistics().descriptors_reused; };
  const auto clipped = [&](double c) {
    std::vector<double> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = std::min(std::max(x[i], 0.0), c);
    return want;
  };
  const auto r0 = reused();
  for (int i = 0; i < 3; ++i) {
    auto y = nan_buffer<float>(n);
    REQUIRE(run(dnn.activation_forward(s, {activation_mode::clipped_relu, 1.0}, gx, y)));
    CHECK(rel_error(down(y), clipped(1.0)) < 1e-6);
  }
  CHECK(reused() - r0 == 2);
  {
    auto y = nan_buffer<float>(n);
    REQUIRE(run(dnn.activation_forward(s, {activation_mode::clipped_relu, 2.0}, gx, y)));
    CHECK(rel_error(down(y), clipped(2.0)) < 1e-6);
    CHECK(reused() - r0 == 2);
  }
  // Softmax over 4 channels, then over 2 (the same data, another shape).
  for (const tensor_shape& t : {s, tensor_shape{2, 2, 1, 4}}) {
    CAPTURE(t.c);
    std::vector<double> want(n);
    for (std::int64_t b = 0; b < t.n; ++b)
      for (std::int64_t w = 0; w < t.w; ++w) {
        double sum = 0;
        for (std::int64_t c = 0; c < t.c; ++c) sum += std::exp(x[at(t, b, c, 0, w)]);
        for (std::int64_t c = 0; c < t.c; ++c)
          want[at(t, b, c, 0, w)] = std::exp(x[at(t, b, c, 0, w)]) / sum;
      }
    auto y = nan_buffer<float>(n);
    REQUIRE(run(dnn.softmax_forward(t, softmax_algorithm::accurate, gx, y)));
    CHECK(rel_error(down(y), want) < 1e-5);
  }
  // Max, then average pooling of the same shapes: 2 x 2 windows of a 4 x 4 image.
  const tensor_shape img{1, 1, 4, 4};
  for (auto mode : {pooling_mode::max, pooling_mode::average_include_padding}) {
    CAPTURE(std::string(to_string(mode)));
    std::vector<double> want(4);
    for (std::int64_t oh = 0; oh < 2; ++oh)
      for (std::int64_t ow = 0; ow < 2; ++ow) {
        double mx = -1e300, sum = 0;
        for (std::int64_t r = 0; r < 2; ++r)
          for (std::int64_t q = 0; q < 2; ++q) {
            const double v = x[at(img, 0, 0, oh * 2 + r, ow * 2 + q)];
            mx = std::max(mx, v);
            sum += v;
          }
        want[static_cast<std::size_t>(oh * 2 + ow)] = mode == pooling_mode::max ? mx : sum / 4;
      }
    auto y = nan_buffer<float>(4);
    REQUIRE(run(dnn.pooling_forward(img, {.mode = mode}, gx, y)));
    CHECK(rel_error(down(y), want) < 1e-6);
  }
  CHECK(reused() - r0 == 2);
  // Each kind keeps its own: the activation of before, after a softmax and
  // a pooling on the lane, reuses its descriptors.
  {
    auto y = nan_buffer<float>(n);
    REQUIRE(run(dnn.activation_forward(s, {activation_mode::clipped_relu, 2.0}, gx, y)));
    CHECK(rel_error(down(y), clipped(2.0)) < 1e-6);
    CHECK(reused() - r0 == 3);
  }
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn softmax over channels, accurate and log, both layouts") {
  for (auto layout : {tensor_layout::nchw, tensor_layout::nhwc}) {
    const tensor_shape s{2, 5, 3, 4, layout};
    const auto n = static_cast<std::size_t>(s.elements());
    auto x = random_values<float>(n, 9, -4, 4);
    for (auto a : {softmax_algorithm::accurate, softmax_algorithm::log}) {
      std::vector<double> want(n);
      for (std::int64_t b = 0; b < s.n; ++b)
        for (std::int64_t h = 0; h < s.h; ++h)
          for (std::int64_t w = 0; w < s.w; ++w) {
            double mx = -1e300, sum = 0;
            for (std::int64_t c = 0; c < s.c; ++c) mx = std::max(mx, x[at(s, b, c, h, w)]);
            for (std::int64_t c = 0; c < s.c; ++c) sum += std::exp(x[at(s, b, c, h, w)] - mx);
            for (std::int64_t c = 0; c < s.c; ++c) {
              const double v = x[at(s, b, c, h, w)] - mx;
              want[at(s, b, c, h, w)] =
                  a == softmax_algorithm::log ? v - std::log(sum) : std::exp(v) / sum;
            }
          }
      auto y = nan_buffer<float>(n);
      REQUIRE(run(dnn.softmax_forward(s, a, up<float>(x), y)));
      CHECK(rel_error(down(y), want) < 1e-5);
      auto yh = nan_buffer<half>(n);
      REQUIRE(run(dnn.softmax_forward(s, a, up<half>(x), yh)));
      CHECK(rel_error(down(yh), want) < 1e-2);
    }
  }
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn pooling: max and average, padding and stride") {
  for (auto layout : {tensor_layout::nchw, tensor_layout::nhwc})
    for (auto mode : {pooling_mode::max, pooling_mode::average_include_padding,
                      pooling_mode::average_exclude_padding}) {
      CAPTURE(std::string(to_string(mode)));
      const tensor_shape xs{2, 3, 7, 8, layout};
      const pooling_params p{.mode = mode,
                             .window_h = 3,
                             .window_w = 2,
                             .pad_h = 1,
                             .pad_w = 1,
                             .stride_h = 2,
                             .stride_w = 2};
      const auto ys = detail::check_pooling("test", xs, p).value();
      auto x = random_values<float>(static_cast<std::size_t>(xs.elements()), 31);
      std::vector<double> want(static_cast<std::size_t>(ys.elements()));
      for (std::int64_t b = 0; b < ys.n; ++b)
        for (std::int64_t c = 0; c < ys.c; ++c)
          for (std::int64_t oh = 0; oh < ys.h; ++oh)
            for (std::int64_t ow = 0; ow < ys.w; ++ow) {
              double mx = -1e300, sum = 0;
              int real = 0;
              for (std::int64_t r = 0; r < p.window_h; ++r)
                for (std::int64_t q = 0; q < p.window_w; ++q) {
                  const auto ih = oh * p.stride_h - p.pad_h + r, iw = ow * p.stride_w - p.pad_w + q;
                  if (ih < 0 || ih >= xs.h || iw < 0 || iw >= xs.w) continue;
                  const double v = x[at(xs, b, c, ih, iw)];
                  mx = std::max(mx, v);
                  sum += v;
                  ++real;
                }
              want[at(ys, b, c, oh, ow)] = mode == pooling_mode::max ? mx
                                           : mode == pooling_mode::average_include_padding
                                               ? sum / static_cast<double>(p.window_h * p.window_w)
                                               : sum / real;
            }
      auto y = nan_buffer<float>(want.size());
      REQUIRE(run(dnn.pooling_forward(xs, p, up<float>(x), y)));
      CHECK(rel_error(down(y), want) < 1e-5);
      auto yh = nan_buffer<half>(want.size());
      REQUIRE(run(dnn.pooling_forward(xs, p, up<half>(x), yh)));
      CHECK(rel_error(down(yh), want) < 1e-2);
    }
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn batch normalization inference") {
  for (auto layout : {tensor_layout::nchw, tensor_layout::nhwc}) {
    const tensor_shape s{3, 4, 5, 6, layout};
    const auto n = static_cast<std::size_t>(s.elements());
    const auto c = static_cast<std::size_t>(s.c);
    auto x = random_values<float>(n, 41);
    auto scale = random_values<float>(c, 43, 0.5, 2);
    auto bias = random_values<float>(c, 47);
    auto mean = random_values<float>(c, 53, -0.5, 0.5);
    auto var = random_values<float>(c, 59, 0.1, 2);
    const double eps = 1e-5;
    std::vector<double> want(n);
    for (std::int64_t b = 0; b < s.n; ++b)
      for (std::int64_t k = 0; k < s.c; ++k)
        for (std::int64_t h = 0; h < s.h; ++h)
          for (std::int64_t w = 0; w < s.w; ++w) {
            const auto i = at(s, b, k, h, w);
            const auto kk = static_cast<std::size_t>(k);
            want[i] = scale[kk] * (x[i] - mean[kk]) / std::sqrt(var[kk] + eps) + bias[kk];
          }
    auto gs = up<float>(scale), gb = up<float>(bias), gm = up<float>(mean), gv = up<float>(var);
    auto y = nan_buffer<float>(n);
    REQUIRE(run(dnn.batchnorm_inference(s, eps, up<float>(x), gs, gb, gm, gv, y)));
    CHECK(rel_error(down(y), want) < 1e-5);
    auto yh = nan_buffer<half>(n);
    REQUIRE(run(dnn.batchnorm_inference(s, eps, up<half>(x), gs, gb, gm, gv, yh)));
    CHECK(rel_error(down(yh), want) < 1e-2);
  }
}

TEST_CASE_FIXTURE(cudnn_fixture, "cudnn operations reject bad arguments before any GPU call") {
  auto bad = [](const auto& r, std::string_view arg) {
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CAPTURE(r.error().message());
    CHECK(r.error().message().find(std::string(arg) + " ") != std::string::npos);
  };
  const tensor_shape xs{1, 2, 4, 4};
  const conv2d_params p{.out_channels = 2, .filter_h = 3, .filter_w = 3};
  auto x = alloc<float>(32), f = alloc<float>(36), y = alloc<float>(8);
  const auto before = dev.statistics().ops_completed;
  bad(run(dnn.conv2d_forward(xs, p, x, f, {}, alloc<float>(9))), "y");
  bad(run(dnn.conv2d_forward(xs, p, x, alloc<float>(35), {}, y)), "filter");
  bad(run(dnn.conv2d_forward(xs, p, x, f, alloc<float>(3), y)), "bias");
  bad(run(dnn.conv2d_forward(xs, {.out_channels = 3, .groups = 2}, x, f, {}, y)), "params.groups");
  bad(run(dnn.conv2d_forward(xs, p, x, f, {}, x.subspan(0, 8).value())), "y");
  bad(run(dnn.activation_forward(xs, {activation_mode::elu, 0}, x, alloc<float>(32))),
      "params.coef");
  bad(run(dnn.softmax_forward(xs, softmax_algorithm::accurate, x, alloc<float>(31))), "y");
  bad(run(dnn.pooling_forward(xs, {.window_h = 5}, x, alloc<float>(8))), "params.window_h");
  auto c = alloc<float>(2);
  bad(run(dnn.batchnorm_inference(xs, 0.0, x, c, c, c, c, alloc<float>(32))), "epsilon");
  bad(run(dnn.batchnorm_inference(xs, 1e-5, x, c, alloc<float>(3), c, c, alloc<float>(32))),
      "bias");
  bad(run(dnn.batchnorm_inference(xs, 1e-5, x, c, c, c, gpu_ref<float>{}, alloc<float>(32))),
      "var");
  CHECK(dev.statistics().ops_completed == before);
}
