// NCCL collectives and copies between devices (issue 22), over every GPU of
// this machine: one rank per device, each collective against a CPU
// reference in double precision. On a machine with one GPU the communicator
// has one rank (every collective still runs through NCCL, the numbers still
// checked) and the copies between two devices report why they were skipped.
#include <atomr/cuda.hpp>

#include "gpu_fixture.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <span>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::gpu_fixture;

#if ATOMR_CUDA_HAS_NCCL

namespace {

/// Small integers as floats: every sum and product below is exact in f32.
std::vector<float> small_ints(std::size_t n, std::uint64_t seed) {
  const auto r = test::random_floats(n, seed);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = std::floor(r[i] * 7.0f) - 3.0f;  // -3..3
  return out;
}

struct ranks_fixture : gpu_fixture {
  device_set set = device_set::open(ioc.get_executor()).value();
  collective_actor nccl = collective_actor::create(set).value();
  std::size_t n = set.size();

  /// count floats on every rank's device, uploaded from `host[r]`; views
  /// starting 3 elements into their allocations (offsets must be honoured).
  std::vector<gpu_ref<float>> put(const std::vector<std::vector<float>>& host) {
    std::vector<gpu_ref<float>> out;
    for (std::size_t r = 0; r < n; ++r) {
      auto whole = set[r].allocate<float>(host[r].size() + 5).value();
      REQUIRE(run(fill_bytes(whole, 0xFF)));
      auto v = whole.subspan(3, host[r].size()).value();
      REQUIRE(run(upload(std::span<const float>(host[r]), v)));
      out.push_back(v);
    }
    return out;
  }
  std::vector<gpu_ref<float>> empty_like(std::size_t count) {
    std::vector<gpu_ref<float>> out;
    for (std::size_t r = 0; r < n; ++r) {
      auto whole = set[r].allocate<float>(count + 5).value();
      REQUIRE(run(fill_bytes(whole, 0xFF)));
      out.push_back(whole.subspan(2, count).value());
    }
    return out;
  }
  /// Elements of `got` that differ from the sum over the ranks of `host`.
  std::size_t wrong_sums(const std::vector<float>& got,
                         const std::vector<std::vector<float>>& host) const {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      double want = 0;
      for (const auto& h : host) want += h[i];
      wrong += got[i] != static_cast<float>(want);
    }
    return wrong;
  }
  std::vector<float> get(const gpu_ref<float>& r) {
    std::vector<float> out(r.size());
    REQUIRE(run(download(r, std::span<float>(out))));
    return out;
  }
};

}  // namespace

