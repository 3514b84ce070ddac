// rng_actor on a real GPU: distributions within 5 standard errors, seeds,
// the published Sobol points, raw bits, and an invalid_argument per operation.
// Every output is filled with 0xFF bytes (NaN for floats) before each run.
#include "gpu_fixture.hpp"

#include <atomr/cuda/rng_actor.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;

namespace {

constexpr rng_kind all_kinds[] = {rng_kind::philox4_32_10, rng_kind::xorwow,
                                  rng_kind::mrg32k3a,      rng_kind::mtgp32,
                                  rng_kind::sobol32,       rng_kind::scrambled_sobol32,
                                  rng_kind::sobol64,       rng_kind::scrambled_sobol64};
constexpr rng_kind pseudo_kinds[] = {rng_kind::philox4_32_10, rng_kind::xorwow, rng_kind::mrg32k3a,
                                     rng_kind::mtgp32};

constexpr std::size_t n_samples = std::size_t{1} << 20;

struct moments {
  double mean = 0;
  double var = 0;  // unbiased sample variance
};

template <class T>
moments sample_moments(const std::vector<T>& v) {
  double s = 0;
  for (auto x : v) s += static_cast<double>(x);
  const double mean = s / static_cast<double>(v.size());
  double ss = 0;
  for (auto x : v) ss += (static_cast<double>(x) - mean) * (static_cast<double>(x) - mean);
  return {mean, ss / static_cast<double>(v.size() - 1)};
}

/// Sample mean and variance within 5 standard errors of a distribution with
/// this mean, variance and fourth central moment.
template <class T>
void check_distribution(const std::vector<T>& v, double mean, double var, double mu4) {
  const auto n = static_cast<double>(v.size());
  const moments m = sample_moments(v);
  const double se_mean = std::sqrt(var / n);
  const double se_var = std::sqrt((mu4 - var * var) / n);
  CAPTURE(m.mean);
  CAPTURE(m.var);
  CHECK(std::abs(m.mean - mean) < 5 * se_mean);
  CHECK(std::abs(m.var - var) < 5 * se_var);
}

struct rng_fixture : gpu_fixture {
  rng_actor make(rng_options o = {}) {
    auto a = rng_actor::create(dev, o);
    REQUIRE_MESSAGE(a, (a ? "" : a.error().message()));
    return a.value();
  }

  /// A device buffer of n elements, every byte 0xFF (NaN for floats).
  template <element T>
  gpu_ref<T> poisoned_buffer(std::size_t n) {
    auto r = alloc<T>(n);
    auto f = run(fill_bytes(r, 0xFF));
    REQUIRE(f);
    return r;
  }

  template <element T>
  std::vector<T> fetch(const gpu_ref<T>& r) {
    std::vector<T> out(r.size());
    auto d = run(download(r, std::span<T>(out)));
    REQUIRE_MESSAGE(d, (d ? "" : d.error().message()));
    return out;
  }

  /// Runs one operation into a fresh NaN-filled buffer and returns the values.
  template <element T, class Op>
  std::vector<T> generate(std::size_t n, Op op) {
    auto buf = poisoned_buffer<T>(n);
    auto r = run(op(buf));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    CHECK(r.value().state() == buf.state());
    auto v = fetch(buf);
    if constexpr (std::is_floating_point_v<T>) {
      std::size_t bad = 0;
      for (auto x : v) bad += std::isfinite(x) ? 0 : 1;
      CHECK(bad == 0);  // every element written
    }
    return v;
  }

  /// Runs an operation that must be refused before touching the GPU.
  template <class R>
  void expect_invalid(asio::awaitable<result<R>> aw, const std::string& what) {
    const auto before = dev.statistics();
    auto r = run(std::move(aw));
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(r.error().library() == "curand");
    CAPTURE(r.error().message());
    CHECK(r.error().message().find(what) != std::string::npos);
    const auto after = dev.statistics();
    CHECK(after.ops_completed == before.ops_completed);
    CHECK(after.ops_failed == before.ops_failed);  // never reached run_kernel
  }
};

}  // namespace

