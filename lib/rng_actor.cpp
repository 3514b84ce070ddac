// rng_actor: one cuRAND generator bound to one stream, launched through run_kernel.
#include "atomr/cuda/rng_actor.hpp"

#include "atomr/cuda/detail/actor_core.hpp"
#include <atomr/cuda/detail/remote_ops.hpp>
#include "device_impl.hpp"
#include "remote.hpp"
#include "atomr/cuda/run_kernel.hpp"

#include <boost/asio/this_coro.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace atomr::cuda {

std::string_view to_string(rng_kind k) noexcept {
  switch (k) {
    case rng_kind::philox4_32_10:
      return "philox4_32_10";
    case rng_kind::xorwow:
      return "xorwow";
    case rng_kind::mrg32k3a:
      return "mrg32k3a";
    case rng_kind::mtgp32:
      return "mtgp32";
    case rng_kind::sobol32:
      return "sobol32";
    case rng_kind::scrambled_sobol32:
      return "scrambled_sobol32";
    case rng_kind::sobol64:
      return "sobol64";
    case rng_kind::scrambled_sobol64:
      return "scrambled_sobol64";
  }
  return "unknown";
}

namespace detail {

namespace {

constexpr std::string_view k_lib = "curand";

bool known_kind(rng_kind k) noexcept {
  return static_cast<unsigned>(k) <= static_cast<unsigned>(rng_kind::scrambled_sobol64);
}

curandRngType_t native_kind(rng_kind k) noexcept {
  switch (k) {
    case rng_kind::philox4_32_10:
      return CURAND_RNG_PSEUDO_PHILOX4_32_10;
    case rng_kind::xorwow:
      return CURAND_RNG_PSEUDO_XORWOW;
    case rng_kind::mrg32k3a:
      return CURAND_RNG_PSEUDO_MRG32K3A;
    case rng_kind::mtgp32:
      return CURAND_RNG_PSEUDO_MTGP32;
    case rng_kind::sobol32:
      return CURAND_RNG_QUASI_SOBOL32;
    case rng_kind::scrambled_sobol32:
      return CURAND_RNG_QUASI_SCRAMBLED_SOBOL32;
    case rng_kind::sobol64:
      return CURAND_RNG_QUASI_SOBOL64;
    case rng_kind::scrambled_sobol64:
      return CURAND_RNG_QUASI_SCRAMBLED_SOBOL64;
  }
  return CURAND_RNG_PSEUDO_PHILOX4_32_10;
}

std::string kind_name(rng_kind k) {
  return std::string(to_string(k));
}

std::string num(double v) {
  // Shortest readable form: "0.5", "-1", "nan", "inf".
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = std::to_string(v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

bool is_quasi(rng_kind k) noexcept {
  switch (k) {
    case rng_kind::sobol32:
    case rng_kind::scrambled_sobol32:
    case rng_kind::sobol64:
    case rng_kind::scrambled_sobol64:
      return true;
    default:
      return false;
  }
}

bool is_64bit(rng_kind k) noexcept {
  return k == rng_kind::sobol64 || k == rng_kind::scrambled_sobol64;
}

result<void> check_rng_seed(rng_kind k) {
  if (is_quasi(k))
    return bad_argument(
        "set_seed", "seed",
        "cannot be set: " + kind_name(k) + " is a quasi-random generator, which has no seed");
  return outcome::success();
}

result<void> check_rng_offset(rng_kind k, std::uint64_t offset) {
  if (k == rng_kind::mtgp32 && offset != 0)
    return bad_argument("set_offset", "offset",
                        "(" + std::to_string(offset) +
                            ") must be 0 for mtgp32: cuRAND cannot skip ahead in MTGP32");
  return outcome::success();
}

result<void> check_rng_options(const rng_options& o) {
  constexpr std::string_view op = "rng_actor::create";
  if (!known_kind(o.kind))
    return bad_argument(
        op, "kind",
        "(" + std::to_string(static_cast<unsigned>(o.kind)) + ") is not a known generator");
  if (o.seed && is_quasi(o.kind))
    return bad_argument(
        op, "seed",
        "cannot be set: " + kind_name(o.kind) + " is a quasi-random generator, which has no seed");
  if (is_quasi(o.kind)) {
    if (o.dimensions < 1 || o.dimensions > rng_max_dimensions)
      return bad_argument(op, "dimensions",
                          "(" + std::to_string(o.dimensions) + ") must be 1 to " +
                              std::to_string(rng_max_dimensions));
  } else if (o.dimensions != 1) {
    return bad_argument(op, "dimensions",
                        "(" + std::to_string(o.dimensions) + ") must be 1: " + kind_name(o.kind) +
                            " is a pseudo-random generator; dimensions are for quasi-random ones");
  }
  if (o.kind == rng_kind::mtgp32 && o.offset != 0)
    return bad_argument(op, "offset",
                        "(" + std::to_string(o.offset) +
                            ") must be 0 for mtgp32: cuRAND cannot skip ahead in MTGP32");
  return check_max_lanes(op, o.max_lanes);
}

bool rng_lanes_allowed(rng_kind k) noexcept {
  // Philox is counter based: a generator set to an offset (curandSetGeneratorOffset)
  // produces exactly what one generator would there, so lanes can share one
  // sequence by reserving a range per operation. The others keep one generator.
  return k == rng_kind::philox4_32_10;
}

std::uint64_t rng_sequence_span(std::size_t count, std::size_t value_bytes) noexcept {
  // 32-bit values (raw, float uniform/normal/log-normal, Poisson): cuRAND's
  // Philox moves on by exactly `count` (measured on the H200 with cuRAND of
  // CUDA 13 for counts 2 to 3e7), so the actor's sequence is a plain
  // generator's. Doubles: the kernels read far more than 2 values each, laid
  // out with a 2^18-position stride (count 3 reads positions [0, 262146)); the
  // span covers everything they read, so no two operations share random bits.
  if (value_bytes <= 4) return count;
  constexpr std::uint64_t k_double_stride = std::uint64_t{1} << 18;
  return 2 * static_cast<std::uint64_t>(count) + k_double_stride + 64;
}

result<void> check_rng_count(std::string_view op, rng_kind k, unsigned dimensions,
                             std::size_t count, bool pairs) {
  if (count == 0) return bad_argument(op, "out", "is empty (0 elements to generate)");
  if (is_quasi(k)) {
    if (dimensions == 0 || count % dimensions != 0)
      return bad_argument(op, "out",
                          "size (" + std::to_string(count) + ") must be a multiple of the " +
                              std::to_string(dimensions) + " dimensions of the " + kind_name(k) +
                              " generator (one value per dimension per point)");
  } else if (pairs && count % 2 != 0) {
    return bad_argument(op, "out",
                        "size (" + std::to_string(count) +
                            ") must be even: cuRAND makes normal values in pairs (Box-Muller) "
                            "with the pseudo-random generator " +
                            kind_name(k));
  }
  return outcome::success();
}

result<void> check_rng_normal(std::string_view op, double mean, double stddev) {
  if (!std::isfinite(mean)) return bad_argument(op, "mean", "(" + num(mean) + ") must be finite");
  if (!std::isfinite(stddev) || !(stddev > 0))
    return bad_argument(op, "stddev", "(" + num(stddev) + ") must be finite and > 0");
  return outcome::success();
}

result<void> check_rng_lambda(std::string_view op, double lambda) {
  if (!std::isfinite(lambda) || !(lambda > 0) || lambda > rng_max_lambda)
    return bad_argument(op, "lambda",
                        "(" + num(lambda) + ") must be > 0 and <= " + num(rng_max_lambda));
  return outcome::success();
}

result<void> check_rng_raw_bits(std::string_view op, rng_kind k, unsigned bits) {
  if (bits == 64 && !is_64bit(k))
    return bad_argument(op, "out",
                        "is gpu_ref<uint64>, but " + kind_name(k) +
                            " makes 32-bit values: 64-bit raw values come only from sobol64 and "
                            "scrambled_sobol64 (use gpu_ref<uint32>)");
  if (bits == 32 && is_64bit(k))
    return bad_argument(
        op, "out",
        "is gpu_ref<uint32>, but " + kind_name(k) + " makes 64-bit values (use gpu_ref<uint64>)");
  if (bits != 32 && bits != 64)
    return bad_argument(op, "out", "raw values are 32 or 64 bits, not " + std::to_string(bits));
  return outcome::success();
}

/// One cuRAND generator. Shared by the actor and by every kernel in flight
/// that uses it (its state lives in device memory), so a generator replaced
/// by set_seed on MTGP32 is destroyed only after its last kernel ends.
struct generator {
  explicit generator(device d) : dev(std::move(d)) {}
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;
  ~generator() {
    if (gen == nullptr) return;
    // A poisoned context is never called again (its memory dies with the process).
    if (dev.health() == health_state::poisoned) return;
    if (cudaSetDevice(dev.ordinal()) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    curandDestroyGenerator(gen);
  }

  device dev;
  curandGenerator_t gen = nullptr;
};

/// One lane of an rng_actor (docs/design.md, "One actor, several lanes"):
/// a generator bound to the lane's stream. Philox lanes draw from a block of
/// the actor's sequence, [cursor, end), one operation after another, so the
/// generator is already where the next operation starts and no offset is
/// set (curandSetGeneratorOffset waits for the whole device). Guarded by mu.
struct rng_lane : lane_base {
  explicit rng_lane(stream s) noexcept : lane_base(std::move(s)) {}
  std::shared_ptr<generator> gen;  // MTGP32's set_seed replaces it
  std::uint64_t epoch = 0;         // Philox: the seed epoch of `gen` and of the block
  std::uint64_t cursor = 0;        // Philox: the next operation's start
  std::uint64_t end = 0;           // Philox: the block's end (cursor == end: no block)
  bool placed = false;             // Philox: the generator is at `cursor`
  std::uint64_t repositions = 0;   // curandSetGeneratorOffset calls made for operations
};

/// The shared state behind rng_actor handles. Operations keep it alive until
/// the GPU is done with them (it is their run_kernel keep-alive).
struct rng_state {
  rng_state(device d, rng_kind k, unsigned dims, completion c, lane_policy lp)
      : dev(std::move(d)),
        kind(k),
        dimensions(dims),
        how(c),
        lane_streams(lp.streams),
        blocks(k == rng_kind::philox4_32_10),
        lanes(lp.max_lanes) {}
  rng_state(const rng_state&) = delete;
  rng_state& operator=(const rng_state&) = delete;

  device dev;
  const rng_kind kind;
  const unsigned dimensions;
  const completion how;
  const stream_policy lane_streams;
  /// Philox (one lane or several): each lane takes blocks of
  /// rng_lane_block positions from the actor's sequence (`next`) and its
  /// operations take consecutive ranges of its block. Other generators have
  /// one lane that moves on by itself.
  const bool blocks;
  std::mutex seq_mu;
  std::optional<std::uint64_t> seed;    ///< the last seed set (unset: cuRAND's default); seq_mu
  std::atomic<std::uint64_t> epoch{0};  ///< Philox: bumped by set_seed and set_offset; seq_mu
  std::uint64_t next = 0;               ///< Philox: the next block's start; seq_mu
  lane_set<rng_lane> lanes;

  /// Isolated devices: the actor's id in the worker (whose twin is made with
  /// `remote` at its first request; docs/design.md, "Isolated device"), and
  /// what get_stream() answers (there are no lanes here). 0 in process.
  /// set_seed and set_offset change `remote` (seed, offset, epoch; seq_mu),
  /// and the twin applies them at the next request.
  std::uint64_t remote_id = 0;
  wire::actor_settings remote;
  stream remote_stream;
  ~rng_state() {
    if (remote_id && dev.impl()->remote)
      dev.impl()->remote->release(wire::release_kind::actor, remote_id);
  }

  result<void> accepting() const { return dev.status(); }
  /// A new lane: its stream and a generator seeded with the current seed.
  result<std::unique_ptr<rng_lane>> make_lane();
  /// The lane for an operation writing the buffer `key` (docs/design.md,
  /// "One actor, several lanes"); null: the calling thread's lane.
  rng_lane& lane(const void* key = nullptr) {
    return lanes.pick([this](std::size_t) { return make_lane(); }, key);
  }
  /// Philox: the start of the next `span` positions of `l`'s block (a new
  /// block when it has not that many left, or set_seed or set_offset ran),
  /// with `l`'s generator pointed there (reseeded first after set_seed).
  /// Lane lock held, device current.
  result<std::uint64_t> position(rng_lane& l, std::uint64_t span);
};

namespace {

result<void> curand_ok(curandStatus_t st, std::string_view call) {
  if (st == CURAND_STATUS_SUCCESS) return outcome::success();
  return classify(st, call);
}

/// A generator of `st`'s kind on stream `on`, seeded (unless `seed` is
/// unset: cuRAND's default), at `offset`. MTGP32 is restarted this way:
/// reseeding an MTGP32 generator that has already produced numbers does not
/// restart its sequence (seen on the H200 with cuRAND of CUDA 13), so
/// set_seed and set_offset(0) build a fresh one.
result<std::shared_ptr<generator>> make_generator(const rng_state& st, const stream& on,
                                                  std::optional<std::uint64_t> seed,
                                                  std::uint64_t offset) {
  if (auto e = cudaSetDevice(st.dev.ordinal()); e != cudaSuccess)
    return classify(e, "cudaSetDevice").tagged(k_lib);
  auto g = std::make_shared<generator>(st.dev);
  if (auto ok =
          curand_ok(curandCreateGenerator(&g->gen, native_kind(st.kind)), "curandCreateGenerator");
      !ok) {
    g->gen = nullptr;
    return ok.error();
  }
  BOOST_OUTCOME_TRY(curand_ok(curandSetStream(g->gen, on.native_handle()), "curandSetStream"));
  if (seed) {
    BOOST_OUTCOME_TRY(curand_ok(curandSetPseudoRandomGeneratorSeed(g->gen, *seed),
                                "curandSetPseudoRandomGeneratorSeed"));
  }
  if (offset != 0) {
    BOOST_OUTCOME_TRY(
        curand_ok(curandSetGeneratorOffset(g->gen, offset), "curandSetGeneratorOffset"));
  }
  if (is_quasi(st.kind)) {
    BOOST_OUTCOME_TRY(curand_ok(curandSetQuasiRandomGeneratorDimensions(g->gen, st.dimensions),
                                "curandSetQuasiRandomGeneratorDimensions"));
  }
  return g;
}

/// Checks `out` and launches `call(gen, ptr, count)` under the lane's lock;
/// `span`: the positions of the sequence the call uses (rng_sequence_span).
/// `pre` holds the pure argument checks' verdict, made before this is called.
/// What an isolated device's worker is asked for: the operation and its numbers.
struct remote_rng {
  wire::actor_op op;
  wire::rng_args args;
};

template <class T, class Call>
asio::awaitable<result<gpu_ref<T>>> generate(std::shared_ptr<rng_state> st, std::string_view op,
                                             gpu_ref<T> out, result<void> pre, remote_rng rop,
                                             Call call, std::string_view call_name) {
  if (auto ok = st->accepting(); !ok) co_return ok.error().tagged(k_lib);
  if (auto ok = check_ref(op, "out", out, st->dev, 0); !ok) co_return ok.error().tagged(k_lib);
  if (!pre) co_return pre.error().tagged(k_lib);
  if (auto* unit = detail::unit_of(co_await asio::this_coro::executor); unit && unit->capture)
    co_return make_error(errc::not_supported,
                         "curand: " + std::string(op) +
                             ": cuRAND generators cannot be recorded into a CUDA graph (each "
                             "call advances the generator's state on the host); run them "
                             "outside the recording")
        .tagged(k_lib);
  if (st->remote_id) {
    wire::actor_settings settings;
    {
      std::lock_guard lk(st->seq_mu);
      settings = st->remote;
    }
    auto r = co_await remote_actor_call(
        *st->dev.impl(),
        actor_head_of(st->remote_id, wire::actor_kind::rng, rop.op, dtype_of<T>, settings),
        rop.args, st->how, out);
    if (!r) co_return r.error();
    co_return out;
  }
  auto& lane = st->lane(out.state().get());
  co_return co_await run_kernel(
      k_lib, lane.strm, st->how, out, [&](launch& l) -> result<std::shared_ptr<generator>> {
        BOOST_OUTCOME_TRY(T * p, l.write(out));
        std::lock_guard lock(lane.mu);
        // Doubles: what cuRAND's double kernels give depends on how the
        // generator reached its position, not only on the position (seen on
        // the H200), and where they leave it is not always known: a double
        // operation sets its offset first, and the next operation sets it again.
        constexpr bool doubles = sizeof(T) > 4;
        if (st->blocks) {
          if (doubles) lane.placed = false;
          BOOST_OUTCOME_TRY(st->position(lane, rng_sequence_span(out.size(), sizeof(T))));
        }
        auto ok = curand_ok(call(lane.gen->gen, p, out.size()), call_name);
        if (!ok || doubles) lane.placed = false;  // a failed call: its position is unknown
        if (!ok) return ok.error();
        return lane.gen;  // the generator (and its state memory) outlives the kernel
      });
}

}  // namespace

}  // namespace detail

namespace detail {

result<std::unique_ptr<rng_lane>> rng_state::make_lane() {
  BOOST_OUTCOME_TRY(auto s, dev.acquire_stream(lane_streams, k_lib));
  auto lane = std::make_unique<rng_lane>(std::move(s));
  std::optional<std::uint64_t> sd;
  {
    std::lock_guard lk(seq_mu);
    sd = seed;
    lane->epoch = epoch.load(std::memory_order_relaxed);  // its first block is taken at its
  }                                                       // first operation
  BOOST_OUTCOME_TRY(lane->gen, make_generator(*this, lane->strm, sd, 0));
  return lane;
}

result<std::uint64_t> rng_state::position(rng_lane& l, std::uint64_t span) {
  // Unsigned arithmetic: positions wrap after 2^64, as cuRAND's offset does.
  if (l.epoch != epoch.load(std::memory_order_acquire) || l.end - l.cursor < span) {
    std::optional<std::uint64_t> sd;
    std::uint64_t start = 0, ep = 0;
    const std::uint64_t take = std::max(rng_lane_block, span);
    {
      std::lock_guard lk(seq_mu);
      start = next;
      next += take;
      ep = epoch.load(std::memory_order_relaxed);
      sd = seed;
    }
    if (l.epoch == ep && start == l.end) {
      // The block right after this lane's last one (one lane, or no other
      // lane took a block since): the block grows, so one lane's operations
      // stay end to end, and the generator stays where it is.
      l.end = start + take;
    } else {
      l.placed = false;
      if (l.epoch != ep) {
        if (sd) {
          BOOST_OUTCOME_TRY(curand_ok(curandSetPseudoRandomGeneratorSeed(l.gen->gen, *sd),
                                      "curandSetPseudoRandomGeneratorSeed"));
        }
        l.epoch = ep;
      }
      l.cursor = start;
      l.end = start + take;
    }
  }
  if (!l.placed) {
    BOOST_OUTCOME_TRY(
        curand_ok(curandSetGeneratorOffset(l.gen->gen, l.cursor), "curandSetGeneratorOffset"));
    ++l.repositions;
    l.placed = true;
  }
  const std::uint64_t at = l.cursor;
  l.cursor += span;
  return at;
}

}  // namespace detail

result<rng_actor> rng_actor::create(device dev, rng_options options) {
  if (!dev.impl())
    return detail::bad_argument("rng_actor::create", "dev", "is an empty device handle")
        .tagged(detail::k_lib);
  if (auto ok = dev.status(); !ok) return ok.error().tagged(detail::k_lib);
  if (!dev.options().libraries.curand)
    return make_error(errc::not_supported,
                      "rng_actor::create: cuRAND is disabled in this device's options "
                      "(device_options::libraries.curand)")
        .tagged(detail::k_lib);
  if (auto ok = detail::check_rng_options(options); !ok) return ok.error().tagged(detail::k_lib);

  const completion how = options.how.value_or(dev.options().default_completion);
  // Only Philox gets lanes: the others keep one generator (rng_options::max_lanes).
  const auto lanes = detail::resolve_lanes(
      options.streams, detail::rng_lanes_allowed(options.kind) ? options.max_lanes : 1,
      dev.options());
  auto st = std::make_shared<detail::rng_state>(dev, options.kind, options.dimensions, how, lanes);
  st->seed = options.seed;
  if (dev.isolated()) {
    // No generator here: the worker makes the actor's twin at its first request.
    namespace wire = detail::wire;
    st->remote_id = dev.impl()->remote->next_id();
    st->remote_stream = dev.main_stream();
    auto& r = st->remote = detail::lane_settings(options.streams, options.max_lanes);
    r.variant = static_cast<std::uint8_t>(options.kind);
    r.flags = options.seed ? wire::has_seed : 0;
    r.limit = options.seed.value_or(0);
    r.offset = options.offset;
    r.dimensions = options.dimensions;
    return rng_actor(std::move(st));
  }
  auto s = dev.acquire_stream(lanes.streams, detail::k_lib);
  if (!s) return s.error().tagged(detail::k_lib);
  auto first = std::make_unique<detail::rng_lane>(std::move(s).value());
  auto gen = detail::make_generator(*st, first->strm, options.seed, options.offset);
  if (!gen) return dev.impl()->blame_fault(gen.error());
  first->gen = gen.value();
  if (st->blocks) {  // the first block starts at the offset, where the generator is
    first->cursor = options.offset;
    first->end = options.offset + detail::rng_lane_block;
    first->placed = true;
    st->next = first->end;
  }
  st->lanes.install_first(std::move(first));
  return rng_actor(std::move(st));
}

asio::awaitable<result<gpu_ref<float>>> rng_actor::uniform(gpu_ref<float> out) const {
  constexpr std::string_view op = "uniform";
  auto pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), false);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::uniform, {}},
      [](curandGenerator_t g, float* p, std::size_t n) { return curandGenerateUniform(g, p, n); },
      "curandGenerateUniform");
}

