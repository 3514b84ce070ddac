// Lanes on the CPU: the max_lanes checks of every actor's options (create
// refuses a bad value before any GPU call), how the lanes' stream policy and
// count are resolved, lane_set's choice and growth with fake lanes, and the
// rng sequence span. No CUDA call is made except where a create() on an
// unusable device is expected to fail.
#include <atomr/cuda.hpp>
#include <atomr/cuda/detail/actor_core.hpp>

#include "io_fixture.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;
using detail::lane_policy;
using detail::max_lanes_limit;
using detail::resolve_lanes;

namespace {

// The error is invalid_argument and its message names `op` and max_lanes.
template <class R>
void check_bad_lanes(const R& r, std::string_view op) {
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  const auto& m = r.error().message();
  CAPTURE(m);
  CHECK(m.find(std::string(op) + ": max_lanes (") != std::string::npos);
  CHECK(m.find("is more than 64") != std::string::npos);
}

// A lane without a stream: lane_set only needs the lock.
struct fake_lane : detail::lane_base {
  explicit fake_lane(std::size_t i) : lane_base(stream()), index(i) {}
  std::size_t index;
};

using fake_set = detail::lane_set<fake_lane>;

result<std::unique_ptr<fake_lane>> make_fake(std::size_t i) {
  return std::make_unique<fake_lane>(i);
}

// Holds the locks of some lanes on a thread of its own (a thread may not
// try_lock a mutex it holds) until release().
class holder {
public:
  explicit holder(std::vector<fake_lane*> lanes)
      : t_([this, lanes] {
          for (auto* l : lanes) l->mu.lock();
          {
            std::lock_guard lk(m_);
            held_ = true;
          }
          cv_.notify_all();
          std::unique_lock lk(m_);
          cv_.wait(lk, [&] { return released_; });
          for (auto* l : lanes) l->mu.unlock();
        }) {
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return held_; });
  }
  holder(const holder&) = delete;
  holder& operator=(const holder&) = delete;
  ~holder() { release(); }
  void release() {
    {
      std::lock_guard lk(m_);
      released_ = true;
    }
    cv_.notify_all();
    if (t_.joinable()) t_.join();
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false;
  std::thread t_;
};

std::vector<fake_lane*> all_of(const fake_set& s) {
  std::vector<fake_lane*> out;
  for (std::size_t i = 0; i < s.size(); ++i) out.push_back(&s.at(i));
  return out;
}

}  // namespace

TEST_CASE("max_lanes: 0 to 64 are accepted, more is invalid_argument") {
  for (std::size_t ok : {std::size_t{0}, std::size_t{1}, std::size_t{8}, max_lanes_limit})
    CHECK(detail::check_max_lanes("x", ok));
  for (std::size_t bad : {max_lanes_limit + 1, std::size_t{1000}, ~std::size_t{0}})
    check_bad_lanes(detail::check_max_lanes("blas_actor::create", bad), "blas_actor::create");

#if ATOMR_CUDA_HAS_CUBLAS
  check_bad_lanes(detail::check_blas_options({.max_lanes = 65}), "blas_actor::create");
  CHECK(detail::check_blas_options({.max_lanes = 64}));
#endif
#if ATOMR_CUDA_HAS_CUFFT
  check_bad_lanes(detail::check_fft_options({.max_lanes = 65}), "fft_actor::create");
  CHECK(detail::check_fft_options({.max_lanes = 1}));
#endif
#if ATOMR_CUDA_HAS_CUDNN
  check_bad_lanes(detail::check_cudnn_options({.max_lanes = 65}), "cudnn_actor::create");
  CHECK(detail::check_cudnn_options({.max_lanes = 0}));
#endif
#if ATOMR_CUDA_HAS_CURAND
  check_bad_lanes(detail::check_rng_options({.max_lanes = 65}), "rng_actor::create");
  CHECK(detail::check_rng_options({.max_lanes = 2}));
  // Any generator accepts a max_lanes; only Philox uses more than one lane.
  CHECK(detail::check_rng_options({.kind = rng_kind::xorwow, .max_lanes = 8}));
  for (auto k : {rng_kind::philox4_32_10, rng_kind::xorwow, rng_kind::mrg32k3a, rng_kind::mtgp32,
                 rng_kind::sobol32, rng_kind::scrambled_sobol32, rng_kind::sobol64,
                 rng_kind::scrambled_sobol64})
    CHECK(detail::rng_lanes_allowed(k) == (k == rng_kind::philox4_32_10));
#endif
}