TEST_CASE_FIXTURE(ranks_fixture,
                  "collectives: every kind and reduction over every device against a CPU "
                  "reference") {
  MESSAGE("ranks: ", n, " (NCCL ", nccl.statistics().nccl_version, ")");
  REQUIRE(nccl.ranks() == n);
  const std::size_t count = 4099;
  std::vector<std::vector<float>> host;
  for (std::size_t r = 0; r < n; ++r) host.push_back(small_ints(count, 700 + r));
  auto send = put(host);

  SUBCASE("all_reduce, each reduction") {
    for (auto op :
         {reduce_op::sum, reduce_op::prod, reduce_op::max, reduce_op::min, reduce_op::avg}) {
      CAPTURE(to_string(op));
      auto recv = empty_like(count);
      auto done = run(nccl.all_reduce(send, recv, op));
      REQUIRE_MESSAGE(done, (done ? "" : done.error().message()));
      // Every element of every rank, once per op.
      for (std::size_t r = 0; r < n; ++r) {
        const auto got = get(recv[r]);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          double want = host[0][i];
          for (std::size_t q = 1; q < n; ++q) {
            const double x = host[q][i];
            if (op == reduce_op::sum || op == reduce_op::avg) want += x;
            if (op == reduce_op::prod) want *= x;
            if (op == reduce_op::max) want = std::max(want, x);
            if (op == reduce_op::min) want = std::min(want, x);
          }
          if (op == reduce_op::avg) want /= static_cast<double>(n);
          if (std::abs(got[i] - want) > 1e-6 * std::max(1.0, std::abs(want))) ++wrong;
        }
        CHECK(wrong == 0);
      }
    }
  }

  SUBCASE("all_reduce in place, then broadcast, reduce, all_gather, reduce_scatter, send_recv") {
    // In place: send[r] == recv[r].
    auto inplace = put(host);
    REQUIRE(run(nccl.all_reduce(inplace, inplace)));
    for (std::size_t r = 0; r < n; ++r) CHECK(wrong_sums(get(inplace[r]), host) == 0);

    const int root = static_cast<int>(n - 1);
    auto bcast = empty_like(count);
    REQUIRE(run(nccl.broadcast(send[n - 1], bcast, root)));
    for (std::size_t r = 0; r < n; ++r) CHECK(get(bcast[r]) == host[n - 1]);

    auto reduced = set[0].allocate<float>(count).value();
    REQUIRE(run(nccl.reduce(send, reduced, reduce_op::sum, 0)));
    CHECK(wrong_sums(get(reduced), host) == 0);

    auto gathered = empty_like(n * count);
    REQUIRE(run(nccl.all_gather(send, gathered)));
    for (std::size_t r = 0; r < n; ++r) {
      const auto got = get(gathered[r]);
      for (std::size_t q = 0; q < n; ++q)
        CHECK(std::equal(host[q].begin(), host[q].end(),
                         got.begin() + static_cast<std::ptrdiff_t>(q * count)));
    }

    // reduce_scatter: each rank sends n blocks of `block`; rank r gets block r summed.
    const std::size_t block = 1031;
    std::vector<std::vector<float>> big;
    for (std::size_t r = 0; r < n; ++r) big.push_back(small_ints(n * block, 900 + r));
    auto scatter_in = put(big);
    auto scattered = empty_like(block);
    REQUIRE(run(nccl.reduce_scatter(scatter_in, scattered, reduce_op::max)));
    for (std::size_t r = 0; r < n; ++r) {
      const auto got = get(scattered[r]);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < block; ++i) {
        float want = big[0][r * block + i];
        for (std::size_t q = 1; q < n; ++q) want = std::max(want, big[q][r * block + i]);
        wrong += got[i] != want;
      }
      CHECK(wrong == 0);
    }

    // send_recv from rank 0 to the last rank (to itself with one rank).
    auto dst = set[n - 1].allocate<float>(count).value();
    REQUIRE(run(nccl.send_recv(0, root, send[0], dst)));
    CHECK(get(dst) == host[0]);
  }

  SUBCASE("a group of two collectives, and complex, half and integer elements") {
    auto sums = empty_like(count);
    auto gathered = empty_like(n * count);
    std::vector<collective_call> calls;
    calls.push_back(all_reduce_call<float>(send, sums));
    calls.push_back(all_gather_call<float>(send, gathered));
    const auto before = nccl.statistics().groups;
    REQUIRE(run(nccl.group(std::move(calls))));
    CHECK(nccl.statistics().groups == before + 1);
    for (std::size_t r = 0; r < n; ++r) {
      const auto s = get(sums[r]);
      const auto g = get(gathered[r]);
      for (std::size_t i = 0; i < count; i += 13) {
        double want = 0;
        for (std::size_t q = 0; q < n; ++q) want += host[q][i];
        CHECK(s[i] == static_cast<float>(want));
        CHECK(g[(n - 1) * count + i] == host[n - 1][i]);
      }
    }

    // c32 sum: both parts summed; i32 max; f16 sum of small integers (exact).
    std::vector<gpu_ref<std::complex<float>>> zc, zo;
    std::vector<gpu_ref<std::int32_t>> ic, io;
    std::vector<gpu_ref<half>> hc, ho;
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<std::complex<float>> z(count);
      std::vector<std::int32_t> k(count);
      std::vector<half> h(count);
      for (std::size_t i = 0; i < count; ++i) {
        z[i] = {host[r][i], -2.0f * host[r][i]};
        k[i] = static_cast<std::int32_t>(host[r][i]) * 1000 + static_cast<std::int32_t>(r);
        h[i] = __float2half(host[r][i]);
      }
      zc.push_back(set[r].allocate<std::complex<float>>(count).value());
      zo.push_back(set[r].allocate<std::complex<float>>(count).value());
      ic.push_back(set[r].allocate<std::int32_t>(count).value());
      io.push_back(set[r].allocate<std::int32_t>(count).value());
      hc.push_back(set[r].allocate<half>(count).value());
      ho.push_back(set[r].allocate<half>(count).value());
      REQUIRE(run(upload(z, zc.back())));
      REQUIRE(run(upload(k, ic.back())));
      REQUIRE(run(upload(h, hc.back())));
    }
    REQUIRE(run(nccl.all_reduce(zc, zo)));
    REQUIRE(run(nccl.all_reduce(ic, io, reduce_op::max)));
    REQUIRE(run(nccl.all_reduce(hc, ho)));
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<std::complex<float>> z(count);
      std::vector<std::int32_t> k(count);
      std::vector<half> h(count);
      REQUIRE(run(download(zo[r], z)));
      REQUIRE(run(download(io[r], k)));
      REQUIRE(run(download(ho[r], h)));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        double re = 0;
        std::int32_t kmax = INT32_MIN;
        for (std::size_t q = 0; q < n; ++q) {
          re += host[q][i];
          kmax = std::max(
              kmax, static_cast<std::int32_t>(host[q][i]) * 1000 + static_cast<std::int32_t>(q));
        }
        wrong += z[i] != std::complex<float>(static_cast<float>(re), static_cast<float>(-2 * re));
        wrong += k[i] != kmax;
        wrong += __half2float(h[i]) != static_cast<float>(re);
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE_FIXTURE(ranks_fixture,
                  "collectives: ordering with other streams is kept by events (a missing wait "
                  "shows as wrong numbers)") {
  // 16 Mi floats per rank: an upload on the device's main stream, the
  // all_reduce on the actor's rank streams and an overwrite of its input on
  // the main stream again, each enqueued while the one before it runs (a
  // read after a write, then a write after the read, across streams).
  const std::size_t count = std::size_t{1} << 24;
  std::vector<std::vector<float>> host;
  for (std::size_t r = 0; r < n; ++r) host.push_back(small_ints(count, 40 + r));
  for (int round = 0; round < 3; ++round) {
    std::vector<gpu_ref<float>> send, recv;
    for (std::size_t r = 0; r < n; ++r) {
      send.push_back(set[r].allocate<float>(count).value());
      recv.push_back(set[r].allocate<float>(count).value());
    }
    auto body = [&]() -> asio::awaitable<result<std::vector<float>>> {
      using namespace asio::experimental::awaitable_operators;
      for (std::size_t r = 1; r < n; ++r) {
        BOOST_OUTCOME_CO_TRY(co_await upload(std::span<const float>(host[r]), send[r]));
      }
      // `&&` starts each operation when the one before it has enqueued and
      // suspended: rank 0's upload is still running when the collective is
      // enqueued, and the collective when send[0] is overwritten.
      auto [up, reduced, filled] = co_await (upload(std::span<const float>(host[0]), send[0]) &&
                                             nccl.all_reduce(send, recv) && fill_bytes(send[0], 0));
      BOOST_OUTCOME_CO_TRY(up);
      BOOST_OUTCOME_CO_TRY(reduced);
      BOOST_OUTCOME_CO_TRY(filled);
      std::vector<float> out(count);
      BOOST_OUTCOME_CO_TRY(co_await download(recv[n - 1], std::span<float>(out)));
      co_return out;
    };
    auto got = run(body());
    REQUIRE(got);
    CHECK(wrong_sums(got.value(), host) == 0);
  }
}

