// The device's event poller (lib/poll_hub.hpp) without a GPU: no wait is
// ever left unlooked-at. The waits here carry a null event, which
// cudaEventQuery answers at once with an error (no driver: insufficient
// driver; with one: an invalid handle), and any answer but "not ready" ends
// a wait, so every wait must finish within a few of the hub's steps.
#include "../lib/poll_hub.hpp"
#include <doctest/doctest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace atomr::cuda::detail;
namespace asio = boost::asio;

namespace {

/// A wait whose event is answered at once; counts how it ended.
class instant_wait final : public polled_wait {
public:
  /// `throws`: its completion throws after counting itself, as a handler
  /// that rethrows a coroutine's exception would.
  instant_wait(cudaStream_t s, std::atomic<std::uint64_t>* ended, bool throws = false)
      : stream_(s), ended_(ended), throws_(throws) {}
  cudaStream_t polled_stream() const noexcept override { return stream_; }
  cudaEvent_t polled_event() const noexcept override { return nullptr; }
  bool polled_done() const noexcept override { return done_.load(); }
  clock::time_point polled_start() const noexcept override { return start_; }
  // No spin budget: a step that leaves waits behind arms a timer, whose
  // step may later find the hub empty.
  clock::duration polled_spin() const noexcept override { return clock::duration::zero(); }
  clock::duration polled_max_backoff() const noexcept override {
    return std::chrono::milliseconds(1);
  }
  void polled_complete(cudaError_t, bool) override {
    end();
    if (throws_) throw std::runtime_error("a completion handler threw");
  }
  void polled_reject() override { end(); }
  bool done() const noexcept { return done_.load(); }
  int ends() const noexcept { return ends_.load(); }

private:
  void end() {
    ++ends_;
    done_.store(true);
    ended_->fetch_add(1);
  }
  cudaStream_t stream_;
  std::atomic<std::uint64_t>* ended_;
  bool throws_;
  clock::time_point start_ = clock::now();
  std::atomic<bool> done_{false};
  std::atomic<int> ends_{0};
};

}  // namespace

namespace atomr::cuda::detail {
/// Runs one step of a hub on the calling thread (poll_hub's friend).
struct poll_hub_test_access {
  static void step(poll_hub& h) { h.step(false); }
};
}  // namespace atomr::cuda::detail

TEST_CASE(
    "poll hub: waits added from many threads while steps run are each looked at and "
    "ended once (no lost wake-up)") {
  // One step runs at a time; a step turned away leaves the next look to the
  // running one (poll_hub::step, look_again). Without that hand-over a wait
  // added during a step stays unpolled: removing the running step's check
  // fails this case at once (the empty-hub exit's window is too narrow to
  // be hit here: the next case opens it on purpose). In lock step, each
  // round's last wait has no later add to rescue it, so a lost one shows.
  asio::io_context ioc;
  auto guard = asio::make_work_guard(ioc);
  auto hub = std::make_shared<poll_hub>(
      ioc.get_executor(), [] { return true; }, 8, 0, std::chrono::microseconds(0),
      std::chrono::microseconds(0));
  std::vector<std::thread> io;
  // The runtime's start-up (the first cudaEventQuery) before the timed rounds.
  (void)cudaEventQuery(nullptr);
  // More io threads than cores: a step is often preempted inside its
  // critical sections, which widens the windows between them.
  for (int i = 0; i < 8; ++i) io.emplace_back([&] { ioc.run(); });
  constexpr int submitters = 4;
  constexpr int rounds = 20000;  // about 1.5 s on two cores
  std::atomic<std::uint64_t> ended{0};
  std::atomic<int> lost{0}, twice{0};
  // Each round every thread adds one wait and waits for it.
  std::barrier sync(submitters);
  std::vector<std::thread> subs;
  for (int t = 0; t < submitters; ++t)
    subs.emplace_back([&, t] {
      // A stream handle of its own (never dereferenced: the hub only keys on it).
      const auto s = reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(t + 1) * 256);
      for (int i = 0; i < rounds; ++i) {
        sync.arrive_and_wait();
        if (lost.load()) return (void)sync.arrive_and_drop();
        auto w = std::make_shared<instant_wait>(s, &ended);
        hub->add(w);
        const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (!w->done() && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
        if (!w->done()) ++lost;
        twice += w->ends() > 1;
      }
      sync.arrive_and_drop();
    });
  for (auto& s : subs) s.join();
  guard.reset();
  ioc.stop();
  for (auto& t : io) t.join();
  hub->clear();
  CHECK(lost.load() == 0);
  CHECK(twice.load() == 0);
  if (lost.load() == 0) CHECK(ended.load() == static_cast<std::uint64_t>(submitters) * rounds);
}

