// fft_actor on the CPU: every argument check with good and bad values, the
// LRU plan cache on its own, and creation on an unusable device. The buffer
// checks run on a device state marked healthy by hand (as test_staleness.cpp
// does); no CUDA call is made.
#include <atomr/cuda.hpp>
#include <atomr/cuda/fft_actor.hpp>

#include "../lib/device_impl.hpp"
#include "io_fixture.hpp"

#include <doctest/doctest.h>

#include <climits>
#include <complex>
#include <memory>
#include <string>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;
using detail::fft_kind;

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

fft_shape shape1(long long n, long long batch = 1) {
  return {.rank = 1, .dims = {n, 1, 1}, .batch = batch};
}

struct fake_device : io_fixture {
  std::shared_ptr<detail::device_impl> impl =
      std::make_shared<detail::device_impl>(ioc.get_executor(), 4243, device_options{});
  device dev{impl};

  fake_device() { impl->health.store(health_state::healthy); }
  ~fake_device() { impl->poison(make_error(errc::context_poisoned, "test teardown")); }

  template <element T>
  gpu_ref<T> ref(std::size_t n, const std::shared_ptr<detail::device_impl>& on) {
    ++on->live_buffers;
    auto st =
        std::make_shared<detail::buffer_state>(on, nullptr, n, dtype_of<T>, on->generation.load());
    return gpu_ref<T>(std::move(st), 0, n);
  }
  template <element T>
  gpu_ref<T> ref(std::size_t n) {
    return ref<T>(n, impl);
  }
};

}  // namespace

TEST_CASE("fft shape: rank, dims and batch") {
  const auto op = "fft_actor::c2c";
  CHECK(detail::check_fft_shape(op, shape1(8), fft_kind::c2c));
  for (int rank : {0, -1, 4, 100}) {
    fft_shape s{.rank = rank, .dims = {2, 2, 2}};
    check_bad(detail::check_fft_shape(op, s, fft_kind::c2c), op, "shape.rank");
  }
  for (int bad = 0; bad < 3; ++bad) {
    for (long long v : {0LL, -1LL, LLONG_MIN}) {
      fft_shape s{.rank = 3, .dims = {4, 4, 4}};
      s.dims[bad] = v;
      check_bad(detail::check_fft_shape(op, s, fft_kind::c2c), op,
                "shape.dims[" + std::to_string(bad) + "]");
    }
  }
  // Dims beyond the rank are ignored, whatever they hold.
  fft_shape ignored{.rank = 1, .dims = {8, 0, -5}};
  CHECK(detail::check_fft_shape(op, ignored, fft_kind::c2c));
  for (long long b : {0LL, -3LL}) {
    auto s = shape1(8, b);
    check_bad(detail::check_fft_shape(op, s, fft_kind::c2c), op, "shape.batch");
  }
  fft_shape dir = shape1(8);
  dir.direction = static_cast<fft_direction>(7);
  check_bad(detail::check_fft_shape(op, dir, fft_kind::c2c), op, "shape.direction");
}

TEST_CASE("fft shape: counts that overflow a long long are rejected") {
  const auto op = "fft_actor::c2c";
  fft_shape s{.rank = 3, .dims = {1LL << 31, 1LL << 31, 4}};
  check_bad(detail::check_fft_shape(op, s, fft_kind::c2c), op, "shape.dims[2]");
  fft_shape b{.rank = 2, .dims = {1LL << 31, 1LL << 30, 1}, .batch = 8};
  check_bad(detail::check_fft_shape(op, b, fft_kind::c2c), op, "shape.batch");
  fft_shape ok{.rank = 2, .dims = {1LL << 31, 1LL << 30, 1}, .batch = 2};
  CHECK(detail::check_fft_shape(op, ok, fft_kind::c2c));
}

TEST_CASE("fft shape: element counts of each layout") {
  fft_shape s{.rank = 3, .dims = {3, 5, 8}, .batch = 2};
  auto c = detail::check_fft_shape("c2c", s, fft_kind::c2c).value();
  CHECK(c.points == 120);
  CHECK(c.in_elems == 240);
  CHECK(c.out_elems == 240);
  auto r = detail::check_fft_shape("r2c", s, fft_kind::r2c).value();
  CHECK(r.points == 120);
  CHECK(r.in_elems == 240);
  CHECK(r.out_elems == 2 * 3 * 5 * (8 / 2 + 1));
  s.direction = fft_direction::inverse;
  auto i = detail::check_fft_shape("c2r", s, fft_kind::c2r).value();
  CHECK(i.in_elems == 2 * 3 * 5 * 5);
  CHECK(i.out_elems == 240);
  // An odd last dimension: n/2 + 1 rounds down.
  fft_shape odd{.rank = 1, .dims = {7, 1, 1}, .batch = 3};
  CHECK(detail::check_fft_shape("r2c", odd, fft_kind::r2c).value().out_elems == 3 * 4);
  fft_shape one{.rank = 2, .dims = {4, 1, 1}};
  CHECK(detail::check_fft_shape("r2c", one, fft_kind::r2c).value().out_elems == 4);
}

