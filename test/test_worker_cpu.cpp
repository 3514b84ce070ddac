// The isolated device's worker process, supervised without a GPU (the worker
// runs with --no-cuda): start, heartbeats, crash, hang, abort and clean exit
// each followed by a restart, the budget spent, stop, and no process left
// behind (issue 20, groundwork).
#include "io_fixture.hpp"

#include <atomr/cuda/detail/worker_supervisor.hpp>

#include "../lib/worker/protocol.hpp"
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
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

// doctest's io_fixture runs one io_context on the test thread.
struct worker_fixture : io_fixture {
  std::mutex mu;
  std::vector<worker_event> events;

  worker_options options(std::vector<std::string> extra = {"--no-cuda", "--test-faults"}) {
    worker_options o;
    o.extra_args = std::move(extra);
    o.heartbeat = 20ms;
    o.heartbeat_timeout = 1000ms;  // generous: a loaded CI machine must not look hung
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
  CHECK(pid_gone(pid));
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
  CHECK(pid_gone(first));
  const int second = w->statistics().pid;
  CHECK(second != first);

  w->inject_fault(1);  // abort
  REQUIRE(run_until([&] { return running_incarnation(w, 3); }));
  failed = last(worker_state::failed);
  REQUIRE(failed->error);
  CHECK(failed->error->message().find("killed by signal 6") != std::string::npos);
  // The worker's last stderr lines are in the message.
  CHECK(failed->error->message().find("injecting fault 1") != std::string::npos);
  CHECK(pid_gone(second));

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
  CHECK(pid_gone(pid));
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
  for (int p : pids) CHECK(pid_gone(p));
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
  CHECK(pid_gone(pid));
  run_until([] { return false; }, 100ms);  // the pending handlers find it gone
  CHECK(count(worker_state::restarting) == 0);
}

namespace {
/// Entries this process left in /dev/shm (the arenas are named after its pid).
std::size_t shm_entries() {
  std::size_t n = 0;
  const std::string prefix = "atomr-cuda-" + std::to_string(::getpid()) + "-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    n += e.path().filename().string().rfind(prefix, 0) == 0;
  return n;
}
}  // namespace

TEST_CASE_FIXTURE(worker_fixture,
                  "worker arena: bytes written here are read by the worker (shared memory); "
                  "ranges checked here; nothing left in /dev/shm") {
  auto o = options();
  o.arena_bytes = std::size_t{4} << 20;
  auto w = start(o);
  REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
  CHECK(w->statistics().arena_mapped);
  CHECK(shm_entries() == 0);  // the name goes once the worker has mapped it
  auto a = w->arena();
  REQUIRE(a.data);
  REQUIRE(a.size >= o.arena_bytes);
  for (std::size_t i = 0; i < o.arena_bytes; ++i)
    a.data[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::optional<result<std::uint64_t>> got, bad;
  const std::size_t off = 4096 + 3, len = (std::size_t{3} << 20) + 5;
  w->arena_checksum(off, len, [&](result<std::uint64_t> r) { got.emplace(r); });
  w->arena_checksum(o.arena_bytes - 4, 8, [&](result<std::uint64_t> r) { bad.emplace(r); });
  REQUIRE(run_until([&] { return got && bad; }));
  REQUIRE_MESSAGE(*got, (*got ? "" : got->error().message()));
  CHECK(got->value() == wire::fnv1a(a.data + off, len));
  REQUIRE_FALSE(*bad);
  CHECK(bad->error().code() == errc::invalid_argument);

  // A request to a hung worker fails when the hang is found: it never hangs itself.
  w->inject_fault(3);
  std::optional<result<std::uint64_t>> stuck;
  w->arena_checksum(0, 16, [&](result<std::uint64_t> r) { stuck.emplace(r); });
  REQUIRE(run_until([&] { return stuck.has_value(); }));
  REQUIRE_FALSE(*stuck);
  CHECK(stuck->error().code() == errc::timeout);
  // The next worker has an arena of its own; the old mapping stays valid here.
  REQUIRE(run_until([&] { return running_incarnation(w, 2); }));
  CHECK(w->arena().incarnation == 2);
  CHECK(w->arena().data != nullptr);
  a.data[0] = std::byte{1};
  w->stop();
  REQUIRE(run_until([&] { return w->statistics().state == worker_state::stopped; }));
  CHECK(shm_entries() == 0);
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
