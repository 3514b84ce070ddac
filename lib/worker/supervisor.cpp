// worker_supervisor: one GPU worker process started, watched and restarted
// from the service's io_context (docs/design.md, "Isolated device").
// std::filesystem, not Boost.Filesystem (a compiled library we do not link).
// Boost 1.81's Process v2 then still names boost::optional without including it.
#define BOOST_PROCESS_USE_STD_FS 1
#define BOOST_PROCESS_V2_HEADER_ONLY 1
#include <boost/optional.hpp>

#include "../cpu_relax.hpp"
#include "protocol.hpp"
#include "reply_batch.hpp"
#include "ring.hpp"

#include <atomr/cuda/detail/worker_supervisor.hpp>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/defer.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

namespace atomr::cuda::detail {

namespace bp = boost::process::v2;
using local = asio::local::stream_protocol;
using clock = std::chrono::steady_clock;

namespace {

std::string describe_exit(int raw) {
  if (WIFSIGNALED(raw)) {
    const int sig = WTERMSIG(raw);
    const char* name = ::strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  if (WIFEXITED(raw)) return "exited with status " + std::to_string(WEXITSTATUS(raw));
  return "ended (wait status " + std::to_string(raw) + ")";
}

bool is_executable(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

/// The threads of process `pid` now (its /proc/PID/task entries); 0 when it
/// is gone or /proc cannot be read.
std::size_t threads_of(int pid) {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec);
  std::size_t n = 0;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) ++n;
  return ec ? 0 : n;
}

}  // namespace

result<std::string> find_worker_executable() {
  if (const char* env = std::getenv("ATOMR_CUDA_WORKER"); env && *env) {
    if (is_executable(env)) return std::string(env);
    return make_error(errc::device_unavailable,
                      std::string("ATOMR_CUDA_WORKER names no executable file: ") + env);
  }
  std::vector<std::filesystem::path> tried;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&find_worker_executable), &info) && info.dli_fname) {
    const auto dir = std::filesystem::absolute(info.dli_fname).parent_path();
    tried = {
        dir / "atomr-cuda-worker",
        dir.parent_path() / "libexec" / "atomr-accel-cuda" / "atomr-cuda-worker",
        dir.parent_path().parent_path() / "libexec" / "atomr-accel-cuda" / "atomr-cuda-worker"};
  }
  std::string names;
  for (const auto& p : tried) {
    if (is_executable(p)) return p.string();
    names += (names.empty() ? "" : ", ") + p.string();
  }
  return make_error(errc::device_unavailable,
                    "the worker executable atomr-cuda-worker was not found (tried " + names +
                        "); set ATOMR_CUDA_WORKER to its path");
}

namespace {

/// The string literal gpu_error keeps for a library named by the worker.
std::string_view library_name(const std::string& lib) {
  for (std::string_view known : {"cuda", "cublas", "cudnn", "cufft", "curand", "atomr"})
    if (lib == known) return known;
  return "atomr";
}

/// A reply's result: `arg` 0 is success with the payload, else an error.
result<std::vector<char>> decode_reply(std::uint16_t arg, std::vector<char> payload) {
  if (arg == 0) return payload;
  std::int32_t code = 0, native = 0;
  std::string lib, msg;
  if (!wire::decode_error(payload, code, native, lib, msg) || code <= 0 ||
      code > static_cast<std::int32_t>(errc::not_supported))
    return make_error(errc::library, "the worker sent a malformed error");
  return gpu_error(static_cast<errc>(code), library_name(lib), native, std::move(msg));
}

/// The request ring a service thread uses: threads take turns, so that the
/// io threads of a service spread over the rings (and their worker threads).
std::size_t ring_index(std::size_t rings) {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine % rings;
}

/// How long the reply reader keeps looking after its last reply before it
/// sleeps: while calls are pending, and while none are.
constexpr auto reader_busy_spin = std::chrono::microseconds(200);
constexpr auto reader_idle_spin = std::chrono::microseconds(20);
/// The reader's pause between looks while an io thread polls the rings.
constexpr auto reader_yield = std::chrono::microseconds(20);

}  // namespace

/// The shared-memory request path of one worker incarnation: its rings, and
/// the calls sent through them that wait for their replies (any thread).
struct ring_link {
  using reply_fn = worker_supervisor::reply_fn;
  struct entry {
    reply_fn done;
    clock::time_point deadline;
  };

  std::shared_ptr<void> keep;  // the mapping
  wire::region_view v;
  std::uint64_t inc = 0;
  /// Calls may be pushed: the first worker starting, or any worker running.
  std::atomic<bool> accepting{false};
  std::atomic<std::size_t> pending{0};

