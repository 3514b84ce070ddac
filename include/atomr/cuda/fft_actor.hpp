// fft_actor: cuFFT transforms (C2C/Z2Z, R2C/D2Z, C2R/Z2D; rank 1-3, batched)
// as awaitables, with a bounded LRU cache of plans.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/detail/actor_core.hpp>
#include <atomr/cuda/detail/lru.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <boost/asio/awaitable.hpp>

#include <array>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace atomr::cuda {

/// The sign of the exponent: forward is e^{-2 pi i jk/N}, inverse e^{+2 pi i jk/N}.
enum class fft_direction : std::uint8_t {
  forward,  ///< CUFFT_FORWARD
  inverse,  ///< CUFFT_INVERSE
};

/// The enumerator's name ("forward", "inverse"); "unknown" for any other value.
std::string_view to_string(fft_direction d) noexcept;

/// The transform: a plain value, so that it can cross a process boundary.
///
/// Layout: dims[0..rank) in row-major order as cuFFT's n[] (dims[rank-1] is
/// contiguous); the `batch` transforms are packed one after the other with no
/// padding. Entries of `dims` at and beyond `rank` are ignored. For R2C the
/// complex side holds dims[rank-1]/2 + 1 elements in the last dimension (the
/// non-redundant half), for C2R likewise on its input.
struct fft_shape {
  int rank = 1;                            ///< 1, 2 or 3
  std::array<long long, 3> dims{1, 1, 1};  ///< the transform size, dims[0] slowest
  long long batch = 1;                     ///< number of transforms, > 0
  /// c2c: either; r2c must be forward and c2r inverse (checked, so that a
  /// shape written for one direction is not silently run in the other).
  fft_direction direction = fft_direction::forward;
  /// Scale the output of this transform by 1/N, N = dims[0]*...*dims[rank-1]
  /// (cuFFT itself never normalises). The usual choice is to set it on the
  /// inverse, so that inverse(forward(x)) == x; it applies to whichever
  /// direction is asked for. Done on the GPU by cuBLAS (?scal on the
  /// transform's stream, right after it); not_supported if cuBLAS is not linked.
  bool normalize = false;
};

/// How an fft_actor is created.
struct fft_options {
  /// How the lanes' streams are chosen (owner name "cufft"). Unset: a fresh
  /// stream per lane (stream_policy::per_actor_fresh), or the device's
  /// policy when max_lanes is 1 or the device's policy is single. single and
  /// per_actor_shared allow one lane, pooled at most stream_pool_size.
  std::optional<stream_policy> streams{};
  /// Completion strategy for every operation; the device's default when empty.
  std::optional<completion> how{};
  /// Plans kept per lane (each with its workspace); at least 1. The least
  /// recently used plan of a lane is evicted beyond it (it lives on until
  /// its last exec ends).
  std::size_t plan_cache_size = 16;
  /// The most lanes (a stream with its own plans each) the actor may make.
  /// It uses one per io thread that submits to it, a transform going to the
  /// lane its output hashes to, so that transforms from several threads launch in parallel
  /// (docs/design.md, "One actor, several lanes"); a lane makes its own
  /// plans on first use. 0: the device's launch_threads (8 by default; 8
  /// without launch threads). 1: one stream, as before lanes. At most 64.
  std::size_t max_lanes = 0;
};

/// A snapshot of an actor's plan caches, summed over its lanes.
struct fft_statistics {
  std::uint64_t plan_hits = 0;       ///< executions that found their plan cached
  std::uint64_t plan_misses = 0;     ///< executions that had to create a plan
  std::uint64_t plan_evictions = 0;  ///< plans dropped from the cache (LRU)
  std::size_t plans_cached = 0;      ///< plans held now, all lanes
  std::size_t plan_cache_size = 0;   ///< the bound, per lane
  std::size_t lanes = 0;             ///< lanes made so far (fft_options::max_lanes)
};