TEST_CASE_FIXTURE(io_fixture, "create refuses a bad max_lanes before looking at the device") {
  // The device is unusable: an answer of invalid_argument shows the options
  // were checked first, before any GPU call.
  device d(ioc.get_executor(), unusable_ordinal());
#if ATOMR_CUDA_HAS_CUBLAS
  check_bad_lanes(blas_actor::create(d, {.max_lanes = 65}), "blas_actor::create");
  // Good values reach the device check.
  auto b = blas_actor::create(d, {.max_lanes = 64});
  REQUIRE_FALSE(b);
  CHECK(b.error().code() == errc::device_unavailable);
#endif
#if ATOMR_CUDA_HAS_CUFFT
  check_bad_lanes(fft_actor::create(d, {.max_lanes = 100}), "fft_actor::create");
#endif
#if ATOMR_CUDA_HAS_CUDNN
  check_bad_lanes(cudnn_actor::create(d, {.max_lanes = 65}), "cudnn_actor::create");
#endif
#if ATOMR_CUDA_HAS_CURAND
  // rng_actor checks the device state first (test_rng_args.cpp), then its options.
  auto r = rng_actor::create(d, {.max_lanes = 65});
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::device_unavailable);
#endif
  CHECK(d.statistics().ops_in_flight == 0);
}

TEST_CASE("resolve_lanes: the lanes' stream policy and count") {
  device_options dev;  // pooled (4 streams), launch_threads 8
  auto same = [](lane_policy p, stream_policy s, std::size_t n) {
    CHECK(p.streams == s);
    CHECK(p.max_lanes == n);
  };
  // Defaults: one fresh stream per lane, as many lanes as launch threads.
  same(resolve_lanes(std::nullopt, 0, dev), stream_policy::per_actor_fresh, 8);
  same(resolve_lanes(std::nullopt, 3, dev), stream_policy::per_actor_fresh, 3);
  same(resolve_lanes(std::nullopt, 64, dev), stream_policy::per_actor_fresh, 64);
  // max_lanes = 1: the device's policy, exactly as before lanes.
  same(resolve_lanes(std::nullopt, 1, dev), stream_policy::pooled, 1);
  // The default follows launch_threads; without them, 8.
  device_options more = dev;
  more.launch_threads = 16;
  same(resolve_lanes(std::nullopt, 0, more), stream_policy::per_actor_fresh, 16);
  device_options none = dev;
  none.launch_threads = 0;
  same(resolve_lanes(std::nullopt, 0, none), stream_policy::per_actor_fresh,
       detail::fallback_max_lanes);
  // A device whose policy is single keeps every actor on its main stream.
  device_options single = dev;
  single.streams = stream_policy::single;
  same(resolve_lanes(std::nullopt, 0, single), stream_policy::single, 1);
  same(resolve_lanes(std::nullopt, 8, single), stream_policy::single, 1);
  // Asked for: single and per_actor_shared give one lane; pooled at most the pool.
  same(resolve_lanes(stream_policy::single, 8, dev), stream_policy::single, 1);
  same(resolve_lanes(stream_policy::per_actor_shared, 0, dev), stream_policy::per_actor_shared, 1);
  same(resolve_lanes(stream_policy::pooled, 0, dev), stream_policy::pooled, 4);
  same(resolve_lanes(stream_policy::pooled, 2, dev), stream_policy::pooled, 2);
  same(resolve_lanes(stream_policy::per_actor_fresh, 0, dev), stream_policy::per_actor_fresh, 8);
  same(resolve_lanes(stream_policy::per_actor_fresh, 1, dev), stream_policy::per_actor_fresh, 1);
  device_options no_pool = dev;
  no_pool.stream_pool_size = 0;
  same(resolve_lanes(stream_policy::pooled, 0, no_pool), stream_policy::pooled, 1);
  // Over the limit (create() refuses it first) is clamped, never more than 64.
  same(resolve_lanes(std::nullopt, 1000, dev), stream_policy::per_actor_fresh, max_lanes_limit);
}