  /// Registers a call (taking `done`); false once the incarnation ended.
  bool add(std::uint64_t id, reply_fn& done, clock::time_point deadline) {
    std::lock_guard lk(mu_);
    if (dead_) return false;
    calls_.emplace(id, entry{std::move(done), deadline});
    pending.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  /// Takes a call back (its reply came, or its push failed).
  std::optional<reply_fn> take(std::uint64_t id) {
    std::lock_guard lk(mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return std::nullopt;
    auto done = std::move(it->second.done);
    calls_.erase(it);
    pending.fetch_sub(1, std::memory_order_relaxed);
    return done;
  }

  /// Completes the call a reply names (ignored when unknown: failed already).
  void complete(std::uint64_t id, std::uint16_t arg, std::vector<char> payload) {
    if (auto done = take(id)) (*done)(decode_reply(arg, std::move(payload)));
  }
  /// Completes the call a ring's reply names; a reply whose slot claimed
  /// more bytes than it holds fails its call.
  void complete(wire::ring_message& m) {
    if (!m.oversized) return complete(m.id, m.op, std::move(m.payload));
    if (auto done = take(m.id))
      (*done)(make_error(errc::library,
                         "the worker's reply claimed more bytes than its ring slot "
                         "holds (the shared region was written over)"));
  }

  /// Completes every reply already in the rings.
  void drain() {
    wire::ring_message m;
    for (std::size_t i = 0; i < v.rings; ++i)
      while (v.replies[i].pop(m)) complete(m);
  }

  /// Ends the incarnation: no call is added any more; the waiting ones are returned.
  std::vector<reply_fn> close() {
    accepting.store(false);
    std::vector<reply_fn> out;
    std::lock_guard lk(mu_);
    dead_ = true;
    for (auto& [id, e] : calls_) out.push_back(std::move(e.done));
    calls_.clear();
    pending.store(0);
    return out;
  }

  /// A call past its deadline.
  bool overdue(clock::time_point now) {
    std::lock_guard lk(mu_);
    for (const auto& [id, e] : calls_)
      if (e.deadline <= now) return true;
    return false;
  }

private:
  std::mutex mu_;
  bool dead_ = false;
  std::unordered_map<std::uint64_t, entry> calls_;
};

struct worker_supervisor::impl : std::enable_shared_from_this<impl> {
  impl(asio::any_io_executor ex, worker_options o, observer f, std::string exe_path)
      : strand(asio::make_strand(std::move(ex))),
        opt(std::move(o)),
        obs(std::move(f)),
        exe(std::move(exe_path)),
        budget(opt.budget),
        timer(strand) {
    stats.restarts_left = opt.budget.max_restarts;
  }

  asio::strand<asio::any_io_executor> strand;
  const worker_options opt;
  const observer obs;
  const std::string exe;

  // Guarded by mu (read from any thread).
  mutable std::mutex mu;
  worker_statistics stats;
  std::deque<std::string> tail;
  std::string partial;

  /// The running child's pid until it is reaped (the public destructor's
  /// synchronous kill takes it from any thread).
  std::atomic<int> live_pid{0};
  std::atomic<bool> stopping{false};

  // The current incarnation: strand only.
  supervisor budget;
  std::uint64_t inc = 0;
  std::unique_ptr<bp::process> proc;
  std::unique_ptr<local::acceptor> acceptor;
  std::unique_ptr<local::socket> sock;
  std::unique_ptr<asio::readable_pipe> err;
  asio::steady_timer timer;  // start deadline, then heartbeats, then the stop grace
  bool ended = true;
  bool reaped = true;
  bool running = false;
  std::optional<gpu_error> failure;
  clock::time_point last_pong{};
  std::uint64_t next_ping = 1;
  std::deque<std::vector<std::byte>> outq;
  bool writing = false;
  /// The arena of the current incarnation; its name until the worker said
  /// it mapped it (then the name is removed: nothing is left in /dev/shm).
  worker_arena shared;     // guarded by mu (read by arena())
  std::string arena_name;  // guarded by mu (the destructor removes it too)
  std::uint64_t next_request = 1;
  std::map<std::uint64_t, std::function<void(result<std::uint64_t>)>> pending;
  /// Operations sent (or held for the hello), by id, with their deadlines.
  struct pending_call {
    reply_fn done;
    clock::time_point deadline;
  };
  std::map<std::uint64_t, pending_call> calls;
  /// Messages posted while the worker starts: sent after its hello, in order.
  std::vector<std::vector<std::byte>> early;
  wire::header in_header{};
  std::vector<char> in_payload;

  // The request rings (docs/design.md, "The request rings"): the current
  // incarnation's link, and the reply reader thread's state.
  std::mutex link_mu;
  std::shared_ptr<ring_link> link;  // guarded by link_mu
  /// With rings: alloc and release notes made before the first link existed
  /// (allocate() before the strand ran launch(), e.g. before io_context::run),
  /// in order. launch() puts them into the new link's control ring before
  /// publishing it, so they come before any request a ring carries (the
  /// worker reads the control ring first). They went to the socket, held
  /// until the hello, while requests naming their buffers went into the
  /// rings: the worker's ring threads, started before its hello, took those
  /// first and answered stale_ref. Guarded by link_mu.
  struct control_note {
    std::uint16_t kind, arg;
    std::string payload;
  };
  std::vector<control_note> unlinked;
  bool linked = false;  // a link was published once; guarded by link_mu
  std::atomic<std::uint64_t> link_gen{0};
  std::condition_variable link_cv;
  std::atomic<bool> reader_stop{false};
  std::atomic<std::uint64_t> next_ring_id{1};
  std::atomic<std::uint64_t> ring_calls{0}, socket_calls{0};
  std::atomic<std::uint64_t> reader_replies{0}, io_replies{0}, io_polls{0};
  /// Set while an io thread's turn of polling the reply rings is queued or
  /// running (io_poll).
  std::atomic<bool> io_polling{false};

  std::shared_ptr<ring_link> current_link() {
    std::lock_guard lk(link_mu);
    return link;
  }

  /// Installs the link of a new incarnation (or none), waking the reader.
  /// A new link first gets the notes made before any link (`unlinked`).
  void set_link(std::shared_ptr<ring_link> l) {
    std::shared_ptr<ring_link> old;
    {
      std::lock_guard lk(link_mu);
      if (l) {
        // At most control_slots notes wait (fast_notify), and the ring is new.
        for (auto& n : unlinked) l->v.control.push(0, n.kind, n.arg, n.payload);
        unlinked.clear();
        linked = true;
      }
      old = std::exchange(link, std::move(l));
      link_gen.fetch_add(1, std::memory_order_acq_rel);
    }
    link_cv.notify_all();
    if (old) wire::ring::wake(old->v.header->reader);
  }

  /// The reply reader (one thread per supervisor, from start() to the
  /// destructor): completes the calls whose replies the worker put in its
  /// reply rings. Spins while calls are pending, then sleeps on the
  /// region's reader semaphore, which the worker posts.
  void read_replies() {
    std::shared_ptr<ring_link> l;
    std::uint64_t gen = ~std::uint64_t{0};
    auto last = clock::now();
    while (!reader_stop.load(std::memory_order_relaxed)) {
      if (link_gen.load(std::memory_order_acquire) != gen) {
        std::unique_lock lk(link_mu);
        gen = link_gen.load();
        l = link;
        if (!l) {
          link_cv.wait(lk, [&] { return reader_stop.load() || link_gen.load() != gen; });
          continue;
        }
        last = clock::now();
      }
      std::uint64_t n = 0;
      if (replies_ready(*l)) {
        // One sweep's completions posted a chunk at a time (one io thread
        // woken per chunk, not per reply).
        reply_batch batch;
        n = sweep(*l);
        batch.finish();
      }
      const auto now = clock::now();
      if (n) {
        reader_replies.fetch_add(n, std::memory_order_relaxed);
        last = now;
        continue;
      }
      if (io_polling.load(std::memory_order_relaxed)) {
        // An io thread polls the rings and resumes the waiters itself
        // (io_poll): look again shortly instead of racing it for each reply.
        std::this_thread::sleep_for(reader_yield);
        last = clock::now();
        continue;
      }
      const auto idle = now - last;
      if (idle < reader_idle_spin ||
          (l->pending.load(std::memory_order_relaxed) > 0 && idle < reader_busy_spin)) {
        cpu_relax();
        continue;
      }
      {
        std::lock_guard lk(mu);
        ++stats.reader_sleeps;
      }
      wire::ring::sleep_on(
          l->v.header->reader,
          [&] { return replies_ready(*l) || reader_stop.load() || link_gen.load() != gen; },
          std::chrono::milliseconds(50));
      last = clock::now();
    }
  }

  /// A reply waits in one of the reply rings.
  static bool replies_ready(const ring_link& l) {
    for (std::size_t i = 0; i < l.v.rings; ++i)
      if (l.v.replies[i].ready()) return true;
    return false;
  }

  /// Takes every reply in the reply rings and completes its call (into the
  /// reply_batch open on this thread, which posts or runs them when it
  /// closes). Returns the replies taken.
  static std::uint64_t sweep(ring_link& l) {
    std::uint64_t n = 0;
    wire::ring_message m;
    for (std::size_t i = 0; i < l.v.rings; ++i)
      while (l.v.replies[i].pop(m)) {
        ++n;
        l.complete(m);
      }
    return n;
  }

  /// Starts an io thread's polling of the reply rings unless one is queued
  /// or running (worker_options::reply_spin; docs/design.md, "The request
  /// rings").
  void start_io_poll() {
    if (opt.reply_spin.count() <= 0 || io_polling.load(std::memory_order_relaxed) ||
        io_polling.exchange(true, std::memory_order_acq_rel))
      return;
    io_polls.fetch_add(1, std::memory_order_relaxed);
    asio::post(strand.get_inner_executor(),
               [self = shared_from_this()] { self->io_poll(clock::now()); });
  }

  /// One turn of an io thread's polling: the replies in the rings are
  /// completed with the first few resumed on this thread (no sleeping io
  /// thread woken for them), then the turn defers itself (to the back of
  /// the queue, without waking a thread) while calls wait and a reply came
  /// within reply_spin. The reply reader takes whatever comes later. A call
  /// made while the last turn decides to stop does not start another: the
  /// reader completes it. A completion that throws ends the polling (the
  /// next call starts it again) and leaves like a handler's exception.
  void io_poll(clock::time_point last) {
    auto ex = strand.get_inner_executor();
    auto l = current_link();
    if (l) {
      std::uint64_t n = 0;
      if (replies_ready(*l)) {
        try {
          reply_batch batch(ex);
          n = sweep(*l);
          batch.finish();  // the first chunk runs here
        } catch (...) {
          io_polling.store(false, std::memory_order_release);
          throw;
        }
      }
      const auto now = clock::now();
      if (n) {
        io_replies.fetch_add(n, std::memory_order_relaxed);
        last = now;
      }
      if (!reader_stop.load(std::memory_order_relaxed) &&
          l->pending.load(std::memory_order_relaxed) > 0 && now - last < opt.reply_spin) {
        asio::defer(ex, [self = shared_from_this(), last] { self->io_poll(last); });
        return;
      }
    }
    io_polling.store(false, std::memory_order_release);
  }

  /// The shared-memory path of call(); false: take the socket.
  bool fast_call(std::uint16_t op, const std::string& payload, clock::time_point deadline,
                 std::uint64_t incarnation, reply_fn& done) {
    if (payload.size() > wire::ring_payload) return false;
    auto l = current_link();
    if (!l || !l->accepting.load(std::memory_order_acquire) ||
        (incarnation != 0 && incarnation != l->inc))
      return false;
    const auto id = (std::uint64_t{1} << 63) | next_ring_id.fetch_add(1, std::memory_order_relaxed);
    if (!l->add(id, done, deadline)) return false;
    // The calling thread's ring: a thread's requests stay in the order it
    // made them (two operations issued together that write one buffer keep
    // their order, as on a device in process: docs/guide.md, 2.4).
    auto& r = l->v.requests[ring_index(l->v.rings)];
    if (r.push(id, op, 0, payload)) {
      wire::ring::wake(*r.head());
      ring_calls.fetch_add(1, std::memory_order_relaxed);
      start_io_poll();
      return true;
    }
    auto back = l->take(id);  // the ring is full: the socket takes it
    if (!back) return true;   // the worker ended meanwhile and failed it
    done = std::move(*back);
    return false;
  }

  /// alloc and release through the control ring (read before every
  /// request: no wake of its own).
  enum class control { sent, full, no_link };
  control fast_notify(std::uint16_t kind, std::uint16_t arg, const std::string& payload) {
    std::shared_ptr<ring_link> l;
    {
      std::lock_guard lk(link_mu);
      if (!link && !linked && opt.arena_bytes > 0) {  // rings to come: wait for the first
        if (unlinked.size() >= wire::control_slots) return control::full;
        unlinked.push_back({kind, arg, payload});
        return control::sent;
      }
      l = link;
    }
    if (!l || !l->accepting.load(std::memory_order_acquire)) return control::no_link;
    return l->v.control.push(0, kind, arg, payload) ? control::sent : control::full;
  }
  std::array<char, 4096> err_buf{};

  void notify(worker_state s, const std::optional<gpu_error>& e) {
    worker_event ev;
    {
      std::lock_guard lk(mu);
      stats.state = s;
      ev.state = s;
      ev.incarnation = stats.incarnation;
      ev.pid = stats.pid;
    }
    ev.error = e;
    if (obs) obs(ev);
  }

  std::string tail_text() const {
    std::lock_guard lk(mu);
    std::string t;
    for (const auto& l : tail) t += l + "\n";
    if (!partial.empty()) t += partial + "\n";
    return t;
  }

  void add_stderr(const char* data, std::size_t n) {
    std::lock_guard lk(mu);
    for (std::size_t i = 0; i < n; ++i) {
      if (data[i] != '\n') {
        if (partial.size() < 4096) partial += data[i];
        continue;
      }
      tail.push_back(std::move(partial));
      partial.clear();
      while (tail.size() > opt.stderr_lines) tail.pop_front();
    }
  }

  gpu_error with_tail(errc code, std::string m) const {
    const auto t = tail_text();
    if (!t.empty()) m += "; its last stderr lines:\n" + t;
    return make_error(code, std::move(m));
  }

  // ---- one incarnation

  void launch() {
    ++inc;
    ended = false;
    reaped = true;
    running = false;
    failure.reset();
    outq.clear();
    early.clear();
    writing = false;
    {
      std::lock_guard lk(mu);
      stats.incarnation = inc;
      stats.pid = 0;
      stats.device_status = -1;
      stats.device_message.clear();
      tail.clear();
      partial.clear();
    }
    notify(worker_state::starting, std::nullopt);
    std::random_device rd;
    const std::string name = "atomr-cuda-" + std::to_string(::getpid()) + "-" +
                             std::to_string(inc) + "-" + std::to_string(rd());
    std::vector<std::string> args{"--socket", name, "--ordinal", std::to_string(opt.ordinal)};
    args.insert(args.end(), opt.extra_args.begin(), opt.extra_args.end());
    try {
      if (opt.arena_bytes > 0) {
        // One shared memory object: the request rings, then the arena.
        namespace ipc = boost::interprocess;
        const std::size_t rings = std::clamp<std::size_t>(opt.rings, 1, wire::max_rings);
        const wire::region_layout layout{rings};
        const std::string shm_name = "/" + name;
        {
          std::lock_guard lk(mu);
          arena_name = shm_name;
        }
        ipc::shared_memory_object shm(ipc::create_only, shm_name.c_str(), ipc::read_write);
        shm.truncate(static_cast<ipc::offset_t>(layout.bytes() + opt.arena_bytes));
        auto region = std::make_shared<ipc::mapped_region>(shm, ipc::read_write);
        auto* base = static_cast<std::byte*>(region->get_address());
        auto l = std::make_shared<ring_link>();
        l->v = wire::region_view::map(base, rings, true);
        l->inc = inc;
        l->keep = region;
        // The first worker's calls wait in the rings until it runs; a
        // restarted one's fail fast (the socket path says so) until its hello.
        l->accepting.store(inc == 1);
        {
          std::lock_guard lk(mu);
          shared.data = base + layout.bytes();
          shared.size = opt.arena_bytes;
          shared.incarnation = inc;
          shared.keep = std::move(region);
        }
        set_link(std::move(l));
        args.insert(args.end(),
                    {"--arena", shm_name, "--arena-bytes", std::to_string(opt.arena_bytes),
                     "--rings", std::to_string(rings)});
      }
      acceptor = std::make_unique<local::acceptor>(strand);
      acceptor->open();
      acceptor->bind(local::endpoint(std::string(1, '\0') + name));
      acceptor->listen(1);
      err = std::make_unique<asio::readable_pipe>(strand);
      proc = std::make_unique<bp::process>(strand, exe, args, bp::process_stdio{{}, {}, *err});
    } catch (const std::exception& e) {
      ended = true;
      failure =
          make_error(errc::device_unavailable, "cannot start the worker " + exe + ": " + e.what());
      finish();
      return;
    }
    reaped = false;
    live_pid.store(proc->id());
    {
      std::lock_guard lk(mu);
      stats.pid = proc->id();
    }
    auto self = shared_from_this();
    const auto my = inc;
    read_stderr(my);
    proc->async_wait(asio::bind_executor(strand, [self, my](boost::system::error_code, int) {
      if (my != self->inc) return;
      self->on_exit();
    }));
    sock = std::make_unique<local::socket>(strand);
    acceptor->async_accept(*sock, [self, my](boost::system::error_code ec) {
      if (my != self->inc || self->ended) return;
      if (ec)
        return self->end(
            make_error(errc::context_poisoned, "the worker's connection failed: " + ec.message()));
      self->acceptor->close();
      self->read_hello(my);
    });
    timer.expires_after(opt.start_timeout);
    timer.async_wait([self, my](boost::system::error_code ec) {
      if (ec || my != self->inc || self->ended || self->running) return;
      self->end(self->with_tail(
          errc::timeout, "the worker (pid " + std::to_string(self->proc->id()) +
                             ") did not answer within " +
                             std::to_string(self->opt.start_timeout.count()) + " ms of its start"));
    });
  }

  void read_stderr(std::uint64_t my) {
    auto self = shared_from_this();
    err->async_read_some(asio::buffer(err_buf),
                         [self, my](boost::system::error_code ec, std::size_t n) {
                           if (my != self->inc) return;
                           if (n) self->add_stderr(self->err_buf.data(), n);
                           if (!ec) self->read_stderr(my);
                         });
  }

  void read_hello(std::uint64_t my) {
    auto self = shared_from_this();
    read_message(my, [self, my] {
      if (self->in_header.type != static_cast<std::uint16_t>(wire::kind::hello) ||
          self->in_payload.size() < sizeof(wire::hello_fixed))
        return self->end(
            self->with_tail(errc::library, "the worker's first message was not a hello"));
      wire::hello_fixed f;
      std::memcpy(&f, self->in_payload.data(), sizeof f);
      self->remove_arena_name();
      {
        std::lock_guard lk(self->mu);
        self->stats.arena_mapped = f.arena_mapped != 0;
        self->stats.device_status = f.status;
        self->stats.device_message.assign(self->in_payload.begin() + sizeof f,
                                          self->in_payload.end());
      }
      self->running = true;
      self->last_pong = clock::now();
      if (auto l = self->current_link(); l && l->inc == self->inc) {
        if (f.arena_mapped != 0) {
          if (!self->stopping.load()) l->accepting.store(true);
        } else {
          // The worker could not map the rings and the arena (its stderr
          // says why): nothing will read the calls pushed there while it
          // started. They fail now, not at their deadline; later calls take
          // the socket, and transfers find no arena (a clear error).
          {
            std::lock_guard lk(self->mu);
            self->shared = {};
          }
          const auto why =
              self->with_tail(errc::device_unavailable,
                              "the isolated device's worker could not map the shared arena");
          for (auto& done : l->close()) done(why);
        }
      }
      auto held = std::move(self->early);
      self->early.clear();
      for (auto& m : held) self->send(std::move(m));
      self->notify(worker_state::running, std::nullopt);
      self->heartbeat(my);
      self->read_loop(my);
    });
  }

  /// Reads one message into in_header / in_payload, then calls `next`;
  /// a read error ends nothing by itself (the exit or the heartbeat will).
  template <class Next>
  void read_message(std::uint64_t my, Next next) {
    auto self = shared_from_this();
    asio::async_read(
        *sock, asio::buffer(&in_header, sizeof in_header),
        [self, my, next](boost::system::error_code ec, std::size_t) {
          if (ec || my != self->inc || self->ended) return;
          if (self->in_header.size > wire::max_payload)
            return self->end(self->with_tail(
                errc::library,
                "the worker sent a message of " + std::to_string(self->in_header.size) + " bytes"));
          self->in_payload.resize(self->in_header.size);
          asio::async_read(*self->sock, asio::buffer(self->in_payload),
                           [self, my, next](boost::system::error_code ec2, std::size_t) {
                             if (ec2 || my != self->inc || self->ended) return;
                             next();
                           });
        });
  }

  void read_loop(std::uint64_t my) {
    auto self = shared_from_this();
    read_message(my, [self, my] {
      if (self->in_header.type == static_cast<std::uint16_t>(wire::kind::pong)) {
        self->last_pong = clock::now();
        wire::pong_payload mem;
        const bool has_mem = wire::read_pod(self->in_payload, mem);
        std::lock_guard lk(self->mu);
        ++self->stats.pongs;
        if (has_mem) {
          self->stats.free_bytes = mem.free_bytes;
          self->stats.total_bytes = mem.total_bytes;
        }
      } else if (self->in_header.type == static_cast<std::uint16_t>(wire::kind::reply)) {
        self->on_reply();
      } else if (self->in_header.type == static_cast<std::uint16_t>(wire::kind::checksum_result)) {
        auto it = self->pending.find(self->in_header.id);
        if (it != self->pending.end()) {
          auto done = std::move(it->second);
          self->pending.erase(it);
          std::uint64_t hash = 0;
          if (self->in_header.arg != 0 || self->in_payload.size() < sizeof hash) {
            done(make_error(errc::invalid_argument, "the worker refused the arena range"));
          } else {
            std::memcpy(&hash, self->in_payload.data(), sizeof hash);
            done(hash);
          }
        }
      }
      self->read_loop(my);
    });
  }

  void on_reply() {
    auto it = calls.find(in_header.id);
    if (it == calls.end()) {
      // A ring call whose reply did not fit a slot, or never sent by this
      // incarnation (ignored).
      if (auto l = current_link(); l && l->inc == inc)
        l->complete(in_header.id, in_header.arg, std::move(in_payload));
      return;
    }
    auto done = std::move(it->second.done);
    calls.erase(it);
    {
      std::lock_guard lk(mu);
      stats.calls_pending = calls.size();
    }
    done(decode_reply(in_header.arg, std::move(in_payload)));
  }

  /// A call past its deadline without a reply: the worker is hung.
  bool check_deadlines() {
    const auto now = clock::now();
    auto l = current_link();
    bool late = l && l->inc == inc && l->pending.load() > 0 && l->overdue(now);
    for (const auto& [id, c] : calls) late = late || c.deadline <= now;
    if (late) {
      end(with_tail(errc::timeout,
                    "an operation on the worker (pid " + std::to_string(proc->id()) +
                        ") had no answer by its deadline (its timeout plus the hang margin): "
                        "the worker is hung (a kernel that never ends?) and was killed"));
      return false;
    }
    return true;
  }

  void post_call(std::uint16_t op, std::string payload, clock::time_point deadline,
                 std::uint64_t incarnation, reply_fn done) {
    if (incarnation != 0 && incarnation != inc)
      return done(make_error(errc::stale_ref,
                             "the request's arena block belongs to an earlier worker (restarted)"));
    if (ended || stopping.load() || (!running && restarting_now())) {
      return done(make_error(errc::device_unavailable,
                             stopping.load() ? "the isolated device's worker is stopped"
                                             : "the isolated device's worker is restarting"));
    }
    const auto id = next_request++;
    calls.emplace(id, pending_call{std::move(done), deadline});
    {
      std::lock_guard lk(mu);
      stats.calls_pending = calls.size();
    }
    send_or_hold(wire::encode(wire::kind::call, op, id, payload));
  }

  /// True while a restarted (not the first) worker starts: calls fail fast.
  bool restarting_now() const { return inc > 1; }

  void send_or_hold(std::vector<std::byte> msg) {
    if (ended) return;
    if (running)
      send(std::move(msg));
    else
      early.push_back(std::move(msg));
  }

  void heartbeat(std::uint64_t my) {
    if (!check_deadlines()) return;
    const auto silent = clock::now() - last_pong;
    if (silent > opt.heartbeat_timeout) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
      return end(with_tail(errc::timeout, "the worker (pid " + std::to_string(proc->id()) +
                                              ") answered no heartbeat for " + std::to_string(ms) +
                                              " ms: hung"));
    }
    send(wire::encode(wire::kind::ping, 0, next_ping++));
    {
      std::lock_guard lk(mu);
      ++stats.pings;
    }
    auto self = shared_from_this();
    timer.expires_after(opt.heartbeat);
    timer.async_wait([self, my](boost::system::error_code ec) {
      if (ec || my != self->inc || self->ended) return;
      self->heartbeat(my);
    });
  }

  void send(std::vector<std::byte> msg) {
    if (!sock || !sock->is_open()) return;
    outq.push_back(std::move(msg));
    if (!writing) write_next(inc);
  }

  void write_next(std::uint64_t my) {
    if (outq.empty() || my != inc || ended) {
      writing = false;
      return;
    }
    writing = true;
    auto self = shared_from_this();
    asio::async_write(*sock, asio::buffer(outq.front()),
                      [self, my](boost::system::error_code ec, std::size_t) {
                        if (my != self->inc) return;
                        self->outq.pop_front();
                        if (ec) {
                          self->writing = false;
                          return;  // the exit or the heartbeat ends the incarnation
                        }
                        self->write_next(my);
                      });
  }

  void on_exit() {
    int raw = 0;
    if (proc) raw = proc->native_exit_code();
    reaped = true;
    live_pid.store(0);
    // Whatever the child wrote before it died is in the pipe: read it now
    // (its write end is closed, so this ends at once).
    if (err && err->is_open()) {
      boost::system::error_code ec;
      for (int i = 0; i < 64 && !ec; ++i) {
        const auto n = err->read_some(asio::buffer(err_buf), ec);
        if (n) add_stderr(err_buf.data(), n);
      }
    }
    if (!ended) {
      ended = true;
      failure = stopping.load() ? make_error(errc::device_unavailable, "stopped")
                                : with_tail(errc::context_poisoned, "the worker (pid " +
                                                                        std::to_string(proc->id()) +
                                                                        ") " + describe_exit(raw));
    }
    finish();
  }

  /// Ends the incarnation with `e`: the child is killed if it still runs;
  /// finish() follows once it has been reaped.
  void end(gpu_error e) {
    if (ended) return;
    ended = true;
    if (auto l = current_link()) l->accepting.store(false);
    failure = std::move(e);
    close_io();
    if (!reaped && proc) {
      ::kill(proc->id(), SIGKILL);  // on_exit() reaps it and calls finish()
      return;
    }
    finish();
  }

  /// Removes the arena's name from /dev/shm (once; any thread). The
  /// mappings stay valid: the memory goes with the last one.
  void remove_arena_name() {
    std::string name;
    {
      std::lock_guard lk(mu);
      name.swap(arena_name);
    }
    if (!name.empty()) boost::interprocess::shared_memory_object::remove(name.c_str());
  }

  /// Every request still waiting for this worker fails with `e`, at once.
  void fail_pending(const gpu_error& e) {
    // The rings first: replies already written complete as answered (the
    // worker may have put its fault's own error there before it exited).
    if (auto l = current_link()) {
      l->drain();
      for (auto& done : l->close()) done(e);
    }
    auto waiting = std::move(pending);
    pending.clear();
    for (auto& [id, done] : waiting) done(e);
    auto ops = std::move(calls);
    calls.clear();
    early.clear();
    {
      std::lock_guard lk(mu);
      stats.calls_pending = 0;
    }
    for (auto& [id, c] : ops) c.done(e);
  }

  void close_io() {
    boost::system::error_code ec;
    timer.cancel();
    if (acceptor) acceptor->close(ec);
    if (sock) sock->close(ec);
  }

  /// After the child has been reaped (or never started): report, then restart or stop.
  void finish() {
    close_io();
    remove_arena_name();
    {
      std::lock_guard lk(mu);
      shared = {};  // a user's worker_arena keeps its mapping alive
    }
    fail_pending(failure.value_or(make_error(errc::device_unavailable, "stopped")));
    set_link(nullptr);
    if (err) {
      boost::system::error_code ec;
      err->close(ec);
    }
    running = false;
    if (stopping.load()) {
      notify(worker_state::stopped, std::nullopt);
      return;
    }
    const auto why = failure.value_or(make_error(errc::context_poisoned, "the worker ended"));
    notify(worker_state::failed, why);
    const bool can_start = why.code() != errc::device_unavailable;  // no executable: no retry
    const bool restart =
        can_start && budget.on_failure(errc::context_poisoned) == decision::restart;
    {
      std::lock_guard lk(mu);
      const auto used = budget.recent_restarts();
      stats.restarts_left = used >= opt.budget.max_restarts ? 0 : opt.budget.max_restarts - used;
    }
    if (restart) {
      {
        std::lock_guard lk(mu);
        ++stats.restarts;
      }
      notify(worker_state::restarting, why);
      launch();
    } else {
      notify(worker_state::stopped, why);
    }
  }

  void stop() {
    if (stopping.exchange(true)) return;
    if (auto l = current_link()) l->accepting.store(false);
    if (ended) {
      // Between incarnations (never, as finish() restarts at once) or stopped.
      return;
    }
    if (!running) {
      end(make_error(errc::device_unavailable, "stopped"));
      return;
    }
    // Ask it to exit; kill it if it has not within 500 ms.
    send(wire::encode(wire::kind::bye, 0, 0));
    auto self = shared_from_this();
    const auto my = inc;
    timer.expires_after(std::chrono::milliseconds(500));
    timer.async_wait([self, my](boost::system::error_code ec) {
      if (ec == asio::error::operation_aborted && self->ended) return;
      if (my == self->inc) self->end(make_error(errc::device_unavailable, "stopped"));
    });
  }
};

result<std::shared_ptr<worker_supervisor>> worker_supervisor::start(asio::any_io_executor ex,
                                                                    worker_options o,
                                                                    observer obs) {
  std::string exe = o.executable;
  if (exe.empty()) {
    BOOST_OUTCOME_TRY(exe, find_worker_executable());
  } else if (!is_executable(exe)) {
    return make_error(errc::device_unavailable,
                      "the worker executable " + exe + " does not exist or is not executable");
  }
  auto p = std::make_shared<impl>(std::move(ex), std::move(o), std::move(obs), std::move(exe));
  auto s = std::make_shared<worker_supervisor>(p);
  if (p->opt.arena_bytes > 0) {
    // The reply reader holds the state, not the supervisor: the last
    // reference may go on this thread (a completion dropping the device).
    s->reader_ = std::thread([p] { p->read_replies(); });
    std::lock_guard lk(p->mu);
    p->stats.reader_threads = 1;
  }
  asio::post(p->strand, [p] { p->launch(); });
  return s;
}

worker_supervisor::~worker_supervisor() {
  p_->stopping.store(true);
  if (reader_.joinable()) {
    p_->reader_stop.store(true);
    p_->set_link(p_->current_link());  // wakes the reader wherever it sleeps
    if (reader_.get_id() == std::this_thread::get_id())
      reader_.detach();  // it leaves its loop once this returns
    else
      reader_.join();
  }
  // No worker may outlive its supervisor, even when the io_context no longer
  // runs: kill and reap it here (the pending handlers then find it gone).
  if (const int pid = p_->live_pid.exchange(0); pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // Nor its arena's name: a handler posted below may never run (the
  // io_context stopped or destroyed), and a name left in /dev/shm holds its
  // memory until the machine restarts.
  p_->remove_arena_name();
  asio::post(p_->strand, [p = p_] {
    p->reaped = true;
    if (!p->ended) {
      p->ended = true;
      p->failure = make_error(errc::device_unavailable, "stopped");
    }
    p->close_io();
    p->remove_arena_name();
    p->fail_pending(make_error(errc::device_unavailable, "the isolated device was shut down"));
    if (p->err) {
      boost::system::error_code ec;
      p->err->close(ec);
    }
  });
}

void worker_supervisor::stop() {
  asio::post(p_->strand, [p = p_] { p->stop(); });
}

void worker_supervisor::inject_fault(std::uint16_t fault_kind) {
  asio::post(p_->strand, [p = p_, fault_kind] {
    if (p->running && !p->ended) p->send(wire::encode(wire::kind::fault, fault_kind, 0));
  });
}

void worker_supervisor::arena_checksum(std::uint64_t offset, std::uint64_t length,
                                       std::function<void(result<std::uint64_t>)> done) {
  asio::post(p_->strand, [p = p_, offset, length, done = std::move(done)]() mutable {
    if (!p->running || p->ended)
      return done(make_error(errc::device_unavailable, "arena_checksum: no worker is running"));
    const std::size_t size = p->opt.arena_bytes;
    if (offset > size || length > size - offset)
      return done(make_error(errc::invalid_argument, "arena_checksum: [" + std::to_string(offset) +
                                                         ", +" + std::to_string(length) +
                                                         ") is outside the arena of " +
                                                         std::to_string(size) + " bytes"));
    const auto id = p->next_request++;
    p->pending.emplace(id, std::move(done));
    const std::uint64_t range[2] = {offset, length};
    p->send(wire::encode(wire::kind::checksum, 0, id,
                         std::string_view(reinterpret_cast<const char*>(range), sizeof range)));
  });
}

void worker_supervisor::call(std::uint16_t op, std::string payload,
                             std::chrono::steady_clock::time_point deadline,
                             std::uint64_t incarnation, reply_fn done) {
  if (p_->fast_call(op, payload, deadline, incarnation, done)) return;
  p_->socket_calls.fetch_add(1, std::memory_order_relaxed);
  asio::post(p_->strand, [p = p_, op, payload = std::move(payload), deadline, incarnation,
                          done = std::move(done)]() mutable {
    p->post_call(op, std::move(payload), deadline, incarnation, std::move(done));
  });
}

bool worker_supervisor::notify_worker(std::uint16_t kind, std::uint16_t arg, std::string payload) {
  switch (p_->fast_notify(kind, arg, payload)) {
    case impl::control::sent:
      return true;
    case impl::control::full:
      // An allocation on the socket could be overtaken by a request naming
      // it in a ring: refused. A release may come late: the socket takes it.
      if (kind == static_cast<std::uint16_t>(wire::kind::call)) return false;
      break;
    case impl::control::no_link:
      break;
  }
  asio::post(p_->strand, [p = p_, kind, arg, payload = std::move(payload)] {
    if (p->ended || p->stopping.load()) return;
    p->send_or_hold(wire::encode(static_cast<wire::kind>(kind), arg, 0, payload));
  });
  return true;
}

worker_arena worker_supervisor::arena() const {
  std::lock_guard lk(p_->mu);
  return p_->shared;
}

worker_statistics worker_supervisor::statistics() const {
  std::size_t ring_calls = 0;
  std::vector<std::uint64_t> per_ring;
  if (auto l = p_->current_link()) {
    ring_calls = l->pending.load();
    // A ring's producer count is its calls: a full ring claims nothing.
    for (std::size_t i = 0; i < l->v.rings; ++i) per_ring.push_back(l->v.requests[i].claimed());
  }
  std::unique_lock lk(p_->mu);
  auto s = p_->stats;
  s.calls_per_ring = std::move(per_ring);
  s.calls_pending += ring_calls;
  s.ring_calls = p_->ring_calls.load();
  s.reader_replies = p_->reader_replies.load();
  s.io_replies = p_->io_replies.load();
  s.io_polls = p_->io_polls.load();
  s.socket_calls = p_->socket_calls.load();
  lk.unlock();
  // Read now rather than with each heartbeat: statistics are taken far more
  // rarely than heartbeats are answered.
  const bool alive = s.state == worker_state::starting || s.state == worker_state::running;
  s.worker_threads = alive && s.pid > 0 ? threads_of(s.pid) : 0;
  return s;
}

std::string worker_supervisor::stderr_tail() const {
  return p_->tail_text();
}

}  // namespace atomr::cuda::detail
