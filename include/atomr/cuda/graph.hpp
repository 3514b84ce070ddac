// graph: a unit of operations recorded once into a CUDA graph and replayed.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/compose.hpp>
#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/detail/unit_capture.hpp>
#include <atomr/cuda/detail/unit_recorder.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

namespace atomr::cuda {

namespace detail {
struct graph_state;
/// Opens a recording on a fresh stream of `dev` (cudaStreamBeginCapture,
/// relaxed mode: other threads and other streams are not affected).
result<std::unique_ptr<unit_capture>> begin_recording(const device& dev);
/// Closes it: the instantiated graph with everything its nodes use, or the
/// error (`failed` first; not_supported when the capture was invalidated or
/// the graph allocates memory).
result<std::shared_ptr<graph_state>> end_recording(unit_capture& c, std::optional<gpu_error> failed,
                                                   std::size_t steps);
/// An isolated device's recording: the requests `rec`'s steps made are
/// recorded into a CUDA graph by the worker, which keeps it (`failed`: the
/// error, nothing is sent). docs/design.md, "Recordings on an isolated device".
asio::awaitable<result<std::shared_ptr<graph_state>>> end_remote_recording(
    const device& dev, unit_recorder& rec, std::optional<gpu_error> failed, std::size_t steps);
}  // namespace detail

/// A unit recorded into an instantiated CUDA graph (record()). A cheap,
/// copyable handle: copies share one graph. It keeps every buffer, pinned host
/// buffer, descriptor and workspace its nodes use alive, and the graph is
/// destroyed only when the last handle and the last replay using it are
/// done. Thread-safe to copy and to replay from several threads (replays of
/// one graph run one after another on its stream).
class recorded_unit {
public:
  /// An empty handle: replay() yields invalid_argument.
  recorded_unit() noexcept = default;
  /// Wraps the library's graph state; record() is how users make one.
  explicit recorded_unit(std::shared_ptr<detail::graph_state> st) noexcept : st_(std::move(st)) {}

  /// False for an empty handle.
  explicit operator bool() const noexcept { return st_ != nullptr; }
  /// The operations recorded (record()'s steps).
  std::size_t steps() const noexcept;
  /// The graph's nodes (kernels, copies, memsets...), as CUDA recorded them.
  std::size_t nodes() const noexcept;
  /// The device generation it was recorded in. A replay checks the device
  /// first (context_poisoned after a fault, device_unavailable after stop(),
  /// as any operation), then this generation: after an isolated device's
  /// worker restart it yields stale_ref. Neither makes a CUDA call.
  std::uint64_t generation() const noexcept;
  /// Replays launched so far.
  std::uint64_t replays() const noexcept;

