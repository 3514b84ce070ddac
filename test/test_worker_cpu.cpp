// The isolated device's worker process, supervised without a GPU (the worker
// runs with --no-cuda): start, heartbeats, crash, hang, abort and clean exit
// each followed by a restart, the budget spent, stop, and no process left
// behind (issue 20, groundwork).
#include "io_fixture.hpp"

#include <atomr/cuda/detail/worker_supervisor.hpp>
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#if ATOMR_CUDA_HAS_WORKER

using namespace atomr::cuda;
using namespace atomr::cuda::detail;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;

namespace {

/// True once `pid` is gone and reaped (a zombie still answers kill(pid, 0)).
bool gone(int pid) {
  return pid > 0 && ::kill(pid, 0) == -1 && errno == ESRCH;
}

// doctest's io_fixture runs one io_context on the test thread.
struct worker_fixture : io_fixture {
  std::mutex mu;
  std::vector<worker_event> events;

  worker_options options(std::vector<std::string> extra = {"--no-cuda", "--test-faults"}) {
    worker_options o;
    o.extra_args = std::move(extra);
    o.heartbeat = 20ms;
    o.heartbeat_timeout = 400ms;
    o.start_timeout = 10s;
    return o;
  }
  std::shared_ptr<worker_supervisor> start(worker_options o) {
    auto s =
        worker_supervisor::start(ioc.get_executor(), std::move(o), [this](const worker_event& e) {
          std::lock_guard lk(mu);
          events.push_back(e);
        });
    REQUIRE_MESSAGE(s, (s ? "" : s.error().message()));
    return s.value();
  }
  /// Runs the io_context until `done()` or `limit`; true if done.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 10s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      ioc.restart();
      ioc.run_for(5ms);
    }
    return true;
  }
  std::size_t count(worker_state s) {
    std::lock_guard lk(mu);
    std::size_t n = 0;
    for (const auto& e : events) n += e.state == s;
    return n;
  }
  std::optional<worker_event> last(worker_state s) {
    std::lock_guard lk(mu);
    for (auto it = events.rbegin(); it != events.rend(); ++it)
      if (it->state == s) return *it;
    return std::nullopt;
  }
  bool running_incarnation(const std::shared_ptr<worker_supervisor>& w, std::uint64_t inc) {
    const auto st = w->statistics();
    return st.state == worker_state::running && st.incarnation == inc;
  }
};

}  // namespace

