// atomr-cuda-worker: the process an isolated device runs its GPU work in
// (docs/design.md, "Isolated device"). Started by the service process's
// supervisor with the name of an abstract Unix socket to connect to; it
// answers heartbeats and exits when the service closes the connection, so it
// never outlives its service. Not meant to be started by hand.
//
// Usage: atomr-cuda-worker --socket NAME [--ordinal N] [--arena NAME --arena-bytes N]
//                          [--no-cuda] [--test-faults]
//   --arena        a POSIX shared memory object the service made: the bulk data
//                  path (mapped here; registered as pinned memory with the GPU
//                  work path, not built yet)
//   --no-cuda      do not touch CUDA (the hello reports device_unavailable):
//                  for the supervision tests on machines without a GPU
//   --test-faults  accept the fault-injection message (tests only): abort,
//                  SIGKILL, hang, clean exit
#include "protocol.hpp"

#include <atomr/cuda/error.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <memory>
#include <thread>

namespace asio = boost::asio;
namespace wire = atomr::cuda::detail::wire;
using atomr::cuda::errc;

namespace {

struct args {
  std::string socket;
  std::string arena;
  std::uint64_t arena_bytes = 0;
  int ordinal = 0;
  bool no_cuda = false;
  bool test_faults = false;
};

int usage(const char* why) {
  std::fprintf(stderr,
               "atomr-cuda-worker: %s\n"
               "usage: atomr-cuda-worker --socket NAME [--ordinal N] [--no-cuda] [--test-faults]\n"
               "(started by an isolated atomr::cuda::device; not meant to be run by hand)\n",
               why);
  return 64;
}

/// Opens the device (cudaSetDevice + cudaFree(0) creates the context): the
/// hello's status, 0 on success, with CUDA's message otherwise.
std::pair<int, std::string> open_device(const args& a) {
  if (a.no_cuda) return {static_cast<int>(errc::device_unavailable), "started with --no-cuda"};
  if (auto e = cudaSetDevice(a.ordinal); e != cudaSuccess)
    return {static_cast<int>(errc::device_unavailable),
            std::string("cudaSetDevice: ") + cudaGetErrorString(e)};
  if (auto e = cudaFree(nullptr); e != cudaSuccess)
    return {static_cast<int>(errc::device_unavailable),
            std::string("cudaFree(0): ") + cudaGetErrorString(e)};
  return {0, "device " + std::to_string(a.ordinal) + " opened"};
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
      std::exit(0);
    case wire::fault_kind::hang:
      // Stops answering, which is what a kernel that never ends looks like.
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  std::fprintf(stderr, "atomr-cuda-worker: unknown fault %d\n", static_cast<int>(f));
  std::exit(66);
}

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
    else if (s == "--ordinal" && i + 1 < argc)
      a.ordinal = std::atoi(argv[++i]);
    else if (s == "--no-cuda")
      a.no_cuda = true;
    else if (s == "--test-faults")
      a.test_faults = true;
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
  // The shared arena: mapped before the hello, so that the service may
  // remove its name once the hello says it is mapped.
  std::unique_ptr<boost::interprocess::mapped_region> arena;
  if (!a.arena.empty()) {
    namespace ipc = boost::interprocess;
    try {
      ipc::shared_memory_object shm(ipc::open_only, a.arena.c_str(), ipc::read_write);
      arena = std::make_unique<ipc::mapped_region>(shm, ipc::read_write, 0, a.arena_bytes);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "atomr-cuda-worker: cannot map the arena %s: %s\n", a.arena.c_str(),
                   e.what());
    }
  }
  const auto [status, message] = open_device(a);
  if (status != 0) std::fprintf(stderr, "atomr-cuda-worker: %s\n", message.c_str());
  asio::write(sock,
              asio::buffer(
                  wire::encode(wire::kind::hello, 0, 0,
                               wire::hello_payload(::getpid(), status, arena != nullptr, message))),
              ec);
  if (ec) return 70;

  std::vector<char> payload;
  for (;;) {
    wire::header h;
    asio::read(sock, asio::buffer(&h, sizeof h), ec);
    if (ec) return 0;  // the service closed the connection (or is gone): exit
    if (h.size > wire::max_payload) {
      std::fprintf(stderr, "atomr-cuda-worker: message of %u bytes refused\n", h.size);
      return 65;
    }
    payload.resize(h.size);
    if (h.size) asio::read(sock, asio::buffer(payload), ec);
    if (ec) return 0;
    switch (static_cast<wire::kind>(h.type)) {
      case wire::kind::ping:
        asio::write(sock, asio::buffer(wire::encode(wire::kind::pong, 0, h.id)), ec);
        if (ec) return 0;
        break;
      case wire::kind::bye:
        return 0;
      case wire::kind::checksum: {
        if (!a.test_faults) break;
        std::uint64_t range[2] = {0, 0};
        if (payload.size() >= sizeof range) std::memcpy(range, payload.data(), sizeof range);
        const bool ok =
            arena && range[0] <= arena->get_size() && range[1] <= arena->get_size() - range[0];
        std::uint64_t hash = 0;
        if (ok)
          hash = wire::fnv1a(static_cast<const char*>(arena->get_address()) + range[0], range[1]);
        asio::write(sock,
                    asio::buffer(wire::encode(
                        wire::kind::checksum_result, ok ? 0 : 1, h.id,
                        std::string_view(reinterpret_cast<const char*>(&hash), sizeof hash))),
                    ec);
        if (ec) return 0;
        break;
      }
      case wire::kind::fault:
        if (!a.test_faults) {
          std::fprintf(stderr, "atomr-cuda-worker: fault injection refused (no --test-faults)\n");
          break;
        }
        inject(static_cast<wire::fault_kind>(h.arg));
      default:
        std::fprintf(stderr, "atomr-cuda-worker: unknown message type %u ignored\n",
                     static_cast<unsigned>(h.type));
        break;
    }
  }
}