TEST_CASE_FIXTURE(rng_fixture, "uniform f32 and f64: mean 1/2, variance 1/12, in (0, 1]") {
  for (auto k : all_kinds) {
    CAPTURE(to_string(k));
    auto a = make({.kind = k});
    const double var = 1.0 / 12, mu4 = 1.0 / 80;
    auto f = generate<float>(n_samples, [&](auto b) { return a.uniform(b); });
    check_distribution(f, 0.5, var, mu4);
    for (auto x : f) REQUIRE((x > 0.0f && x <= 1.0f));
    auto d = generate<double>(n_samples, [&](auto b) { return a.uniform(b); });
    check_distribution(d, 0.5, var, mu4);
    for (auto x : d) REQUIRE((x > 0.0 && x <= 1.0));
  }
}

TEST_CASE_FIXTURE(rng_fixture, "normal f32 and f64: mean and variance") {
  const double mean = 1.5, sd = 2.0;
  for (auto k : all_kinds) {
    CAPTURE(to_string(k));
    auto a = make({.kind = k, .seed = detail::is_quasi(k) ? std::nullopt : std::optional(7ull)});
    auto f = generate<float>(n_samples, [&](auto b) { return a.normal(b, 1.5f, 2.0f); });
    check_distribution(f, mean, sd * sd, 3 * std::pow(sd, 4));
    auto d = generate<double>(n_samples, [&](auto b) { return a.normal(b, mean, sd); });
    check_distribution(d, mean, sd * sd, 3 * std::pow(sd, 4));
  }
}

TEST_CASE_FIXTURE(rng_fixture, "log-normal f32 and f64: mean and variance") {
  const double mu = 0.25, s = 0.5;
  const double s2 = s * s;
  const double mean = std::exp(mu + s2 / 2);
  const double var = (std::exp(s2) - 1) * std::exp(2 * mu + s2);
  const double kurtosis = std::exp(4 * s2) + 2 * std::exp(3 * s2) + 3 * std::exp(2 * s2) - 3;
  for (auto k : {rng_kind::philox4_32_10, rng_kind::xorwow, rng_kind::mrg32k3a, rng_kind::mtgp32,
                 rng_kind::sobol32, rng_kind::sobol64}) {
    CAPTURE(to_string(k));
    auto a = make({.kind = k});
    auto f = generate<float>(n_samples, [&](auto b) { return a.log_normal(b, 0.25f, 0.5f); });
    check_distribution(f, mean, var, kurtosis * var * var);
    for (auto x : f) REQUIRE(x > 0.0f);
    auto d = generate<double>(n_samples, [&](auto b) { return a.log_normal(b, mu, s); });
    check_distribution(d, mean, var, kurtosis * var * var);
  }
}

TEST_CASE_FIXTURE(rng_fixture, "Poisson: mean and variance lambda") {
  for (auto k : {rng_kind::philox4_32_10, rng_kind::xorwow, rng_kind::mtgp32, rng_kind::sobol32}) {
    for (double lambda : {0.5, 4.0, 100.0, 1000.0}) {
      CAPTURE(to_string(k));
      CAPTURE(lambda);
      auto a = make({.kind = k});
      auto v = generate<std::uint32_t>(n_samples, [&](auto b) { return a.poisson(b, lambda); });
      for (auto x : v) REQUIRE(x != 0xFFFFFFFFu);  // every element written
      check_distribution(v, lambda, lambda, lambda * (1 + 3 * lambda));
    }
  }
}

TEST_CASE_FIXTURE(rng_fixture, "raw 32-bit values look uniform") {
  for (auto k : all_kinds) {
    if (detail::is_64bit(k)) continue;
    CAPTURE(to_string(k));
    auto a = make({.kind = k});
    auto v = generate<std::uint32_t>(n_samples, [&](auto b) { return a.raw(b); });
    // The top byte is uniform on 0..255: mean 127.5, variance (256^2 - 1) / 12.
    std::vector<double> top(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) top[i] = static_cast<double>(v[i] >> 24);
    const double var = (256.0 * 256.0 - 1) / 12;
    check_distribution(top, 127.5, var, 1.8 * var * var);  // kurtosis of a uniform: 9/5
    // Pseudo-random: every bit is set about half the time (5 standard errors of
    // a fair coin). Not for Sobol: the first 2^20 points leave the low 12 bits fixed.
    if (detail::is_quasi(k)) continue;
    for (int bit = 0; bit < 32; ++bit) {
      std::size_t ones = 0;
      for (auto x : v) ones += (x >> bit) & 1u;
      CAPTURE(bit);
      CHECK(std::abs(static_cast<double>(ones) / v.size() - 0.5) <
            5 * 0.5 / std::sqrt(static_cast<double>(v.size())));
    }
  }
}