namespace detail {

/// Which family of transform, independent of precision.
enum class fft_kind : std::uint8_t { c2c, r2c, c2r };

/// The cuFFT transform type: kind x precision (cufftType C2C, Z2Z, R2C, D2Z, C2R, Z2D).
enum class fft_type : std::uint8_t { c2c, z2z, r2c, d2z, c2r, z2d };

std::string_view to_string(fft_type t) noexcept;

/// What a plan is keyed by. Unused dims are stored as 1.
struct fft_plan_key {
  int rank = 1;
  std::array<long long, 3> dims{1, 1, 1};
  long long batch = 1;
  fft_type type = fft_type::c2c;
  friend auto operator<=>(const fft_plan_key&, const fft_plan_key&) = default;
};

fft_plan_key make_plan_key(const fft_shape& s, fft_type t) noexcept;

/// Element counts of one call (whole batch), as the checks computed them.
struct fft_layout {
  long long points = 0;     ///< N = product of the dims (one transform)
  long long in_elems = 0;   ///< elements of the input buffer (its own type)
  long long out_elems = 0;  ///< elements of the output buffer
};

/// Checks rank (1..3), dims (> 0), batch (> 0), direction (valid, and
/// forward for r2c / inverse for c2r) and that every count fits in a long
/// long; yields the element counts. invalid_argument names "shape.<field>".
/// Pure: no GPU call.
result<fft_layout> check_fft_shape(std::string_view op, const fft_shape& s, fft_kind kind);

/// Checks that a buffer of `have` elements holds exactly `need`.
result<void> check_fft_size(std::string_view op, std::string_view arg, std::size_t have,
                            long long need);

/// Checks that [a, a + a_bytes) and [b, b + b_bytes) of one allocation do not
/// overlap (transforms here are out of place). Pure.
result<void> check_no_overlap(std::string_view op, bool same_allocation, std::size_t a,
                              std::size_t a_bytes, std::size_t b, std::size_t b_bytes);

/// Checks fft_options::plan_cache_size (>= 1) and max_lanes (<= 64).
result<void> check_fft_options(const fft_options& o);

/// Every check of one call, in order: the shape, then each buffer (empty,
/// another device, stale, exact size), then that output and input do not
/// overlap. No GPU call.
template <element In, element Out>
result<fft_layout> check_fft_call(std::string_view op, const fft_shape& s, fft_kind kind,
                                  const gpu_ref<In>& in, const gpu_ref<Out>& out,
                                  const device& dev) {
  BOOST_OUTCOME_TRY(auto lay, check_fft_shape(op, s, kind));
  BOOST_OUTCOME_TRY(check_ref(op, "input", in, dev, 0));
  BOOST_OUTCOME_TRY(check_fft_size(op, "input", in.size(), lay.in_elems));
  BOOST_OUTCOME_TRY(check_ref(op, "output", out, dev, 0));
  BOOST_OUTCOME_TRY(check_fft_size(op, "output", out.size(), lay.out_elems));
  BOOST_OUTCOME_TRY(check_no_overlap(op, in.state() == out.state(), in.offset() * sizeof(In),
                                     in.size_bytes(), out.offset() * sizeof(Out),
                                     out.size_bytes()));
  return lay;
}

struct fft_state;

}  // namespace detail

/// One cuFFT user: a copyable handle over a shared state (its device and its
/// lanes: each a stream, a plan cache whose plans are bound to that stream
/// and, once a normalised transform is asked for, a cuBLAS handle bound to
/// the same stream). The actor uses one lane per io thread that submits to
/// it (up to fft_options::max_lanes), a transform going to the lane its
/// output hashes to, so one actor shared by many io threads launches on as
/// many streams.
///
/// Every operation checks all its arguments before any GPU call
/// (invalid_argument naming the argument), fails at once when the device no
/// longer accepts work, then enqueues through run_kernel: the lane's plan is
/// looked up (or created, with its workspace from the device pool) and
/// executed under the lane's enqueue lock, which is released before the
/// wait, so the next request enqueues while this transform runs. Plans
/// evicted from the cache live until every transform that used them has
/// finished. Ordering is per buffer (events across lanes): a transform
/// awaited before the next operation is issued is seen by it. Transforms
/// are out of place; the output is written whole.
///
/// Thread safety: all members may be called from any thread, by coroutines
/// on io_contexts run by several threads. Parameters are plain values.
class fft_actor {
public:
  using c32 = std::complex<float>;   ///< a single-precision complex element
  using c64 = std::complex<double>;  ///< a double-precision complex element

  /// An actor on `dev`: acquires its first lane's stream (no other GPU call;
  /// plans are made on first use). invalid_argument for bad options (before
  /// anything else), device_unavailable when the device does not accept
  /// work, not_supported when the device's library_set disables cuFFT.
  static result<fft_actor> create(device dev, fft_options options = {});