TEST_CASE("lane_set: each thread keeps a lane of its own, made on first use, up to the limit") {
  fake_set s(3);
  CHECK(s.limit() == 3);
  s.install_first(std::make_unique<fake_lane>(0));
  CHECK(s.size() == 1);
  std::atomic<int> made{0};
  auto make = [&](std::size_t i) {
    ++made;
    return make_fake(i);
  };
  // The first thread gets lane 0 (already there), every time.
  for (int i = 0; i < 10; ++i) CHECK(&s.pick(make) == &s.first());
  CHECK(made == 0);
  // The next threads get lanes 1 and 2 (made then), then lane 0 again.
  std::vector<std::size_t> got;
  for (int t = 0; t < 3; ++t) {
    std::size_t first = 0, again = 0;
    std::thread([&] {
      first = s.pick(make).index;
      again = s.pick(make).index;
    }).join();
    CHECK(first == again);  // a thread keeps its lane
    got.push_back(first);
  }
  CHECK(got == std::vector<std::size_t>{1, 2, 0});
  CHECK(made == 2);
  CHECK(s.size() == 3);
  CHECK(&s.pick(make) == &s.first());  // this thread still has lane 0
  int visited = 0;
  s.for_each_locked([&](fake_lane& l) { CHECK(l.index == static_cast<std::size_t>(visited++)); });
  CHECK(visited == 3);
}

TEST_CASE("lane_set: a lane that cannot be made stops the growth") {
  fake_set s(8);
  s.install_first(std::make_unique<fake_lane>(0));
  int tried = 0;
  auto failing = [&](std::size_t) -> result<std::unique_ptr<fake_lane>> {
    ++tried;
    return make_error(errc::out_of_memory, "no handle today");
  };
  CHECK(&s.pick(failing) == &s.first());  // this thread: lane 0, nothing to make
  for (int t = 0; t < 3; ++t) {
    fake_lane* got = nullptr;
    std::thread([&] { got = &s.pick(failing); }).join();
    CHECK(got == &s.first());  // the existing lane serves
  }
  CHECK(tried == 1);  // never tried again
  CHECK(s.growth_stopped());
  CHECK(s.size() == 1);
}

TEST_CASE("lane_set: a limit of 1 never makes a lane") {
  fake_set s(1);
  s.install_first(std::make_unique<fake_lane>(0));
  int made = 0;
  holder h(all_of(s));
  for (int i = 0; i < 5; ++i) {
    CHECK(&s.pick([&](std::size_t i) {
      ++made;
      return make_fake(i);
    }) == &s.first());
  }
  CHECK(made == 0);
  CHECK(s.size() == 1);
  CHECK(fake_set(0).limit() == 1);  // 0 counts as 1
  CHECK(fake_set(1000).limit() == max_lanes_limit);
}