TEST_CASE_FIXTURE(rng_fixture, "raw 64-bit values from sobol64 and scrambled_sobol64") {
  for (auto k : {rng_kind::sobol64, rng_kind::scrambled_sobol64}) {
    CAPTURE(to_string(k));
    auto a = make({.kind = k});
    auto v = generate<std::uint64_t>(1 << 16, [&](auto b) { return a.raw(b); });
    std::vector<double> top(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) top[i] = static_cast<double>(v[i] >> 56);
    const double var = (256.0 * 256.0 - 1) / 12;
    check_distribution(top, 127.5, var, 1.8 * var * var);
  }
  // Sobol64 dimension 1 starts 0, 1/2, 3/4, 1/4 (in units of 2^64).
  auto a = make({.kind = rng_kind::sobol64});
  auto v = generate<std::uint64_t>(4, [&](auto b) { return a.raw(b); });
  CHECK(v == std::vector<std::uint64_t>{0, 1ull << 63, 3ull << 62, 1ull << 62});
}

TEST_CASE_FIXTURE(rng_fixture, "the same seed gives the same numbers, another seed others") {
  for (auto k : pseudo_kinds) {
    CAPTURE(to_string(k));
    auto a = make({.kind = k, .seed = 42});
    auto b = make({.kind = k, .seed = 42});
    auto c = make({.kind = k, .seed = 43});
    auto raw = [&](rng_actor& x) {
      return generate<std::uint32_t>(1 << 16, [&](auto buf) { return x.raw(buf); });
    };
    auto va = raw(a);
    auto vb = raw(b);
    auto vc = raw(c);
    CHECK(va == vb);
    std::size_t same = 0;
    for (std::size_t i = 0; i < va.size(); ++i) same += va[i] == vc[i] ? 1 : 0;
    CHECK(same < va.size() / 100);

    // The sequence goes on; set_seed restarts it.
    auto next = raw(a);
    CHECK(next != va);
    REQUIRE(a.set_seed(42));
    CHECK(raw(a) == va);
    REQUIRE(c.set_seed(42));
    CHECK(raw(c) == va);

    // Floats too: a reseeded actor matches a fresh one.
    auto fresh = make({.kind = k, .seed = 42});
    auto fa = generate<float>(1 << 12, [&](auto buf) { return fresh.normal(buf, 0.0f, 1.0f); });
    REQUIRE(b.set_seed(42));
    auto fb = generate<float>(1 << 12, [&](auto buf) { return b.normal(buf, 0.0f, 1.0f); });
    CHECK(fa == fb);
  }
}

TEST_CASE_FIXTURE(rng_fixture, "set_offset moves to an absolute position") {
  auto a = make({.kind = rng_kind::philox4_32_10, .seed = 5});
  auto raw = [&] { return generate<std::uint32_t>(1 << 12, [&](auto b) { return a.raw(b); }); };
  auto first = raw();
  CHECK(raw() != first);
  REQUIRE(a.set_offset(0));
  CHECK(raw() == first);
  auto b = make({.kind = rng_kind::philox4_32_10, .seed = 5, .offset = 1 << 12});
  auto second_of_b = generate<std::uint32_t>(1 << 12, [&](auto buf) { return b.raw(buf); });
  REQUIRE(a.set_offset(1 << 12));
  CHECK(raw() == second_of_b);
}

