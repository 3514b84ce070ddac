// graph: recording a unit into a CUDA graph, replaying it, and the cache.
#include "cuda_graph_record.hpp"
#include "device_impl.hpp"
#include "remote.hpp"

#include <atomr/cuda/detail/lru.hpp>
#include <atomr/cuda/graph.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <string>
#include <tuple>

namespace atomr::cuda {

namespace detail {

/// What a recorded_unit shares: the instantiated graph, the stream it is
/// replayed on, and everything its nodes point at.
struct graph_state {
  graph_state() = default;
  graph_state(const graph_state&) = delete;
  graph_state& operator=(const graph_state&) = delete;
  // Destroyed only when no replay can still run it: each replay's keep-alive
  // holds this state until its GPU work is done (or the context is gone).
  ~graph_state() {
    if (remote_id) {  // the worker's graph goes with its last handle here
      if (remote_dev->remote) remote_dev->remote->release(wire::release_kind::recording, remote_id);
      return;
    }
    // Nothing is handed back to a poisoned context (a stopped one still works).
    if (exec && on && on.state()->owner->health.load() != health_state::poisoned)
      cudaGraphExecDestroy(exec);  // teardown: errors deliberately ignored
  }

  /// Isolated devices: the recording's handle in the worker, which holds
  /// the graph (0 in process), and the device.
  std::uint64_t remote_id = 0;
  std::shared_ptr<device_impl> remote_dev;

