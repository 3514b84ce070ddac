// Sticky faults on a real GPU. A fault ends GPU use for the whole process
// (DEVICE.md), so meson runs each of these test cases in a process of its
// own (see test/meson.build); running them together in one process would
// make every case after the first see an already-poisoned device.
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {

struct fault_fixture : gpu_fixture {
  test_kernels kernels;

  /// Enqueues an illegal write through run_kernel and awaits it with `how`,
  /// while 100 other operations (all three strategies, several streams) are
  /// in flight; then checks everything the contract promises after a fault.
  void poison_and_check(completion how) {
    auto before = alloc<float>(1024);  // a ref from the healthy generation
    // A recorded unit of the healthy generation, replayed once, and cached.
    auto copied = alloc<float>(1024);
    auto unit = run(record(dev, fill_bytes(before, 0), copy(before, copied)));
    REQUIRE(unit);
    REQUIRE(run(replay(unit.value())));
    graph_cache cache(4);
    cache.insert(1, unit.value());
    std::optional<health_state> woke;
    dev.async_wait_health_change([&](health_state h) { woke = h; });

    // The spin kernel really spins (so the others below are in flight).
    {
      const auto t0 = std::chrono::steady_clock::now();
      auto r =
          run(run_kernel("cuda", dev.main_stream(), event_poll{}, 0, [&](launch& l) -> result<int> {
            if (auto st = kernels.spin(l.native_stream(), 20); st != cudaSuccess)
              return classify(st, "cudaLaunchKernel(spin)");
            return 0;
          }));
      REQUIRE(r);
      CHECK(std::chrono::steady_clock::now() - t0 >= 19ms);
    }

    const completion strategies[] = {event_poll{}, host_fn{}, blocking_sync{}};
    constexpr int others = 100;
    const auto started = std::chrono::steady_clock::now();
    auto last_other = started;
    int finished = 0, ok = 0, poisoned = 0, other_error = 0;
    std::string unexpected;
    for (int i = 0; i < others; ++i) {
      asio::co_spawn(
          ioc,
          [&, i]() -> asio::awaitable<void> {
            auto s = dev.acquire_stream();
            if (!s) co_return;
            auto r = co_await run_kernel(
                "cuda", s.value(), strategies[i % 3], 0, [&](launch& l) -> result<int> {
                  if (auto st = kernels.spin(l.native_stream(), 5 + i % 40); st != cudaSuccess)
                    return classify(st, "cudaLaunchKernel(spin)");
                  return 0;
                });
            ++finished;
            last_other = std::chrono::steady_clock::now();
            if (r)
              ++ok;
            else if (r.error() == errc::context_poisoned)
              ++poisoned;
            else {
              ++other_error;
              unexpected = r.error().message();
            }
          },
          asio::detached);
    }

    std::optional<result<int>> faulted;
    auto fault_seen = started;
    auto fault_stream = dev.acquire_stream(stream_policy::per_actor_fresh).value();
    asio::co_spawn(
        ioc,
        [&]() -> asio::awaitable<void> {
          faulted.emplace(
              co_await run_kernel("cuda", fault_stream, how, 0, [&](launch& l) -> result<int> {
                auto st = kernels.write_to(l.native_stream(), 0x10, 7);
                if (st != cudaSuccess) return classify(st, "cudaLaunchKernel(write_to)");
                return 0;
              }));
          fault_seen = std::chrono::steady_clock::now();
        },
        asio::detached);

    ioc.restart();
    ioc.run_for(60s);  // every wait must end well before this

    REQUIRE(faulted);
    REQUIRE_FALSE(*faulted);
    CHECK(faulted->error().code() == errc::context_poisoned);
    MESSAGE("fault: ", faulted->error().message());
    CHECK(finished == others);
    CHECK(ok + poisoned == others);
    CHECK(other_error == 0);
    if (!unexpected.empty()) MESSAGE("unexpected: ", unexpected);
    MESSAGE(ok, " of the others succeeded, ", poisoned, " failed with context_poisoned");
    using ms_d = std::chrono::duration<double, std::milli>;
    MESSAGE("fault seen after ", ms_d(fault_seen - started).count(), " ms; last other ended after ",
            ms_d(last_other - started).count(), " ms");

    CHECK(dev.health() == health_state::poisoned);
    REQUIRE(woke);
    CHECK(*woke == health_state::poisoned);
    CHECK(before.check().error().code() == errc::stale_ref);
    auto stats = dev.statistics();
    CHECK(stats.faults == 1);
    CHECK(stats.ops_in_flight == 0);

    // Later calls fail at once, with the original fault's message.
    const auto t0 = std::chrono::steady_clock::now();
    auto a = dev.allocate<float>(16);
    auto r = run(run_kernel("cublas", dev.main_stream(), event_poll{}, 0,
                            [&](launch&) -> result<int> { return 0; }));
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took < 1ms);
    REQUIRE_FALSE(a);
    REQUIRE_FALSE(r);
    CHECK(a.error().code() == errc::context_poisoned);
    CHECK(r.error().code() == errc::context_poisoned);
    const auto fault = dev.fault();  // a copy: message() refers into it
    REQUIRE(fault);
    CHECK(fault->message().find("cudaErrorIllegalAddress") != std::string::npos);
    CHECK(r.error().message().find("cudaErrorIllegalAddress") != std::string::npos);

    // A replay never launches into the poisoned context: the fault's error at once.
    auto again = run(replay(unit.value()));
    REQUIRE_FALSE(again);
    CHECK(again.error().code() == errc::context_poisoned);
    CHECK(unit.value().replays() == 1);
    CHECK_FALSE(cache.find(1));  // of an older generation: dropped
  }
};

}  // namespace

TEST_CASE_FIXTURE(fault_fixture, "fault awaited by event_poll poisons the device") {
  poison_and_check(event_poll{});
}
TEST_CASE_FIXTURE(fault_fixture, "fault awaited by host_fn poisons the device") {
  poison_and_check(host_fn{});
}
TEST_CASE_FIXTURE(fault_fixture, "fault awaited by blocking_sync poisons the device") {
  poison_and_check(blocking_sync{});
}