TEST_CASE("lane_set: many threads picking while holding their lane make at most the limit") {
  constexpr std::size_t limit = 6;
  fake_set s(limit);
  s.install_first(std::make_unique<fake_lane>(0));
  std::atomic<int> made{0};
  std::mutex seen_mu;
  std::set<std::size_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        fake_lane& l = s.pick([&](std::size_t idx) {
          ++made;
          return make_fake(idx);
        });
        // As an enqueue does: the lock for a moment (blocking at the limit).
        std::lock_guard lk(l.mu);
        std::lock_guard sl(seen_mu);
        seen.insert(l.index);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(s.size() <= limit);
  CHECK(static_cast<std::size_t>(made.load()) == s.size() - 1);
  for (std::size_t i = 0; i < s.size(); ++i) CHECK(s.at(i).index == i);
  CHECK(*seen.rbegin() < s.size());
}

// The lane of a keyed operation (the buffer it writes) among the lanes in
// use: one per submitting thread, or spread_lanes' count on this thread.
TEST_CASE("lane_set: keyed operations spread over the threads' lanes or spread_lanes' count") {
  fake_set s(8);
  s.install_first(std::make_unique<fake_lane>(0));
  auto make = [](std::size_t i) { return make_fake(i); };
  auto key = [](std::size_t i) { return reinterpret_cast<const void*>((i + 1) * 4096); };
  // The lanes 64 keys go to, twice over (a key keeps its lane).
  auto lanes_of_keys = [&] {
    std::set<std::size_t> seen;
    for (std::size_t i = 0; i < 64; ++i) {
      const std::size_t first = s.pick(make, key(i)).index;
      CHECK(s.pick(make, key(i)).index == first);
      seen.insert(first);
    }
    return seen;
  };
  // One submitting thread: one lane in use, whatever the key.
  CHECK(lanes_of_keys() == std::set<std::size_t>{0});
  CHECK(s.size() == 1);
  std::set<std::size_t> spread4, spread_over, after;
  std::thread([&] {
    detail::spread_lanes(4);
    CHECK(detail::lanes_spread() == 4);
    spread4 = lanes_of_keys();
    detail::spread_lanes(100);  // more than the limit: the limit
    spread_over = lanes_of_keys();
    detail::spread_lanes(0);  // back to one lane per submitting thread (two so far)
    after = lanes_of_keys();
  }).join();
  CHECK(spread4 == std::set<std::size_t>{0, 1, 2, 3});
  CHECK(spread_over.size() > 4);
  CHECK(*spread_over.rbegin() < 8);
  CHECK(s.size() <= 8);
  CHECK(after == std::set<std::size_t>{0, 1});
  // The count is the setting thread's own: this thread never set it.
  CHECK(detail::lanes_spread() == 0);
  CHECK(lanes_of_keys() == std::set<std::size_t>{0, 1});
}

#if ATOMR_CUDA_HAS_CURAND
TEST_CASE("rng_sequence_span: one position per 32-bit value; doubles cover what cuRAND reads") {
  CHECK(detail::rng_sequence_span(1, 4) == 1);
  CHECK(detail::rng_sequence_span(4097, 4) == 4097);  // float, uint32
  CHECK(detail::rng_sequence_span(std::size_t{1} << 20, sizeof(float)) == std::uint64_t{1} << 20);
  // Doubles: the raw positions cuRAND's Philox double kernels read, measured
  // on the H200 (cuRAND of CUDA 13; docs/design.md, "One random sequence per
  // seed"), and what its generator moves on by itself, n + 2^18 *
  // floor(n / 2^18): a span below either would share random bits.
  struct measured {
    std::size_t n;
    std::uint64_t footprint;
  };
  for (auto m : {measured{3, 262146}, measured{1000, 263144}, measured{3000001, 6145728}}) {
    CAPTURE(m.n);
    const auto span = detail::rng_sequence_span(m.n, sizeof(double));
    CHECK(span >= m.footprint);
    CHECK(span >= m.n + (std::uint64_t{1} << 18) * (m.n >> 18));
    CHECK(span <= 2 * m.n + (std::uint64_t{1} << 19));  // not wasteful either
  }
}
#endif