  cudaGraphExec_t exec = nullptr;
  stream on;
  std::uint64_t generation = 0;
  std::size_t steps = 0;
  std::size_t nodes = 0;
  std::vector<unit_capture::access> buffers;
  std::vector<std::shared_ptr<void>> keeps;
  std::vector<gpu_ref<std::uint8_t>> scratch;
  std::atomic<std::uint64_t> replays{0};
  /// Serialises the ordering and the launch of replays started at once (an
  /// executable graph is not thread-safe; two io threads, or an io thread and
  /// a launch thread, may enqueue replays of one unit together).
  std::mutex launch_mu;
};

result<std::unique_ptr<unit_capture>> begin_recording(const device& dev) {
  BOOST_OUTCOME_TRY(dev.status());
  // A stream of its own: no other work can be captured with the steps', and
  // the graph is replayed on it afterwards.
  BOOST_OUTCOME_TRY(auto s, device(dev).acquire_stream(stream_policy::per_actor_fresh, "graph"));
  auto c = std::make_unique<unit_capture>(std::move(s));
  if (auto e = c->on.state()->owner->make_current(); e != cudaSuccess)
    return classify(e, "cudaSetDevice");
  // Relaxed: the steps resume on any io thread, between them other coroutines
  // run on these threads, and nothing of theirs may be refused or captured.
  if (auto e = cudaStreamBeginCapture(c->on.native_handle(), cudaStreamCaptureModeRelaxed);
      e != cudaSuccess) {
    cudaGetLastError();
    return classify(e, "cudaStreamBeginCapture");
  }
  c->open = true;
  return c;
}

result<std::shared_ptr<graph_state>> end_recording(unit_capture& c, std::optional<gpu_error> failed,
                                                   std::size_t steps) {
  auto& d = *c.on.state()->owner;
  d.make_current();
  cudaGraph_t graph = nullptr;
  const auto ended = cudaStreamEndCapture(c.on.native_handle(), &graph);
  c.open = false;
  struct graph_guard {
    cudaGraph_t g;
    ~graph_guard() {
      if (g) cudaGraphDestroy(g);
    }
  } guard{graph};
  if (failed) {
    cudaGetLastError();
    return std::move(*failed);
  }
  if (ended != cudaSuccess || !graph) {
    cudaGetLastError();  // capture errors are not sticky
    BOOST_OUTCOME_TRY(d.check_accepting());
    return make_error(errc::not_supported,
                      "record: the capture was invalidated (" +
                          std::string(cudaGetErrorString(ended)) +
                          "): a step made a call that stream capture does not allow");
  }
  if (allocates(graph))
    return make_error(errc::not_supported,
                      "record: a step allocates or frees memory inside the graph (a library "
                      "call without a workspace of its own); it cannot be replayed safely");
  std::size_t nodes = 0;
  if (auto e = cudaGraphGetNodes(graph, nullptr, &nodes); e != cudaSuccess)
    return classify(e, "cudaGraphGetNodes");
  auto st = std::make_shared<graph_state>();
  if (auto e = cudaGraphInstantiate(&st->exec, graph, 0); e != cudaSuccess) {
    st->exec = nullptr;
    cudaGetLastError();
    BOOST_OUTCOME_TRY(d.check_accepting());
    return classify(e, "cudaGraphInstantiate");
  }
  st->on = c.on;
  st->generation = d.generation.load();
  st->steps = steps;
  st->nodes = nodes;
  st->buffers = std::move(c.buffers);
  st->keeps = std::move(c.keeps);
  st->scratch = std::move(c.scratch);
  return st;
}

asio::awaitable<result<std::shared_ptr<graph_state>>> end_remote_recording(
    const device& dev, unit_recorder& rec, std::optional<gpu_error> failed, std::size_t steps) {
  rec.ended = true;
  if (failed) co_return std::move(*failed);  // nothing of it was sent
  auto d = dev.impl();
  const auto gen = d->generation.load();
  const auto id = d->remote->next_id();
  BOOST_OUTCOME_CO_TRY(auto nodes,
                       co_await send_remote_record(rec, id, d->options.default_completion));
  auto st = std::make_shared<graph_state>();
  st->remote_id = id;
  st->remote_dev = d;
  st->on = device(d).main_stream();
  st->generation = gen;
  st->steps = steps;
  st->nodes = static_cast<std::size_t>(nodes);
  if (d->generation.load() != gen)
    co_return make_error(errc::stale_ref, "record: the worker was restarted while it recorded");
  co_return st;
}

}  // namespace detail

std::size_t recorded_unit::steps() const noexcept {
  return st_ ? st_->steps : 0;
}
std::size_t recorded_unit::nodes() const noexcept {
  return st_ ? st_->nodes : 0;
}
std::uint64_t recorded_unit::generation() const noexcept {
  return st_ ? st_->generation : 0;
}
std::uint64_t recorded_unit::replays() const noexcept {
  return st_ ? st_->replays.load(std::memory_order_relaxed) : 0;
}

asio::any_io_executor replay_executor(const recorded_unit& unit) {
  if (!unit) return {};
  if (const auto& d = unit.state()->remote_dev) return d->executor;  // isolated
  return unit.state()->on.get_device().get_executor();
}

asio::awaitable<result<void>> replay(recorded_unit unit, completion how) {
  if (!unit) co_return make_error(errc::invalid_argument, "replay: empty recorded_unit");
  auto st = unit.state();
  auto& d = *st->on.state()->owner;
  BOOST_OUTCOME_CO_TRY(d.check_accepting());
  if (const auto now = d.generation.load(); now != st->generation)
    co_return make_error(errc::stale_ref, "replay: the unit was recorded in device generation " +
                                              std::to_string(st->generation) +
                                              ", the device is at " + std::to_string(now));
  if (st->remote_id) {  // the worker replays its graph
    BOOST_OUTCOME_CO_TRY(check_completion(how));
    auto r = co_await detail::remote_call(d, detail::wire::op_code::replay,
                                          std::string(detail::wire::bytes_of(st->remote_id)), how,
                                          nullptr);
    if (!r) co_return r.error();
    st->replays.fetch_add(1, std::memory_order_relaxed);
    co_return outcome::success();
  }
  using keep = std::shared_ptr<detail::graph_state>;
  auto r =
      co_await run_kernel("cuda", st->on, how, std::tuple<>{}, [st](launch& l) -> result<keep> {
        if (l.recording())
          return make_error(errc::not_supported,
                            "replay: a recorded unit cannot be replayed inside a recording");
        // One launch of this executable graph at a time (CUDA allows no
        // concurrent calls on one graph object): replays from several threads
        // meet here (docs/design.md). The lock was declared and never taken.
        std::lock_guard lk(st->launch_mu);
        for (const auto& b : st->buffers) {
          BOOST_OUTCOME_TRY(l.order(b.st, b.write));
        }
        if (auto e = cudaGraphLaunch(st->exec, l.native_stream()); e != cudaSuccess)
          return classify(e, "cudaGraphLaunch (a recorded unit)");
        st->replays.fetch_add(1, std::memory_order_relaxed);
        return st;
      });
  if (!r) co_return r.error();
  co_return outcome::success();
}

asio::awaitable<result<void>> replay(recorded_unit unit) {
  completion how{};
  if (unit) {
    const auto& st = *unit.state();
    how = st.remote_dev ? st.remote_dev->options.default_completion
                        : st.on.get_device().options().default_completion;
  }
  return replay(std::move(unit), how);
}

// ---- graph_cache

struct graph_cache::impl {
  explicit impl(std::size_t capacity) : units(capacity) {}
  mutable std::mutex mu;
  detail::lru<std::uint64_t, recorded_unit> units;  // guarded by mu
  std::uint64_t stale = 0;                          // guarded by mu
};

graph_cache::graph_cache(std::size_t capacity) : impl_(std::make_unique<impl>(capacity)) {}
graph_cache::~graph_cache() = default;

recorded_unit graph_cache::find(std::uint64_t key) {
  std::lock_guard lk(impl_->mu);
  auto* u = impl_->units.find(key);
  if (!u) return {};
  const auto& st = u->state();
  if (!st || st->on.state()->owner->generation.load() != st->generation) {
    impl_->units.erase(key);
    ++impl_->stale;
    return {};
  }
  return *u;
}

void graph_cache::insert(std::uint64_t key, recorded_unit unit) {
  std::lock_guard lk(impl_->mu);
  if (!unit) {
    impl_->units.erase(key);
    return;
  }
  impl_->units.insert(key, std::move(unit));
}

void graph_cache::erase(std::uint64_t key) {
  std::lock_guard lk(impl_->mu);
  impl_->units.erase(key);
}

void graph_cache::clear() {
  std::lock_guard lk(impl_->mu);
  impl_->units.clear();
}

graph_cache_statistics graph_cache::statistics() const {
  std::lock_guard lk(impl_->mu);
  graph_cache_statistics s;
  s.size = impl_->units.size();
  s.capacity = impl_->units.capacity();
  s.hits = impl_->units.hits();
  s.misses = impl_->units.misses();
  s.evictions = impl_->units.evictions();
  s.stale = impl_->stale;
  return s;
}

}  // namespace atomr::cuda
