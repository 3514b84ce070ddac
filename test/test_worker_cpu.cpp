// The isolated device's worker process, supervised without a GPU (the worker
// runs with --no-cuda): start, heartbeats, crash, hang, abort and clean exit
// each followed by a restart, the budget spent, stop, and no process left
// behind (issue 20, groundwork).
#include "io_fixture.hpp"

#include <atomr/cuda/detail/worker_supervisor.hpp>

#include "../lib/worker/actor_wire.hpp"
#include "../lib/worker/protocol.hpp"
#include "../lib/worker/ring.hpp"
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
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
  /// Stops the worker and waits until the supervisor says so.
  void stop_and_wait(const std::shared_ptr<worker_supervisor>& w) {
    w->stop();
    REQUIRE(run_until([&] { return w->statistics().state == worker_state::stopped; }));
  }
  static constexpr std::size_t test_arena = std::size_t{4} << 20;
  /// A worker with an arena of `test_arena` bytes and `rings` request rings
  /// (0: the default), once its first incarnation runs.
  std::shared_ptr<worker_supervisor> start_with_rings(std::size_t rings = 0) {
    auto o = options();
    o.arena_bytes = test_arena;
    if (rings != 0) o.rings = rings;
    auto w = start(o);
    REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
    return w;
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
  stop_and_wait(w);
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
  stop_and_wait(w);
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
  stop_and_wait(w);
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
  auto w = start_with_rings();
  CHECK(w->statistics().arena_mapped);
  CHECK(shm_entries() == 0);  // the name goes once the worker has mapped it
  auto a = w->arena();
  REQUIRE(a.data);
  REQUIRE(a.size >= test_arena);
  for (std::size_t i = 0; i < test_arena; ++i)
    a.data[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::optional<result<std::uint64_t>> got, bad;
  const std::size_t off = 4096 + 3, len = (std::size_t{3} << 20) + 5;
  w->arena_checksum(off, len, [&](result<std::uint64_t> r) { got.emplace(r); });
  w->arena_checksum(test_arena - 4, 8, [&](result<std::uint64_t> r) { bad.emplace(r); });
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
  stop_and_wait(w);
  CHECK(shm_entries() == 0);
}

namespace {

/// Answers counted by code (done runs on the reply reader or the strand).
struct answers {
  std::mutex mu;
  std::map<errc, std::size_t> by_code;
  std::size_t ok = 0, total = 0;
  std::string last_message;
  worker_supervisor::reply_fn fn() {
    return [this](result<std::vector<char>> r) {
      std::lock_guard lk(mu);
      ++total;
      if (r) {
        ++ok;
        return;
      }
      ++by_code[r.error().code()];
      last_message = r.error().message();
    };
  }
  std::size_t count() {
    std::lock_guard lk(mu);
    return total;
  }
};

/// Every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat).
bool all_threads_stopped(int pid) {
  namespace fs = std::filesystem;
  std::error_code ec;
  bool any = false;
  for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(t.path() / "stat");
    std::string line;
    std::getline(f, line);
    const auto close = line.rfind(')');  // the name may hold spaces and parentheses
    if (close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'T')
      return false;
    any = true;
  }
  return any && !ec;
}

std::string copy_payload(std::uint64_t i) {
  wire::copy_args a;
  a.src = {i, 0, 1};
  a.dst = {i + 1, 0, 1};
  a.type = 0;
  return std::string(wire::bytes_of(a));
}

}  // namespace

