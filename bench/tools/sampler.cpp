// A diagnostic LD_PRELOAD sampling profiler (the GPU machine has no perf):
// every 50 us of process CPU time (ITIMER_PROF) the interrupted thread's
// stack is captured with backtrace(); at exit every frame is written as
// "module+offset" lines, one stack per line after the thread's id ("T<tid>"), to $SAMPLER_OUT
// (default sampler.txt). scripts/sampler-report.py symbolises them here with addr2line against
// copies of the same binaries and prints flat and inclusive profiles. Build and use:
//   g++ -O2 -shared -fPIC -o /tmp/sampler.so bench/tools/sampler.cpp -ldl
//   timeout 60 env SAMPLER_OUT=$OUT/s.txt LD_PRELOAD=/tmp/sampler.so
//     build-gpu/bench/atomr-bench-throughput ...
// (the preload after `timeout`: loaded into GNU timeout too, the sampler
// would rewrite the file empty when timeout exits; every process that loads
// it writes $SAMPLER_OUT at exit). The kernel's profiling timer ticks are
// coarser than 50 us on most systems: expect a few hundred samples a second.
// "%p" in $SAMPLER_OUT becomes the process id; SAMPLER_DUMP_AFTER_S and
// SAMPLER_WRITE_EVERY_S write the file earlier or periodically (for processes
// that are killed, e.g. an isolated device's worker; scripts/profile-*.sh).
// Diagnostic only: backtrace() is not formally async-signal-safe (it is
// primed once at start so that it does not load libgcc in the handler), and
// unwinding through code without unwind information (a driver's) may read a
// bad address: a SIGSEGV or SIGBUS raised while the handler unwinds drops
// that sample (siglongjmp back into the handler; counted in the dump's
// stderr line) instead of ending the process, and any other one goes to the
// handler that was there before, or ends the process as it would have (a
// program that installs a SIGSEGV handler of its own later, as doctest does,
// replaces the guard).
// SAMPLER_SELFTEST_FAULT=N makes every Nth sample fault on purpose inside
// that guard (to check it).
#include <dlfcn.h>
#include <execinfo.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace {

constexpr int k_depth = 32;
constexpr std::size_t k_max_samples = 400000;

struct sample {
  int depth;
  long tid;
  void* pc[k_depth];
  std::atomic<bool> done;  // filled in (a periodic write skips it until then)
};

sample* g_samples = nullptr;
std::atomic<std::size_t> g_next{0};
std::atomic<bool> g_on{false};
std::atomic<std::size_t> g_dropped{0};  // samples whose unwinding faulted
std::size_t g_selftest_every = 0;       // SAMPLER_SELFTEST_FAULT
struct sigaction g_prev_segv = {};      // the handlers on_fault replaced
struct sigaction g_prev_bus = {};
// Set while on_prof unwinds this thread's stack: where a fault goes back to.
// Initial-exec: read in signal handlers, so never through __tls_get_addr.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_unwinding = nullptr;

void on_fault(int sig, siginfo_t* info, void* ctx) {
  if (sigjmp_buf* back = t_unwinding) {
    t_unwinding = nullptr;
    siglongjmp(*back, 1);
  }
  // Not the sampler's fault: the handler from before, else the default
  // action (the faulting instruction runs again and ends the process).
  const struct sigaction& prev = sig == SIGSEGV ? g_prev_segv : g_prev_bus;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) return prev.sa_sigaction(sig, info, ctx);
  if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN)
    return prev.sa_handler(sig);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

void on_prof(int, siginfo_t*, void*) {
  if (!g_on.load(std::memory_order_relaxed)) return;
  const int saved = errno;
  const auto i = g_next.fetch_add(1, std::memory_order_relaxed);
  if (i < k_max_samples) {
    g_samples[i].tid = syscall(SYS_gettid);
    // The mask is not saved (no sigprocmask call per sample): on_fault runs
    // with this handler's mask (SA_NODEFER, an empty sa_mask), so jumping
    // back leaves it as it is here.
    sigjmp_buf back;
    if (sigsetjmp(back, 0) == 0) {
      t_unwinding = &back;
      if (g_selftest_every && i % g_selftest_every == g_selftest_every - 1)
        *static_cast<volatile int*>(nullptr) = 1;  // SAMPLER_SELFTEST_FAULT
      g_samples[i].depth = backtrace(g_samples[i].pc, k_depth);
      t_unwinding = nullptr;
      g_samples[i].done.store(true, std::memory_order_release);
    } else {
      g_dropped.fetch_add(1, std::memory_order_relaxed);  // left not done: never written
    }
  }
  errno = saved;
}