TEST_CASE_FIXTURE(ranks_fixture,
                  "collectives: bad arguments are refused before any NCCL call; reset rebuilds "
                  "the communicator; not a step of a unit") {
  const auto before = nccl.statistics();
  std::vector<gpu_ref<float>> send, recv, short_recv;
  for (std::size_t r = 0; r < n; ++r) {
    send.push_back(set[r].allocate<float>(64).value());
    recv.push_back(set[r].allocate<float>(64).value());
    short_recv.push_back(set[r].allocate<float>(32).value());
  }
  auto code = [&](auto aw) {
    auto r = run(std::move(aw));
    REQUIRE_FALSE(r);
    MESSAGE(r.error().message());
    return r.error().code();
  };
  CHECK(code(nccl.all_reduce(send, short_recv)) == errc::invalid_argument);
  CHECK(code(nccl.all_gather(send, short_recv)) == errc::invalid_argument);  // needs n x 64
  auto fewer = send;
  fewer.pop_back();
  CHECK(code(nccl.all_reduce(fewer, recv)) == errc::invalid_argument);
  CHECK(code(nccl.broadcast(send[0], recv, static_cast<int>(n))) == errc::invalid_argument);
  CHECK(code(nccl.send_recv(0, -1, send[0], recv[0])) == errc::invalid_argument);
  std::vector<gpu_ref<std::int32_t>> ints{set[0].allocate<std::int32_t>(8).value()};
  if (n == 1) CHECK(code(nccl.all_reduce(ints, ints, reduce_op::avg)) == errc::not_supported);
  std::vector<gpu_ref<float>> holes(n);
  CHECK(code(nccl.all_reduce(holes, recv)) == errc::invalid_argument);  // empty refs
  CHECK(code(nccl.group({})) == errc::invalid_argument);
  if (n >= 2) {
    auto swapped = send;
    std::swap(swapped[0], swapped[1]);
    CHECK(code(nccl.all_reduce(swapped, recv)) == errc::invalid_argument);  // wrong devices
  }
  CHECK(nccl.statistics().groups == before.groups);

  // In a unit: refused (a unit runs on one device).
  auto in_unit = run(compose(set[0], nccl.all_reduce(send, recv)));
  REQUIRE_FALSE(in_unit);
  CHECK(in_unit.error().code() == errc::not_supported);

  // reset: the communicator is aborted and made again, and works.
  REQUIRE(nccl.reset());
  const auto after = nccl.statistics();
  CHECK(after.builds == before.builds + 1);
  CHECK(after.aborts == before.aborts + 1);
  std::vector<std::vector<float>> host(n, std::vector<float>(64, 2.0f));
  for (std::size_t r = 0; r < n; ++r) REQUIRE(run(upload(host[r], send[r])));
  REQUIRE(run(nccl.all_reduce(send, recv)));
  std::vector<float> got(64);
  REQUIRE(run(download(recv[0], got)));
  CHECK(got == std::vector<float>(64, 2.0f * static_cast<float>(n)));
}