TEST_CASE_FIXTURE(worker_fixture,
                  "worker arena: a supervisor destroyed before its worker's hello leaves nothing "
                  "in /dev/shm, even without running the io_context again") {
  // A stand-in worker that never says hello: the arena's name is still in
  // /dev/shm when the supervisor goes.
  const auto script = std::filesystem::temp_directory_path() /
                      ("atomr-silent-worker-" + std::to_string(::getpid()) + ".sh");
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nexec sleep 30\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto o = options();
  o.executable = script.string();
  o.arena_bytes = test_arena;
  int pid = 0;
  {
    auto w = start(o);
    REQUIRE(run_until([&] { return w->statistics().pid > 0; }));
    pid = w->statistics().pid;
    CHECK(w->statistics().state == worker_state::starting);
    CHECK(shm_entries() == 1);
  }
  CHECK(shm_entries() == 0);  // before any handler of the io_context ran
  CHECK(pid_gone(pid));
  std::filesystem::remove(script);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker rings: calls from several threads go through the shared-memory rings "
                  "and each gets exactly one answer; too large ones take the socket") {
  auto w = start_with_rings(2);
  CHECK(w->statistics().reader_threads == 1);
  // An allocation through the control ring (the --no-cuda worker records it
  // as failed: the later requests naming it are answered all the same).
  wire::alloc_args al;
  al.handle = 1;
  al.count = 16;
  CHECK(w->notify_worker(static_cast<std::uint16_t>(wire::kind::call),
                         static_cast<std::uint16_t>(wire::op_code::alloc),
                         std::string(wire::bytes_of(al))));
  answers got;
  constexpr int threads = 4, per_thread = 500;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i)
        w->call(static_cast<std::uint16_t>(wire::op_code::copy),
                copy_payload(static_cast<std::uint64_t>(t * per_thread + i)), deadline, 0,
                got.fn());
    });
  for (auto& t : ts) t.join();
  // One call too large for a slot: the socket.
  w->call(static_cast<std::uint16_t>(wire::op_code::copy), std::string(wire::ring_payload + 8, 'x'),
          deadline, 0, got.fn());
  const std::size_t want = threads * per_thread + 1;
  REQUIRE(run_until([&] { return got.count() == want; }));
  run_until([] { return false; }, 50ms);  // a second answer would show here
  CHECK(got.count() == want);
  CHECK(got.ok == 0);
  CHECK(got.by_code[errc::device_unavailable] == want);  // the worker has no device
  CHECK(got.last_message.find("the worker has no device") != std::string::npos);
  const auto st = w->statistics();
  CHECK(st.ring_calls == threads * per_thread);
  CHECK(st.socket_calls == 1);
  CHECK(st.calls_pending == 0);
  CHECK(st.state == worker_state::running);
  stop_and_wait(w);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker statistics count the worker process's threads: its io threads and one "
                  "per request ring; none once it is stopped") {
  struct setting {
    std::size_t arena;
    std::size_t rings;
    int io_threads;
  };
  for (const auto& c : {setting{0, 0, 1}, setting{test_arena, 2, 1}, setting{test_arena, 4, 3}}) {
    CAPTURE(c.rings);
    CAPTURE(c.io_threads);
    auto extra = std::vector<std::string>{"--no-cuda", "--test-faults"};
    if (c.io_threads != 1) {
      extra.push_back("--threads");
      extra.push_back(std::to_string(c.io_threads));
    }
    auto o = options(extra);
    o.arena_bytes = c.arena;  // 0: no arena, so no rings
    if (c.rings) o.rings = c.rings;
    auto w = start(o);
    REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
    // The ring threads start right after the hello; a --no-cuda worker
    // starts nothing else, so the count then stays.
    const std::size_t expected = c.rings + static_cast<std::size_t>(c.io_threads);
    CHECK(run_until([&] { return w->statistics().worker_threads == expected; }));
    run_until([] { return false; }, 50ms);
    CHECK(w->statistics().worker_threads == expected);
    stop_and_wait(w);
    CHECK(w->statistics().worker_threads == 0);
  }
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker rings: while calls wait, the io thread polls the reply rings and "
                  "completes replies itself; with reply_spin 0 only the reader does") {
  for (const auto spin : {std::chrono::microseconds(200), std::chrono::microseconds(0)}) {
    CAPTURE(spin.count());
    // The first round runs the worker's defaults (its ring threads run the
    // io_context's handlers too, one io thread of its own); the second its
    // other settings: ring threads that do not, and three io threads that
    // keep looking for handlers for 100 us after each (--io-spin).
    auto o = spin.count() != 0 ? options()
                               : options({"--no-cuda", "--test-faults", "--no-ring-io-poll",
                                          "--threads", "3", "--io-spin", "100"});
    o.arena_bytes = test_arena;
    o.reply_spin = spin;
    auto w = start(o);
    REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
    // A chain of calls, each made by the previous one's completion, on
    // whichever thread took its reply: the io thread (this one) or the reader.
    constexpr std::size_t chain = 300;
    const auto io_thread = std::this_thread::get_id();
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    std::atomic<std::size_t> answered{0}, on_io{0}, failed_other{0};
    std::function<void(std::uint64_t)> next = [&](std::uint64_t i) {
      w->call(static_cast<std::uint16_t>(wire::op_code::copy), copy_payload(i), deadline, 0,
              [&, i](result<std::vector<char>> r) {
                if (r || r.error().code() != errc::device_unavailable) ++failed_other;
                if (std::this_thread::get_id() == io_thread) ++on_io;
                if (++answered < chain) next(i + 1);
              });
    };
    asio::post(ioc, [&] { next(0); });
    REQUIRE(run_until([&] { return answered.load() == chain; }));
    run_until([] { return false; }, 20ms);  // a second answer would show here
    CHECK(answered.load() == chain);
    CHECK(failed_other.load() == 0);  // the --no-cuda worker answers device_unavailable
    const auto st = w->statistics();
    CHECK(st.ring_calls == chain);
    CHECK(st.calls_pending == 0);
    // Each reply was taken once, by one of the two; the callback ran there.
    CHECK(st.io_replies + st.reader_replies == chain);
    CHECK(st.io_replies == on_io.load());
    if (spin.count() == 0) {
      CHECK(st.io_polls == 0);
      CHECK(st.io_replies == 0);
    } else {
      CHECK(st.io_polls > 0);  // the first call, made on the io thread, started one
      // The reader stands back while an io thread polls (typically it
      // takes most; a loaded machine's scheduling decides how many).
      CHECK(st.io_replies > 0);
    }
    const int pid = st.pid;
    stop_and_wait(w);
    CHECK(pid_gone(pid));
    CHECK(count(worker_state::failed) == 0);  // it exited when asked, on either setting
  }
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker rings: a completion that throws on the polling io thread leaves "
                  "through the io_context, and the next call starts the polling again") {
  auto w = start_with_rings(2);
  const auto io_thread = std::this_thread::get_id();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::atomic<bool> thrown{false};
  std::atomic<std::size_t> answered{0};
  // A chain of calls until one's completion runs on this (the io) thread,
  // where it throws once.
  std::function<void(std::uint64_t)> next = [&](std::uint64_t i) {
    w->call(static_cast<std::uint16_t>(wire::op_code::copy), copy_payload(i), deadline, 0,
            [&, i](result<std::vector<char>>) {
              ++answered;
              if (std::this_thread::get_id() == io_thread && !thrown.exchange(true))
                throw std::runtime_error("a completion threw");
              if (!thrown.load() && i < 10000) next(i + 1);
            });
  };
  asio::post(ioc, [&] { next(0); });
  bool caught = false;
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!caught && std::chrono::steady_clock::now() < until) {
    try {
      ioc.run_for(10ms);
    } catch (const std::runtime_error& e) {
      caught = std::string(e.what()) == "a completion threw";
    }
    if (ioc.stopped()) ioc.restart();
  }
  REQUIRE(caught);
  // The polling ended with the exception; a new call starts another.
  const auto polls = w->statistics().io_polls;
  std::atomic<std::size_t> more{0};
  asio::post(ioc, [&] {
    w->call(static_cast<std::uint16_t>(wire::op_code::copy), copy_payload(1), deadline, 0,
            [&](result<std::vector<char>>) { ++more; });
  });
  REQUIRE(run_until([&] { return more.load() == 1; }));
  CHECK(w->statistics().io_polls == polls + 1);
  stop_and_wait(w);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker rings: calls waiting in the rings fail at once when the worker dies, "
                  "none hangs, and the next worker answers through its own rings") {
  auto w = start_with_rings();
  const int pid = w->statistics().pid;
  // Stopped, it reads nothing: the calls wait in the rings. SIGSTOP lands
  // asynchronously: wait until every thread of the worker is stopped.
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  REQUIRE(run_until([&] { return all_threads_stopped(pid); }));
  answers got;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (std::uint64_t i = 0; i < 300; ++i)
    w->call(static_cast<std::uint16_t>(wire::op_code::copy), copy_payload(i), deadline, 0,
            got.fn());
  run_until([] { return false; }, 20ms);
  CHECK(got.count() == 0);
  CHECK(w->statistics().calls_pending == 300);
  CHECK(w->statistics().ring_calls == 300);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(run_until([&] { return got.count() == 300; }));
  CHECK(got.by_code[errc::context_poisoned] == 300);
  CHECK(got.last_message.find("killed by signal 9") != std::string::npos);
  CHECK(w->statistics().calls_pending == 0);
  REQUIRE(run_until([&] { return running_incarnation(w, 2); }));
  CHECK(pid_gone(pid));
  answers again;
  for (std::uint64_t i = 0; i < 100; ++i)
    w->call(static_cast<std::uint16_t>(wire::op_code::copy), copy_payload(i), deadline, 0,
            again.fn());
  REQUIRE(run_until([&] { return again.count() == 100; }));
  CHECK(again.by_code[errc::device_unavailable] == 100);
  CHECK(w->statistics().ring_calls == 400);
  stop_and_wait(w);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker rings: a thread's calls go into one ring, in order; threads take "
                  "turns over the rings; every call is answered") {
  auto w = start_with_rings(4);
  REQUIRE(w->statistics().calls_per_ring.size() == 4);
  // A stopped worker answers nothing: the calls stay in the rings, where
  // statistics() counts them.
  const int pid = w->statistics().pid;
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  REQUIRE(run_until([&] { return all_threads_stopped(pid); }));
  answers got;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto calls = [&](std::uint64_t first, int n) {
    for (int i = 0; i < n; ++i)
      w->call(static_cast<std::uint16_t>(wire::op_code::copy),
              copy_payload(first + static_cast<std::uint64_t>(i)), deadline, 0, got.fn());
  };
  // One thread, 100 calls: all in one ring (so a worker thread takes them
  // in the order they were made; a ring chosen per call by load would let
  // two requests that write one buffer swap).
  std::thread([&] { calls(0, 100); }).join();
  auto st = w->statistics();
  REQUIRE(st.calls_per_ring.size() == 4);
  CHECK(std::count(st.calls_per_ring.begin(), st.calls_per_ring.end(), 100u) == 1);
  CHECK(std::count(st.calls_per_ring.begin(), st.calls_per_ring.end(), 0u) == 3);
  // Three more threads, one after another: each takes the next ring.
  for (int t = 1; t < 4; ++t) std::thread([&, t] { calls(100u * t, 100); }).join();
  st = w->statistics();
  CHECK(st.ring_calls == 400);
  CHECK(st.calls_pending == 400);
  for (auto n : st.calls_per_ring) CHECK(n == 100);
  REQUIRE(::kill(pid, SIGCONT) == 0);
  REQUIRE(run_until([&] { return got.count() == 400; }));
  CHECK(got.by_code[errc::device_unavailable] == 400);  // the worker has no device
  CHECK(w->statistics().calls_pending == 0);
  CHECK(w->statistics().state == worker_state::running);
  stop_and_wait(w);
}

