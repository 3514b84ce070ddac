// Buffers and transfers on a real GPU: bit-exact round trips for every
// element type, cross-stream ordering without host synchronisation, many
// concurrent coroutines, statistics.
#include "gpu_fixture.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>

using namespace atomr::cuda;
using namespace atomr::cuda::test;

TYPE_TO_STRING(half);
TYPE_TO_STRING(bfloat16);
TYPE_TO_STRING(std::complex<float>);
TYPE_TO_STRING(std::complex<double>);

TEST_CASE_TEMPLATE("256 MiB of random data round-trips bit-exactly", T, float, double, half,
                   bfloat16, std::complex<float>, std::complex<double>, std::int8_t, std::int32_t,
                   std::int64_t, std::uint8_t, std::uint32_t, std::uint64_t) {
  gpu_fixture f;
  constexpr std::size_t bytes = std::size_t{256} << 20;
  constexpr std::size_t n = bytes / sizeof(T);
  std::vector<T> src(n);
  random_bytes(src.data(), bytes, static_cast<std::uint64_t>(dtype_of<T>) + 17);

  auto a = f.alloc<T>(n);
  auto b = f.alloc<T>(n);
  auto pinned = f.dev.allocate_pinned<T>(n).value();
  std::memset(static_cast<void*>(pinned.data()), 0, bytes);
  std::vector<T> back(n);

  auto r = f.run([&]() -> asio::awaitable<result<void>> {
    BOOST_OUTCOME_CO_TRY(co_await upload(std::span<const T>(src), a));  // pageable
    BOOST_OUTCOME_CO_TRY(co_await copy(a, b));                          // d2d
    BOOST_OUTCOME_CO_TRY(co_await download(b, pinned));                 // pinned
    BOOST_OUTCOME_CO_TRY(co_await fill_bytes(a, 0xA5));                 // memset
    BOOST_OUTCOME_CO_TRY(co_await upload(pinned, a));                   // pinned up
    BOOST_OUTCOME_CO_TRY(co_await download(a, std::span<T>(back)));     // pageable
    co_return outcome::success();
  }());
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  CHECK(std::memcmp(pinned.data(), src.data(), bytes) == 0);
  CHECK(std::memcmp(back.data(), src.data(), bytes) == 0);
}

TEST_CASE_FIXTURE(gpu_fixture, "fill_bytes writes every byte") {
  auto a = alloc<std::uint32_t>(1 << 20);
  std::vector<std::uint32_t> out(1 << 20, 0);
  auto r = run([&]() -> asio::awaitable<result<void>> {
    BOOST_OUTCOME_CO_TRY(co_await fill_bytes(a, 0x3C));
    co_return co_await download(a, std::span<std::uint32_t>(out));
  }());
  REQUIRE(r);
  for (auto v : out) REQUIRE(v == 0x3C3C3C3Cu);
}

TEST_CASE_FIXTURE(gpu_fixture,
                  "a write on stream A is seen by a read on stream B with no host sync") {
  auto sa = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto sb = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  REQUIRE(sa.id() != sb.id());
  constexpr int n = 4096;  // ~tens of ms of FP32 work: a reader that did not wait sees zeros
  auto av = random_floats(std::size_t{n} * n, 1);
  auto bv = random_floats(std::size_t{n} * n, 2);
  auto a = upload_floats(av, sa);
  auto b = upload_floats(bv, sa);
  auto c = alloc<float>(std::size_t{n} * n);
  REQUIRE(run(fill_bytes(c, 0, {.on = sa})));
  blas_handle blas(sa);
  std::vector<float> seen(std::size_t{n} * n);

  std::optional<result<gpu_ref<float>>> wrote;
  std::optional<result<void>> read;
  // Both coroutines are launched before either waits: the gemm is enqueued on
  // A, then the download on B; only the per-buffer event makes B wait.
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        wrote.emplace(co_await sgemm(blas, sa, event_poll{}, a, b, c, n, 3));
      },
      asio::detached);
  asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<void> {
        read.emplace(co_await download(c, std::span<float>(seen), {.on = sb}));
      },
      asio::detached);
  ioc.restart();
  ioc.run_for(limit);
  REQUIRE(wrote);
  REQUIRE(read);
  REQUIRE(*wrote);
  REQUIRE(*read);
  CHECK(gemm_rel_error(av, bv, seen, n, 256) < 1e-5);
}