TEST_CASE("fft shape: r2c is forward, c2r is inverse, c2c either") {
  auto s = shape1(16);
  CHECK(detail::check_fft_shape("fft_actor::r2c", s, fft_kind::r2c));
  check_bad(detail::check_fft_shape("fft_actor::c2r", s, fft_kind::c2r), "fft_actor::c2r",
            "shape.direction");
  CHECK(detail::check_fft_shape("fft_actor::c2c", s, fft_kind::c2c));
  s.direction = fft_direction::inverse;
  CHECK(detail::check_fft_shape("fft_actor::c2r", s, fft_kind::c2r));
  check_bad(detail::check_fft_shape("fft_actor::r2c", s, fft_kind::r2c), "fft_actor::r2c",
            "shape.direction");
  CHECK(detail::check_fft_shape("fft_actor::c2c", s, fft_kind::c2c));
  CHECK(to_string(fft_direction::inverse) == "inverse");
}

TEST_CASE("fft buffer sizes must match exactly; overlap is refused") {
  CHECK(detail::check_fft_size("op", "input", 12, 12));
  check_bad(detail::check_fft_size("op", "input", 11, 12), "op", "input");
  check_bad(detail::check_fft_size("op", "output", 13, 12), "op", "output");
  CHECK(detail::check_fft_size("op", "output", 13, 12).error().message().find("needs exactly 12") !=
        std::string::npos);

  CHECK(detail::check_no_overlap("op", false, 0, 64, 0, 64));
  CHECK(detail::check_no_overlap("op", true, 0, 64, 64, 64));
  CHECK(detail::check_no_overlap("op", true, 64, 64, 0, 64));
  check_bad(detail::check_no_overlap("op", true, 0, 64, 63, 64), "op", "output");
  check_bad(detail::check_no_overlap("op", true, 32, 8, 0, 64), "op", "output");
}

TEST_CASE("fft options: plan_cache_size") {
  CHECK(detail::check_fft_options({}));
  CHECK(fft_options{}.plan_cache_size == 16);
  check_bad(detail::check_fft_options({.plan_cache_size = 0}), "fft_actor::create",
            "plan_cache_size");
}

TEST_CASE_FIXTURE(fake_device, "fft call: every buffer check, in order") {
  using c32 = std::complex<float>;
  using c64 = std::complex<double>;
  const auto op = "fft_actor::c2c";
  const auto s = shape1(8, 2);
  auto in = ref<c32>(16), out = ref<c32>(16);
  CHECK(detail::check_fft_call(op, s, fft_kind::c2c, in, out, dev));

  // The shape is checked first.
  check_bad(detail::check_fft_call(op, shape1(0), fft_kind::c2c, in, out, dev), op,
            "shape.dims[0]");
  check_bad(detail::check_fft_call(op, s, fft_kind::c2c, gpu_ref<c32>{}, out, dev), op, "input");
  check_bad(detail::check_fft_call(op, s, fft_kind::c2c, in, gpu_ref<c32>{}, dev), op, "output");
  check_bad(detail::check_fft_call(op, s, fft_kind::c2c, ref<c32>(15), out, dev), op, "input");
  check_bad(detail::check_fft_call(op, s, fft_kind::c2c, in, ref<c32>(17), dev), op, "output");

  // Another device's buffer.
  auto other = std::make_shared<detail::device_impl>(ioc.get_executor(), 4244, device_options{});
  other->health.store(health_state::healthy);
  {
    auto foreign = ref<c32>(16, other);
    auto r = detail::check_fft_call(op, s, fft_kind::c2c, foreign, out, dev);
    check_bad(r, op, "input");
    CHECK(r.error().message().find("another device") != std::string::npos);
  }
  other->poison(make_error(errc::context_poisoned, "test teardown"));

  // In and out overlapping in one allocation.
  auto big = ref<c32>(32);
  auto lo = big.subspan(0, 16).value(), mid = big.subspan(8, 16).value(),
       hi = big.subspan(16, 16).value();
  CHECK(detail::check_fft_call(op, s, fft_kind::c2c, lo, hi, dev));
  check_bad(detail::check_fft_call(op, s, fft_kind::c2c, lo, mid, dev), op, "output");
  check_bad(detail::check_fft_call(op, s, fft_kind::c2c, lo, lo, dev), op, "output");

  // Real transforms: the complex side is halved.
  fft_shape r{.rank = 2, .dims = {4, 6, 1}, .batch = 3};
  auto rin = ref<double>(72);
  auto cout = ref<c64>(3 * 4 * 4);
  CHECK(detail::check_fft_call("fft_actor::r2c", r, fft_kind::r2c, rin, cout, dev));
  check_bad(detail::check_fft_call("fft_actor::r2c", r, fft_kind::r2c, rin, ref<c64>(72), dev),
            "fft_actor::r2c", "output");
  r.direction = fft_direction::inverse;
  CHECK(detail::check_fft_call("fft_actor::c2r", r, fft_kind::c2r, cout, rin, dev));
  check_bad(detail::check_fft_call("fft_actor::c2r", r, fft_kind::c2r, ref<c64>(72), rin, dev),
            "fft_actor::c2r", "input");
}

