// collective_actor: NCCL collectives (docs/design.md, "Several devices").
#include "device_impl.hpp"

#include <atomr/cuda/collective_actor.hpp>
#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/detail/unit_recorder.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <boost/asio/this_coro.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace atomr::cuda {

std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::prod:
      return "prod";
    case reduce_op::max:
      return "max";
    case reduce_op::min:
      return "min";
    case reduce_op::avg:
      return "avg";
  }
  return "unknown";
}

std::string_view to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::all_reduce:
      return "all_reduce";
    case collective_kind::broadcast:
      return "broadcast";
    case collective_kind::reduce:
      return "reduce";
    case collective_kind::all_gather:
      return "all_gather";
    case collective_kind::reduce_scatter:
      return "reduce_scatter";
    case collective_kind::send_recv:
      return "send_recv";
  }
  return "unknown";
}

namespace detail {

namespace {

bool is_floating(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
    case dtype::f64:
    case dtype::f16:
    case dtype::bf16:
    case dtype::c32:
    case dtype::c64:
      return true;
    default:
      return false;
  }
}

bool is_complex(dtype t) noexcept {
  return t == dtype::c32 || t == dtype::c64;
}

bool reduces(collective_kind k) noexcept {
  return k == collective_kind::all_reduce || k == collective_kind::reduce ||
         k == collective_kind::reduce_scatter;
}

std::string elements(std::size_t n) {
  return std::to_string(n) + " elements";
}

/// The overlap rule of one call: `a` and `b` may be the same memory only
/// when b starts exactly at a + shift elements (NCCL's in-place layouts);
/// any other overlap of one allocation is refused.
bool bad_overlap(const collective_view& a, const collective_view& b, std::size_t shift) {
  if (!a.st || a.st != b.st) return false;
  if (b.offset == a.offset + shift) return false;  // in place
  const std::size_t a1 = a.offset + a.count, b1 = b.offset + b.count;
  return a.offset < b1 && b.offset < a1;
}

}  // namespace

