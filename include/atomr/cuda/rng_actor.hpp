// rng_actor: cuRAND generation (uniform, normal, log-normal, Poisson, raw bits) as awaitables.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>

namespace atomr::cuda {

/// The cuRAND generator an rng_actor owns.
enum class rng_kind : std::uint8_t {
  philox4_32_10,      ///< CURAND_RNG_PSEUDO_PHILOX4_32_10 (the default)
  xorwow,             ///< CURAND_RNG_PSEUDO_XORWOW
  mrg32k3a,           ///< CURAND_RNG_PSEUDO_MRG32K3A
  mtgp32,             ///< CURAND_RNG_PSEUDO_MTGP32 (no offset: cuRAND cannot skip ahead)
  sobol32,            ///< CURAND_RNG_QUASI_SOBOL32
  scrambled_sobol32,  ///< CURAND_RNG_QUASI_SCRAMBLED_SOBOL32
  sobol64,            ///< CURAND_RNG_QUASI_SOBOL64 (raw values are 64-bit)
  scrambled_sobol64,  ///< CURAND_RNG_QUASI_SCRAMBLED_SOBOL64 (raw values are 64-bit)
};

/// The enumerator's name ("philox4_32_10", ...); "unknown" for any other value.
std::string_view to_string(rng_kind k) noexcept;

/// Settings of one rng_actor, fixed at create() (seed and offset may change later).
struct rng_options {
  rng_kind kind = rng_kind::philox4_32_10;  ///< the generator
  /// Pseudo-random generators only; unset means cuRAND's default seed (0).
  /// A quasi-random generator takes no seed: setting one is invalid_argument.
  std::optional<std::uint64_t> seed{};
  /// Absolute position in the sequence (in 32-bit values for pseudo-random
  /// generators, in points for quasi-random ones). MTGP32 accepts only 0.
  std::uint64_t offset = 0;
  /// Quasi-random generators: the number of dimensions, 1 to 20000. Results
  /// are laid out dimension by dimension (count/dimensions values each).
  /// Pseudo-random generators accept only 1.
  unsigned dimensions = 1;
  /// How the lanes' streams are chosen. Unset: a fresh stream per lane
  /// (stream_policy::per_actor_fresh), or the device's policy when the actor
  /// has one lane (max_lanes 1, a generator other than Philox) or the
  /// device's policy is single. single and per_actor_shared allow one lane,
  /// pooled at most stream_pool_size.
  std::optional<stream_policy> streams{};
  /// How completion is awaited; unset: the device's default strategy.
  std::optional<completion> how{};
  /// The most lanes (a stream and a generator bound to it each) the actor
  /// may make (one per submitting io thread; docs/design.md, "One actor,
  /// several lanes"). 0: the device's launch_threads (8 by default; 8
  /// without launch threads). 1: one generator, and numbers in submission
  /// order (see rng_actor). At most 64. Only Philox gets more than one
  /// lane: its lanes share the actor's one sequence by drawing from blocks
  /// of it, a counter-based generator being set to a block's start once.
  /// Every other kind keeps one
  /// generator whatever this says: XORWOW and MRG32k3a would rebuild their
  /// state at every offset change, MTGP32 cannot skip ahead, and the Sobol
  /// generators' points are laid out by dimension.
  std::size_t max_lanes = 0;
};

/// A snapshot of an rng_actor's counts.
struct rng_statistics {
  std::size_t lanes = 0;  ///< lanes made so far (rng_options::max_lanes)
  /// Philox: operations that had to point their lane's generator at a new
  /// position (curandSetGeneratorOffset). Each makes cuRAND wait, on the
  /// calling thread, for all work queued on the device; they happen when a
  /// lane starts a block of the sequence that does not follow its last one
  /// (a lane's first operation, after set_seed or set_offset, a block used
  /// up with several lanes), for every double operation and the one after
  /// it, and after a failed cuRAND call.
  std::uint64_t repositions = 0;
};

namespace detail {

struct rng_state;

/// Largest quasi-random dimension count cuRAND accepts.
inline constexpr unsigned rng_max_dimensions = 20000;
/// Largest Poisson lambda cuRAND accepts.
inline constexpr double rng_max_lambda = 400000.0;

bool is_quasi(rng_kind k) noexcept;
/// True for the generators whose raw values are 64-bit (sobol64, scrambled_sobol64).
bool is_64bit(rng_kind k) noexcept;

// Pure checks (no GPU call), each answering invalid_argument naming the operation
// and the argument. They are what rng_actor runs before any cuRAND call.

/// kind in range; seed only for pseudo-random; dimensions 1..20000 (1 for
/// pseudo-random); offset 0 for MTGP32; max_lanes at most 64.
result<void> check_rng_options(const rng_options& o);
/// True for the generators that may have several lanes (Philox).
bool rng_lanes_allowed(rng_kind k) noexcept;
/// Positions (32-bit values) of a Philox sequence that one operation making
/// `count` values of `value_bytes` bytes each takes: `count` for 32-bit
/// values (exactly what cuRAND's generator moves on by), 2 * count + 2^18 +
/// 64 for doubles (what cuRAND's double kernels read, measured on the H200;
/// docs/design.md, "One random sequence per seed").
std::uint64_t rng_sequence_span(std::size_t count, std::size_t value_bytes) noexcept;
/// Philox: the positions a lane takes from its actor's sequence at a time (2^36).
inline constexpr std::uint64_t rng_lane_block = std::uint64_t{1} << 36;
/// set_seed: only pseudo-random generators have a seed.
result<void> check_rng_seed(rng_kind k);
/// set_offset: MTGP32 cannot skip ahead (only 0 is accepted).
result<void> check_rng_offset(rng_kind k, std::uint64_t offset);
/// `count` output values: non-zero; a multiple of `dimensions` for quasi-random
/// generators; even for normal/log-normal (`pairs`) on pseudo-random generators
/// (Box-Muller makes values in pairs).
result<void> check_rng_count(std::string_view op, rng_kind k, unsigned dimensions,
                             std::size_t count, bool pairs);
/// mean finite, stddev finite and > 0.
result<void> check_rng_normal(std::string_view op, double mean, double stddev);
/// lambda finite, > 0 and <= 400000.
result<void> check_rng_lambda(std::string_view op, double lambda);
/// Raw values of `bits` (32 or 64): 64-bit only from sobol64/scrambled_sobol64,
/// 32-bit from every other generator.
result<void> check_rng_raw_bits(std::string_view op, rng_kind k, unsigned bits);

}  // namespace detail

/// cuRAND on one device: one random sequence per seed, made by generators
/// each bound once to a stream of its own (lanes). A copyable handle: copies
/// share the generators, whose calls are serialised per lane (the lock is
/// held only around the synchronous cuRAND calls, never while the GPU works).
/// Several rng_actors may exist, each with its own sequence.
///
/// The sequence: every operation takes its own range of it, so operations
/// never share random bits. One lane (an actor used by one coroutine at a
/// time, or max_lanes = 1) takes the ranges end to end in the order its
/// enqueues run: one coroutine issuing operations one after the other gets
/// the same numbers for the same seed and offset every time, and while only
/// 32-bit values are drawn they are exactly a plain cuRAND Philox
/// generator's used the same way (a double operation takes more of the
/// sequence than cuRAND moves on by, so no two operations share bits; after
/// one the two differ; each double operation is cuRAND's with its generator
/// set to its range, which costs a wait for the device: see
/// rng_statistics::repositions). A Philox actor adds a lane per submitting io thread
/// (up to rng_options::max_lanes); each lane takes blocks of rng_lane_block
/// (2^36) positions from the sequence, from the offset on, and its
/// operations run end to end in its block, so no lane ever moves its
/// generator (curandSetGeneratorOffset makes cuRAND wait for the whole
/// device) except at its first operation and after set_seed or set_offset.
/// With several lanes which range an operation gets depends on which lane
/// runs it: numbers are then reproducible only per lane. test/test_gpu_lanes.cpp
/// checks all of this against cuRAND on the GPU. Other generators have one
/// lane whose generator moves on by itself, as cuRAND does.
///
/// Every operation fills all of `out` and yields it; arguments are checked
/// before any GPU call (invalid_argument naming the argument), and once the
/// device is poisoned or stopped every call fails at once. A generator
/// lives until the GPU is done with the last operation that used it.
/// Thread safety: all members may be called from any thread.
class rng_actor {
public:
  /// Creates the first lane's generator (curandCreateGenerator), sets seed,
  /// offset and dimensions and binds it to a stream of `dev`
  /// (curandSetStream). Fails with device_unavailable (or the device's
  /// fault) when `dev` does not accept work (checked first), not_supported
  /// when the device's options disable cuRAND, and invalid_argument for bad
  /// options.
  static result<rng_actor> create(device dev, rng_options options = {});

