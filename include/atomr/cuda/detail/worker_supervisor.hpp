// The GPU worker process of an isolated device, started, watched and
// restarted from the service's io_context (docs/design.md, "Isolated device").
// Internal: the isolated device is built on it.
#pragma once

#include <atomr/cuda/error.hpp>
#include <atomr/cuda/supervision.hpp>

#include <boost/asio/any_io_executor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace atomr::cuda {
namespace asio = boost::asio;
}

namespace atomr::cuda::detail {

/// How a worker process is started and watched.
struct worker_options {
  /// The worker executable; empty: find_worker_executable().
  std::string executable;
  int ordinal = 0;
  /// More arguments for the worker (tests: "--no-cuda", "--test-faults").
  std::vector<std::string> extra_args;
  /// Restarts allowed after a crash or hang; one more stops the worker for good.
  restart_budget budget{};
  /// A ping every `heartbeat`; no answer for `heartbeat_timeout`: a hang.
  std::chrono::milliseconds heartbeat{100};
  std::chrono::milliseconds heartbeat_timeout{2000};
  /// From spawn to the worker's hello (CUDA context creation included).
  std::chrono::milliseconds start_timeout{20000};
  /// The worker's last stderr lines kept for error messages.
  std::size_t stderr_lines = 20;
  /// Bytes of the shared arena (POSIX shared memory made per worker, mapped
  /// by both processes: the bulk data path); 0: none.
  std::size_t arena_bytes = std::size_t{64} << 20;
  /// Request rings in the shared memory (with an arena only; 1 to 16): a
  /// service thread uses one, a worker thread serves each.
  std::size_t rings = 4;
  /// How long an io thread polls the reply rings after the last reply it
  /// took while calls are waiting (isolation_options::reply_spin); 0: never.
  std::chrono::microseconds reply_spin{200};
};

/// The current worker's shared arena as mapped in this process. `keep` holds
/// the mapping: it stays valid after its worker is gone (a new worker gets a
/// new arena).
struct worker_arena {
  std::shared_ptr<void> keep;
  std::byte* data = nullptr;
  std::size_t size = 0;
  std::uint64_t incarnation = 0;
};

enum class worker_state : std::uint8_t {
  starting,    ///< spawned, its hello not received yet
  running,     ///< answered its hello; heartbeats flowing
  failed,      ///< crashed, hung or quit: it has been killed and reaped
  restarting,  ///< a new worker is being started (budget left)
  stopped,     ///< stop() was called, or the budget is spent: no more workers
};

/// What an observer is told at each change of state.
struct worker_event {
  worker_state state = worker_state::starting;
  std::uint64_t incarnation = 0;  ///< 1 for the first worker, +1 per restart
  int pid = 0;
  /// failed / stopped by a failure: why (context_poisoned for a crash,
  /// timeout for a hang), with the worker's last stderr lines.
  std::optional<gpu_error> error;
};

struct worker_statistics {
  worker_state state = worker_state::starting;
  std::uint64_t incarnation = 0;
  std::uint64_t restarts = 0;
  int pid = 0;
  std::uint64_t pings = 0, pongs = 0;
  bool arena_mapped = false;  ///< the worker's hello said it mapped the arena
  /// The device status the current worker reported in its hello (errc as an
  /// int; 0: opened), and its message.
  int device_status = -1;
  std::string device_message;
  /// The device's memory at the last heartbeat (0 before the first pong).
  std::uint64_t free_bytes = 0, total_bytes = 0;
  /// Operations sent and not answered yet.
  std::size_t calls_pending = 0;
  /// Restarts the budget allows in its window, as of the last failure.
  std::size_t restarts_left = 0;
  /// Threads this supervisor started: the reply reader (1 with an arena,
  /// from start() to the destructor), and the times it went to sleep.
  std::size_t reader_threads = 0;
  std::uint64_t reader_sleeps = 0;
  /// The worker process's threads now (the entries of /proc/PID/task, read
  /// when the statistics are taken; 0 without a starting or running
  /// worker): its io thread (more with --threads), one per request ring,
  /// and once its device is open the device's launch threads and the CUDA
  /// driver's own threads (docs/design.md, "Isolated device", "Threads").
  std::size_t worker_threads = 0;
  /// Ring replies taken by the reply reader thread, and by io threads
  /// polling the reply rings (worker_options::reply_spin); the times such
  /// polling started (it stops reply_spin after the last reply it took).
  std::uint64_t reader_replies = 0, io_replies = 0, io_polls = 0;
  /// Calls sent through the shared-memory rings, and through the socket
  /// (too large for a slot, a full ring, no worker accepting).
  std::uint64_t ring_calls = 0, socket_calls = 0;
  /// ring_calls by request ring (one entry per ring of the current worker;
  /// empty without an arena): a call goes to the calling thread's ring
  /// (threads take turns over the rings).
  std::vector<std::uint64_t> calls_per_ring;
};

/// Starts, watches and restarts one worker process. Runs on its executor's
/// io threads; the one thread it starts reads the replies of the shared-memory
/// request rings (with an arena). Otherwise: the child is an Asio I/O object
/// (Boost.Process v2: its exit is awaited through a pidfd), the control
/// channel an abstract Unix socket, heartbeats a timer. A worker that dies
/// (any signal, a non-zero or zero exit), stops answering heartbeats, or
/// sends garbage is killed (SIGKILL), reaped, and restarted while the budget
/// allows; observers see failed, then restarting, then running, or stopped.
/// Thread-safe: every member may be called from any thread.
class worker_supervisor : public std::enable_shared_from_this<worker_supervisor> {
public:
  using observer = std::function<void(const worker_event&)>;

