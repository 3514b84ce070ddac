// fft_actor on the GPU: forward then normalised inverse returns the input
// (rank 1, 2, 3, batched; C2C, Z2Z, R2C/C2R, D2Z/Z2D), a forward transform
// against a CPU DFT in double, plan cache hits, misses and evictions (with
// evicted plans still in flight), and invalid_argument for every operation.
// Inputs are random (never zero); outputs are NaN-filled before every run.
#include <atomr/cuda/fft_actor.hpp>

#include "gpu_fixture.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::gpu_fixture;
using atomr::cuda::test::random_floats;

namespace {

using c32 = std::complex<float>;
using c64 = std::complex<double>;

template <class T>
struct real_of {
  using type = T;
};
template <class T>
struct real_of<std::complex<T>> {
  using type = T;
};

/// Random values in [-1, 1) (real and imaginary parts alike), never all zero.
template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed) {
  std::vector<T> out(n);
  if constexpr (std::is_floating_point_v<T>) {
    auto f = random_floats(n, seed);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(f[i]);
  } else {
    using R = typename T::value_type;
    auto f = random_floats(2 * n, seed);
    for (std::size_t i = 0; i < n; ++i)
      out[i] = T(static_cast<R>(f[2 * i]), static_cast<R>(f[2 * i + 1]));
  }
  return out;
}

/// ||got - want|| / ||want||, in double.
template <class A, class B>
double rel_error(const std::vector<A>& got, const std::vector<B>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const c64 g(got[i]), w(want[i]);
    num += std::norm(g - w);
    den += std::norm(w);
  }
  return std::sqrt(num / den);
}

/// The forward DFT of every batch, by definition, in double (row-major dims).
template <class T>
std::vector<c64> cpu_dft(const std::vector<T>& in, const fft_shape& s) {
  std::array<long long, 3> d{1, 1, 1};
  for (int i = 0; i < s.rank; ++i) d[3 - s.rank + i] = s.dims[i];
  const long long n = d[0] * d[1] * d[2];
  std::vector<c64> out(static_cast<std::size_t>(n * s.batch));
  const double two_pi = 2 * std::numbers::pi;
  for (long long b = 0; b < s.batch; ++b)
    for (long long k0 = 0; k0 < d[0]; ++k0)
      for (long long k1 = 0; k1 < d[1]; ++k1)
        for (long long k2 = 0; k2 < d[2]; ++k2) {
          c64 acc = 0;
          for (long long j0 = 0; j0 < d[0]; ++j0)
            for (long long j1 = 0; j1 < d[1]; ++j1)
              for (long long j2 = 0; j2 < d[2]; ++j2) {
                const double ph =
                    -two_pi * (double(k0 * j0) / double(d[0]) + double(k1 * j1) / double(d[1]) +
                               double(k2 * j2) / double(d[2]));
                acc += c64(in[static_cast<std::size_t>(b * n + (j0 * d[1] + j1) * d[2] + j2)]) *
                       c64(std::cos(ph), std::sin(ph));
              }
          out[static_cast<std::size_t>(b * n + (k0 * d[1] + k1) * d[2] + k2)] = acc;
        }
  return out;
}

long long points(const fft_shape& s) {
  long long n = 1;
  for (int i = 0; i < s.rank; ++i) n *= s.dims[i];
  return n;
}
long long half_points(const fft_shape& s) {
  const long long last = s.dims[s.rank - 1];
  return points(s) / last * (last / 2 + 1);
}

struct fft_fixture : gpu_fixture {
  fft_actor fft = fft_actor::create(dev).value();

  template <element T>
  gpu_ref<T> upload_values(const std::vector<T>& v) {
    auto r = alloc<T>(v.size());
    REQUIRE(run(upload(std::span<const T>(v), r)));
    return r;
  }
  template <element T>
  std::vector<T> download_values(const gpu_ref<T>& r) {
    std::vector<T> out(r.size());
    REQUIRE(run(download(r, std::span<T>(out))));
    return out;
  }
  /// A buffer of n elements, every byte 0xFF (NaN in every float type).
  template <element T>
  gpu_ref<T> nan_buffer(std::size_t n) {
    auto r = alloc<T>(n);
    REQUIRE(run(fill_bytes(r, 0xFF)));
    return r;
  }