asio::awaitable<result<gpu_ref<double>>> rng_actor::uniform(gpu_ref<double> out) const {
  constexpr std::string_view op = "uniform";
  auto pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), false);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::uniform, {}},
      [](curandGenerator_t g, double* p, std::size_t n) {
        return curandGenerateUniformDouble(g, p, n);
      },
      "curandGenerateUniformDouble");
}

asio::awaitable<result<gpu_ref<float>>> rng_actor::normal(gpu_ref<float> out, float mean,
                                                          float stddev) const {
  constexpr std::string_view op = "normal";
  result<void> pre = detail::check_rng_normal(op, mean, stddev);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), true);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::normal, {mean, stddev}},
      [mean, stddev](curandGenerator_t g, float* p, std::size_t n) {
        return curandGenerateNormal(g, p, n, mean, stddev);
      },
      "curandGenerateNormal");
}

asio::awaitable<result<gpu_ref<double>>> rng_actor::normal(gpu_ref<double> out, double mean,
                                                           double stddev) const {
  constexpr std::string_view op = "normal";
  result<void> pre = detail::check_rng_normal(op, mean, stddev);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), true);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::normal, {mean, stddev}},
      [mean, stddev](curandGenerator_t g, double* p, std::size_t n) {
        return curandGenerateNormalDouble(g, p, n, mean, stddev);
      },
      "curandGenerateNormalDouble");
}

