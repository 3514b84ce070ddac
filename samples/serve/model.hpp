// The small fixed inference model of atomr-serve's /v1/infer, its weights
// (made from a fixed seed, so that the service, the load generator and the
// tests agree without sending them) and a double-precision CPU reference.
// Not part of the library.
//
//   x: 1 x 1 x 28 x 28 (NCHW)
//   conv 3x3, 8 filters, pad 1, + bias  -> 8 x 28 x 28
//   relu
//   max pool 2x2, stride 2              -> 8 x 14 x 14 (1568 values, NCHW order)
//   dense 10 x 1568 + bias              -> 10 logits
//   softmax                             -> 10 probabilities
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace serve::model {

inline constexpr int in_h = 28, in_w = 28, filters = 8, kernel = 3, pool = 2;
inline constexpr int out_h = in_h / pool, out_w = in_w / pool;
inline constexpr int features = filters * out_h * out_w;  // 1568
inline constexpr int classes = 10;
inline constexpr std::size_t input_size = in_h * in_w;
inline constexpr std::uint32_t default_seed = 20261205;

struct weights {
  std::vector<float> conv_w;   ///< filters x 1 x 3 x 3 (KCRS)
  std::vector<float> conv_b;   ///< filters
  std::vector<float> dense_w;  ///< classes x features, column-major (ld = classes)
  std::vector<float> dense_b;  ///< classes
};

inline weights make_weights(std::uint32_t seed = default_seed) {
  std::mt19937 g(seed);
  auto fill = [&](std::vector<float>& v, std::size_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    v.resize(n);
    for (auto& x : v) x = u(g);
  };
  weights w;
  fill(w.conv_w, filters * kernel * kernel, 1.0f / 3);
  fill(w.conv_b, filters, 0.1f);
  fill(w.dense_w, static_cast<std::size_t>(classes) * features, 0.05f);
  fill(w.dense_b, classes, 0.1f);
  return w;
}

/// The model on the CPU, in double precision: the 10 probabilities.
inline std::array<double, classes> reference(const weights& w, const float* x) {
  std::vector<double> act(static_cast<std::size_t>(filters) * in_h * in_w);
  for (int k = 0; k < filters; ++k)
    for (int p = 0; p < in_h; ++p)
      for (int q = 0; q < in_w; ++q) {
        double s = w.conv_b[k];
        for (int r = 0; r < kernel; ++r)
          for (int t = 0; t < kernel; ++t) {
            const int y = p - 1 + r, z = q - 1 + t;
            if (y < 0 || y >= in_h || z < 0 || z >= in_w) continue;
            s += static_cast<double>(x[y * in_w + z]) * w.conv_w[(k * kernel + r) * kernel + t];
          }
        act[(static_cast<std::size_t>(k) * in_h + p) * in_w + q] = std::max(s, 0.0);
      }
  std::vector<double> pooled(features);
  for (int k = 0; k < filters; ++k)
    for (int p = 0; p < out_h; ++p)
      for (int q = 0; q < out_w; ++q) {
        double m = -1e300;
        for (int r = 0; r < pool; ++r)
          for (int t = 0; t < pool; ++t)
            m = std::max(
                m, act[(static_cast<std::size_t>(k) * in_h + p * pool + r) * in_w + q * pool + t]);
        pooled[(static_cast<std::size_t>(k) * out_h + p) * out_w + q] = m;
      }
  std::array<double, classes> logits{};
  for (int o = 0; o < classes; ++o) {
    double s = w.dense_b[o];
    for (int j = 0; j < features; ++j)
      s += w.dense_w[static_cast<std::size_t>(o) + static_cast<std::size_t>(classes) * j] *
           pooled[j];
    logits[o] = s;
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (auto& l : logits) sum += (l = std::exp(l - mx));
  for (auto& l : logits) l /= sum;
  return logits;
}

}  // namespace serve::model