  /// C2C / Z2Z: forward, then inverse normalised, equals the input.
  template <class C>
  void c2c_round_trip(fft_shape s, double tol) {
    const auto n = static_cast<std::size_t>(points(s) * s.batch);
    auto host = random_values<C>(n, 17 + n);
    auto in = upload_values(host);
    auto mid = nan_buffer<C>(n);
    s.direction = fft_direction::forward;
    s.normalize = false;
    auto f = run(fft.c2c(s, in, mid));
    REQUIRE(f);
    auto back = nan_buffer<C>(n);
    s.direction = fft_direction::inverse;
    s.normalize = true;
    auto i = run(fft.c2c(s, mid, back));
    REQUIRE(i);
    auto got = download_values(back);
    CHECK(rel_error(got, host) < tol);
    // The input is left as it was.
    CHECK(rel_error(download_values(in), host) == 0.0);
  }

  /// R2C / D2Z then C2R / Z2D normalised equals the input.
  template <class R>
  void real_round_trip(fft_shape s, double tol) {
    using C = std::complex<R>;
    const auto n = static_cast<std::size_t>(points(s) * s.batch);
    const auto h = static_cast<std::size_t>(half_points(s) * s.batch);
    auto host = random_values<R>(n, 29 + n);
    auto in = upload_values(host);
    auto mid = nan_buffer<C>(h);
    s.direction = fft_direction::forward;
    s.normalize = false;
    REQUIRE(run(fft.r2c(s, in, mid)));
    auto back = nan_buffer<R>(n);
    s.direction = fft_direction::inverse;
    s.normalize = true;
    REQUIRE(run(fft.c2r(s, mid, back)));
    CHECK(rel_error(download_values(back), host) < tol);
  }
};

const std::vector<fft_shape> round_trip_shapes = {
    {.rank = 1, .dims = {256, 1, 1}},
    {.rank = 1, .dims = {1000, 1, 1}, .batch = 7},  // not a power of two
    {.rank = 2, .dims = {32, 48, 1}},
    {.rank = 2, .dims = {16, 10, 1}, .batch = 5},
    {.rank = 3, .dims = {8, 12, 16}},
    {.rank = 3, .dims = {6, 8, 10}, .batch = 3},
};

std::string describe(const fft_shape& s) {
  std::string d = "rank " + std::to_string(s.rank) + " dims";
  for (int i = 0; i < s.rank; ++i) d += " " + std::to_string(s.dims[i]);
  return d + " batch " + std::to_string(s.batch);
}

}  // namespace

TEST_CASE_FIXTURE(fft_fixture, "fft c2c forward then normalised inverse returns the input") {
  for (const auto& s : round_trip_shapes) {
    CAPTURE(describe(s));
    c2c_round_trip<c32>(s, 1e-5);
    c2c_round_trip<c64>(s, 1e-12);
  }
}

TEST_CASE_FIXTURE(fft_fixture, "fft r2c then normalised c2r returns the input") {
  for (auto s : round_trip_shapes) {
    CAPTURE(describe(s));
    real_round_trip<float>(s, 1e-5);
    real_round_trip<double>(s, 1e-12);
  }
  // An odd last dimension.
  real_round_trip<float>({.rank = 2, .dims = {6, 9, 1}, .batch = 2}, 1e-5);
}

