// atomr-cuda-worker: the process an isolated device runs its GPU work in
// (docs/design.md, "Isolated device"). Started by the service process's
// supervisor with the name of an abstract Unix socket to connect to. It is an
// in-process user of this library: it opens the device, registers the shared
// arena as pinned memory, and runs each request it is sent as the same
// co_await the service would have made, answering with the result. It exits
// when the service closes the connection (so it never outlives its service),
// and after a sticky fault (having answered the request that met it). Not
// meant to be started by hand.
//
// Usage: atomr-cuda-worker --socket NAME [--ordinal N] [--arena NAME --arena-bytes N
//                          --rings N] [--threads N] [--lanes N] [--no-ring-io-poll]
//                          [--io-spin US] [--inline-launches] [--ring-yield] [--no-cuda]
//                          [--test-faults]
//   --arena        a POSIX shared memory object the service made: the request
//                  rings (--rings of them), then the arena of --arena-bytes
//                  (the bulk data path, registered with cudaHostRegister)
//   --threads      threads running the worker's io_context (default 1: the
//                  ring threads run its handlers too, below; more threads
//                  sleeping in it are woken by every post and were slower)
//   --no-ring-io-poll  a ring thread runs only its own requests' handlers.
//                  By default a ring thread with requests in flight also runs
//                  the worker io_context's handlers between its own: the
//                  device's completion polling runs there, so an operation's
//                  completion is found without waking a sleeping thread
//                  (docs/design.md, "The request rings"; measured in
//                  docs/performance.md, "Isolated device")
//   --io-spin      the io_context's threads keep looking for handlers for
//                  this many microseconds after the last one ran before they
//                  sleep (default 0: they sleep at once). 0 to 10000
//   --inline-launches  a ring thread launches a request's library call
//                  itself whenever the stream is idle. By default, while it
//                  has other requests in flight, it hands the launch to the
//                  stream's launch thread (detail::prefer_batching) and goes
//                  on serving its ring: launching inline, one ring thread
//                  whose requests were spread over several lanes did ~40% of
//                  the in-process rate at T = 1 (docs/design.md, "The
//                  request rings")
//   --lanes N      the ring threads spread the operations they choose a lane
//                  for (by the buffer each writes) over N lanes of an actor,
//                  up to its max_lanes (detail::spread_lanes; default 6): a
//                  lane's launches run on its stream's launch thread, and the
//                  four ring threads alone kept four of them busy. 0: one
//                  lane per ring thread, as before session 33 (docs/design.md,
//                  "The request rings")
//   --ring-yield   a ring thread waiting for its requests' completions (or
//                  spinning before it sleeps) gives its core away on each
//                  turn (sched_yield) instead of a pause instruction, so
//                  that launch threads waiting for a core get it sooner
//                  (an experiment of session 33; off by default)
//   --no-cuda      do not touch CUDA (the hello reports device_unavailable):
//                  for the supervision tests on machines without a GPU
//   --test-faults  accept fault injection (tests only): abort, SIGKILL, hang,
//                  clean exit, and as requests an illegal-address kernel and a
//                  kernel that never ends
//   --test-no-arena  behave as if --arena could not be mapped (tests only)
#include "../cpu_relax.hpp"
#include "protocol.hpp"
#include "ring.hpp"
#include "test_kernels.hpp"
#include "worker_actors.hpp"

#include <atomr/cuda.hpp>
#include <atomr/cuda/detail/buffer_state.hpp>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <complex>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace asio = boost::asio;
namespace wire = atomr::cuda::detail::wire;
namespace cu = atomr::cuda;
using cu::errc;
using cu::result;