TEST_CASE_FIXTURE(rng_fixture, "Sobol32 gives the published direction-number sequence") {
  // Gray-code order from the all-zero point (Bratley & Fox; Joe & Kuo), which is
  // what cuRAND returns: dimension 1 is 0, 1/2, 3/4, 1/4, 3/8, 7/8, 5/8, 1/8;
  // dimension 2 (x + 1, m1 = 1) is 0, 1/2, 1/4, 3/4, 3/8, 7/8, 1/8, 5/8.
  const std::vector<double> dim1 = {0, 0.5, 0.75, 0.25, 0.375, 0.875, 0.625, 0.125};
  const std::vector<double> dim2 = {0, 0.5, 0.25, 0.75, 0.375, 0.875, 0.125, 0.625};
  auto to_raw = [](const std::vector<double>& xs) {
    std::vector<std::uint32_t> out;
    for (double x : xs) out.push_back(static_cast<std::uint32_t>(std::ldexp(x, 32)));
    return out;
  };

  auto one = make({.kind = rng_kind::sobol32});
  auto r1 = generate<std::uint32_t>(8, [&](auto b) { return one.raw(b); });
  CHECK(r1 == to_raw(dim1));

  // Two dimensions: results come dimension by dimension (8 points each).
  auto two = make({.kind = rng_kind::sobol32, .dimensions = 2});
  auto r2 = generate<std::uint32_t>(16, [&](auto b) { return two.raw(b); });
  CHECK(std::vector<std::uint32_t>(r2.begin(), r2.begin() + 8) == to_raw(dim1));
  CHECK(std::vector<std::uint32_t>(r2.begin() + 8, r2.end()) == to_raw(dim2));

  // Uniform floats are the same points moved half a step of 2^-32 off zero.
  auto u = make({.kind = rng_kind::sobol32});
  auto f = generate<double>(8, [&](auto b) { return u.uniform(b); });
  for (std::size_t i = 0; i < 8; ++i) CHECK(f[i] == doctest::Approx(dim1[i]).epsilon(1e-9));

  // The first 2^k points of dimension 1 are exactly {i / 2^k}.
  constexpr unsigned k = 12;
  auto big = make({.kind = rng_kind::sobol32});
  auto pts = generate<std::uint32_t>(1u << k, [&](auto b) { return big.raw(b); });
  std::vector<bool> seen(1u << k, false);
  for (auto p : pts) {
    REQUIRE((p & ((1u << (32 - k)) - 1)) == 0);
    seen[p >> (32 - k)] = true;
  }
  for (bool s : seen) CHECK(s);

  // An offset skips points.
  auto off = make({.kind = rng_kind::sobol32, .offset = 4});
  auto r3 = generate<std::uint32_t>(4, [&](auto b) { return off.raw(b); });
  const auto raw1 = to_raw(dim1);
  CHECK(r3 == std::vector<std::uint32_t>(raw1.begin() + 4, raw1.end()));
}