TEST_CASE_FIXTURE(gpu_fixture, "1000 concurrent coroutines each round-trip their own data") {
  constexpr int coroutines = 1000;
  constexpr std::size_t n = 4096;
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::string> errors;
  std::mutex mu;
  for (int i = 0; i < coroutines; ++i) {
    asio::co_spawn(
        ioc,
        [&, i]() -> asio::awaitable<void> {
          std::vector<std::uint32_t> mine(n);
          for (std::size_t k = 0; k < n; ++k)
            mine[k] = static_cast<std::uint32_t>(i * 1000003u + k);
          auto s = dev.acquire_stream();  // pooled: coroutines share streams
          auto a = dev.allocate<std::uint32_t>(n);
          auto b = dev.allocate<std::uint32_t>(n);
          if (!s || !a || !b) {
            ++bad;
            co_return;
          }
          transfer_options o{.on = s.value()};
          std::vector<std::uint32_t> back(n);
          auto r = co_await upload(std::span<const std::uint32_t>(mine), a.value(), o);
          if (r) r = co_await copy(a.value(), b.value(), o);
          result<void> d = r ? co_await download(b.value(), std::span<std::uint32_t>(back), o)
                             : result<void>(r.error());
          if (d && back == mine) {
            ++ok;
          } else {
            ++bad;
            std::lock_guard lk(mu);
            errors.push_back(d ? "data mismatch" : d.error().message());
          }
        },
        asio::detached);
  }
  ioc.restart();
  // Four io threads: the library must be safe when coroutines resume anywhere.
  std::vector<std::thread> pool;
  for (int t = 0; t < 3; ++t) pool.emplace_back([&] { ioc.run_for(limit); });
  ioc.run_for(limit);
  for (auto& t : pool) t.join();
  CHECK(ok == coroutines);
  CHECK(bad == 0);
  if (!errors.empty()) MESSAGE(errors.front());
  auto st = dev.statistics();
  CHECK(st.ops_in_flight == 0);
  CHECK(st.ops_completed >= 3 * coroutines);
  // Live buffers keep their last access events, so 1000 coroutines holding
  // buffers at once legitimately pin ~3000 events. Once they are gone, the
  // pool serves new work without creating events.
  MESSAGE("events created for ", 3 * coroutines, " concurrent operations: ", st.events_created);
  const auto created = st.events_created;
  auto buf = alloc<std::uint32_t>(n);
  std::vector<std::uint32_t> host(n, 7u);
  auto seq = run([&]() -> asio::awaitable<result<void>> {
    for (int i = 0; i < 200; ++i) {
      BOOST_OUTCOME_CO_TRY(co_await upload(std::span<const std::uint32_t>(host), buf));
    }
    co_return outcome::success();
  }());
  REQUIRE(seq);
  CHECK(dev.statistics().events_created <= created + 4);
}

TEST_CASE_FIXTURE(gpu_fixture, "statistics come from the driver") {
  auto before = dev.statistics();
  CHECK(before.health == health_state::healthy);
  // The driver's own answer (an H200 has ~141 GB, an H100 ~80 GB).
  std::size_t driver_free = 0, driver_total = 0;
  REQUIRE(cudaMemGetInfo(&driver_free, &driver_total) == cudaSuccess);
  CHECK(before.total_bytes == driver_total);
  CHECK(before.total_bytes > (std::size_t{8} << 30));
  CHECK(before.free_bytes > 0);
  CHECK(before.free_bytes <= before.total_bytes);
  {
    auto big = alloc<float>(std::size_t{1} << 28);  // 1 GiB from the pool
    CHECK(dev.statistics().live_buffers == before.live_buffers + 1);
  }
  CHECK(dev.statistics().live_buffers == before.live_buffers);
}

TEST_CASE_FIXTURE(gpu_fixture, "bad arguments are refused before any GPU call") {
  CHECK(dev.allocate<float>(0).error().code() == errc::invalid_argument);
  CHECK(dev.allocate<double>(std::size_t{1} << 62).error().code() == errc::invalid_argument);
  auto a = alloc<float>(16);
  std::vector<float> small(8);
  auto r = run(upload(std::span<const float>(small), a));
  CHECK(r.error().code() == errc::invalid_argument);
  auto b = alloc<float>(8);
  CHECK(run(copy(a, b)).error().code() == errc::invalid_argument);
  auto p = dev.allocate_pinned<float>(4).value();
  CHECK(run(download(a, p)).error().code() == errc::invalid_argument);
  CHECK(dev.statistics().ops_in_flight == 0);
}

TEST_CASE_FIXTURE(gpu_fixture, "stream policies hand out the streams they promise") {
  auto s1 = dev.acquire_stream(stream_policy::single).value();
  auto s2 = dev.acquire_stream(stream_policy::single).value();
  CHECK(s1.id() == s2.id());
  CHECK(s1.id() == dev.main_stream().id());
  auto f1 = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  auto f2 = dev.acquire_stream(stream_policy::per_actor_fresh).value();
  CHECK(f1.id() != f2.id());
  auto o1 = dev.acquire_stream(stream_policy::per_actor_shared, "cublas").value();
  auto o2 = dev.acquire_stream(stream_policy::per_actor_shared, "cublas").value();
  auto o3 = dev.acquire_stream(stream_policy::per_actor_shared, "cufft").value();
  CHECK(o1.id() == o2.id());
  CHECK(o1.id() != o3.id());
  std::set<std::uint64_t> pooled;
  for (std::size_t i = 0; i < 2 * dev.options().stream_pool_size; ++i)
    pooled.insert(dev.acquire_stream(stream_policy::pooled).value().id());
  CHECK(pooled.size() == dev.options().stream_pool_size);
}