  /// Starts the first worker (asynchronously: the result is returned before
  /// the worker answered). Fails at once when no executable is found.
  static result<std::shared_ptr<worker_supervisor>> start(asio::any_io_executor ex,
                                                          worker_options o, observer obs = {});

  worker_supervisor(const worker_supervisor&) = delete;
  worker_supervisor& operator=(const worker_supervisor&) = delete;
  /// Kills and reaps a worker still running (synchronously: SIGKILL, waitpid).
  ~worker_supervisor();

  /// Stops for good: asks the worker to exit, kills it if it has not within
  /// 500 ms, reaps it; observers then see stopped. Idempotent; does not wait.
  void stop();
  /// Tests only: asks a worker started with --test-faults to fail this way.
  void inject_fault(std::uint16_t fault_kind);

  /// Tests and diagnostics (a worker started with --test-faults): the FNV-1a
  /// hash of arena bytes [offset, offset + length) as the worker reads them.
  /// `done` runs on the io_context with the hash, invalid_argument for a
  /// range outside the arena (checked here, nothing sent), device_unavailable
  /// when no worker runs, or the worker's failure if it ends first: a pending
  /// request never hangs.
  void arena_checksum(std::uint64_t offset, std::uint64_t length,
                      std::function<void(result<std::uint64_t>)> done);
  /// The current worker's arena (empty before the first hello and after stop).
  worker_arena arena() const;

  /// What a call is answered with: the value's bytes, or the error.
  using reply_fn = std::function<void(result<std::vector<char>>)>;
  /// Sends one operation (wire::kind::call with `op`) and runs `done` with
  /// the worker's reply (on the reply reader thread when it went through the
  /// shared-memory rings, else on the supervisor's strand), or with the worker's
  /// failure (at once when it ends, restarts or is stopped; a pending call
  /// never hangs). Sent at once while a worker runs; held and sent after the
  /// hello while the first worker starts; failed with device_unavailable
  /// otherwise. No reply by `deadline` (time_point::max(): none) is a hang:
  /// the worker is killed (and restarted) and every pending call fails with
  /// timeout. Messages from one thread are sent in the order posted.
  /// `incarnation` non-zero: the call refers to that worker's arena, so it
  /// fails with stale_ref (nothing sent) on any other.
  void call(std::uint16_t op, std::string payload, std::chrono::steady_clock::time_point deadline,
            std::uint64_t incarnation, reply_fn done);
  /// Sends a message that has no answer (alloc, release): through the
  /// control ring, which the worker reads before every request, or the
  /// socket when the ring is full; dropped when no worker runs or starts.
  /// False (nothing sent) for a `call` (an alloc) while the control ring is
  /// full: on the socket it could be overtaken by a request naming it.
  bool notify_worker(std::uint16_t kind, std::uint16_t arg, std::string payload);

  worker_statistics statistics() const;
  /// The current (or last) worker's last stderr lines, oldest first.
  std::string stderr_tail() const;

  struct impl;
  explicit worker_supervisor(std::shared_ptr<impl> p) noexcept : p_(std::move(p)) {}

private:
  std::shared_ptr<impl> p_;
  std::thread reader_;  // the reply reader (docs/design.md, "The request rings")
};

/// The worker executable: $ATOMR_CUDA_WORKER if set, else
/// `atomr-cuda-worker` beside this library (a build tree), else in
/// `<libdir>/../libexec/atomr-accel-cuda/` or `<libdir>/../../libexec/atomr-accel-cuda/`
/// (an install, multiarch or not). device_unavailable naming the places tried.
result<std::string> find_worker_executable();

}  // namespace atomr::cuda::detail