namespace {

/// with_type's argument for a tag it does not know.
struct unknown_type {};

struct args {
  std::string socket;
  std::string arena;
  std::uint64_t arena_bytes = 0;
  std::size_t rings = 0;
  int ordinal = 0;
  int threads = 1;
  std::size_t lanes = 6;  // --lanes: the ring threads' spread_lanes (0: one lane per ring)
  bool ring_io_poll = true;
  bool defer_launches = true;  // --inline-launches turns it off
  bool ring_yield = false;     // --ring-yield
  std::chrono::microseconds io_spin{0};
  bool no_cuda = false;
  bool test_faults = false;
  bool test_no_arena = false;
};

int usage(const char* why) {
  std::fprintf(stderr,
               "atomr-cuda-worker: %s\n"
               "usage: atomr-cuda-worker --socket NAME [--ordinal N] [--arena NAME --arena-bytes "
               "N --rings N] [--threads N] [--lanes N] [--no-ring-io-poll] [--io-spin US] "
               "[--inline-launches] [--ring-yield] [--no-cuda] [--test-faults] [--test-no-arena]\n"
               "(started by an isolated atomr::cuda::device; not meant to be run by hand)\n",
               why);
  return 64;
}

/// Runs `io` until it stops, like io.run(); with `spin`, a thread that ran
/// a handler keeps looking for the next one for `spin` before it blocks.
void run_io(asio::io_context& io, std::chrono::microseconds spin) {
  if (spin.count() == 0) {
    io.run();
    return;
  }
  using clock = std::chrono::steady_clock;
  auto last = clock::now();
  while (!io.stopped()) {
    if (io.poll_one()) {
      last = clock::now();
    } else if (clock::now() - last < spin) {
      cu::detail::cpu_relax();
    } else {
      io.run_one();
      last = clock::now();
    }
  }
}

[[noreturn]] void inject(wire::fault_kind f) {
  std::fprintf(stderr, "atomr-cuda-worker: injecting fault %d on request\n", static_cast<int>(f));
  std::fflush(stderr);
  switch (f) {
    case wire::fault_kind::abort_process:
      std::abort();
    case wire::fault_kind::kill_self:
      ::kill(::getpid(), SIGKILL);
      break;
    case wire::fault_kind::exit_cleanly:
      std::_Exit(0);
    case wire::fault_kind::hang:
      // Stops answering, which is what a process stuck in a driver call looks like.
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    default:
      break;
  }
  std::fprintf(stderr, "atomr-cuda-worker: unknown fault %d\n", static_cast<int>(f));
  std::_Exit(66);
}

/// Calls f(T{}) for the element type `t` names (any of the twelve); for an
/// unknown tag, f's result type with invalid_argument. Works for coroutines
/// too: f then returns an awaitable, which is returned as is.
template <class F>
auto with_type(std::uint32_t t, F&& f) -> decltype(f(float{})) {
  switch (static_cast<cu::dtype>(t)) {
    case cu::dtype::f32:
      return f(float{});
    case cu::dtype::f64:
      return f(double{});
    case cu::dtype::f16:
      return f(cu::half{});
    case cu::dtype::bf16:
      return f(cu::bfloat16{});
    case cu::dtype::c32:
      return f(std::complex<float>{});
    case cu::dtype::c64:
      return f(std::complex<double>{});
    case cu::dtype::i8:
      return f(std::int8_t{});
    case cu::dtype::i32:
      return f(std::int32_t{});
    case cu::dtype::i64:
      return f(std::int64_t{});
    case cu::dtype::u8:
      return f(std::uint8_t{});
    case cu::dtype::u32:
      return f(std::uint32_t{});
    case cu::dtype::u64:
      return f(std::uint64_t{});
  }
  return f(unknown_type{});
}

/// The worker's state: the device, the buffers and actors the service made,
/// the arena, and the one connection with its write queue.
class worker {
public:
  worker(asio::io_context& io, asio::local::stream_protocol::socket s, const args& a)
      : io_(io), sock_(std::move(s)), wstrand_(asio::make_strand(io)), a_(a) {}

