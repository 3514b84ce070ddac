// Every thread's stack, for a test's report of a stall (Linux, glibc): the
// GPU case that stalls only under compute-sanitizer (test_gpu_lanes.cpp)
// says where each thread is, so that one run on the GPU shows what waits on
// what. Test code only: a signal handler stays installed for the process.
#pragma once

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace atomr::cuda::test {

namespace thread_dump_detail {
inline std::atomic<int> out_fd{-1};
inline std::atomic<int> answered{0};  // the tid of the thread that wrote its stack

/// Runs on the thread asked: its own frames to out_fd. backtrace() and
/// backtrace_symbols_fd() do not allocate once the unwinder is loaded
/// (dump_thread_stacks loads it first).
inline void on_signal(int) {
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, out_fd.load());
  answered.store(static_cast<int>(::syscall(SYS_gettid)));
}

inline std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}
}  // namespace thread_dump_detail

/// Writes, for every thread of the process but the caller: its id, name,
/// scheduler state (R running, S sleeping, D uninterruptible), the kernel
/// function it sleeps in, then its stack as glibc's backtrace_symbols_fd
/// prints it (exported names only, mangled: c++filt reads them; the test
/// programs link with -rdynamic so that their own functions are named). A
/// thread that does not answer within 500 ms (the signal blocked) is said to.
/// The threads are asked one at a time, with SIGUSR2, whose handler stays
/// installed (a late answer must not meet the default action, which ends the
/// process).
inline void dump_thread_stacks(int fd) {
  namespace d = thread_dump_detail;
  void* warm[2];
  ::backtrace(warm, 2);  // loads the unwinder here, not in the handler
  d::out_fd.store(fd);
  struct sigaction sa {};
  sa.sa_handler = d::on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR2, &sa, nullptr);
  const int self = static_cast<int>(::syscall(SYS_gettid));
  DIR* dir = ::opendir("/proc/self/task");
  if (!dir) return;
  while (const dirent* e = ::readdir(dir)) {
    const int tid = std::atoi(e->d_name);
    if (tid <= 0 || tid == self) continue;
    const std::string at = "/proc/self/task/" + std::to_string(tid);
    const std::string stat = d::read_line(at + "/stat");
    const auto close = stat.rfind(')');
    const char state =
        close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
    ::dprintf(fd, "thread %d (%s) state %c in %s:\n", tid, d::read_line(at + "/comm").c_str(),
              state, d::read_line(at + "/wchan").c_str());
    d::answered.store(0);
    if (::syscall(SYS_tgkill, ::getpid(), tid, SIGUSR2) != 0) {
      ::dprintf(fd, "  (gone)\n");
      continue;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (d::answered.load() != tid && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (d::answered.load() != tid) ::dprintf(fd, "  (no answer within 500 ms)\n");
  }
  ::closedir(dir);
}

}  // namespace atomr::cuda::test