result<void> check_collective(const collective_call& c, std::size_t ranks) {
  if (c.kind > collective_kind::send_recv)
    return make_error(errc::invalid_argument, "collective: unknown kind");
  const std::string op(to_string(c.kind));
  if (c.type > dtype::u64) return make_error(errc::invalid_argument, op + ": unknown element type");
  if (ranks == 0) return make_error(errc::invalid_argument, op + ": a communicator of no rank");
  if (reduces(c.kind)) {
    if (c.op > reduce_op::avg)
      return make_error(errc::invalid_argument, op + ": unknown reduce_op");
    if (c.op == reduce_op::avg && !is_floating(c.type))
      return make_error(errc::not_supported, op + ": avg needs a floating-point type, not " +
                                                 std::string(to_string(c.type)));
    if (c.op != reduce_op::sum && c.op != reduce_op::avg && is_complex(c.type))
      return make_error(errc::not_supported, op + ": " + std::string(to_string(c.op)) +
                                                 " is not defined on complex " +
                                                 std::string(to_string(c.type)));
  }
  auto rank_ok = [&](int r, std::string_view what) -> result<void> {
    if (r >= 0 && static_cast<std::size_t>(r) < ranks) return outcome::success();
    return make_error(errc::invalid_argument, op + ": " + std::string(what) + " " +
                                                  std::to_string(r) + " is not a rank (" +
                                                  std::to_string(ranks) + " ranks)");
  };
  auto per_rank = [&](const std::vector<collective_view>& v,
                      std::string_view name) -> result<void> {
    if (v.size() != ranks)
      return make_error(errc::invalid_argument,
                        op + ": " + std::string(name) + " has " + std::to_string(v.size()) +
                            " buffers, the communicator " + std::to_string(ranks) + " ranks");
    for (std::size_t r = 0; r < v.size(); ++r)
      if (v[r].count == 0)
        return make_error(errc::invalid_argument,
                          op + ": " + std::string(name) + "[" + std::to_string(r) + "] is empty");
    return outcome::success();
  };
  auto one = [&](const std::vector<collective_view>& v, std::string_view name) -> result<void> {
    if (v.size() != 1)
      return make_error(
          errc::invalid_argument,
          op + ": " + std::string(name) + " is one buffer, got " + std::to_string(v.size()));
    if (v[0].count == 0)
      return make_error(errc::invalid_argument, op + ": " + std::string(name) + " is empty");
    return outcome::success();
  };
  // name[r] must hold `want` elements ("recv[1] has 8 elements, send[1] 16").
  auto sized = [&](const collective_view& v, std::string_view name, std::size_t r, std::size_t want,
                   std::string_view against) -> result<void> {
    if (v.count == want) return outcome::success();
    return make_error(errc::invalid_argument, op + ": " + std::string(name) + "[" +
                                                  std::to_string(r) + "] has " + elements(v.count) +
                                                  ", " + std::string(against) + " " +
                                                  std::to_string(want));
  };
  auto overlap = [&](const collective_view& a, const collective_view& b, std::size_t shift,
                     std::size_t r) -> result<void> {
    if (!bad_overlap(a, b, shift)) return outcome::success();
    return make_error(errc::invalid_argument,
                      op + ": send and recv of rank " + std::to_string(r) +
                          " overlap in one allocation without being in place");
  };
  // all_gather and reduce_scatter: `whole[r]` holds ranks blocks of
  // `part[r]`'s size, every rank's parts of one size.
  auto blocks = [&](const std::vector<collective_view>& whole, std::string_view whole_name,
                    const std::vector<collective_view>& part,
                    std::string_view part_name) -> result<void> {
    BOOST_OUTCOME_TRY(per_rank(c.send, "send"));
    BOOST_OUTCOME_TRY(per_rank(c.recv, "recv"));
    const std::string part0 = std::string(part_name) + "[0] has";
    const std::string times = "ranks x " + std::string(part_name) + " =";
    for (std::size_t r = 0; r < ranks; ++r) {
      BOOST_OUTCOME_TRY(sized(part[r], part_name, r, part[0].count, part0));
      BOOST_OUTCOME_TRY(sized(whole[r], whole_name, r, ranks * part[r].count, times));
      BOOST_OUTCOME_TRY(overlap(whole[r], part[r], r * part[r].count, r));
    }
    return outcome::success();
  };
  switch (c.kind) {
    case collective_kind::all_reduce: {
      BOOST_OUTCOME_TRY(per_rank(c.send, "send"));
      BOOST_OUTCOME_TRY(per_rank(c.recv, "recv"));
      for (std::size_t r = 0; r < ranks; ++r) {
        BOOST_OUTCOME_TRY(sized(c.send[r], "send", r, c.send[0].count, "send[0] has"));
        BOOST_OUTCOME_TRY(sized(c.recv[r], "recv", r, c.send[r].count, "send has"));
        BOOST_OUTCOME_TRY(overlap(c.send[r], c.recv[r], 0, r));
      }
      return outcome::success();
    }
    case collective_kind::broadcast: {
      BOOST_OUTCOME_TRY(rank_ok(c.root, "root"));
      BOOST_OUTCOME_TRY(one(c.send, "the root's source"));
      BOOST_OUTCOME_TRY(per_rank(c.recv, "recv"));
      for (std::size_t r = 0; r < ranks; ++r) {
        BOOST_OUTCOME_TRY(sized(c.recv[r], "recv", r, c.send[0].count, "the source has"));
      }
      return overlap(c.send[0], c.recv[static_cast<std::size_t>(c.root)], 0,
                     static_cast<std::size_t>(c.root));
    }
    case collective_kind::reduce: {
      BOOST_OUTCOME_TRY(rank_ok(c.root, "root"));
      BOOST_OUTCOME_TRY(per_rank(c.send, "send"));
      BOOST_OUTCOME_TRY(one(c.recv, "the root's destination"));
      for (std::size_t r = 0; r < ranks; ++r) {
        BOOST_OUTCOME_TRY(sized(c.send[r], "send", r, c.send[0].count, "send[0] has"));
      }
      if (c.recv[0].count != c.send[0].count)
        return make_error(errc::invalid_argument, op + ": the root's destination has " +
                                                      elements(c.recv[0].count) + ", send " +
                                                      std::to_string(c.send[0].count));
      return overlap(c.send[static_cast<std::size_t>(c.root)], c.recv[0], 0,
                     static_cast<std::size_t>(c.root));
    }
    case collective_kind::all_gather:
      // recv[r] holds every rank's send block; in place: send[r] is rank r's block of it.
      return blocks(c.recv, "recv", c.send, "send");
    case collective_kind::reduce_scatter:
      // send[r] holds every rank's block; in place: recv[r] is rank r's block of it.
      return blocks(c.send, "send", c.recv, "recv");
    case collective_kind::send_recv: {
      BOOST_OUTCOME_TRY(rank_ok(c.root, "sender"));
      BOOST_OUTCOME_TRY(rank_ok(c.peer, "receiver"));
      BOOST_OUTCOME_TRY(one(c.send, "the source"));
      BOOST_OUTCOME_TRY(one(c.recv, "the destination"));
      if (c.recv[0].count != c.send[0].count)
        return make_error(errc::invalid_argument, op + ": the destination has " +
                                                      elements(c.recv[0].count) + ", the source " +
                                                      std::to_string(c.send[0].count));
      if (c.send[0].st && c.send[0].st == c.recv[0].st &&
          c.send[0].offset < c.recv[0].offset + c.recv[0].count &&
          c.recv[0].offset < c.send[0].offset + c.send[0].count)
        return make_error(errc::invalid_argument,
                          op + ": the source and the destination overlap in one allocation");
      return outcome::success();
    }
  }
  return outcome::success();
}