  /// Maps the arena and opens the device: the hello's status and message.
  std::pair<int, std::string> open() {
    if (!a_.arena.empty()) {
      namespace ipc = boost::interprocess;
      try {
        if (a_.test_no_arena) throw std::runtime_error("made to fail by --test-no-arena");
        const std::size_t rings = std::min(a_.rings, wire::max_rings);
        const wire::region_layout layout{rings};
        ipc::shared_memory_object shm(ipc::open_only, a_.arena.c_str(), ipc::read_write);
        auto m = std::make_unique<ipc::mapped_region>(shm, ipc::read_write, 0,
                                                      layout.bytes() + a_.arena_bytes);
        auto* base = static_cast<std::byte*>(m->get_address());
        const auto* h = reinterpret_cast<const wire::region_header*>(base);
        if (rings == 0 || h->magic != wire::ring_magic || h->rings != rings)
          throw std::runtime_error("the request rings are not laid out as --rings says");
        rings_ = wire::region_view::map(base, rings, false);
        arena_base_ = base + layout.bytes();
        arena_ = std::move(m);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "atomr-cuda-worker: cannot map the arena %s: %s\n", a_.arena.c_str(),
                     e.what());
      }
    }
    if (a_.no_cuda) return {static_cast<int>(errc::device_unavailable), "started with --no-cuda"};
    auto d = cu::device::open(io_.get_executor(), a_.ordinal);
    if (!d) return {static_cast<int>(d.error().code()), d.error().message()};
    dev_ = d.value();
    host_.emplace(dev_, [this](std::uint64_t handle) { return buffer(handle); });
    if (arena_) {
      // The DMA engines read and write the arena directly: no staging copy.
      if (auto e =
              cudaHostRegister(arena_->get_address(), arena_->get_size(), cudaHostRegisterDefault);
          e != cudaSuccess)
        return {static_cast<int>(errc::device_unavailable),
                std::string("cudaHostRegister of the arena: ") + cudaGetErrorString(e)};
    }
    if (a_.test_faults) {
      // The fault kernels are NVRTC-compiled on a thread of their own, now:
      // a compile takes 0.1 s to seconds on a cold host, and made at the
      // first fault request on an io thread it held heartbeats past their
      // timeout (a fault then took a hang's restart). fault() waits for it.
      const int ordinal = a_.ordinal;
      kernels_ =
          std::async(std::launch::async, [ordinal] {
            if (auto e = cudaSetDevice(ordinal); e != cudaSuccess)
              throw std::runtime_error(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
            const auto t0 = std::chrono::steady_clock::now();
            auto k = std::make_shared<const cu::test::test_kernels>();
            std::fprintf(
                stderr, "atomr-cuda-worker: fault kernels compiled in %.0f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
            return k;
          }).share();
    }
    return {0, "device " + std::to_string(a_.ordinal) + " opened"};
  }

  bool arena_mapped() const { return arena_ != nullptr; }

  /// Starts one thread per request ring (after open(): requests pushed
  /// before wait in the rings).
  void start_rings(std::vector<std::thread>& threads) {
    if (!arena_) return;
    for (std::size_t r = 0; r < rings_.rings; ++r)
      threads.emplace_back([this, r] { ring_loop(r); });
  }

  /// Sends one message (any thread); writes are serialised on a strand.
  void send(std::vector<std::byte> msg) {
    asio::post(wstrand_, [this, msg = std::move(msg)]() mutable {
      outq_.push_back(std::move(msg));
      if (!writing_) write_next();
    });
  }

  asio::awaitable<void> read_loop() {
    std::vector<char> payload;
    for (;;) {
      wire::header h;
      boost::system::error_code ec;
      co_await asio::async_read(sock_, asio::buffer(&h, sizeof h),
                                asio::redirect_error(asio::use_awaitable, ec));
      if (ec) quit(0);  // the service closed the connection (or is gone)
      if (h.size > wire::max_payload) {
        std::fprintf(stderr, "atomr-cuda-worker: message of %u bytes refused\n", h.size);
        quit(65);
      }
      payload.resize(h.size);
      if (h.size)
        co_await asio::async_read(sock_, asio::buffer(payload),
                                  asio::redirect_error(asio::use_awaitable, ec));
      if (ec) quit(0);
      on_message(h, payload);
    }
  }

private:
  struct buffer_entry {
    std::shared_ptr<cu::detail::buffer_state> st;
    std::optional<cu::gpu_error> failed;  // the allocation's error
  };

  [[noreturn]] void quit(int code) {
    std::fflush(stderr);
    std::_Exit(code);
  }

  void write_next() {
    if (outq_.empty()) {
      writing_ = false;
      if (dying_.load()) {
        std::fprintf(stderr, "atomr-cuda-worker: the context is poisoned; exiting\n");
        quit(3);
      }
      return;
    }
    writing_ = true;
    asio::async_write(
        sock_, asio::buffer(outq_.front()),
        asio::bind_executor(wstrand_, [this](boost::system::error_code ec, std::size_t) {
          outq_.pop_front();
          if (ec) quit(0);
          write_next();
        }));
  }

  void on_message(const wire::header& h, const std::vector<char>& payload) {
    drain_control();  // allocations announced before this message come first
    switch (static_cast<wire::kind>(h.type)) {
      case wire::kind::ping: {
        wire::pong_payload mem;
        if (dev_ && dev_.accepting() && cudaSetDevice(a_.ordinal) == cudaSuccess) {
          std::size_t f = 0, t = 0;
          if (cudaMemGetInfo(&f, &t) == cudaSuccess) {
            mem.free_bytes = f;
            mem.total_bytes = t;
          } else {
            cudaGetLastError();
          }
        }
        send(wire::encode(wire::kind::pong, 0, h.id, wire::bytes_of(mem)));
        return;
      }
      case wire::kind::bye:
        quit(0);
      case wire::kind::checksum:
        return checksum(h, payload);
      case wire::kind::fault:
        if (!a_.test_faults) {
          std::fprintf(stderr, "atomr-cuda-worker: fault injection refused (no --test-faults)\n");
          return;
        }
        inject(static_cast<wire::fault_kind>(h.arg));
      case wire::kind::release:
        return release(h.arg, payload);
      case wire::kind::call:
        if (static_cast<wire::op_code>(h.arg) == wire::op_code::alloc) return alloc(payload);
        // Each request runs as its own coroutine: the next message is read
        // while its GPU work runs.
        asio::co_spawn(io_, run_call(h.id, static_cast<wire::op_code>(h.arg), payload),
                       asio::detached);
        return;
      default:
        std::fprintf(stderr, "atomr-cuda-worker: unknown message type %u ignored\n",
                     static_cast<unsigned>(h.type));
        return;
    }
  }

  void checksum(const wire::header& h, const std::vector<char>& payload) {
    if (!a_.test_faults) return;
    std::uint64_t range[2] = {0, 0};
    if (payload.size() >= sizeof range) std::memcpy(range, payload.data(), sizeof range);
    const bool ok = arena_ && range[0] <= a_.arena_bytes && range[1] <= a_.arena_bytes - range[0];
    std::uint64_t hash = 0;
    if (ok) hash = wire::fnv1a(arena_base_ + range[0], range[1]);
    send(wire::encode(wire::kind::checksum_result, ok ? 0 : 1, h.id, wire::bytes_of(hash)));
  }

  void release(std::uint16_t kind, const std::vector<char>& payload) {
    std::uint64_t id = 0;
    if (!wire::read_pod(payload, id)) return;
    std::unique_lock lk(mu_);
    if (static_cast<wire::release_kind>(kind) == wire::release_kind::buffer) {
      buffers_.erase(id);  // freed stream-ordered once the work using it is done
      return;
    }
    if (static_cast<wire::release_kind>(kind) == wire::release_kind::recording) {
      recordings_.erase(id);  // its graph lives on until its last replay is done
      return;
    }
    lk.unlock();
    if (host_) host_->release(id);
  }

  /// Allocates in the read loop, so that it happens before any later request.
  void alloc(const std::vector<char>& payload) {
    wire::alloc_args a;
    if (!wire::read_pod(payload, a)) return;
    buffer_entry e;
    if (!dev_) {
      e.failed = cu::make_error(errc::device_unavailable, "the worker has no device");
    } else {
      auto r = with_type(a.type, [&](auto t) -> result<void> {
        using T = decltype(t);
        if constexpr (std::is_same_v<T, unknown_type>) {
          return cu::make_error(errc::invalid_argument, "worker: unknown element type");
        } else {
          BOOST_OUTCOME_TRY(auto ref, dev_.allocate<T>(a.count));
          e.st = ref.state();
          return cu::outcome::success();
        }
      });
      if (!r) e.failed = r.error();
    }
    std::lock_guard lk(mu_);
    buffers_[a.handle] = std::move(e);
  }

  /// The buffer `handle` names (the allocation's error if it failed).
  result<std::shared_ptr<cu::detail::buffer_state>> buffer(std::uint64_t handle) {
    std::lock_guard lk(mu_);
    auto it = buffers_.find(handle);
    if (it == buffers_.end())
      return cu::make_error(errc::stale_ref,
                            "buffer " + std::to_string(handle) +
                                " is unknown to this worker (freed, or made before a restart)");
    if (it->second.failed) return *it->second.failed;
    return it->second.st;
  }

  /// The view `r` of a buffer of element type T, checked.
  template <class T>
  result<cu::gpu_ref<T>> view(const wire::ref_arg& r) {
    BOOST_OUTCOME_TRY(auto st, buffer(r.handle));
    return cu::detail::worker_side::checked_view<T>(std::move(st), r);
  }

  /// Arena bytes [off, off + bytes), checked.
  result<std::byte*> arena_at(std::uint64_t off, std::uint64_t bytes) {
    if (!arena_ || off > a_.arena_bytes || bytes > a_.arena_bytes - off)
      return cu::make_error(errc::invalid_argument, "worker: range outside the arena");
    return arena_base_ + off;
  }

  result<cu::stream> transfer_stream() {
    return dev_.acquire_stream(cu::stream_policy::pooled, "worker");
  }

  /// A host <-> device copy between the arena (registered: DMA) and `ref`.
  template <class T>
  asio::awaitable<result<void>> arena_copy(const wire::transfer_args& a, bool up) {
    if (auto* u = cu::detail::unit_of(co_await asio::this_coro::executor); u && u->capture)
      co_return cu::make_error(errc::not_supported,
                               "worker: transfers through the arena cannot be recorded");
    BOOST_OUTCOME_CO_TRY(auto ref, view<T>(a.ref));
    BOOST_OUTCOME_CO_TRY(std::byte * host, arena_at(a.arena_offset, ref.size_bytes()));
    BOOST_OUTCOME_CO_TRY(auto s, transfer_stream());
    const auto how = dev_.options().default_completion;
    auto r = co_await cu::run_kernel(
        "cuda", s, how, std::tuple<>{}, [&](cu::launch& l) -> result<cu::gpu_ref<T>> {
          cudaError_t e;
          if (up) {
            BOOST_OUTCOME_TRY(T * p, l.write(ref));
            e = cudaMemcpyAsync(p, host, ref.size_bytes(), cudaMemcpyHostToDevice,
                                l.native_stream());
          } else {
            BOOST_OUTCOME_TRY(const T* p, l.read(ref));
            e = cudaMemcpyAsync(host, p, ref.size_bytes(), cudaMemcpyDeviceToHost,
                                l.native_stream());
          }
          if (e != cudaSuccess) return cu::classify(e, "cudaMemcpyAsync");
          return ref;
        });
    if (!r) co_return r.error();
    co_return cu::outcome::success();
  }

  template <class T>
  asio::awaitable<result<void>> gemm(const wire::gemm_args& w) {
    BOOST_OUTCOME_CO_TRY(auto a, view<T>(w.a));
    BOOST_OUTCOME_CO_TRY(auto b, view<T>(w.b));
    BOOST_OUTCOME_CO_TRY(auto c, view<T>(w.c));
    BOOST_OUTCOME_CO_TRY(auto actor, blas_for(w));
    cu::gemm_params p;
    p.transa = static_cast<cu::blas_op>(w.transa);
    p.transb = static_cast<cu::blas_op>(w.transb);
    p.m = w.m;
    p.n = w.n;
    p.k = w.k;
    p.lda = w.lda;
    p.ldb = w.ldb;
    p.ldc = w.ldc;
    p.alpha = w.alpha;
    p.beta = w.beta;
    BOOST_OUTCOME_CO_TRY(co_await actor.gemm(p, a, b, c));
    co_return cu::outcome::success();
  }

  /// The worker's twin of the service's blas actor `w.actor` (made at its
  /// first call with the service actor's options; its math mode follows set_tf32).
  result<cu::blas_actor> blas_for(const wire::gemm_args& w) {
    wire::actor_settings s;
    s.has_streams = w.has_streams;
    s.streams = w.streams;
    s.flags =
        static_cast<std::uint8_t>((w.tf32 ? wire::tf32 : 0) | (w.lt_matmul ? wire::lt_matmul : 0));
    s.max_lanes = static_cast<std::uint32_t>(w.max_lanes);
    s.cache = w.cuda_graph_cache;
    return host_->blas(w.actor, s);
  }

  asio::awaitable<result<void>> fault(std::uint16_t kind) {
    if (!a_.test_faults)
      co_return cu::make_error(errc::invalid_argument,
                               "worker: fault injection refused (no --test-faults)");
    if (!kernels_.valid())
      co_return cu::make_error(errc::device_unavailable, "worker: no fault kernels (no device)");
    // Compiled since the device opened (open()); wait without blocking this thread.
    for (asio::steady_timer t(io_);
         kernels_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;) {
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(asio::use_awaitable);
    }
    std::shared_ptr<const cu::test::test_kernels> k;
    try {
      k = kernels_.get();
    } catch (const std::exception& e) {
      co_return cu::make_error(errc::library, std::string("worker: test kernels: ") + e.what());
    }
    BOOST_OUTCOME_CO_TRY(auto s, transfer_stream());
    const auto f = static_cast<wire::fault_kind>(kind);
    std::fprintf(stderr, "atomr-cuda-worker: injecting GPU fault %d on request\n", kind);
    auto r = co_await cu::run_kernel(
        "cuda", s, dev_.options().default_completion, std::tuple<>{},
        [&](cu::launch& l) -> result<std::tuple<>> {
          cudaError_t e =
              f == wire::fault_kind::illegal_address
                  ? k->write_to(l.native_stream(), 0x10, 1)
                  : k->spin(l.native_stream(), 1e12);  // never ends, as far as anyone waits
          if (e != cudaSuccess) return cu::classify(e, "cudaLaunchKernel");
          return std::tuple<>{};
        });
    if (!r) co_return r.error();
    co_return cu::outcome::success();
  }

  asio::awaitable<result<void>> dispatch(wire::op_code op, const std::vector<char>& payload) {
    if (!dev_) co_return cu::make_error(errc::device_unavailable, "the worker has no device");
    auto bad = [] { return cu::make_error(errc::invalid_argument, "worker: short request"); };
    switch (op) {
      case wire::op_code::upload:
      case wire::op_code::download: {
        wire::transfer_args a;
        if (!wire::read_pod(payload, a)) co_return bad();
        const bool up = op == wire::op_code::upload;
        co_return co_await typed(a.type, [&](auto t) -> asio::awaitable<result<void>> {
          co_return co_await arena_copy<decltype(t)>(a, up);
        });
      }
      case wire::op_code::copy: {
        wire::copy_args a;
        if (!wire::read_pod(payload, a)) co_return bad();
        co_return co_await typed(a.type, [&](auto t) -> asio::awaitable<result<void>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto src, view<T>(a.src));
          BOOST_OUTCOME_CO_TRY(auto dst, view<T>(a.dst));
          BOOST_OUTCOME_CO_TRY(auto s, transfer_stream());
          BOOST_OUTCOME_CO_TRY(co_await cu::copy(src, dst, {.on = s}));
          co_return cu::outcome::success();
        });
      }
      case wire::op_code::fill_bytes: {
        wire::fill_args a;
        if (!wire::read_pod(payload, a)) co_return bad();
        co_return co_await typed(a.type, [&](auto t) -> asio::awaitable<result<void>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto dst, view<T>(a.dst));
          BOOST_OUTCOME_CO_TRY(auto s, transfer_stream());
          BOOST_OUTCOME_CO_TRY(
              co_await cu::fill_bytes(dst, static_cast<unsigned char>(a.value), {.on = s}));
          co_return cu::outcome::success();
        });
      }
      case wire::op_code::gemm: {
        wire::gemm_args w;
        if (!wire::read_pod(payload, w)) co_return bad();
        co_return co_await typed(w.type, [&](auto t) -> asio::awaitable<result<void>> {
          using T = decltype(t);
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                        std::is_same_v<T, cu::half> || std::is_same_v<T, cu::bfloat16>)
            co_return co_await gemm<T>(w);
          else
            co_return cu::make_error(errc::invalid_argument, "worker: gemm of this element type");
        });
      }
      case wire::op_code::fault: {
        std::uint16_t k = 0;
        if (!wire::read_pod(payload, k)) co_return bad();
        co_return co_await fault(k);
      }
      default:
        co_return cu::make_error(errc::not_supported, "worker: unknown request");
    }
  }

  /// Awaits f(T{}) for the element type `t` (any of the twelve).
  template <class F>
  asio::awaitable<result<void>> typed(std::uint32_t t, F&& f) {
    return with_type(t, [&](auto v) -> asio::awaitable<result<void>> {
      if constexpr (std::is_same_v<decltype(v), unknown_type>)
        return unknown_tag();
      else
        return f(v);
    });
  }
  static asio::awaitable<result<void>> unknown_tag() {
    co_return cu::make_error(errc::invalid_argument, "worker: unknown element type");
  }

  asio::awaitable<void> run_call(std::uint64_t id, wire::op_code op, std::vector<char> payload) {
    const auto r = co_await answer_of(op, payload);
    if (r) {
      send(wire::encode(wire::kind::reply, 0, id, r.value()));
      co_return;
    }
    send(wire::encode(wire::kind::reply, 1, id, error_payload(r.error())));
  }

  /// A request of ring `ring`, answered through its reply ring (the socket
  /// when the answer does not fit a slot or the ring is full).
  asio::awaitable<void> ring_call(std::size_t ring, wire::ring_message m) {
    result<std::string> r = std::string();
    if (m.oversized)
      r = cu::make_error(errc::invalid_argument,
                         "worker: a request's ring slot claimed more bytes than it holds (the "
                         "shared region was written over)");
    else
      r = co_await answer_of(static_cast<wire::op_code>(m.op), m.payload);
    const std::string answer = r ? r.value() : error_payload(r.error());
    const std::uint16_t arg = r ? 0 : 1;
    if (rings_.replies[ring].push(m.id, arg, 0, answer))
      wire::ring::wake(rings_.header->reader);
    else
      send(wire::encode(wire::kind::reply, arg, m.id, answer));
    --outstanding_[ring];
    if (dying_.load() && !r && r.error().code() == errc::context_poisoned) {
      // Answered; the socket's queue may still hold answers: the writer
      // exits once it is empty, and here the process exits if it is idle.
      asio::post(wstrand_, [this] {
        if (!writing_) {
          std::fprintf(stderr, "atomr-cuda-worker: the context is poisoned; exiting\n");
          quit(3);
        }
      });
    }
  }

  /// The error as a reply's payload; a poisoned context makes the worker exit
  /// once its answers are out.
  std::string error_payload(const cu::gpu_error& e) {
    if (e.code() == errc::context_poisoned) dying_.store(true);
    return wire::encode_error(static_cast<std::int32_t>(e.code()), e.native_status(), e.library(),
                              e.message());
  }

  /// A request's answer: its bytes (empty but for operations yielding a value).
  asio::awaitable<result<std::string>> answer_of(wire::op_code op,
                                                 const std::vector<char>& payload) {
    result<std::string> r = std::string();
    if (dying_.load()) {
      r = cu::make_error(errc::context_poisoned,
                         "the worker's CUDA context is poisoned by an earlier fault; it exits");
    } else {
      try {
        std::vector<char> moved;
        const bool indirect = op == wire::op_code::indirect;
        if (indirect) {
          // The payload is in the arena: copied out, then answered as its request.
          wire::indirect_args a;
          if (!wire::read_pod(payload, a)) co_return cu::detail::worker_side::short_request();
          auto at = arena_at(a.arena_offset, a.size);
          if (!at) co_return at.error();
          const char* from = reinterpret_cast<const char*>(at.value());
          moved.assign(from, from + a.size);
          op = static_cast<wire::op_code>(a.op);
          if (op == wire::op_code::indirect)
            co_return cu::make_error(errc::invalid_argument, "worker: an indirect request in one");
        }
        // An indirect request's body is what it points at, even when empty
        // (then the answer is the operation's own "short request" error).
        const auto& body = indirect ? moved : payload;
        if (op == wire::op_code::unit || op == wire::op_code::record)
          r = co_await run_unit(body, op == wire::op_code::record);
        else
          r = co_await answer_one(op, body);
      } catch (const std::exception& e) {
        r = cu::make_error(errc::library, std::string("worker: ") + e.what());
      }
    }
    co_return r;
  }

  /// One request (not a unit).
  asio::awaitable<result<std::string>> answer_one(wire::op_code op,
                                                  const std::vector<char>& payload) {
    if (op == wire::op_code::actor) {
      wire::actor_request q;
      if (!wire::parse_actor(payload, q)) co_return cu::detail::worker_side::short_request();
      if (!host_) co_return cu::make_error(errc::device_unavailable, "the worker has no device");
      co_return co_await host_->run(q);
    }
    if (op == wire::op_code::unit || op == wire::op_code::record)
      co_return cu::make_error(errc::invalid_argument, "worker: a unit inside a unit");
    if (op == wire::op_code::replay) co_return co_await replay(payload);
    if (auto done = co_await dispatch(op, payload); !done) co_return done.error();
    co_return std::string();
  }

  /// A composed unit's requests (op_code::unit), run as one unit here: each
  /// enqueued as the service's step would have been, back to back on this
  /// coroutine's unit executor, then one wait (compose()'s own steps and
  /// end, for a number of steps known only now). The first failure stops
  /// it and is named by the service's step number. `recording`
  /// (op_code::record): the same steps recorded into a CUDA graph (record()'s
  /// capture), kept under the head's handle; the answer is its node count.
  asio::awaitable<result<std::string>> run_unit(const std::vector<char>& payload, bool recording) {
    namespace det = cu::detail;
    wire::unit_head head;
    std::vector<wire::unit_request> steps;
    if (!wire::parse_unit(payload, head, steps))
      co_return cu::make_error(errc::invalid_argument, "worker: malformed unit request");
    if (!dev_) co_return cu::make_error(errc::device_unavailable, "the worker has no device");
    det::unit_recorder rec;
    std::unique_ptr<det::unit_capture> cap;
    if (recording) {
      BOOST_OUTCOME_CO_TRY(cap, det::begin_recording(dev_));
      rec.capture = cap.get();
      rec.name = "record";
    }
    const det::unit_executor ex(co_await asio::this_coro::executor, &rec);
    std::optional<cu::gpu_error> failed;
    const std::size_t n = head.steps;
    auto body = [&]() -> asio::awaitable<void> {
      for (const auto& q : steps) {
        rec.step = q.step;
        auto r = co_await answer_one(static_cast<wire::op_code>(q.op), q.payload);
        if (rec.pending_failure) {
          failed = det::unit_step_error(rec.pending_failure->second, rec.pending_failure->first, n,
                                        rec.name);
          break;
        }
        if (!r) {
          failed = det::unit_step_error(r.error(), q.step, n, rec.name);
          break;
        }
      }
      if (!rec.pending.empty() && !det::flush_pending(rec, cu::stream{}) && !failed)
        failed = det::unit_step_error(rec.pending_failure->second, rec.pending_failure->first, n,
                                      rec.name);
      if (auto closed = rec.close_runs(); !closed && !failed) failed = closed.error();
    };
    result<void> ended = cu::outcome::success();
    try {
      co_await asio::co_spawn(ex, body(), asio::use_awaitable);
      if (recording) {
        auto st = det::end_recording(*cap, std::move(failed), n);
        if (!st) co_return st.error();
        const std::uint64_t nodes = cu::recorded_unit(st.value()).nodes();
        std::lock_guard lk(mu_);
        recordings_[head.handle] = cu::recorded_unit(std::move(st).value());
        co_return std::string(wire::bytes_of(nodes));
      }
      ended = co_await det::finish_unit(rec, dev_.options().default_completion, std::move(failed));
    } catch (...) {
      const auto e = failed ? *failed
                            : cu::make_error(errc::library,
                                             "worker: the unit was torn down by "
                                             "an exception");
      det::abandon_unit(rec, e);
      ended = e;
    }
    if (!ended) co_return ended.error();
    co_return std::string();
  }

  /// op_code::replay: one of the recordings this worker keeps, launched.
  asio::awaitable<result<std::string>> replay(const std::vector<char>& payload) {
    std::uint64_t handle = 0;
    if (!wire::read_pod(payload, handle))
      co_return cu::make_error(errc::invalid_argument, "worker: short request");
    cu::recorded_unit unit;
    {
      std::lock_guard lk(mu_);
      if (auto it = recordings_.find(handle); it != recordings_.end()) unit = it->second;
    }
    if (!unit)
      co_return cu::make_error(errc::stale_ref,
                               "replay: the recording is unknown to this worker (made before a "
                               "restart, or dropped)");
    BOOST_OUTCOME_CO_TRY(co_await cu::replay(unit, dev_.options().default_completion));
    co_return std::string();
  }

  /// Allocations and releases the service put in the control ring, applied
  /// before any request is dispatched (any thread; one at a time).
  void drain_control() {
    if (!arena_) return;
    if (rings_.control.claimed() == control_done_.load(std::memory_order_acquire)) return;
    std::lock_guard lk(control_mu_);
    wire::ring_message m;
    while (rings_.control.pop(m)) {
      if (m.oversized)
        std::fprintf(stderr,
                     "atomr-cuda-worker: a control message claimed more bytes than its "
                     "slot holds; ignored\n");
      else if (m.op == static_cast<std::uint16_t>(wire::kind::call) &&
               m.arg == static_cast<std::uint16_t>(wire::op_code::alloc))
        alloc(m.payload);
      else if (m.op == static_cast<std::uint16_t>(wire::kind::release))
        release(m.arg, m.payload);
      control_done_.fetch_add(1, std::memory_order_release);
    }
  }

  /// One request ring's thread: takes requests, runs each as a coroutine on
  /// this thread's own io_context (their GPU completions come back here),
  /// answers through the ring's reply ring. Spins while it has work or had
  /// some within `idle_spin`; with requests in flight and nothing new for
  /// `busy_spin`, it naps in short waits for their completions; idle, it
  /// sleeps on the ring's semaphore, which a service thread posts. With
  /// requests in flight it also runs a handler of the worker's io_context
  /// per turn (unless --no-ring-io-poll): the device's completion polling
  /// runs there, and a handler posted by this thread's launch may otherwise
  /// wait for a sleeping io thread to wake up. While it has more than one
  /// request in flight, its library calls go to the streams' launch threads
  /// (unless --inline-launches), so that launching never holds up the ring.
  void ring_loop(std::size_t r) {
    using clock = std::chrono::steady_clock;
    constexpr auto idle_spin = std::chrono::microseconds(200);
    constexpr auto busy_spin = std::chrono::microseconds(1000);
    asio::io_context rio(1);
    auto guard = asio::make_work_guard(rio);
    cu::detail::spread_lanes(a_.lanes);
    auto& q = rings_.requests[r];
    auto last = clock::now();
    for (;;) {
      std::size_t n = 0;
      if (q.ready()) {
        wire::ring_message m;
        while (q.pop(m)) {
          // The allocations announced before this request first: a burst's
          // later requests may name buffers announced after an earlier drain.
          drain_control();
          ++n;
          ++outstanding_[r];
          asio::co_spawn(rio, ring_call(r, std::move(m)), asio::detached);
        }
      }
      // With other requests in flight, this thread's launches go to the
      // streams' launch threads (--inline-launches: never).
      if (a_.defer_launches) cu::detail::prefer_batching(outstanding_[r] > 1);
      n += rio.poll();
      if (outstanding_[r] > 0 && a_.ring_io_poll) n += io_.poll_one();
      const auto now = clock::now();
      if (n) {
        last = now;
        continue;
      }
      const auto idle = now - last;
      if (outstanding_[r] > 0) {
        if (idle < busy_spin)
          spin_turn();
        else if (rio.run_one_for(std::chrono::microseconds(50)))
          last = clock::now();
        continue;
      }
      if (idle < idle_spin) {
        spin_turn();
        continue;
      }
      q.sleep(std::chrono::milliseconds(100));
      last = clock::now();
    }
  }

  /// One turn of a ring thread's spin: a pause, or with --ring-yield the core
  /// given to another thread that waits for one.
  void spin_turn() const {
    if (a_.ring_yield)
      std::this_thread::yield();
    else
      cu::detail::cpu_relax();
  }

  asio::io_context& io_;
  asio::local::stream_protocol::socket sock_;
  asio::strand<asio::io_context::executor_type> wstrand_;
  const args& a_;
  std::unique_ptr<boost::interprocess::mapped_region> arena_;  // rings, then arena
  std::byte* arena_base_ = nullptr;
  wire::region_view rings_;
  std::size_t outstanding_[wire::max_rings] = {};  // ring r's, on its thread only
  std::mutex control_mu_;
  std::atomic<std::uint64_t> control_done_{0};
  cu::device dev_;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, buffer_entry> buffers_;          // guarded by mu_
  std::unordered_map<std::uint64_t, cu::recorded_unit> recordings_;  // guarded by mu_
  std::optional<cu::detail::worker_side::actor_host> host_;          // set by open()
  /// --test-faults: the fault kernels, compiled by open() on a thread of their own.
  std::shared_future<std::shared_ptr<const cu::test::test_kernels>> kernels_;
  std::deque<std::vector<std::byte>> outq_;  // on wstrand_
  bool writing_ = false;                     // on wstrand_
  std::atomic<bool> dying_{false};
};

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--socket" && i + 1 < argc)
      a.socket = argv[++i];
    else if (s == "--arena" && i + 1 < argc)
      a.arena = argv[++i];
    else if (s == "--arena-bytes" && i + 1 < argc)
      a.arena_bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (s == "--rings" && i + 1 < argc)
      a.rings = std::strtoull(argv[++i], nullptr, 10);
    else if (s == "--ordinal" && i + 1 < argc)
      a.ordinal = std::atoi(argv[++i]);
    else if (s == "--threads" && i + 1 < argc)
      a.threads = std::max(1, std::atoi(argv[++i]));
    else if (s == "--lanes" && i + 1 < argc)
      a.lanes = std::strtoull(argv[++i], nullptr, 10);
    else if (s == "--ring-io-poll")  // the default; kept for older command lines
      a.ring_io_poll = true;
    else if (s == "--no-ring-io-poll")
      a.ring_io_poll = false;
    else if (s == "--io-spin" && i + 1 < argc)
      a.io_spin = std::chrono::microseconds(std::clamp(std::atol(argv[++i]), 0L, 10000L));
    else if (s == "--inline-launches")
      a.defer_launches = false;
    else if (s == "--ring-yield")
      a.ring_yield = true;
    else if (s == "--no-cuda")
      a.no_cuda = true;
    else if (s == "--test-faults")
      a.test_faults = true;
    else if (s == "--test-no-arena")
      a.test_no_arena = true;
    else
      return usage(("unknown argument " + s).c_str());
  }
  if (a.socket.empty()) return usage("--socket is required");

  asio::io_context io;
  asio::local::stream_protocol::socket sock(io);
  boost::system::error_code ec;
  // An abstract socket name (Linux): a leading NUL, nothing on the file system.
  sock.connect(asio::local::stream_protocol::endpoint(std::string(1, '\0') + a.socket), ec);
  if (ec) {
    std::fprintf(stderr, "atomr-cuda-worker: cannot connect to the service: %s\n",
                 ec.message().c_str());
    return 69;
  }
  worker w(io, std::move(sock), a);
  // The arena is mapped before the hello, so that the service may remove its
  // name once the hello says it is mapped.
  const auto [status, message] = w.open();
  if (status != 0) std::fprintf(stderr, "atomr-cuda-worker: %s\n", message.c_str());
  w.send(wire::encode(wire::kind::hello, 0, 0,
                      wire::hello_payload(::getpid(), status, w.arena_mapped(), message)));
  asio::co_spawn(io, w.read_loop(), asio::detached);
  std::vector<std::thread> more;
  w.start_rings(more);
  for (int i = 1; i < a.threads; ++i) more.emplace_back([&] { run_io(io, a.io_spin); });
  run_io(io, a.io_spin);
  for (auto& t : more) t.join();
  return 0;
}