  /// Uniform in (0, 1] (cuRAND excludes 0 and includes 1).
  /// @{
  asio::awaitable<result<gpu_ref<float>>> uniform(gpu_ref<float> out) const;
  asio::awaitable<result<gpu_ref<double>>> uniform(gpu_ref<double> out) const;
  /// @}

  /// Normal(mean, stddev). Pseudo-random generators need an even out.size().
  /// @{
  asio::awaitable<result<gpu_ref<float>>> normal(gpu_ref<float> out, float mean = 0.0f,
                                                 float stddev = 1.0f) const;
  asio::awaitable<result<gpu_ref<double>>> normal(gpu_ref<double> out, double mean = 0.0,
                                                  double stddev = 1.0) const;
  /// @}

  /// exp(Normal(mean, stddev)). Pseudo-random generators need an even out.size().
  /// @{
  asio::awaitable<result<gpu_ref<float>>> log_normal(gpu_ref<float> out, float mean = 0.0f,
                                                     float stddev = 1.0f) const;
  asio::awaitable<result<gpu_ref<double>>> log_normal(gpu_ref<double> out, double mean = 0.0,
                                                      double stddev = 1.0) const;
  /// @}

  /// Poisson(lambda), 0 < lambda <= 400000.
  asio::awaitable<result<gpu_ref<std::uint32_t>>> poisson(gpu_ref<std::uint32_t> out,
                                                          double lambda) const;