  /// Complex to complex, single precision (cufftExecC2C). Yields `out`.
  asio::awaitable<result<gpu_ref<c32>>> c2c(fft_shape shape, gpu_ref<c32> in,
                                            gpu_ref<c32> out) const;
  /// Complex to complex, double precision (cufftExecZ2Z). Yields `out`.
  asio::awaitable<result<gpu_ref<c64>>> c2c(fft_shape shape, gpu_ref<c64> in,
                                            gpu_ref<c64> out) const;
  /// Real to complex, forward (cufftExecR2C): `in` has batch*N reals, `out`
  /// batch*N/dims[rank-1]*(dims[rank-1]/2+1) complex values. Yields `out`.
  asio::awaitable<result<gpu_ref<c32>>> r2c(fft_shape shape, gpu_ref<float> in,
                                            gpu_ref<c32> out) const;
  /// Real to complex, double precision (cufftExecD2Z). Yields `out`.
  asio::awaitable<result<gpu_ref<c64>>> r2c(fft_shape shape, gpu_ref<double> in,
                                            gpu_ref<c64> out) const;
  /// Complex to real, inverse (cufftExecC2R); sizes mirror r2c. cuFFT uses
  /// the input as scratch: **`in` is overwritten** (ordered as a write).
  /// Yields `out`.
  asio::awaitable<result<gpu_ref<float>>> c2r(fft_shape shape, gpu_ref<c32> in,
                                              gpu_ref<float> out) const;
  /// Complex to real, double precision (cufftExecZ2D); `in` is overwritten.
  asio::awaitable<result<gpu_ref<double>>> c2r(fft_shape shape, gpu_ref<c64> in,
                                               gpu_ref<double> out) const;

  // ---- Completion tokens (docs/design.md, "Completion tokens") ----
  // Each transform above also takes any Asio completion token as its last
  // argument: it then completes with void(result<gpu_ref<Out>>) on the
  // handler's associated executor; it runs on the handler's executor when
  // that has one of its own, else on the device's executor. The handler's
  // cancellation slot reaches the wait (terminal, partial, total:
  // errc::cancelled). The operation holds its own copy of this actor. Costs
  // one co_spawn on top of the awaitable. They exist for exactly the element
  // types the awaitables take.

  /// The transform of the same name, completing through an Asio completion
  /// token with void(result<gpu_ref<Out>>) instead of returning an awaitable
  /// (see the comment above these overloads).
  /// @{
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const fft_actor& s, fft_shape sh, gpu_ref<T> x) { s.c2c(sh, x, x); }
  auto c2c(fft_shape shape, gpu_ref<T> in, gpu_ref<T> out, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const fft_actor& s) { return s.c2c(shape, in, out); });
  }
  template <element In, element Out, result_token<gpu_ref<Out>> Token>
  requires requires(const fft_actor& s, fft_shape sh, gpu_ref<In> x, gpu_ref<Out> y) {
    s.r2c(sh, x, y);
  }
  auto r2c(fft_shape shape, gpu_ref<In> in, gpu_ref<Out> out, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const fft_actor& s) { return s.r2c(shape, in, out); });
  }
  template <element In, element Out, result_token<gpu_ref<Out>> Token>
  requires requires(const fft_actor& s, fft_shape sh, gpu_ref<In> x, gpu_ref<Out> y) {
    s.c2r(sh, x, y);
  }
  auto c2r(fft_shape shape, gpu_ref<In> in, gpu_ref<Out> out, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const fft_actor& s) { return s.c2r(shape, in, out); });
  }
  /// @}

  /// Plan cache counts, summed over the lanes. Takes each lane's lock
  /// briefly; no GPU call.
  fft_statistics statistics() const;
  /// Drops every cached plan of every lane (each lives on until its last
  /// exec ended).
  void clear_plans() const;

  /// The device the actor was created on.
  const device& get_device() const noexcept;
  /// The first lane's stream. With more than one lane, transforms may run
  /// on the others' streams too (their buffers are ordered by events).
  const stream& get_stream() const noexcept;

  /// Wraps the library's state; create() is how users make an actor.
  explicit fft_actor(std::shared_ptr<detail::fft_state> st) noexcept : st_(std::move(st)) {}

private:
  std::shared_ptr<detail::fft_state> st_;
};

}  // namespace atomr::cuda