TEST_CASE_FIXTURE(fft_fixture, "fft forward transforms equal a CPU DFT in double") {
  for (fft_shape s : {fft_shape{.rank = 1, .dims = {30, 1, 1}, .batch = 2},
                      fft_shape{.rank = 2, .dims = {6, 10, 1}, .batch = 2},
                      fft_shape{.rank = 3, .dims = {3, 4, 5}}}) {
    CAPTURE(describe(s));
    const auto n = static_cast<std::size_t>(points(s) * s.batch);

    auto zin = random_values<c64>(n, 3);
    auto zout = nan_buffer<c64>(n);
    REQUIRE(run(fft.c2c(s, upload_values(zin), zout)));
    CHECK(rel_error(download_values(zout), cpu_dft(zin, s)) < 1e-12);

    auto cin = random_values<c32>(n, 5);
    auto cout = nan_buffer<c32>(n);
    REQUIRE(run(fft.c2c(s, upload_values(cin), cout)));
    CHECK(rel_error(download_values(cout), cpu_dft(cin, s)) < 1e-5);

    // R2C: the non-redundant half of the full DFT of the real input.
    auto rin = random_values<float>(n, 7);
    const auto h = static_cast<std::size_t>(half_points(s) * s.batch);
    auto rout = nan_buffer<c32>(h);
    REQUIRE(run(fft.r2c(s, upload_values(rin), rout)));
    auto full = cpu_dft(rin, s);
    const long long last = s.dims[s.rank - 1], half = last / 2 + 1;
    std::vector<c64> want;
    for (std::size_t i = 0; i < full.size(); ++i)
      if (static_cast<long long>(i) % last < half) want.push_back(full[i]);
    REQUIRE(want.size() == h);
    CHECK(rel_error(download_values(rout), want) < 1e-5);

    // The forward transform scaled by 1/N when asked.
    auto scaled = nan_buffer<c64>(n);
    s.normalize = true;
    REQUIRE(run(fft.c2c(s, upload_values(zin), scaled)));
    auto ref = cpu_dft(zin, s);
    for (auto& v : ref) v /= static_cast<double>(points(s));
    CHECK(rel_error(download_values(scaled), ref) < 1e-12);
  }
}

TEST_CASE_FIXTURE(fft_fixture, "fft plan cache counts hits, misses and evictions") {
  auto small = fft_actor::create(dev, {.plan_cache_size = 2}).value();
  CHECK(small.statistics().plan_cache_size == 2);
  fft_shape a{.rank = 1, .dims = {64, 1, 1}}, b{.rank = 1, .dims = {128, 1, 1}},
      c{.rank = 2, .dims = {8, 8, 1}};
  auto go = [&](const fft_shape& s) {
    const auto n = static_cast<std::size_t>(points(s));
    auto in = upload_values(random_values<c32>(n, 11));
    REQUIRE(run(small.c2c(s, in, nan_buffer<c32>(n))));
  };
  go(a);  // miss
  go(a);  // hit
  go(b);  // miss
  go(a);  // hit
  go(c);  // miss, evicts b
  go(a);  // hit
  go(b);  // miss, evicts c
  auto st = small.statistics();
  CHECK(st.plan_misses == 4);
  CHECK(st.plan_hits == 3);
  CHECK(st.plan_evictions == 2);
  CHECK(st.plans_cached == 2);

  // Same size in another precision or type is another plan.
  auto z = upload_values(random_values<c64>(64, 1));
  REQUIRE(run(small.c2c(a, z, nan_buffer<c64>(64))));
  CHECK(small.statistics().plan_misses == 5);

  // Arguments rejected before any lookup are not counted.
  CHECK_FALSE(run(small.c2c(a, z, nan_buffer<c64>(63))));
  CHECK(small.statistics().plan_misses == 5);
  small.clear_plans();
  CHECK(small.statistics().plans_cached == 0);
}

