// The stall report's thread dump (thread_dump.hpp) names where another
// thread waits: checked here so that a GPU run's report can be trusted.
#include "thread_dump.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace {
std::mutex marker_mu;
std::condition_variable marker_cv;
bool marker_waiting = false, marker_release = false;
}  // namespace

/// Exported (the CPU tests link with -rdynamic) and never inlined, so that its
/// name is in the waiting thread's frames.
extern "C" __attribute__((noinline)) void atomr_test_parked_in_marker() {
  std::unique_lock lk(marker_mu);
  marker_waiting = true;
  marker_cv.notify_all();
  marker_cv.wait(lk, [] { return marker_release; });
}

TEST_CASE("a thread dump names the function another thread waits in, and its state") {
  std::thread waiter([] { atomr_test_parked_in_marker(); });
  {
    std::unique_lock lk(marker_mu);
    marker_cv.wait(lk, [] { return marker_waiting; });
  }
  // In cv.wait once the lock is free again: take and drop it, then give the
  // waiter a moment to sleep in the kernel.
  { std::lock_guard lk(marker_mu); }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  atomr::cuda::test::dump_thread_stacks(fileno(f));
  std::rewind(f);
  std::string text;
  char buf[4096];
  while (const auto n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  std::fclose(f);
  {
    std::lock_guard lk(marker_mu);
    marker_release = true;
  }
  marker_cv.notify_all();
  waiter.join();
  INFO(text);
  CHECK(text.find("atomr_test_parked_in_marker") != std::string::npos);
  CHECK(text.find("state S") != std::string::npos);
  CHECK(text.find("no answer") == std::string::npos);
}
