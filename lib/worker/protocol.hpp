// Private: the messages between a service process and its GPU worker process
// (docs/design.md, "Isolated device"). Not installed. Both ends are built from
// this tree, so the layout is native (same host, same build).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace atomr::cuda::detail::wire {

/// What a message is. Every message is a header followed by `size` bytes.
enum class kind : std::uint16_t {
  hello = 1,  ///< worker -> service, first: pid, the device's status code, its message
  ping = 2,   ///< service -> worker: heartbeat; answered with pong (same id)
  pong = 3,   ///< worker -> service
  fault = 4,  ///< service -> worker, test-only (--test-faults): `arg` is a fault_kind
  bye = 5,    ///< service -> worker: exit now (the service is stopping the worker)
  /// service -> worker, test-only (--test-faults): the FNV-1a hash of the
  /// shared arena's bytes [offset, offset + length) (payload: two u64)
  checksum = 6,
  /// worker -> service: `id` echoed; arg 0 and a u64 hash, or arg 1 (bad range)
  checksum_result = 7,
};

/// Faults a worker started with --test-faults injects on request.
enum class fault_kind : std::uint16_t {
  abort_process = 1,  ///< std::abort(): dies with SIGABRT
  kill_self = 2,      ///< SIGKILL to itself (as the OOM killer would)
  hang = 3,           ///< stops answering anything, forever (a kernel that never ends)
  exit_cleanly = 5,   ///< exits with status 0 (a worker that quits on its own)
  // 4 is kept for the illegal-address fault, which comes with the GPU work path.
};

struct header {
  std::uint32_t size = 0;  ///< payload bytes after the header
  std::uint16_t type = 0;  ///< a kind
  std::uint16_t arg = 0;   ///< per kind (fault: the fault_kind)
  std::uint64_t id = 0;    ///< ping/pong: the sequence number
};
static_assert(sizeof(header) == 16);

/// The most payload one message may carry: more means a broken peer.
inline constexpr std::uint32_t max_payload = 1u << 20;

/// hello's payload: the worker's pid and the device status (an errc value;
/// 0: the device opened), then the status message's bytes.
struct hello_fixed {
  std::int32_t pid = 0;
  std::int32_t status = 0;
  std::int32_t arena_mapped = 0;  ///< 1: the shared arena is mapped in the worker
  std::int32_t reserved = 0;
};

/// FNV-1a over `n` bytes (the checksum message's answer).
inline std::uint64_t fnv1a(const void* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

inline std::vector<std::byte> encode(kind k, std::uint16_t arg, std::uint64_t id,
                                     std::string_view payload = {}) {
  header h;
  h.size = static_cast<std::uint32_t>(payload.size());
  h.type = static_cast<std::uint16_t>(k);
  h.arg = arg;
  h.id = id;
  std::vector<std::byte> out(sizeof h + payload.size());
  std::memcpy(out.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(out.data() + sizeof h, payload.data(), payload.size());
  return out;
}

inline std::string hello_payload(std::int32_t pid, std::int32_t status, bool arena,
                                 std::string_view message) {
  hello_fixed f{pid, status, arena ? 1 : 0, 0};
  std::string p(sizeof f, '\0');
  std::memcpy(p.data(), &f, sizeof f);
  p.append(message);
  return p;
}

}  // namespace atomr::cuda::detail::wire