  /// Raw 32-bit values (curandGenerate): every generator but the 64-bit Sobol ones.
  asio::awaitable<result<gpu_ref<std::uint32_t>>> raw(gpu_ref<std::uint32_t> out) const;
  /// Raw 64-bit values (curandGenerateLongLong): sobol64 and scrambled_sobol64 only.
  asio::awaitable<result<gpu_ref<std::uint64_t>>> raw(gpu_ref<std::uint64_t> out) const;

  // ---- Completion tokens (docs/design.md, "Completion tokens") ----
  // Each operation above also takes any Asio completion token as its last
  // argument, after the full argument list; normal and log_normal also take
  // it right after `out`, for the default mean and stddev. It then completes
  // with void(result<gpu_ref<T>>) on the handler's associated executor; it
  // runs on the handler's executor when that has one of its own, else on the
  // device's executor. The handler's cancellation slot reaches the wait
  // (terminal, partial, total: errc::cancelled). The operation holds its own
  // copy of this actor. Costs one co_spawn on top of the awaitable. They
  // exist for exactly the element types the awaitables take.

  /// The operation of the same name, completing through an Asio completion
  /// token with void(result<gpu_ref<T>>) instead of returning an awaitable
  /// (see the comment above these overloads).
  /// @{
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const rng_actor& s, gpu_ref<T> x) { s.uniform(x); }
  auto uniform(gpu_ref<T> out, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const rng_actor& s) { return s.uniform(out); });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const rng_actor& s, gpu_ref<T> x, T v) { s.normal(x, v, v); }
  auto normal(gpu_ref<T> out, std::type_identity_t<T> mean, std::type_identity_t<T> stddev,
              Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const rng_actor& s) { return s.normal(out, mean, stddev); });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const rng_actor& s, gpu_ref<T> x, T v) { s.normal(x, v, v); }
  auto normal(gpu_ref<T> out, Token&& token) const {
    return normal(std::move(out), T(0), T(1), std::forward<Token>(token));
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const rng_actor& s, gpu_ref<T> x, T v) { s.log_normal(x, v, v); }
  auto log_normal(gpu_ref<T> out, std::type_identity_t<T> mean, std::type_identity_t<T> stddev,
                  Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const rng_actor& s) {
      return s.log_normal(out, mean, stddev);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const rng_actor& s, gpu_ref<T> x, T v) { s.log_normal(x, v, v); }
  auto log_normal(gpu_ref<T> out, Token&& token) const {
    return log_normal(std::move(out), T(0), T(1), std::forward<Token>(token));
  }
  template <result_token<gpu_ref<std::uint32_t>> Token>
  auto poisson(gpu_ref<std::uint32_t> out, double lambda, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const rng_actor& s) { return s.poisson(out, lambda); });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const rng_actor& s, gpu_ref<T> x) { s.raw(x); }
  auto raw(gpu_ref<T> out, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const rng_actor& s) { return s.raw(out); });
  }
  /// @}

  /// Sets the seed (pseudo-random generators only) and restarts the sequence
  /// at offset 0, so that the same seed gives the same numbers again. Takes
  /// effect for operations issued after it returns. Philox makes no cuRAND
  /// call here: each lane's generator is reseeded at its next operation (a
  /// cuRAND error then fails that operation), which starts a new block
  /// (the first lane to run one gets offset 0).
  result<void> set_seed(std::uint64_t seed) const;
  /// Moves to the absolute position `offset` (Philox: the next block
  /// starts there, and every lane takes a new one at its next operation).
  /// MTGP32 cannot skip ahead: it accepts only 0, which restarts its
  /// sequence from the current seed.
  result<void> set_offset(std::uint64_t offset) const;

  /// The lane count and repositions; no GPU call (each lane's lock, briefly).
  rng_statistics statistics() const;

  /// The generator (rng_options::kind).
  rng_kind kind() const noexcept;
  /// The quasi-random dimensions (rng_options::dimensions; 1 for pseudo-random).
  unsigned dimensions() const noexcept;
  /// The device the actor was created on.
  const device& get_device() const noexcept;
  /// The first lane's stream. With more than one lane, operations may run on
  /// the others' streams too (their buffers are ordered by events).
  const stream& get_stream() const noexcept;
  /// How operations wait for the GPU (rng_options::how, else the device's default).
  const completion& how() const noexcept;

private:
  explicit rng_actor(std::shared_ptr<detail::rng_state> st) noexcept : st_(std::move(st)) {}
  std::shared_ptr<detail::rng_state> st_;
};

}  // namespace atomr::cuda
