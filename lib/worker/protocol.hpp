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
  /// service -> worker: one operation (`arg` an op_code, payload its
  /// arguments); answered by one reply with the same id
  call = 8,
  /// worker -> service: `id` echoed; arg 0: success and the value's bytes,
  /// arg 1: an error (encode_error)
  reply = 9,
  /// service -> worker, no answer: `arg` a release_kind, payload one u64 (the
  /// buffer or actor the service dropped)
  release = 10,
};

/// The operations a call carries (docs/design.md, "Isolated device").
enum class op_code : std::uint16_t {
  /// payload: alloc_args. Not answered: the worker allocates when the message
  /// arrives (before any later message is read), and a failed allocation is
  /// reported by the first operation that uses the buffer.
  alloc = 1,
  upload = 2,      ///< payload: transfer_args (host = arena offset); reply: empty
  download = 3,    ///< payload: transfer_args; reply: empty (the data is in the arena block)
  copy = 4,        ///< payload: copy_args; reply: empty
  fill_bytes = 5,  ///< payload: fill_args; reply: empty
  gemm = 6,        ///< payload: gemm_args; reply: empty
  /// test-only (--test-faults): payload: u16 fault_kind (illegal_address or
  /// hang_kernel): the fault as one operation in flight
  fault = 7,
  /// payload: an actor request (actor_wire.hpp: the actor, its options, the
  /// operation, its parameters and views); reply: empty, or the operation's
  /// value (dot, nrm2, asum: T; iamax: int64)
  actor = 8,
  /// payload: unit_head, then per request a unit_entry and its payload: the
  /// requests of one composed unit, run in the worker as one unit (enqueued
  /// back to back, awaited once). reply: empty, or the first error, named
  /// "compose: step k of n" by the service's step numbers
  unit = 9,
  /// payload: as unit, unit_head::handle naming the recording: the requests
  /// recorded into a CUDA graph in the worker (record()), nothing run.
  /// reply: the graph's node count (u64), or the error ("record: step k of n")
  record = 10,
  /// payload: u64, a recording's handle: replays it. reply: empty
  replay = 11,
  /// payload: indirect_args: a request too large for a ring slot, whose
  /// payload the service wrote into an arena block; answered as that request
  indirect = 12,
};

enum class release_kind : std::uint16_t {
  buffer = 1,     ///< a buffer handle (alloc_args::handle)
  actor = 2,      ///< an actor id of any kind (gemm_args::actor, actor_head::actor)
  recording = 3,  ///< a recording's handle (unit_head::handle of op_code::record)
};