asio::awaitable<result<gpu_ref<float>>> rng_actor::log_normal(gpu_ref<float> out, float mean,
                                                              float stddev) const {
  constexpr std::string_view op = "log_normal";
  result<void> pre = detail::check_rng_normal(op, mean, stddev);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), true);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::log_normal, {mean, stddev}},
      [mean, stddev](curandGenerator_t g, float* p, std::size_t n) {
        return curandGenerateLogNormal(g, p, n, mean, stddev);
      },
      "curandGenerateLogNormal");
}

asio::awaitable<result<gpu_ref<double>>> rng_actor::log_normal(gpu_ref<double> out, double mean,
                                                               double stddev) const {
  constexpr std::string_view op = "log_normal";
  result<void> pre = detail::check_rng_normal(op, mean, stddev);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), true);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::log_normal, {mean, stddev}},
      [mean, stddev](curandGenerator_t g, double* p, std::size_t n) {
        return curandGenerateLogNormalDouble(g, p, n, mean, stddev);
      },
      "curandGenerateLogNormalDouble");
}

asio::awaitable<result<gpu_ref<std::uint32_t>>> rng_actor::poisson(gpu_ref<std::uint32_t> out,
                                                                   double lambda) const {
  constexpr std::string_view op = "poisson";
  result<void> pre = detail::check_rng_lambda(op, lambda);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), false);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::poisson, {lambda, 0.0}},
      [lambda](curandGenerator_t g, std::uint32_t* p, std::size_t n) {
        return curandGeneratePoisson(g, p, n, lambda);
      },
      "curandGeneratePoisson");
}