TEST_CASE(
    "request ring: many producers, one consumer: every message once, in each producer's "
    "order; full and oversized pushes refused; a sleeping consumer is woken") {
  const wire::region_layout layout{1};
  const std::size_t bytes = layout.bytes();
  auto* base = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  REQUIRE(base);
  std::memset(base, 0, bytes);
  auto v = wire::region_view::map(base, 1, true);
  auto& q = v.requests[0];

  // Full: ring_slots messages fit, one more does not; too large never does.
  for (std::size_t i = 0; i < wire::ring_slots; ++i) REQUIRE(q.push(i, 1, 0, "x"));
  CHECK_FALSE(q.push(99999, 1, 0, "x"));
  CHECK_FALSE(v.requests[0].push(1, 1, 0, std::string(wire::ring_payload + 1, 'y')));
  wire::ring_message m;
  for (std::size_t i = 0; i < wire::ring_slots; ++i) {
    REQUIRE(q.pop(m));
    CHECK(m.id == i);
  }
  CHECK_FALSE(q.pop(m));

  // Four producers, one consumer, many laps around the ring.
  constexpr std::uint64_t producers = 4, each = 50000;
  std::vector<std::thread> ts;
  for (std::uint64_t p = 0; p < producers; ++p)
    ts.emplace_back([&, p] {
      for (std::uint64_t i = 0; i < each; ++i) {
        const std::uint64_t word[2] = {p, i};
        const std::string_view pay(reinterpret_cast<const char*>(word), sizeof word);
        while (!q.push((p << 32) | i, 7, static_cast<std::uint16_t>(p), pay))
          std::this_thread::yield();
        wire::ring::wake(*q.head());
      }
    });
  std::vector<std::uint64_t> next(producers, 0);
  std::uint64_t received = 0, bad = 0;
  while (received < producers * each) {
    if (!q.pop(m)) {
      q.sleep(std::chrono::milliseconds(10));
      continue;
    }
    std::uint64_t word[2] = {0, 0};
    if (m.payload.size() != sizeof word) {
      ++bad;
      ++received;
      continue;
    }
    std::memcpy(word, m.payload.data(), sizeof word);
    const auto p = word[0];
    if (p >= producers || word[1] != next[p] || m.id != ((p << 32) | word[1]) || m.op != 7 ||
        m.arg != p)
      ++bad;
    else
      ++next[p];
    ++received;
  }
  for (auto& t : ts) t.join();
  CHECK(bad == 0);
  for (auto n : next) CHECK(n == each);
  CHECK_FALSE(q.pop(m));

  // A consumer asleep (for up to 5 s) is woken by a push within far less.
  const auto t0 = std::chrono::steady_clock::now();
  std::thread late([&] {
    std::this_thread::sleep_for(50ms);
    CHECK(q.push(1, 1, 0, {}));
    wire::ring::wake(*q.head());
  });
  while (!q.ready()) q.sleep(5s);
  const auto took = std::chrono::steady_clock::now() - t0;
  late.join();
  CHECK(took < 2s);
  CHECK(q.pop(m));
  std::free(base);
}