TEST_CASE_FIXTURE(fake_device, "fft call: stale buffers yield stale_ref") {
  auto in = ref<std::complex<float>>(8), out = ref<std::complex<float>>(8);
  impl->poison(make_error(errc::context_poisoned, "injected"));
  auto r = detail::check_fft_call("fft_actor::c2c", shape1(8), fft_kind::c2c, in, out, dev);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::stale_ref);
}

TEST_CASE("fft plan keys ignore the dims beyond the rank") {
  fft_shape a{.rank = 1, .dims = {8, 3, 9}};
  fft_shape b{.rank = 1, .dims = {8, 1, 1}};
  CHECK(detail::make_plan_key(a, detail::fft_type::c2c) ==
        detail::make_plan_key(b, detail::fft_type::c2c));
  CHECK(detail::make_plan_key(a, detail::fft_type::c2c) !=
        detail::make_plan_key(a, detail::fft_type::z2z));
  b.batch = 2;
  CHECK(detail::make_plan_key(a, detail::fft_type::c2c) !=
        detail::make_plan_key(b, detail::fft_type::c2c));
  // The direction and normalisation do not change the plan.
  b = a;
  b.direction = fft_direction::inverse;
  b.normalize = true;
  CHECK(detail::make_plan_key(a, detail::fft_type::c2c) ==
        detail::make_plan_key(b, detail::fft_type::c2c));
  CHECK(detail::to_string(detail::fft_type::d2z) == "D2Z");
}

TEST_CASE("lru: hits, misses and eviction of the least recently used") {
  detail::lru<int, std::string> c(3);
  CHECK(c.capacity() == 3);
  CHECK(c.find(1) == nullptr);
  CHECK(c.misses() == 1);
  c.insert(1, "one");
  c.insert(2, "two");
  c.insert(3, "three");
  CHECK(c.size() == 3);
  REQUIRE(c.find(1) != nullptr);  // 1 is now the most recently used
  CHECK(*c.find(1) == "one");
  CHECK(c.hits() == 2);
  c.insert(4, "four");  // evicts 2, the least recently used
  CHECK(c.size() == 3);
  CHECK(c.evictions() == 1);
  CHECK_FALSE(c.contains(2));
  CHECK(c.contains(1));
  CHECK(c.contains(3));
  CHECK(c.contains(4));
  std::vector<int> order;
  c.for_each_key([&](int k) { order.push_back(k); });
  CHECK(order == std::vector<int>{4, 1, 3});

  // Re-inserting an existing key replaces it without evicting.
  c.insert(3, "THREE");
  CHECK(c.evictions() == 1);
  CHECK(*c.find(3) == "THREE");
  order.clear();
  c.for_each_key([&](int k) { order.push_back(k); });
  CHECK(order == std::vector<int>{3, 4, 1});

  for (int k = 10; k < 20; ++k) c.insert(k, "x");
  CHECK(c.size() == 3);  // the bound holds
  CHECK(c.evictions() == 11);
  CHECK(c.contains(19));
  CHECK(c.contains(17));
  CHECK_FALSE(c.contains(16));
  CHECK(c.misses() == 1);
  c.clear();
  CHECK(c.size() == 0);
  CHECK(c.hits() == 3);
}

TEST_CASE("lru: evicted shared values live on with their other owners") {
  detail::lru<int, std::shared_ptr<int>> c(1);
  auto held = std::make_shared<int>(7);
  c.insert(1, held);
  std::weak_ptr<int> dropped;
  {
    auto tmp = std::make_shared<int>(8);
    dropped = tmp;
    c.insert(2, std::move(tmp));  // evicts 1
  }
  CHECK(held.use_count() == 1);  // only the test holds it now
  CHECK(*held == 7);
  c.insert(3, std::make_shared<int>(9));  // evicts 2, which nobody else holds
  CHECK(dropped.expired());
  detail::lru<int, int> zero(0);
  CHECK(zero.capacity() == 1);
}

TEST_CASE_FIXTURE(io_fixture, "fft_actor::create on an unusable device yields device_unavailable") {
  device d(ioc.get_executor(), unusable_ordinal());
  auto a = fft_actor::create(d);
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::device_unavailable);
  // Bad options are reported first, without touching the device.
  auto b = fft_actor::create(d, {.plan_cache_size = 0});
  check_bad(b, "fft_actor::create", "plan_cache_size");
}