asio::awaitable<result<gpu_ref<std::uint32_t>>> rng_actor::raw(gpu_ref<std::uint32_t> out) const {
  constexpr std::string_view op = "raw";
  result<void> pre = detail::check_rng_raw_bits(op, st_->kind, 32);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), false);
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::raw, {}},
      [](curandGenerator_t g, std::uint32_t* p, std::size_t n) { return curandGenerate(g, p, n); },
      "curandGenerate");
}

asio::awaitable<result<gpu_ref<std::uint64_t>>> rng_actor::raw(gpu_ref<std::uint64_t> out) const {
  constexpr std::string_view op = "raw";
  result<void> pre = detail::check_rng_raw_bits(op, st_->kind, 64);
  if (pre) pre = detail::check_rng_count(op, st_->kind, st_->dimensions, out.size(), false);
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  return detail::generate(
      st_, op, std::move(out), std::move(pre), {detail::wire::actor_op::raw, {}},
      [](curandGenerator_t g, std::uint64_t* p, std::size_t n) {
        return curandGenerateLongLong(g, reinterpret_cast<unsigned long long*>(p), n);
      },
      "curandGenerateLongLong");
}

result<void> rng_actor::set_seed(std::uint64_t seed) const {
  if (auto ok = st_->accepting(); !ok) return ok.error().tagged(detail::k_lib);
  if (auto ok = detail::check_rng_seed(st_->kind); !ok) return ok.error().tagged(detail::k_lib);
  if (st_->remote_id) {  // the worker's twin is reseeded at the next request
    std::lock_guard lk(st_->seq_mu);
    st_->seed = seed;
    st_->remote.flags |= detail::wire::has_seed;
    st_->remote.limit = seed;
    st_->remote.offset = 0;
    ++st_->remote.epoch;
    return outcome::success();
  }
  if (st_->blocks) {
    // Each lane's generator is reseeded at its next generation (epoch).
    std::lock_guard lk(st_->seq_mu);
    st_->seed = seed;
    st_->next = 0;
    st_->epoch.fetch_add(1, std::memory_order_release);
    return outcome::success();
  }
  auto& lane = st_->lanes.first();  // the only one
  std::lock_guard lock(lane.mu);
  if (st_->kind == rng_kind::mtgp32) {
    BOOST_OUTCOME_TRY(lane.gen, detail::make_generator(*st_, lane.strm, seed, 0));
  } else {
    BOOST_OUTCOME_TRY(detail::curand_ok(curandSetPseudoRandomGeneratorSeed(lane.gen->gen, seed),
                                        "curandSetPseudoRandomGeneratorSeed"));
    BOOST_OUTCOME_TRY(
        detail::curand_ok(curandSetGeneratorOffset(lane.gen->gen, 0), "curandSetGeneratorOffset"));
  }
  std::lock_guard lk(st_->seq_mu);
  st_->seed = seed;
  return outcome::success();
}