TEST_CASE_FIXTURE(rng_fixture, "every operation answers invalid_argument before any GPU call") {
  auto a = make();  // philox
  auto sobol = make({.kind = rng_kind::sobol32, .dimensions = 3});
  auto s64 = make({.kind = rng_kind::sobol64});
  auto f = poisoned_buffer<float>(9);
  auto d = poisoned_buffer<double>(9);
  auto u = poisoned_buffer<std::uint32_t>(9);
  auto u64 = poisoned_buffer<std::uint64_t>(9);

  expect_invalid(a.uniform(gpu_ref<float>{}), "uniform: out is an empty gpu_ref");
  expect_invalid(a.uniform(d.subspan(0, 0).value()), "uniform: out is empty");
  expect_invalid(sobol.uniform(f.subspan(0, 8).value()),
                 "uniform: out size (8) must be a multiple of the 3 dimensions");
  expect_invalid(a.normal(f, 0.0f, 1.0f), "normal: out size (9) must be even");
  expect_invalid(a.normal(d.subspan(0, 8).value(), 0.0, 0.0), "normal: stddev (0)");
  expect_invalid(a.normal(d.subspan(0, 8).value(), std::nan(""), 1.0), "normal: mean (nan)");
  expect_invalid(a.log_normal(f.subspan(0, 8).value(), 0.0f, -1.0f), "log_normal: stddev (-1)");
  expect_invalid(a.log_normal(d, 0.0, 1.0), "log_normal: out size (9) must be even");
  expect_invalid(a.poisson(u, 0.0), "poisson: lambda (0)");
  expect_invalid(a.poisson(u, -1.0), "poisson: lambda (-1)");
  expect_invalid(a.poisson(gpu_ref<std::uint32_t>{}, 2.0), "poisson: out is an empty gpu_ref");
  expect_invalid(a.raw(u64), "raw: out is gpu_ref<uint64>, but philox4_32_10");
  expect_invalid(s64.raw(u), "raw: out is gpu_ref<uint32>, but sobol64");
  expect_invalid(sobol.raw(u.subspan(0, 4).value()), "raw: out size (4)");

  // Nothing was written: the outputs still hold 0xFF bytes.
  for (auto x : fetch(f)) CHECK(std::isnan(x));
  for (auto x : fetch(d)) CHECK(std::isnan(x));
  for (auto x : fetch(u)) CHECK(x == 0xFFFFFFFFu);
  for (auto x : fetch(u64)) CHECK(x == ~0ull);

  // Odd counts are fine for quasi-random normals (inverse CDF, one value per point).
  auto sob1 = make({.kind = rng_kind::sobol32});
  auto odd = generate<float>(9, [&](auto b) { return sob1.normal(b, 0.0f, 1.0f); });
  CHECK(odd.size() == 9);

  // set_seed / set_offset.
  auto seed = sobol.set_seed(1);
  REQUIRE_FALSE(seed);
  CHECK(seed.error().code() == errc::invalid_argument);
  CHECK(seed.error().message().find("set_seed: seed cannot be set: sobol32") != std::string::npos);
  auto mt = make({.kind = rng_kind::mtgp32});
  auto off = mt.set_offset(10);
  REQUIRE_FALSE(off);
  CHECK(off.error().code() == errc::invalid_argument);
  CHECK(off.error().message().find("set_offset: offset (10) must be 0 for mtgp32") !=
        std::string::npos);
  CHECK(mt.set_seed(3));

  // Bad options at create.
  auto bad = rng_actor::create(dev, {.kind = rng_kind::sobol32, .dimensions = 0});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(bad.error().message().find("dimensions (0)") != std::string::npos);
}

TEST_CASE_FIXTURE(rng_fixture, "actors report their settings; each has its own stream") {
  auto a = make({.kind = rng_kind::xorwow, .streams = stream_policy::per_actor_fresh});
  auto b = make({.kind = rng_kind::xorwow, .streams = stream_policy::per_actor_fresh});
  CHECK(a.kind() == rng_kind::xorwow);
  CHECK(a.dimensions() == 1);
  CHECK(a.get_device() == dev);
  CHECK(a.get_stream().id() != b.get_stream().id());
  auto copy = a;
  CHECK(copy.get_stream().id() == a.get_stream().id());
}

TEST_CASE_FIXTURE(rng_fixture, "many coroutines on two actors and four io threads") {
  auto a =
      make({.kind = rng_kind::philox4_32_10, .seed = 1, .streams = stream_policy::per_actor_fresh});
  auto b = make({.kind = rng_kind::xorwow, .seed = 2, .streams = stream_policy::per_actor_fresh});
  constexpr int tasks = 64;
  constexpr std::size_t n = 1 << 14;
  std::vector<gpu_ref<float>> bufs;
  for (int i = 0; i < tasks; ++i) bufs.push_back(poisoned_buffer<float>(n));
  std::atomic<int> ok{0}, done{0};
  for (int i = 0; i < tasks; ++i) {
    asio::co_spawn(
        ioc,
        [&, i]() -> asio::awaitable<void> {
          auto& actor = i % 2 ? a : b;
          auto r = co_await actor.normal(bufs[static_cast<std::size_t>(i)], 0.0f, 1.0f);
          if (r) ++ok;
          ++done;
        },
        asio::detached);
  }
  ioc.restart();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { ioc.run_for(limit); });
  for (auto& t : threads) t.join();
  CHECK(done == tasks);
  CHECK(ok == tasks);
  for (auto& buf : bufs) {
    auto v = fetch(buf);
    std::size_t bad = 0;
    for (auto x : v) bad += std::isfinite(x) ? 0 : 1;
    CHECK(bad == 0);
  }
}