std::atomic<bool> g_dumped{false};

/// Writes every finished sample so far to $SAMPLER_OUT (replacing the file).
void write_samples() {
  static std::mutex writing;  // the periodic writer and the final dump
  std::lock_guard lk(writing);
  // "%p" in the name becomes the process id: a child process (the isolated
  // device's worker inherits LD_PRELOAD) then keeps a file of its own.
  const char* env = std::getenv("SAMPLER_OUT");
  std::string path = env ? env : "sampler.txt";
  if (const auto at = path.find("%p"); at != std::string::npos)
    path.replace(at, 2, std::to_string(getpid()));
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return;
  const auto n = std::min(g_next.load(), k_max_samples);
  std::map<void*, std::string> names;  // pc -> "module+0xoff symbol"
  std::size_t written = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& s = g_samples[i];
    if (!s.done.load(std::memory_order_acquire)) continue;
    ++written;
    std::fprintf(f, "T%ld\t", s.tid);
    // Frame 0 and 1 are this handler and the signal trampoline.
    for (int d = 2; d < s.depth; ++d) {
      void* pc = s.pc[d];
      auto it = names.find(pc);
      if (it == names.end()) {
        Dl_info info{};
        std::string text = "?";
        if (dladdr(pc, &info) && info.dli_fname) {
          char buf[64];
          // Return addresses point past the call: -1 lands inside it.
          std::snprintf(buf, sizeof buf, "+0x%lx",
                        static_cast<unsigned long>(static_cast<char*>(pc) - 1 -
                                                   static_cast<char*>(info.dli_fbase)));
          text = std::string(info.dli_fname) + buf + " " + (info.dli_sname ? info.dli_sname : "-");
        }
        it = names.emplace(pc, std::move(text)).first;
      }
      std::fprintf(f, "%s%s", d == 2 ? "" : "\t", it->second.c_str());
    }
    std::fputc('\n', f);
  }
  std::fclose(f);
  if (g_dumped.load())
    std::fprintf(stderr, "sampler: %zu samples written, %zu dropped (the unwinder faulted)\n",
                 written, g_dropped.load());
}

void dump() {
  if (g_dumped.exchange(true)) return;
  g_on.store(false);
  itimerval off{};
  setitimer(ITIMER_PROF, &off, nullptr);
  write_samples();
}

struct init {
  init() {
    g_samples = static_cast<sample*>(std::calloc(k_max_samples, sizeof(sample)));
    if (!g_samples) return;
    void* prime[4];
    backtrace(prime, 4);  // loads the unwinder outside the handler
    struct sigaction sa {};
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPROF, &sa, nullptr);
    // SIGSEGV and SIGBUS: a fault while unwinding drops the sample.
    struct sigaction fault {};
    fault.sa_sigaction = on_fault;
    fault.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&fault.sa_mask);
    sigaction(SIGSEGV, &fault, &g_prev_segv);
    sigaction(SIGBUS, &fault, &g_prev_bus);
    if (const char* every = std::getenv("SAMPLER_SELFTEST_FAULT"))
      g_selftest_every = static_cast<std::size_t>(std::atol(every));
    std::atexit(dump);
    // SAMPLER_DUMP_AFTER_S: write the file that many seconds after the start
    // (for a process that is killed rather than exits, e.g. a worker).
    if (const char* after = std::getenv("SAMPLER_DUMP_AFTER_S"))
      std::thread([s = std::atof(after)] {
        std::this_thread::sleep_for(std::chrono::duration<double>(s));
        dump();
      }).detach();
    // SAMPLER_WRITE_EVERY_S: also rewrite the file that often, sampling on
    // (for a process killed at an unknown moment: the file then holds all
    // but its last interval).
    if (const char* every = std::getenv("SAMPLER_WRITE_EVERY_S"))
      std::thread([s = std::atof(every)] {
        while (!g_dumped.load()) {
          std::this_thread::sleep_for(std::chrono::duration<double>(s));
          if (!g_dumped.load()) write_samples();
        }
      }).detach();
    const long us = std::getenv("SAMPLER_US") ? std::atol(std::getenv("SAMPLER_US")) : 50;
    itimerval t{};
    t.it_interval.tv_usec = us;
    t.it_value.tv_usec = us;
    g_on.store(true);
    setitimer(ITIMER_PROF, &t, nullptr);
  }
} g_init;

}  // namespace