TEST_CASE(
    "poll hub: a completion that throws leaves through io_context::run(); every other "
    "wait its step found still ends") {
  // One step finds all 40 (they share one event): 16 complete on the step's
  // thread, 24 are posted in chunks of 16. Waits 3 and 20 throw: before the
  // fix the rest of each one's chunk (23 waits) was dropped with it.
  asio::io_context ioc;
  auto hub = std::make_shared<poll_hub>(
      ioc.get_executor(), [] { return true; }, 8, 0, std::chrono::microseconds(0),
      std::chrono::microseconds(0));
  constexpr int n = 40;
  const auto s = reinterpret_cast<cudaStream_t>(std::uintptr_t{256});
  std::atomic<std::uint64_t> ended{0};
  std::vector<std::shared_ptr<instant_wait>> waits;
  for (int i = 0; i < n; ++i) {
    waits.push_back(std::make_shared<instant_wait>(s, &ended, i == 3 || i == 20));
    hub->add(waits.back());
  }
  int caught = 0;
  for (int round = 0; round < 10 && ended.load() < n; ++round) {
    try {
      ioc.run();  // as a service's io thread would run again after a handler's exception
    } catch (const std::runtime_error&) {
      ++caught;
    }
    ioc.restart();
  }
  hub->clear();
  CHECK(caught == 2);
  CHECK(ended.load() == n);
  for (const auto& w : waits) CHECK(w->ends() == 1);
}

namespace {
/// What the empty-step hook adds, once, to `hub`.
struct in_window {
  poll_hub* hub = nullptr;
  std::shared_ptr<instant_wait> wait;
  bool used = false;
};
in_window* window = nullptr;
}  // namespace

TEST_CASE(
    "poll hub: a wait added while a step that found the hub empty still holds the step "
    "lock is looked at: that exit hands over too") {
  // The step runs on this thread and finds the hub empty; in the window
  // between its two unlocks the hook adds a wait, whose own step an io
  // thread takes and is turned away by the step lock. Before the fix the
  // empty exit returned without the hand-over, and the wait was never polled.
  asio::io_context ioc;
  auto guard = asio::make_work_guard(ioc);
  auto hub = std::make_shared<poll_hub>(
      ioc.get_executor(), [] { return true; }, 8, 0, std::chrono::microseconds(0),
      std::chrono::microseconds(0));
  (void)cudaEventQuery(nullptr);  // the runtime's start-up first
  std::vector<std::thread> io;
  for (int i = 0; i < 2; ++i) io.emplace_back([&] { ioc.run(); });
  std::atomic<std::uint64_t> ended{0};
  in_window w{hub.get(), std::make_shared<instant_wait>(
                             reinterpret_cast<cudaStream_t>(std::uintptr_t{256}), &ended)};
  window = &w;
  poll_hub::empty_step_hook = [](poll_hub& h) {
    if (!window || window->used || &h != window->hub) return;
    window->used = true;
    h.add(window->wait);
    // Long enough for an io thread to take the wait's step and be turned away.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  };
  poll_hub_test_access::step(*hub);
  poll_hub::empty_step_hook = nullptr;
  window = nullptr;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!w.wait->done() && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  guard.reset();
  ioc.stop();
  for (auto& t : io) t.join();
  hub->clear();
  CHECK(w.used);
  CHECK(w.wait->done());
  CHECK(w.wait->ends() == 1);
}