namespace {

gpu_error nccl_error(ncclResult_t r, std::string_view call, ncclComm_t comm = nullptr) {
  errc code = errc::library;
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      code = errc::invalid_argument;
      break;
    case ncclUnhandledCudaError:
      code = errc::driver;
      break;
    default:
      break;
  }
  std::string m = std::string(call) + ": " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) m += std::string(" (") + last + ")";
  return gpu_error(code, "nccl", static_cast<int>(r), std::move(m));
}

struct nccl_type {
  ncclDataType_t type;
  std::size_t scale;  // NCCL elements per element (2 for complex)
};

nccl_type nccl_type_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return {ncclFloat32, 1};
    case dtype::f64:
      return {ncclFloat64, 1};
    case dtype::f16:
      return {ncclFloat16, 1};
    case dtype::bf16:
      return {ncclBfloat16, 1};
    case dtype::c32:
      return {ncclFloat32, 2};
    case dtype::c64:
      return {ncclFloat64, 2};
    case dtype::i8:
      return {ncclInt8, 1};
    case dtype::i32:
      return {ncclInt32, 1};
    case dtype::i64:
      return {ncclInt64, 1};
    case dtype::u8:
      return {ncclUint8, 1};
    case dtype::u32:
      return {ncclUint32, 1};
    case dtype::u64:
      return {ncclUint64, 1};
  }
  return {ncclUint8, 1};
}

ncclRedOp_t nccl_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::prod:
      return ncclProd;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::avg:
      return ncclAvg;
  }
  return ncclSum;
}

}  // namespace

struct collective_state {
  std::vector<device> devices;
  std::vector<int> ordinals;
  std::vector<stream> streams;      // rank r's stream, on its device
  std::vector<cudaEvent_t> events;  // rank r's fork (r = 0) or join event, on its device
  completion how;
  int version = 0;