TEST_CASE(
    "actor requests: the payload carries head, parameters and views; malformed ones are "
    "refused by size") {
  wire::actor_head h;
  h.actor = 42;
  h.kind = static_cast<std::uint16_t>(wire::actor_kind::cudnn);
  h.op = static_cast<std::uint16_t>(wire::actor_op::batchnorm);
  h.type = static_cast<std::uint32_t>(dtype::f16);
  h.settings.limit = 123456;
  h.settings.epoch = 3;
  wire::batchnorm_args a;
  a.shape = tensor_shape{2, 3, 4, 5, tensor_layout::nhwc};
  a.epsilon = 1e-3;
  const std::vector<wire::ref_arg> refs = {{1, 0, 120}, {2, 0, 3}, {3, 0, 3},
                                           {4, 1, 3},   {5, 2, 3}, {6, 0, 120}};
  const auto payload =
      wire::actor_payload(h, a, {refs[0], refs[1], refs[2], refs[3], refs[4], refs[5]});
  CHECK(payload.size() == sizeof(wire::actor_head) + sizeof a + 6 * sizeof(wire::ref_arg));
  std::vector<char> bytes(payload.begin(), payload.end());
  wire::actor_request q;
  REQUIRE(wire::parse_actor(bytes, q));
  CHECK(q.head.actor == 42);
  CHECK(q.head.op == static_cast<std::uint16_t>(wire::actor_op::batchnorm));
  CHECK(q.head.type == static_cast<std::uint32_t>(dtype::f16));
  CHECK(q.head.settings.limit == 123456);
  CHECK(q.head.settings.epoch == 3);
  wire::batchnorm_args back;
  REQUIRE(q.params_as(back));
  CHECK(back.shape == a.shape);
  CHECK(back.epsilon == a.epsilon);
  wire::conv_args wrong;
  CHECK_FALSE(q.params_as(wrong));  // another operation's parameter block
  REQUIRE(q.refs.size() == 6);
  for (std::size_t i = 0; i < refs.size(); ++i) {
    CHECK(q.refs[i].handle == refs[i].handle);
    CHECK(q.refs[i].offset == refs[i].offset);
    CHECK(q.refs[i].count == refs[i].count);
  }
  auto cut = bytes;
  cut.pop_back();
  CHECK_FALSE(wire::parse_actor(cut, q));
  auto longer = bytes;
  longer.push_back(0);
  CHECK_FALSE(wire::parse_actor(longer, q));
  CHECK_FALSE(wire::parse_actor(std::vector<char>(10), q));
  // The small operations fit a ring slot (no socket round trip).
  wire::level1_args l1;
  CHECK(wire::actor_payload(h, l1, {refs[0], refs[1]}).size() <= wire::ring_payload);
  CHECK(wire::actor_payload(h, gemv_params{}, {refs[0], refs[1], refs[2]}).size() <=
        wire::ring_payload);
  CHECK(wire::actor_payload(h, fft_shape{}, {refs[0], refs[1]}).size() <= wire::ring_payload);
  // gemm_fused with a bias: four views (the epilogue travels in the head).
  CHECK(wire::actor_payload(h, gemm_params{}, {refs[0], refs[1], refs[2], refs[3]}).size() <=
        wire::ring_payload);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker: actor and unit requests reach the worker through the rings and the "
                  "socket; malformed ones are answered invalid_argument") {
  auto w = start_with_rings();
  wire::actor_head h;
  h.actor = 7;
  h.kind = static_cast<std::uint16_t>(wire::actor_kind::blas);
  h.op = static_cast<std::uint16_t>(wire::actor_op::dot);
  h.type = static_cast<std::uint32_t>(dtype::f32);
  const auto good =
      wire::actor_payload(h, wire::level1_args{16, 0.0, 1, 1}, {{1, 0, 16}, {2, 0, 16}});
  const auto big = wire::actor_payload(h, std::array<char, 300>{}, {});  // over a slot: socket
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  answers fine, bad;
  const auto op = static_cast<std::uint16_t>(wire::op_code::actor);
  w->call(op, good, deadline, 0, fine.fn());
  w->call(op, big, deadline, 0, fine.fn());
  w->call(op, good.substr(0, good.size() - 1), deadline, 0, bad.fn());
  // A unit of two requests; and one whose sizes do not add up.
  std::string unit;
  wire::unit_head uh{2, 5};
  unit.append(wire::bytes_of(uh));
  for (std::uint32_t step : {2u, 4u}) {
    wire::unit_entry e;
    e.op = op;
    e.step = step;
    e.size = static_cast<std::uint32_t>(good.size());
    unit.append(wire::bytes_of(e));
    unit.append(good);
  }
  {
    std::vector<char> bytes(unit.begin(), unit.end());
    wire::unit_head back;
    std::vector<wire::unit_request> reqs;
    REQUIRE(wire::parse_unit(bytes, back, reqs));
    CHECK(back.steps == 5);
    REQUIRE(reqs.size() == 2);
    CHECK(reqs[1].step == 4);
    CHECK(reqs[1].payload == std::vector<char>(good.begin(), good.end()));
    bytes.pop_back();
    CHECK_FALSE(wire::parse_unit(bytes, back, reqs));
  }
  const auto unit_op = static_cast<std::uint16_t>(wire::op_code::unit);
  w->call(unit_op, unit, deadline, 0, fine.fn());
  answers bad_unit;
  w->call(unit_op, unit.substr(0, unit.size() - 3), deadline, 0, bad_unit.fn());
  REQUIRE(
      run_until([&] { return fine.count() == 3 && bad.count() == 1 && bad_unit.count() == 1; }));
  // Well formed: decoded, then refused by a worker without a device.
  CHECK(fine.by_code[errc::device_unavailable] == 3);
  CHECK(fine.last_message.find("the worker has no device") != std::string::npos);
  CHECK(bad.by_code[errc::invalid_argument] == 1);
  CHECK(bad.last_message.find("malformed actor request") != std::string::npos);
  CHECK(bad_unit.by_code[errc::invalid_argument] == 1);
  CHECK(bad_unit.last_message.find("malformed unit request") != std::string::npos);
  const auto st = w->statistics();
  CHECK(st.ring_calls == 2);
  CHECK(st.socket_calls == 3);  // the units are over a slot's 232 bytes
  stop_and_wait(w);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker: an indirect request's payload is read from the arena; its range and "
                  "its contents are checked") {
  auto w = start_with_rings();
  auto a = w->arena();
  REQUIRE(a.data);
  // A unit of one actor request, over a ring slot: written into the arena.
  wire::actor_head h;
  h.kind = static_cast<std::uint16_t>(wire::actor_kind::blas);
  h.op = static_cast<std::uint16_t>(wire::actor_op::axpy);
  h.type = static_cast<std::uint32_t>(dtype::f64);
  const auto one = wire::actor_payload(h, wire::level1_args{8, 1.0, 1, 1}, {{1, 0, 8}, {2, 0, 8}});
  std::string unit;
  wire::unit_head uh{2, 2};
  unit.append(wire::bytes_of(uh));
  for (std::uint32_t step : {1u, 2u}) {
    wire::unit_entry e;
    e.op = static_cast<std::uint16_t>(wire::op_code::actor);
    e.step = step;
    e.size = static_cast<std::uint32_t>(one.size());
    unit.append(wire::bytes_of(e));
    unit.append(one);
  }
  REQUIRE(unit.size() > wire::ring_payload);
  const std::size_t off = 8192;
  std::memcpy(a.data + off, unit.data(), unit.size());
  auto ind = [](std::uint16_t op, std::uint64_t at, std::uint64_t size) {
    wire::indirect_args x;
    x.op = op;
    x.arena_offset = at;
    x.size = size;
    return std::string(wire::bytes_of(x));
  };
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  const auto op = static_cast<std::uint16_t>(wire::op_code::indirect);
  const auto unit_op = static_cast<std::uint16_t>(wire::op_code::unit);
  answers fine, cut, outside, nested, empty;
  w->call(op, ind(unit_op, off, unit.size()), deadline, 0, fine.fn());
  // Zero bytes at a valid offset: the request is empty (a short replay
  // request), not the indirect request's own bytes read as a replay's handle
  // (which a worker took until session 42: stale_ref, "recording unknown").
  w->call(op, ind(static_cast<std::uint16_t>(wire::op_code::replay), off, 0), deadline, 0,
          empty.fn());
  w->call(op, ind(unit_op, off, unit.size() - 1), deadline, 0, cut.fn());
  w->call(op, ind(unit_op, test_arena - 8, unit.size()), deadline, 0, outside.fn());
  w->call(op, ind(op, off, unit.size()), deadline, 0, nested.fn());
  REQUIRE(run_until([&] {
    return fine.count() == 1 && cut.count() == 1 && outside.count() == 1 && nested.count() == 1 &&
           empty.count() == 1;
  }));
  CHECK(empty.by_code[errc::invalid_argument] == 1);
  CHECK(empty.last_message.find("short request") != std::string::npos);
  // Read and parsed: then refused by a worker without a device.
  CHECK(fine.by_code[errc::device_unavailable] == 1);
  CHECK(cut.by_code[errc::invalid_argument] == 1);
  CHECK(cut.last_message.find("malformed unit request") != std::string::npos);
  CHECK(outside.by_code[errc::invalid_argument] == 1);
  CHECK(outside.last_message.find("outside the arena") != std::string::npos);
  CHECK(nested.by_code[errc::invalid_argument] == 1);
  CHECK(w->statistics().ring_calls == 5);  // all five on the rings
  stop_and_wait(w);
}