TEST_CASE_FIXTURE(fft_fixture, "fft plans evicted while in flight stay alive until done") {
  // A cache of one plan and alternating shapes: every launch evicts the plan
  // of the transform still running before it.
  auto one = fft_actor::create(dev, {.plan_cache_size = 1}).value();
  const fft_shape shapes[2] = {{.rank = 2, .dims = {256, 256, 1}, .batch = 4},
                               {.rank = 2, .dims = {128, 512, 1}, .batch = 4}};
  constexpr int count = 16;
  const auto n = static_cast<std::size_t>(256 * 256 * 4);
  auto host = random_values<c32>(n, 99);
  auto in = upload_values(host);
  std::vector<gpu_ref<c32>> mids, outs;
  for (int i = 0; i < count; ++i) {
    mids.push_back(nan_buffer<c32>(n));
    outs.push_back(nan_buffer<c32>(n));
  }
  int done = 0, ok = 0;
  // Captureless, parameters by value: the coroutine frame owns everything it uses.
  auto task = [](fft_actor a, fft_shape s, gpu_ref<c32> x, gpu_ref<c32> mid, gpu_ref<c32> out,
                 int* ok, int* done) -> asio::awaitable<void> {
    auto f = co_await a.c2c(s, x, mid);
    if (f) {
      s.direction = fft_direction::inverse;
      s.normalize = true;
      auto b = co_await a.c2c(s, mid, out);
      if (b) ++*ok;
    }
    ++*done;
  };
  for (int i = 0; i < count; ++i)
    asio::co_spawn(ioc, task(one, shapes[i % 2], in, mids[i], outs[i], &ok, &done), asio::detached);
  ioc.restart();
  for (int t = 0; t < 12000 && done < count; ++t) ioc.run_for(std::chrono::milliseconds(10));
  REQUIRE(done == count);
  CHECK(ok == count);
  CHECK(one.statistics().plan_evictions >= 2);
  for (int i = 0; i < count; ++i) CHECK(rel_error(download_values(outs[i]), host) < 1e-5);
}

TEST_CASE_FIXTURE(fft_fixture, "fft operations reject bad arguments before any GPU call") {
  auto expect_bad = [&](auto r, std::string_view op, std::string_view arg) {
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CAPTURE(r.error().message());
    CHECK(r.error().message().find(std::string(op) + ": " + std::string(arg)) != std::string::npos);
  };
  fft_shape s{.rank = 1, .dims = {16, 1, 1}, .batch = 2};
  auto c = alloc<c32>(32), c2 = alloc<c32>(32);
  auto z = alloc<c64>(32), z2 = alloc<c64>(32);
  auto f = alloc<float>(32);
  auto d = alloc<double>(32);
  auto ch = alloc<c32>(18);
  auto zh = upload_values(random_values<c64>(18, 2));
  // Counted after the uploads above: nothing below may reach run_kernel.
  const auto before = dev.statistics().ops_completed + dev.statistics().ops_failed;

  expect_bad(run(fft.c2c(s, c, alloc<c32>(31))), "fft_actor::c2c", "output");
  expect_bad(run(fft.c2c(fft_shape{.rank = 4}, c, c2)), "fft_actor::c2c", "shape.rank");
  expect_bad(run(fft.c2c(s, z, z)), "fft_actor::c2c", "output");  // in place
  expect_bad(run(fft.c2c(fft_shape{.dims = {16, 1, 1}, .batch = 0}, z, z2)), "fft_actor::c2c",
             "shape.batch");
  expect_bad(run(fft.r2c(s, alloc<float>(30), ch)), "fft_actor::r2c", "input");
  expect_bad(run(fft.r2c(s, d, alloc<c64>(32))), "fft_actor::r2c", "output");
  auto inv = s;
  inv.direction = fft_direction::inverse;
  expect_bad(run(fft.r2c(inv, f, ch)), "fft_actor::r2c", "shape.direction");
  expect_bad(run(fft.c2r(s, ch, f)), "fft_actor::c2r", "shape.direction");
  expect_bad(run(fft.c2r(inv, c, f)), "fft_actor::c2r", "input");
  expect_bad(run(fft.c2r(inv, zh, alloc<double>(33))), "fft_actor::c2r", "output");
  expect_bad(run(fft.c2r(inv, zh, gpu_ref<double>{})), "fft_actor::c2r", "output");

  // None of them reached run_kernel, and the good calls still work.
  const auto after = dev.statistics().ops_completed + dev.statistics().ops_failed;
  CHECK(after == before);
  CHECK(fft.statistics().plan_misses == 0);
  REQUIRE(run(fft.r2c(s, upload_values(random_values<float>(32, 1)), ch)));
  REQUIRE(run(fft.c2r(inv, zh, nan_buffer<double>(32))));
}