  mutable std::mutex mu;
  std::vector<ncclComm_t> comms;  // guarded by mu; empty: none now
  bool broken = false;            // guarded by mu: abort and rebuild before the next group
  std::atomic<std::uint64_t> groups{0}, builds{0}, aborts{0};

  collective_state() = default;
  collective_state(const collective_state&) = delete;
  collective_state& operator=(const collective_state&) = delete;

  ~collective_state() {
    bool poisoned = false;
    for (const auto& d : devices) poisoned = poisoned || d.health() == health_state::poisoned;
    for (auto c : comms) {
      if (poisoned || broken)
        ncclCommAbort(c);
      else
        ncclCommDestroy(c);
    }
    for (std::size_t r = 0; r < events.size(); ++r) {
      if (!events[r] || devices[r].health() == health_state::poisoned) continue;
      if (devices[r].impl()->make_current() == cudaSuccess) cudaEventDestroy(events[r]);
    }
  }

  result<void> build_locked() {
    std::vector<ncclComm_t> made(ordinals.size(), nullptr);
    const auto r = ncclCommInitAll(made.data(), static_cast<int>(ordinals.size()), ordinals.data());
    if (r != ncclSuccess) return nccl_error(r, "ncclCommInitAll");
    comms = std::move(made);
    broken = false;
    ++builds;
    return outcome::success();
  }

  void abort_locked() {
    for (auto c : comms) ncclCommAbort(c);
    if (!comms.empty()) ++aborts;
    comms.clear();
  }

  /// Rank r's pointer to `v` (ordered on launch `l`'s stream).
  result<void*> pointer(launch& l, const collective_view& v, dtype t, bool write) {
    BOOST_OUTCOME_TRY(void* base, l.order(v.st, write, true));
    return static_cast<void*>(static_cast<char*>(base) + v.offset * size_of(t));
  }

  /// One call's pointers: send and recv, as the call lists them.
  struct pointers {
    std::vector<void*> send, recv;
  };

  /// Orders one call's buffers on launch `l` (rank 0's stream: it waits for
  /// their earlier work on any device) and yields their pointers. Reads
  /// first, then writes: an in-place buffer is upgraded to a write.
  result<pointers> prepare(launch& l, const collective_call& c) {
    pointers p{std::vector<void*>(c.send.size()), std::vector<void*>(c.recv.size())};
    for (std::size_t i = 0; i < c.send.size(); ++i) {
      BOOST_OUTCOME_TRY(p.send[i], pointer(l, c.send[i], c.type, false));
    }
    for (std::size_t i = 0; i < c.recv.size(); ++i) {
      BOOST_OUTCOME_TRY(p.recv[i], pointer(l, c.recv[i], c.type, true));
    }
    return p;
  }