/// Faults a worker started with --test-faults injects on request.
enum class fault_kind : std::uint16_t {
  abort_process = 1,  ///< std::abort(): dies with SIGABRT
  kill_self = 2,      ///< SIGKILL to itself (as the OOM killer would)
  hang = 3,           ///< stops answering anything, forever (a kernel that never ends)
  /// a kernel writes to address 0x10: an illegal-address fault, sticky (sent
  /// as op_code::fault, answered like an operation)
  illegal_address = 4,
  exit_cleanly = 5,  ///< exits with status 0 (a worker that quits on its own)
  /// a kernel that never ends (sent as op_code::fault: never answered)
  hang_kernel = 6,
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

/// What pong carries: the device's memory (cudaMemGetInfo in the worker,
/// at the ping), so that statistics() needs no round trip.
struct pong_payload {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};

/// A buffer as the worker knows it: its handle, and the view's element
/// offset and count (checked in the service, checked again in the worker).
struct ref_arg {
  std::uint64_t handle = 0;
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
};

struct alloc_args {
  std::uint64_t handle = 0;
  std::uint64_t count = 0;
  std::uint32_t type = 0;  ///< a dtype
  std::uint32_t reserved = 0;
};

/// upload: arena bytes [arena_offset, + ref.count elements) to `ref`;
/// download: the other way.
struct transfer_args {
  ref_arg ref;
  std::uint64_t arena_offset = 0;
  std::uint32_t type = 0;  ///< a dtype
  std::uint32_t reserved = 0;
};

struct copy_args {
  ref_arg src, dst;
  std::uint32_t type = 0;
  std::uint32_t reserved = 0;
};

struct fill_args {
  ref_arg dst;
  std::uint32_t type = 0;
  std::uint32_t value = 0;  ///< the byte
};

/// One blas gemm: the actor (created in the worker at its first call with
/// these options), the parameters, A, B and C.
struct gemm_args {
  std::uint64_t actor = 0;
  std::uint32_t type = 0;
  std::uint8_t tf32 = 0;
  std::uint8_t lt_matmul = 1;
  std::uint8_t has_streams = 0;
  std::uint8_t streams = 0;  ///< a stream_policy
  std::uint64_t max_lanes = 0;
  std::uint64_t cuda_graph_cache = 0;
  std::uint8_t transa = 0, transb = 0;
  std::uint8_t reserved[6] = {};
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  double alpha = 1.0, beta = 0.0;
  ref_arg a, b, c;
};

/// op_code::indirect's payload: the request's op_code, and where its
/// payload lies in the arena.
struct indirect_args {
  std::uint16_t op = 0;
  std::uint16_t reserved = 0;
  std::uint32_t reserved2 = 0;
  std::uint64_t arena_offset = 0;
  std::uint64_t size = 0;
};

/// op_code::unit's payload starts with this.
struct unit_head {
  std::uint32_t count = 0;   ///< requests that follow
  std::uint32_t steps = 0;   ///< the service unit's step count (what errors name as n)
  std::uint64_t handle = 0;  ///< op_code::record: the recording's handle
};
/// One request of a unit: its op_code, the service step that made it, and
/// the size of its payload, which follows.
struct unit_entry {
  std::uint16_t op = 0;
  std::uint16_t reserved = 0;
  std::uint32_t step = 0;
  std::uint32_t size = 0;
  std::uint32_t reserved2 = 0;
};

/// One request of a parsed unit.
struct unit_request {
  std::uint16_t op = 0;
  std::uint32_t step = 0;
  std::vector<char> payload;
};

/// op_code::unit's parts; false when the sizes do not add up.
inline bool parse_unit(const std::vector<char>& p, unit_head& head,
                       std::vector<unit_request>& out) {
  if (p.size() < sizeof head) return false;
  std::memcpy(&head, p.data(), sizeof head);
  std::size_t at = sizeof head;
  out.clear();
  for (std::uint32_t i = 0; i < head.count; ++i) {
    unit_entry e;
    if (p.size() - at < sizeof e) return false;
    std::memcpy(&e, p.data() + at, sizeof e);
    at += sizeof e;
    if (p.size() - at < e.size) return false;
    out.push_back({e.op, e.step, std::vector<char>(p.data() + at, p.data() + at + e.size)});
    at += e.size;
  }
  return at == p.size();
}

/// A trivially copyable value as a payload.
template <class T>
std::string_view bytes_of(const T& v) {
  return std::string_view(reinterpret_cast<const char*>(&v), sizeof v);
}

/// The value at the start of `p`, if it holds one.
template <class T>
bool read_pod(const std::vector<char>& p, T& out) {
  if (p.size() < sizeof out) return false;
  std::memcpy(&out, p.data(), sizeof out);
  return true;
}

/// An error as a reply's payload: code, native status, library, message.
inline std::string encode_error(std::int32_t code, std::int32_t native, std::string_view library,
                                std::string_view message) {
  std::string out;
  const std::int32_t head[3] = {code, native, static_cast<std::int32_t>(library.size())};
  out.append(reinterpret_cast<const char*>(head), sizeof head);
  out.append(library);
  out.append(message);
  return out;
}

/// The parts of encode_error's payload; false if it is malformed.
inline bool decode_error(const std::vector<char>& p, std::int32_t& code, std::int32_t& native,
                         std::string& library, std::string& message) {
  std::int32_t head[3];
  if (p.size() < sizeof head) return false;
  std::memcpy(head, p.data(), sizeof head);
  if (head[2] < 0 || static_cast<std::size_t>(head[2]) > p.size() - sizeof head) return false;
  code = head[0];
  native = head[1];
  library.assign(p.data() + sizeof head, static_cast<std::size_t>(head[2]));
  message.assign(p.data() + sizeof head + head[2], p.data() + p.size());
  return true;
}

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