TEST_CASE("find_worker_executable: beside the library in a build tree; a bad override is named") {
  const char* saved = std::getenv("ATOMR_CUDA_WORKER");
  const std::string keep = saved ? saved : "";
  ::unsetenv("ATOMR_CUDA_WORKER");
  auto found = find_worker_executable();
  REQUIRE_MESSAGE(found, (found ? "" : found.error().message()));
  CHECK(found.value().find("atomr-cuda-worker") != std::string::npos);
  ::setenv("ATOMR_CUDA_WORKER", "/nonexistent/atomr-cuda-worker", 1);
  auto bad = find_worker_executable();
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::device_unavailable);
  CHECK(bad.error().message().find("/nonexistent/atomr-cuda-worker") != std::string::npos);
  if (saved)
    ::setenv("ATOMR_CUDA_WORKER", keep.c_str(), 1);
  else
    ::unsetenv("ATOMR_CUDA_WORKER");
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker: starts, says hello, answers heartbeats; stop() ends it and reaps it") {
  auto w = start(options());
  REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
  auto st = w->statistics();
  const int pid = st.pid;
  CHECK(pid > 0);
  CHECK(st.device_status == static_cast<int>(errc::device_unavailable));  // --no-cuda
  CHECK(st.device_message.find("--no-cuda") != std::string::npos);
  REQUIRE(run_until([&] { return w->statistics().pongs >= 5; }));
  CHECK(w->statistics().restarts == 0);
  w->stop();
  REQUIRE(run_until([&] { return w->statistics().state == worker_state::stopped; }));
  CHECK(gone(pid));
  CHECK(count(worker_state::failed) == 0);  // a requested stop is no failure
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker killed (SIGKILL from outside, abort, clean exit): failed with the "
                  "reason, then restarting, then running with a new process") {
  auto w = start(options());
  REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
  const int first = w->statistics().pid;
  ::kill(first, SIGKILL);
  REQUIRE(run_until([&] { return running_incarnation(w, 2); }));
  auto failed = last(worker_state::failed);
  REQUIRE(failed);
  REQUIRE(failed->error);
  CHECK(failed->error->code() == errc::context_poisoned);
  CHECK(failed->error->message().find("killed by signal 9") != std::string::npos);
  CHECK(count(worker_state::restarting) == 1);
  CHECK(gone(first));
  const int second = w->statistics().pid;
  CHECK(second != first);

  w->inject_fault(1);  // abort
  REQUIRE(run_until([&] { return running_incarnation(w, 3); }));
  failed = last(worker_state::failed);
  REQUIRE(failed->error);
  CHECK(failed->error->message().find("killed by signal 6") != std::string::npos);
  // The worker's last stderr lines are in the message.
  CHECK(failed->error->message().find("injecting fault 1") != std::string::npos);
  CHECK(gone(second));

  w->inject_fault(5);  // exits with status 0 on its own: also a failure
  REQUIRE(run_until([&] { return running_incarnation(w, 4); }, 15s));
  failed = last(worker_state::failed);
  REQUIRE(failed->error);
  CHECK(failed->error->message().find("exited with status 0") != std::string::npos);
  CHECK(w->statistics().restarts == 3);
  w->stop();
  REQUIRE(run_until([&] { return w->statistics().state == worker_state::stopped; }));
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker hung (no heartbeat answers): timeout naming the hang, killed, "
                  "restarted") {
  auto w = start(options());
  REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
  const int pid = w->statistics().pid;
  const auto t0 = std::chrono::steady_clock::now();
  w->inject_fault(3);  // hang
  REQUIRE(run_until([&] { return running_incarnation(w, 2); }));
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < 5s);
  auto failed = last(worker_state::failed);
  REQUIRE(failed);
  REQUIRE(failed->error);
  CHECK(failed->error->code() == errc::timeout);
  CHECK(failed->error->message().find("hung") != std::string::npos);
  CHECK(gone(pid));
  w->stop();
  REQUIRE(run_until([&] { return w->statistics().state == worker_state::stopped; }));
}

TEST_CASE_FIXTURE(worker_fixture, "worker: the restart budget spent leads to stopped") {
  auto o = options();
  o.budget = {.max_restarts = 2, .window = std::chrono::seconds(60)};
  auto w = start(o);
  std::vector<int> pids;
  for (std::uint64_t inc = 1; inc <= 3; ++inc) {
    REQUIRE(run_until([&] { return running_incarnation(w, inc); }));
    pids.push_back(w->statistics().pid);
    ::kill(pids.back(), SIGKILL);
  }
  REQUIRE(run_until([&] { return w->statistics().state == worker_state::stopped; }));
  auto stopped = last(worker_state::stopped);
  REQUIRE(stopped);
  REQUIRE(stopped->error);  // stopped by a failure, with its reason
  CHECK(stopped->error->code() == errc::context_poisoned);
  CHECK(w->statistics().restarts == 2);
  for (int p : pids) CHECK(gone(p));
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker: a supervisor destroyed with its worker running kills and reaps it at "
                  "once, even without running the io_context again") {
  int pid = 0;
  {
    auto w = start(options());
    REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
    pid = w->statistics().pid;
  }
  CHECK(gone(pid));
  run_until([] { return false; }, 100ms);  // the pending handlers find it gone
  CHECK(count(worker_state::restarting) == 0);
}

TEST_CASE_FIXTURE(worker_fixture, "worker: a missing executable fails at once") {
  auto o = options();
  o.executable = "/nonexistent/atomr-cuda-worker";
  auto s = worker_supervisor::start(ioc.get_executor(), o);
  REQUIRE_FALSE(s);
  CHECK(s.error().code() == errc::device_unavailable);
}

#else
TEST_CASE("worker supervision: not built (Boost.Process v2 did not compile here)") {
  MESSAGE("SKIP: the isolated device's worker is not part of this build");
}
#endif