  /// Every rank's NCCL calls of one collective (between ncclGroupStart and
  /// ncclGroupEnd, which launches them).
  result<void> issue(const collective_call& c, const pointers& p) {
    const auto nt = nccl_type_of(c.type);
    const std::size_t n = ordinals.size();
    const auto& sp = p.send;
    const auto& rp = p.recv;
    auto s = [&](std::size_t r) { return streams[r].native_handle(); };
    auto ok = [](ncclResult_t r, std::string_view call) -> result<void> {
      if (r == ncclSuccess) return outcome::success();
      return nccl_error(r, call);
    };
    const auto root = static_cast<std::size_t>(c.root);
    switch (c.kind) {
      case collective_kind::all_reduce: {
        for (std::size_t r = 0; r < n; ++r) {
          BOOST_OUTCOME_TRY(ok(ncclAllReduce(sp[r], rp[r], c.send[r].count * nt.scale, nt.type,
                                             nccl_op(c.op), comms[r], s(r)),
                               "ncclAllReduce"));
        }
        break;
      }
      case collective_kind::broadcast: {
        for (std::size_t r = 0; r < n; ++r) {
          BOOST_OUTCOME_TRY(
              ok(ncclBroadcast(r == root ? sp[0] : rp[r], rp[r], c.recv[r].count * nt.scale,
                               nt.type, c.root, comms[r], s(r)),
                 "ncclBroadcast"));
        }
        break;
      }
      case collective_kind::reduce: {
        // recvbuff is used on the root only; the others pass their send buffer.
        for (std::size_t r = 0; r < n; ++r) {
          BOOST_OUTCOME_TRY(
              ok(ncclReduce(sp[r], r == root ? rp[0] : sp[r], c.send[r].count * nt.scale, nt.type,
                            nccl_op(c.op), c.root, comms[r], s(r)),
                 "ncclReduce"));
        }
        break;
      }
      case collective_kind::all_gather: {
        for (std::size_t r = 0; r < n; ++r) {
          BOOST_OUTCOME_TRY(
              ok(ncclAllGather(sp[r], rp[r], c.send[r].count * nt.scale, nt.type, comms[r], s(r)),
                 "ncclAllGather"));
        }
        break;
      }
      case collective_kind::reduce_scatter: {
        for (std::size_t r = 0; r < n; ++r) {
          BOOST_OUTCOME_TRY(ok(ncclReduceScatter(sp[r], rp[r], c.recv[r].count * nt.scale, nt.type,
                                                 nccl_op(c.op), comms[r], s(r)),
                               "ncclReduceScatter"));
        }
        break;
      }
      case collective_kind::send_recv: {
        const auto to = static_cast<std::size_t>(c.peer);
        const std::size_t count = c.send[0].count * nt.scale;
        BOOST_OUTCOME_TRY(
            ok(ncclSend(sp[0], count, nt.type, c.peer, comms[root], s(root)), "ncclSend"));
        BOOST_OUTCOME_TRY(
            ok(ncclRecv(rp[0], count, nt.type, c.root, comms[to], s(to)), "ncclRecv"));
        break;
      }
    }
    return outcome::success();
  }

  /// The group on launch `l` (rank 0's stream): every buffer ordered on
  /// rank 0's stream, the other ranks' streams forked from it, the NCCL
  /// group, and their ends joined back into it, so that the launch's one
  /// completion event covers every rank.
  result<void> enqueue_group(launch& l, const std::vector<collective_call>& calls) {
    std::lock_guard lk(mu);
    if (broken || comms.empty()) {
      abort_locked();
      BOOST_OUTCOME_TRY(build_locked());
    }
    const std::size_t n = ordinals.size();
    BOOST_OUTCOME_TRY(l.make_current());
    std::vector<pointers> ptrs;
    ptrs.reserve(calls.size());
    for (const auto& c : calls) {
      BOOST_OUTCOME_TRY(auto p, prepare(l, c));
      ptrs.push_back(std::move(p));
    }
    auto cuda_ok = [](cudaError_t e, std::string_view call) -> result<void> {
      if (e == cudaSuccess) return outcome::success();
      return classify(e, call);
    };
    const cudaStream_t s0 = streams[0].native_handle();
    if (n > 1) {
      BOOST_OUTCOME_TRY(cuda_ok(cudaEventRecord(events[0], s0), "cudaEventRecord"));
      for (std::size_t r = 1; r < n; ++r) {
        BOOST_OUTCOME_TRY(cuda_ok(cudaStreamWaitEvent(streams[r].native_handle(), events[0], 0),
                                  "cudaStreamWaitEvent"));
      }
    }
    if (auto g = ncclGroupStart(); g != ncclSuccess) return nccl_error(g, "ncclGroupStart");
    result<void> made = outcome::success();
    for (std::size_t i = 0; i < calls.size() && made; ++i) made = issue(calls[i], ptrs[i]);
    const auto ended = ncclGroupEnd();  // always: a started group must end
    if (!made) {
      broken = true;
      return made.error();
    }
    if (ended != ncclSuccess) {
      broken = true;
      return nccl_error(ended, "ncclGroupEnd");
    }
    for (std::size_t r = 1; r < n; ++r) {
      if (auto e = devices[r].impl()->make_current(); e != cudaSuccess)
        return classify(e, "cudaSetDevice");
      BOOST_OUTCOME_TRY(
          cuda_ok(cudaEventRecord(events[r], streams[r].native_handle()), "cudaEventRecord"));
      BOOST_OUTCOME_TRY(cuda_ok(cudaStreamWaitEvent(s0, events[r], 0), "cudaStreamWaitEvent"));
    }
    ++groups;
    return l.make_current();
  }