  /// The shared graph state behind this handle (the library's own use).
  const std::shared_ptr<detail::graph_state>& state() const noexcept { return st_; }

private:
  std::shared_ptr<detail::graph_state> st_;
};

/// Records `steps` (operations not yet awaited, as for compose(): any
/// actor's, transfers, run_kernel calls) into one CUDA graph, and runs
/// nothing: each step makes its argument checks and its library calls as
/// when awaited alone, but on the recording's private stream, which is being
/// captured (docs/design.md, "Recorded units"). Replay the result with
/// replay(); the buffers, pinned host buffers and parameters are those of the
/// steps: write new inputs into the pinned buffers a step uploads from (a
/// copy node of the graph) before each replay, and read the outputs from the
/// pinned buffers a step downloads into after it.
///
/// Refused with not_supported, naming the step ("record: step k of n: ..."):
/// cuRAND operations; transfers from or to pageable host memory (their host
/// copy would not be part of the graph: use pinned_buffer); operations that
/// yield a host value (blas dot, nrm2, asum, iamax); a replay; a unit inside
/// it; any call that stream capture does not allow (a user enqueue that
/// synchronises, allocates with cudaMalloc inside the graph, ...). A
/// failing step stops the recording there and nothing is kept.
///
/// Costs: host time only (each step's enqueue, instantiation: tens of us to
/// a few ms), a fresh stream, and per recording that contains cuBLAS calls a
/// cuBLAS workspace (32 MiB on compute capability 9 and later, else 4 MiB).
/// Never blocks the thread on the GPU. On an isolated device the worker
/// records and keeps the graph (one request), and transfers to or from host
/// memory are refused: upload new inputs into the recorded buffers before
/// replay() and download after it. With a completion token:
/// `async_from(dev.get_executor(), record(dev, step...), token)`.
template <class... T>
asio::awaitable<result<recorded_unit>> record(device dev, asio::awaitable<result<T>>... steps) {
  if (auto ok = dev.status(); !ok) co_return ok.error();
  if constexpr (sizeof...(T) == 0) {
    co_return make_error(errc::invalid_argument, "record: no steps");
  } else {
    auto outer = co_await asio::this_coro::executor;
    if (detail::unit_of(outer))
      co_return make_error(errc::not_supported,
                           "record: a recording cannot be a step of a unit or of a recording");
    if (dev.isolated()) {
      // The steps' requests are kept, then recorded by the worker.
      detail::unit_recorder rec;
      rec.name = "record";
      const detail::unit_executor ex(std::move(outer), &rec);
      std::tuple<std::optional<result<T>>...> got;
      auto failed = co_await detail::run_unit_steps(ex, got, steps...);
      BOOST_OUTCOME_CO_TRY(auto st, co_await detail::end_remote_recording(
                                        dev, rec, std::move(failed), sizeof...(T)));
      co_return recorded_unit(std::move(st));
    }
    BOOST_OUTCOME_CO_TRY(auto cap, detail::begin_recording(dev));
    detail::unit_recorder rec;
    rec.capture = cap.get();
    rec.name = "record";
    const detail::unit_executor ex(std::move(outer), &rec);
    std::tuple<std::optional<result<T>>...> got;
    auto failed = co_await detail::run_unit_steps(ex, got, steps...);
    BOOST_OUTCOME_CO_TRY(auto st, detail::end_recording(*cap, std::move(failed), sizeof...(T)));
    co_return recorded_unit(std::move(st));
  }
}

/// Launches the recorded graph (cudaGraphLaunch on its stream) and awaits it
/// with `how`, as one operation: the device must be accepting (a poisoned or
/// stopped device answers with its error and nothing is launched), the unit
/// must be of the device's current generation (else stale_ref), and the
/// launch is ordered after earlier work on every buffer the graph touches
/// and before later work on them, on any stream, as for any operation. On
/// timeout or cancellation the graph keeps running and everything it uses
/// stays alive until it is done. As a step of compose() it is enqueued with
/// the others and awaited once; inside a recording it is refused. Replaying
/// with the same buffers gives bit-identical results to running the steps
/// unrecorded (the same library calls with the same algorithms).
asio::awaitable<result<void>> replay(recorded_unit unit, completion how);
/// replay() with the device's default completion strategy.
asio::awaitable<result<void>> replay(recorded_unit unit);

/// The executor of the device a unit was recorded on.
asio::any_io_executor replay_executor(const recorded_unit& unit);

/// replay() through any Asio completion token: completes with
/// void(result<void>) (async.hpp; one co_spawn on top of the awaitable).
/// Without `how`: the device's default completion strategy.
/// @{
template <result_token<void> Token>
auto replay(recorded_unit unit, completion how, Token&& token) {
  auto ex = unit ? replay_executor(unit) : asio::any_io_executor{};
  return async_from(std::move(ex), replay(std::move(unit), how), std::forward<Token>(token));
}
template <result_token<void> Token>
auto replay(recorded_unit unit, Token&& token) {
  auto ex = unit ? replay_executor(unit) : asio::any_io_executor{};
  return async_from(std::move(ex), replay(std::move(unit)), std::forward<Token>(token));
}
/// @}

/// A snapshot of a graph_cache's counters.
struct graph_cache_statistics {
  std::size_t size = 0;         ///< units held now
  std::size_t capacity = 0;     ///< the most it holds
  std::uint64_t hits = 0;       ///< find() or replay() found the key
  std::uint64_t misses = 0;     ///< they did not (replay() then recorded)
  std::uint64_t evictions = 0;  ///< units dropped to stay within capacity
  std::uint64_t stale = 0;      ///< units dropped because their device generation changed
};

/// A bounded cache of recorded units under keys the caller chooses (a request
/// type, a shape): at most `capacity` instantiated graphs, the least recently
/// used dropped first. Dropping a unit never destroys a graph the GPU still
/// runs (each replay keeps its graph alive until done). A unit of an older
/// device generation (after a fault or stop) is dropped when found.
/// Thread-safe; the lock is held for map operations only, never across a
/// recording or a replay.
class graph_cache {
public:
  /// `capacity` 0 is raised to 1.
  explicit graph_cache(std::size_t capacity);
  graph_cache(const graph_cache&) = delete;
  graph_cache& operator=(const graph_cache&) = delete;
  ~graph_cache();

  /// The unit under `key`, or an empty handle.
  recorded_unit find(std::uint64_t key);
  /// Stores `unit` under `key` (replacing one there), dropping the least
  /// recently used unit when full. An empty handle erases the key.
  void insert(std::uint64_t key, recorded_unit unit);
  /// Drops the unit under `key`, if any.
  void erase(std::uint64_t key);
  /// Drops every unit.
  void clear();
  /// The counters now.
  graph_cache_statistics statistics() const;

  /// Replays the unit under `key`; when there is none, first records one with
  /// `make()` (a function returning what record() returns) and stores it. Two
  /// coroutines missing the same key at once may both record; the later
  /// one's unit is kept.
  template <class Make>
  asio::awaitable<result<void>> replay(std::uint64_t key, Make make, completion how) {
    auto unit = find(key);
    if (!unit) {
      BOOST_OUTCOME_CO_TRY(unit, co_await make());
      insert(key, unit);
    }
    co_return co_await atomr::cuda::replay(std::move(unit), how);
  }

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace atomr::cuda