result<void> rng_actor::set_offset(std::uint64_t offset) const {
  if (auto ok = st_->accepting(); !ok) return ok.error().tagged(detail::k_lib);
  if (auto ok = detail::check_rng_offset(st_->kind, offset); !ok)
    return ok.error().tagged(detail::k_lib);
  if (st_->remote_id) {  // the worker's twin moves there at the next request
    std::lock_guard lk(st_->seq_mu);
    st_->remote.offset = offset;
    ++st_->remote.epoch;
    return outcome::success();
  }
  if (st_->blocks) {
    // Each lane takes a new block at its next generation (epoch).
    std::lock_guard lk(st_->seq_mu);
    st_->next = offset;
    st_->epoch.fetch_add(1, std::memory_order_release);
    return outcome::success();
  }
  auto& lane = st_->lanes.first();  // the only one
  std::lock_guard lock(lane.mu);
  if (st_->kind == rng_kind::mtgp32) {  // offset 0: restart with the current seed
    std::optional<std::uint64_t> sd;
    {
      std::lock_guard lk(st_->seq_mu);
      sd = st_->seed;
    }
    BOOST_OUTCOME_TRY(lane.gen, detail::make_generator(*st_, lane.strm, sd, 0));
    return outcome::success();
  }
  return detail::curand_ok(curandSetGeneratorOffset(lane.gen->gen, offset),
                           "curandSetGeneratorOffset");
}

rng_statistics rng_actor::statistics() const {
  rng_statistics s;
  s.lanes = st_->lanes.size();
  st_->lanes.for_each_locked([&](const detail::rng_lane& l) { s.repositions += l.repositions; });
  return s;
}

rng_kind rng_actor::kind() const noexcept {
  return st_->kind;
}
unsigned rng_actor::dimensions() const noexcept {
  return st_->dimensions;
}
const device& rng_actor::get_device() const noexcept {
  return st_->dev;
}
const stream& rng_actor::get_stream() const noexcept {
  if (st_->remote_id) return st_->remote_stream;
  return st_->lanes.first().strm;
}
const completion& rng_actor::how() const noexcept {
  return st_->how;
}

}  // namespace atomr::cuda