TEST_CASE_FIXTURE(worker_fixture,
                  "worker stress: calls from four threads while the worker aborts, kills itself, "
                  "exits and hangs, one fault after another: every call answered exactly once, "
                  "nothing pending, no process or shared memory left") {
  auto o = options();
  o.arena_bytes = test_arena;
  o.budget.max_restarts = 1000;  // every fault is restarted
  auto w = start(o);
  REQUIRE(run_until([&] { return running_incarnation(w, 1); }));
  constexpr std::size_t threads = 4, most = 100000;     // calls a thread makes at most
  std::vector<std::atomic<int>> times(threads * most);  // answers per call
  std::array<std::atomic<std::size_t>, threads> made{};
  answers got;
  std::atomic<bool> enough{false};
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < threads; ++t)
    callers.emplace_back([&, t] {
      for (std::size_t i = 0; i < most && !enough.load(); ++i) {
        const std::size_t k = t * most + i;
        auto count = got.fn();
        w->call(static_cast<std::uint16_t>(wire::op_code::copy), copy_payload(k), deadline, 0,
                [&times, k, count](result<std::vector<char>> r) {
                  times[k].fetch_add(1);
                  count(std::move(r));
                });
        made[t] = i + 1;
        if (i % 20 == 19) std::this_thread::sleep_for(1ms);
      }
    });
  // Eight faults, each once the worker before it is running again, while
  // the calls go on (the io_context runs here meanwhile). A hung worker
  // (its socket thread stops; its ring threads still answer) is killed
  // when its heartbeats stop, after heartbeat_timeout.
  const wire::fault_kind kinds[] = {wire::fault_kind::abort_process, wire::fault_kind::kill_self,
                                    wire::fault_kind::exit_cleanly, wire::fault_kind::hang};
  constexpr std::uint64_t faults = 8;
  for (std::uint64_t f = 0; f < faults; ++f) {
    REQUIRE(run_until([&] { return running_incarnation(w, f + 1); }));
    run_until([] { return false; }, 20ms);  // calls flow to this worker for a while
    w->inject_fault(static_cast<std::uint16_t>(kinds[f % 4]));
  }
  REQUIRE(run_until([&] { return running_incarnation(w, faults + 1); }));
  run_until([] { return false; }, 20ms);
  enough = true;
  for (auto& c : callers) c.join();
  std::size_t total = 0;
  for (const auto& m : made) total += m.load();
  REQUIRE(run_until([&] { return got.count() == total; }));
  run_until([] { return false; }, 50ms);  // a second answer would show here
  CHECK(got.count() == total);
  std::size_t not_once = 0;
  for (std::size_t t = 0; t < threads; ++t)
    for (std::size_t i = 0; i < most; ++i)
      not_once += times[t * most + i].load() != (i < made[t].load() ? 1 : 0);
  CHECK(not_once == 0);
  // The worker has no device: it answers device_unavailable; calls it had
  // not answered when it died fail with context_poisoned (timeout when it
  // hung), and those made while no worker ran with device_unavailable.
  CHECK(got.ok == 0);
  CHECK(got.by_code[errc::device_unavailable] + got.by_code[errc::context_poisoned] +
            got.by_code[errc::timeout] ==
        total);
  const auto st = w->statistics();
  CHECK(st.calls_pending == 0);
  CHECK(st.restarts == faults);
  CHECK(count(worker_state::failed) == faults);
  stop_and_wait(w);
  std::vector<int> pids;
  {
    std::lock_guard lk(mu);
    for (const auto& e : events)
      if (e.pid > 0 && std::find(pids.begin(), pids.end(), e.pid) == pids.end())
        pids.push_back(e.pid);
  }
  CHECK(pids.size() == faults + 1);
  // Reaped by the supervisor: no zombie (a zombie still answers kill(pid, 0)).
  for (int p : pids) CHECK(pid_gone(p));
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