  /// An error reported by NCCL after the enqueue (ncclCommGetAsyncError):
  /// the communicator is marked broken.
  result<void> async_errors() {
    std::lock_guard lk(mu);
    for (auto c : comms) {
      ncclResult_t async = ncclSuccess;
      if (auto r = ncclCommGetAsyncError(c, &async); r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        broken = true;
        return nccl_error(async, "ncclCommGetAsyncError", c);
      }
    }
    return outcome::success();
  }
};

}  // namespace detail

result<collective_actor> collective_actor::create(std::vector<device> devices,
                                                  collective_options options) {
  if (devices.empty()) return make_error(errc::invalid_argument, "collective_actor: no device");
  auto st = std::make_shared<detail::collective_state>();
  for (std::size_t r = 0; r < devices.size(); ++r) {
    const auto& d = devices[r];
    if (!d.impl())
      return make_error(errc::invalid_argument,
                        "collective_actor: device " + std::to_string(r) + " is an empty handle");
    if (d.options().isolation.enabled)
      return make_error(errc::not_supported,
                        "collective_actor: device " + std::to_string(d.ordinal()) +
                            " is isolated (its context is in a worker process); NCCL spans "
                            "processes through its unique-id bootstrap (docs/design.md)");
    BOOST_OUTCOME_TRY(d.status());
    for (std::size_t q = 0; q < r; ++q)
      if (devices[q].ordinal() == d.ordinal())
        return make_error(errc::invalid_argument, "collective_actor: device " +
                                                      std::to_string(d.ordinal()) +
                                                      " listed twice (one rank per device)");
    st->ordinals.push_back(d.ordinal());
  }
  st->devices = std::move(devices);
  const auto& first = st->devices.front();
  st->how = options.how.value_or(first.options().default_completion);
  BOOST_OUTCOME_TRY(check_completion(st->how));
  ncclGetVersion(&st->version);
  for (auto& d : st->devices) {
    BOOST_OUTCOME_TRY(auto s, d.acquire_stream(stream_policy::per_actor_fresh, "collective_actor"));
    st->streams.push_back(std::move(s));
    if (st->devices.size() == 1) continue;  // one rank: no fork, no join
    if (auto e = d.impl()->make_current(); e != cudaSuccess) return classify(e, "cudaSetDevice");
    cudaEvent_t ev = nullptr;
    if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
      return classify(e, "cudaEventCreateWithFlags");
    st->events.push_back(ev);
  }
  {
    std::lock_guard lk(st->mu);
    BOOST_OUTCOME_TRY(st->build_locked());
  }
  return collective_actor(std::move(st));
}

result<collective_actor> collective_actor::create(const device_set& set,
                                                  collective_options options) {
  std::vector<device> devices;
  for (std::size_t i = 0; i < set.size(); ++i) devices.push_back(set[i]);
  return create(std::move(devices), std::move(options));
}