#endif  // ATOMR_CUDA_HAS_NCCL

TEST_CASE_FIXTURE(gpu_fixture,
                  "copies between devices: both ways with numbers checked, ordered by events "
                  "(skipped with one GPU; a same-device copy through the set instead)") {
  auto set = device_set::open(ioc.get_executor()).value();
  const std::size_t count = std::size_t{1} << 22;
  const auto host = test::random_floats(count, 5150);
  if (set.size() < 2) {
    MESSAGE("one GPU: copies between two devices not run (need a machine with several GPUs)");
    auto a = set[0].allocate<float>(count).value();
    auto b = set[0].allocate<float>(count).value();
    REQUIRE(run(upload(host, a)));
    REQUIRE(run(copy(a, b)));
    std::vector<float> got(count);
    REQUIRE(run(download(b, got)));
    CHECK(got == host);
    return;
  }
  for (std::size_t i = 0; i + 1 < set.size(); ++i) {
    MESSAGE("devices ", i, " and ", i + 1, ": peer access ", set.peer(i, i + 1) ? "on" : "off");
    auto a = set[i].allocate<float>(count).value();
    auto b = set[i + 1].allocate<float>(count).value();
    auto c = set[i].allocate<float>(count).value();
    // upload (device i's main stream) -> peer copy (device i+1's stream) ->
    // overwrite a at once (must wait for the copy's read) -> copy back.
    auto body = [&]() -> asio::awaitable<result<std::vector<float>>> {
      BOOST_OUTCOME_CO_TRY(co_await upload(std::span<const float>(host), a));
      BOOST_OUTCOME_CO_TRY(co_await copy(a, b));
      BOOST_OUTCOME_CO_TRY(co_await fill_bytes(a, 0));
      BOOST_OUTCOME_CO_TRY(co_await copy(b, c));
      std::vector<float> out(count);
      BOOST_OUTCOME_CO_TRY(co_await download(c, std::span<float>(out)));
      co_return out;
    };
    auto got = run(body());
    REQUIRE(got);
    CHECK(got.value() == host);
    // A unit runs on one device: a copy between two is refused in one.
    auto in_unit = run(compose(set[i], copy(a, b)));
    REQUIRE_FALSE(in_unit);
    CHECK(in_unit.error().code() == errc::not_supported);
  }
}