asio::awaitable<result<void>> collective_actor::group(std::vector<collective_call> calls) const {
  auto st = st_;
  if (!st) co_return make_error(errc::invalid_argument, "collective_actor: empty handle");
  if (calls.empty()) co_return make_error(errc::invalid_argument, "group: no collective");
  if (detail::unit_of(co_await asio::this_coro::executor))
    co_return make_error(errc::not_supported,
                         "collective_actor: a group cannot be a step of a unit or a recording (a "
                         "unit runs on one device): await it alone");
  const std::size_t n = st->devices.size();
  auto tag = [&](std::size_t i, gpu_error e) {
    if (calls.size() == 1) return e;
    return gpu_error(e.code(), e.library(), e.native_status(),
                     "group: call " + std::to_string(i) + ": " + e.message());
  };
  // Which rank's device each buffer must be on.
  auto on_rank = [&](const collective_call& c, const detail::collective_view& v, std::size_t r,
                     std::string_view name) -> result<void> {
    const std::string op(to_string(c.kind));
    if (!v.st)
      return make_error(errc::invalid_argument, op + ": " + std::string(name) + " is empty");
    BOOST_OUTCOME_TRY(detail::check_buffer(v.st.get(), c.type));
    if (v.st->dev != st->devices[r].impl())
      return make_error(errc::invalid_argument, op + ": " + std::string(name) + " is on device " +
                                                    std::to_string(device(v.st->dev).ordinal()) +
                                                    ", rank " + std::to_string(r) + " is device " +
                                                    std::to_string(st->ordinals[r]));
    return outcome::success();
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto& c = calls[i];
    if (auto ok = detail::check_collective(c, n); !ok) co_return tag(i, ok.error());
    auto rank_of_send = [&](std::size_t k) -> std::size_t {
      if (c.kind == collective_kind::broadcast || c.kind == collective_kind::send_recv)
        return static_cast<std::size_t>(c.root);
      return k;
    };
    auto rank_of_recv = [&](std::size_t k) -> std::size_t {
      if (c.kind == collective_kind::reduce) return static_cast<std::size_t>(c.root);
      if (c.kind == collective_kind::send_recv) return static_cast<std::size_t>(c.peer);
      return k;
    };
    for (std::size_t k = 0; k < c.send.size(); ++k)
      if (auto ok = on_rank(c, c.send[k], rank_of_send(k), "send[" + std::to_string(k) + "]"); !ok)
        co_return tag(i, ok.error());
    for (std::size_t k = 0; k < c.recv.size(); ++k)
      if (auto ok = on_rank(c, c.recv[k], rank_of_recv(k), "recv[" + std::to_string(k) + "]"); !ok)
        co_return tag(i, ok.error());
  }
  using keep_t = std::pair<std::shared_ptr<detail::collective_state>, std::vector<collective_call>>;
  auto enqueue = [st, calls = std::move(calls)](launch& l) -> result<keep_t> {
    BOOST_OUTCOME_TRY(st->enqueue_group(l, calls));
    return keep_t{st, calls};
  };
  auto done =
      co_await run_kernel("nccl", st->streams[0], st->how, std::tuple<>{}, std::move(enqueue));
  if (!done) co_return done.error();
  co_return st->async_errors();
}

result<void> collective_actor::reset() const {
  if (!st_) return make_error(errc::invalid_argument, "collective_actor: empty handle");
  std::lock_guard lk(st_->mu);
  st_->abort_locked();
  return st_->build_locked();
}

std::size_t collective_actor::ranks() const noexcept {
  return st_ ? st_->devices.size() : 0;
}

device collective_actor::rank_device(std::size_t r) const {
  if (!st_ || r >= st_->devices.size()) return device{};
  return st_->devices[r];
}

device collective_actor::get_device() const {
  return rank_device(0);
}

collective_statistics collective_actor::statistics() const {
  collective_statistics s;
  if (!st_) return s;
  s.ranks = st_->devices.size();
  s.groups = st_->groups.load();
  s.builds = st_->builds.load();
  s.aborts = st_->aborts.load();
  s.nccl_version = static_cast<std::uint64_t>(st_->version);
  return s;
}

}  // namespace atomr::cuda
