// blas_actor: cuBLAS behind an actor. Lanes made on demand, each a handle
// bound once to a stream of its own; every argument checked before any
// library call; every operation an awaitable.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace atomr::cuda {

/// op(X) of BLAS: X itself or its transpose. Matrices are column-major, as in cuBLAS.
enum class blas_op : std::uint8_t {
  n,  ///< op(X) = X
  t,  ///< op(X) = X^T
};

/// Settings of one blas_actor.
struct blas_options {
  /// How the lanes' streams are chosen. Unset: a fresh stream per lane
  /// (stream_policy::per_actor_fresh), or the device's policy when max_lanes
  /// is 1 or the device's policy is single. single and per_actor_shared
  /// allow one lane, pooled at most device_options::stream_pool_size.
  std::optional<stream_policy> streams{};
  /// TF32 tensor-core math for f32 (CUBLAS_TF32_TENSOR_OP_MATH). Off: pedantic
  /// math (CUBLAS_PEDANTIC_MATH), so f32 results are exact to ~1e-6.
  bool tf32 = false;
  /// How operations wait for the GPU; default: the device's default completion.
  std::optional<completion> how{};
  /// gemm calls recorded as CUDA graphs, at most this many (least recently
  /// used dropped first); 0 (the default) turns recording off. A gemm is
  /// recorded the second time the same call (parameters, alpha, beta, math
  /// mode and buffers) is seen, and later identical calls launch the graph
  /// (cudaGraphLaunch instead of cuBLAS's host work per call), using the
  /// actor's workspace. Off by default: one io thread ran small gemms 2.2x
  /// faster, but many distinct recorded calls launched from several threads
  /// ran slower than plain calls, and left the process's other cuBLAS calls
  /// slower for a while after (docs/design.md). Suits one thread replaying
  /// a few calls.
  std::size_t cuda_graph_cache = 0;
  /// f32 gemm through cuBLASLt (cublasLtMatmul) with the algorithm chosen
  /// once per shape, math mode and pointer alignment and cached, instead of
  /// cublasSgemm, which runs cuBLAS's heuristics on every call. Same math
  /// (pedantic f32, or TF32 when `tf32`); on the H200 host it cost ~2 us less
  /// host time per small call (docs/history/performance.md, session 10). Uses the
  /// actor's workspace (32 MiB from compute capability 9, else 4 MiB, made
  /// on first use). A shape cuBLASLt has no algorithm for, an empty one, or
  /// a workspace that could not be made falls back to cublasSgemm.
  bool lt_matmul = true;
  /// The most lanes (a stream, a cuBLAS handle bound to it, its workspace
  /// and caches each) the actor may make. It uses one lane per io thread
  /// that submits to it, up to this many, made on first use (a few ms,
  /// once); an operation goes to the lane its written buffer hashes to, so
  /// operations from several threads launch in parallel (docs/design.md,
  /// "One actor, several lanes"). 0: the device's launch_threads (8 by
  /// default; 8 without launch threads). 1: one handle on one stream, as
  /// before lanes. At most 64.
  std::size_t max_lanes = 0;
};

/// A snapshot of an actor's counts, summed over its lanes.
struct blas_statistics {
  std::uint64_t gemm_graph_records = 0;   ///< gemm calls recorded into a CUDA graph
  std::uint64_t gemm_graph_launches = 0;  ///< gemm calls run as a recorded graph
  std::uint64_t gemm_graph_failures = 0;  ///< recordings that failed (recording then stops)
  std::size_t gemm_graphs_cached = 0;     ///< recorded gemm graphs held now (cuda_graph_cache)
  std::uint64_t gemm_lt_calls = 0;  ///< f32 gemm and gemm_fused calls made through cublasLtMatmul
  std::uint64_t gemm_lt_plans = 0;  ///< cuBLASLt algorithm choices made (cached after)
  std::uint64_t gemm_lt_fallbacks = 0;  ///< f32 gemm calls cuBLASLt could not take
  std::size_t lanes = 0;                ///< lanes made so far (blas_options::max_lanes)
};

/// C = alpha * op(A) * op(B) + beta * C, with op(A) m x k, op(B) k x n, C m x n.
/// A leading dimension of 0 means tight: the number of rows of the stored matrix.
/// alpha and beta are converted to the compute type (f32 for f32, f16 and bf16).
struct gemm_params {
  blas_op transa = blas_op::n;  ///< op of A
  blas_op transb = blas_op::n;  ///< op of B
  /// The shape: op(A) is m x k, op(B) k x n, C m x n; each >= 0 and fits in int.
  /// @{
  std::int64_t m = 0, n = 0, k = 0;
  /// @}
  /// Leading dimensions of the stored A, B and C; 0: tight (their rows),
  /// else at least that.
  /// @{
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  /// @}
  double alpha = 1.0;  ///< scales op(A) op(B)
  double beta = 0.0;   ///< scales C's previous contents; 0: C is only written
};

/// What gemm_fused applies to each element x = alpha * op(A) op(B) + beta * C
/// in the same cuBLASLt kernel (CUBLASLT_MATMUL_DESC_EPILOGUE). The bias
/// holds one value per row of C, added to every column.
enum class gemm_epilogue : std::uint8_t {
  bias,       ///< x + bias[row] (CUBLASLT_EPILOGUE_BIAS)
  relu,       ///< max(x, 0) (CUBLASLT_EPILOGUE_RELU)
  gelu,       ///< GELU(x), cuBLASLt's tanh form (CUBLASLT_EPILOGUE_GELU)
  bias_relu,  ///< max(x + bias[row], 0) (CUBLASLT_EPILOGUE_RELU_BIAS)
  bias_gelu,  ///< GELU(x + bias[row]) (CUBLASLT_EPILOGUE_GELU_BIAS)
};
/// The enumerator's name ("bias", "relu", ...); "unknown" for any other value.
std::string_view to_string(gemm_epilogue e) noexcept;

/// A stride of batch_params meaning tight: ld * (columns of the stored matrix).
inline constexpr std::int64_t tight_stride = -1;

/// Strided batches: matrix i of A starts at element i * stride_a of the buffer.
/// Strides of A and B may be 0 (the same matrix for every batch); C's must
/// keep the batches of C apart.
struct batch_params {
  std::int64_t count = 1;                ///< number of matrices in each batch (>= 0)
  std::int64_t stride_a = tight_stride;  ///< elements from one A to the next
  std::int64_t stride_b = tight_stride;  ///< elements from one B to the next
  std::int64_t stride_c = tight_stride;  ///< elements from one C to the next (>= one C's span)
};

/// y = alpha * op(A) * x + beta * y, with A stored m x n (before op).
struct gemv_params {
  blas_op trans = blas_op::n;  ///< op of A
  /// Rows and columns of the stored A; x has n elements (m with blas_op::t)
  /// and y m (n with blas_op::t).
  /// @{
  std::int64_t m = 0, n = 0;
  /// @}
  std::int64_t lda = 0;  ///< 0: tight (m)
  /// Steps between consecutive elements of x and y; not 0, may be negative.
  /// @{
  std::int64_t incx = 1, incy = 1;
  /// @}
  double alpha = 1.0;  ///< scales op(A) x
  double beta = 0.0;   ///< scales y's previous contents; 0: y is only written
};

namespace detail {

struct blas_state;

/// max_lanes at most 64, else invalid_argument naming it; no CUDA call.
/// create() checks its options with this first.
result<void> check_blas_options(const blas_options& o);

// Pure argument checks (no GPU): each returns the values cuBLAS gets, or
// invalid_argument naming the operation and the bad argument. Sizes are the
// element counts of the buffers passed.

struct gemm_plan {
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  std::size_t a_elems = 0, b_elems = 0, c_elems = 0;  ///< elements each matrix spans
};
result<gemm_plan> check_gemm(const gemm_params& p, std::size_t a_size, std::size_t b_size,
                             std::size_t c_size, std::string_view op = "gemm");

/// gemm's checks, a known epilogue, and `bias`: empty for relu and gelu,
/// exactly m elements (one per row of C) for the bias epilogues.
result<gemm_plan> check_gemm_fused(const gemm_params& p, gemm_epilogue e, std::size_t a_size,
                                   std::size_t b_size, std::size_t bias_size, std::size_t c_size);
/// True for bias, bias_relu and bias_gelu.
bool epilogue_has_bias(gemm_epilogue e) noexcept;

struct gemm_batched_plan {
  gemm_plan g;  ///< a_elems... are the spans of all batches
  int count = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
};
result<gemm_batched_plan> check_gemm_batched(const gemm_params& p, const batch_params& b,
                                             std::size_t a_size, std::size_t b_size,
                                             std::size_t c_size);

struct gemv_plan {
  int m = 0, n = 0, lda = 0, incx = 0, incy = 0;
  std::size_t a_elems = 0, x_elems = 0, y_elems = 0;
};
result<gemv_plan> check_gemv(const gemv_params& p, std::size_t a_size, std::size_t x_size,
                             std::size_t y_size);

struct level1_plan {
  int n = 0, incx = 0, incy = 0;
  std::size_t x_elems = 0, y_elems = 0;
};
/// axpy and dot: incx, incy != 0 (negative: traversed backwards, as in BLAS).
result<level1_plan> check_axpy(std::int64_t n, std::int64_t incx, std::size_t x_size,
                               std::int64_t incy, std::size_t y_size);
result<level1_plan> check_dot(std::int64_t n, std::int64_t incx, std::size_t x_size,
                              std::int64_t incy, std::size_t y_size);
/// scal, nrm2, asum, iamax: incx > 0 (BLAS does nothing otherwise); n >= min_n.
result<level1_plan> check_vector_op(std::string_view op, std::int64_t n, std::int64_t incx,
                                    std::size_t x_size, std::int64_t min_n = 0);

/// The output range [out_begin, out_begin + out_count) of one allocation must not
/// overlap the input range of the same allocation.
result<void> check_disjoint(std::string_view op, std::string_view out, std::size_t out_begin,
                            std::size_t out_count, std::string_view in, std::size_t in_begin,
                            std::size_t in_count);

}  // namespace detail

/// cuBLAS on one device, in lanes: each lane is a cuBLAS handle bound once
/// to a stream of its own (host pointer mode), with its own workspace and
/// caches. The actor uses one lane per io thread that submits to it (up to
/// blas_options::max_lanes), an operation going to the lane its written
/// buffer hashes to, so one actor shared by many io threads launches on as
/// many streams. A copyable
/// handle: copies share the lanes. Operations may be awaited from any number
/// of threads; each lane's enqueues are serialised by a mutex held only
/// during the synchronous cuBLAS calls, never while the GPU runs. Ordering
/// is per buffer: an operation waits on the GPU for earlier work on its
/// buffers from other lanes (cudaStreamWaitEvent), so an operation awaited
/// before the next one is issued is seen by it whichever lanes they ran on.
/// Every operation checks its arguments before any GPU call
/// (invalid_argument naming the argument) and fails fast with the device's
/// error once it no longer accepts work. Buffers are taken by value and kept
/// alive until the GPU is done with them.
///
/// The handles are destroyed (cublasDestroy, which synchronises the device)
/// with the last copy and the last operation in flight; never once the
/// device is poisoned.
class blas_actor {
public:
  /// Makes the first lane (its stream, cublasCreate: a few ms).
  /// invalid_argument for bad options (before anything else);
  /// device_unavailable without a usable device; not_supported when the
  /// device's library_set disables cuBLAS; the cuBLAS error of cublasCreate
  /// otherwise.
  static result<blas_actor> create(device dev, blas_options options = {});

  /// The device the actor was created on.
  const device& get_device() const noexcept;
  /// The first lane's stream. With more than one lane, operations may run on
  /// the others' streams too (their buffers are ordered by events).
  const stream& get_stream() const noexcept;
  /// How operations wait for the GPU (blas_options::how, else the device's default).
  const completion& get_completion() const noexcept;
  /// Whether f32 operations use TF32 math (blas_options::tf32, set_tf32).
  bool tf32() const noexcept;
  /// Switches TF32 math for later f32 operations (no GPU work): sets it on
  /// every lane's handle (cublasSetMathMode, taking each lane's lock briefly).
  result<void> set_tf32(bool on);
  /// Sums over the lanes; takes each lane's lock briefly.
  blas_statistics statistics() const;

  // Each yields its output buffer (C or y or x) once the GPU has finished.

  /// C = alpha * op(A) op(B) + beta * C (gemm_params); yields C. f32 in the
  /// actor's math mode (through cuBLASLt unless blas_options::lt_matmul is
  /// off), f64, and f16 and bf16 with f32 accumulation. Arguments are
  /// checked first (shape, leading dimensions, buffer sizes, C not
  /// overlapping A or B): invalid_argument naming the argument.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> gemm(gemm_params p, gpu_ref<float> a, gpu_ref<float> b,
                                               gpu_ref<float> c) const;
  asio::awaitable<result<gpu_ref<double>>> gemm(gemm_params p, gpu_ref<double> a, gpu_ref<double> b,
                                                gpu_ref<double> c) const;
  asio::awaitable<result<gpu_ref<half>>> gemm(gemm_params p, gpu_ref<half> a, gpu_ref<half> b,
                                              gpu_ref<half> c) const;
  asio::awaitable<result<gpu_ref<bfloat16>>> gemm(gemm_params p, gpu_ref<bfloat16> a,
                                                  gpu_ref<bfloat16> b, gpu_ref<bfloat16> c) const;
  /// @}

  /// C = epilogue(alpha * op(A) op(B) + beta * C), the epilogue fused into
  /// the matmul kernel (cublasLtMatmul; docs/design.md, "Fused gemm
  /// epilogues"). f32 in the actor's math mode (pedantic, or TF32), f16 and
  /// bf16 with f32 accumulation and scaling. `bias`: an empty gpu_ref for
  /// relu and gelu, m elements of the same type for the bias epilogues
  /// (read, not written). Arguments are checked as gemm's, plus the
  /// epilogue and the bias, before any GPU call; not_supported when
  /// cuBLASLt has no algorithm for the shape.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> gemm_fused(gemm_params p, gemm_epilogue e,
                                                     gpu_ref<float> a, gpu_ref<float> b,
                                                     gpu_ref<float> bias, gpu_ref<float> c) const;
  asio::awaitable<result<gpu_ref<half>>> gemm_fused(gemm_params p, gemm_epilogue e, gpu_ref<half> a,
                                                    gpu_ref<half> b, gpu_ref<half> bias,
                                                    gpu_ref<half> c) const;
  asio::awaitable<result<gpu_ref<bfloat16>>> gemm_fused(gemm_params p, gemm_epilogue e,
                                                        gpu_ref<bfloat16> a, gpu_ref<bfloat16> b,
                                                        gpu_ref<bfloat16> bias,
                                                        gpu_ref<bfloat16> c) const;
  /// @}

  /// gemm over `b.count` matrices at a time (cublasGemmStridedBatchedEx):
  /// C_i = alpha * op(A_i) op(B_i) + beta * C_i, matrix i of each buffer at
  /// i times its stride (batch_params); yields C. Element types and checks
  /// as gemm's, plus the strides (the batches of C may not overlap).
  /// @{
  asio::awaitable<result<gpu_ref<float>>> gemm_strided_batched(gemm_params p, batch_params b,
                                                               gpu_ref<float> a, gpu_ref<float> bm,
                                                               gpu_ref<float> c) const;
  asio::awaitable<result<gpu_ref<double>>> gemm_strided_batched(gemm_params p, batch_params b,
                                                                gpu_ref<double> a,
                                                                gpu_ref<double> bm,
                                                                gpu_ref<double> c) const;
  asio::awaitable<result<gpu_ref<half>>> gemm_strided_batched(gemm_params p, batch_params b,
                                                              gpu_ref<half> a, gpu_ref<half> bm,
                                                              gpu_ref<half> c) const;
  asio::awaitable<result<gpu_ref<bfloat16>>> gemm_strided_batched(gemm_params p, batch_params b,
                                                                  gpu_ref<bfloat16> a,
                                                                  gpu_ref<bfloat16> bm,
                                                                  gpu_ref<bfloat16> c) const;
  /// @}

  /// y = alpha * op(A) x + beta * y (gemv_params); yields y.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> gemv(gemv_params p, gpu_ref<float> a, gpu_ref<float> x,
                                               gpu_ref<float> y) const;
  asio::awaitable<result<gpu_ref<double>>> gemv(gemv_params p, gpu_ref<double> a, gpu_ref<double> x,
                                                gpu_ref<double> y) const;
  /// @}

  /// y = alpha * x + y over n elements, x read every `incx` elements and y
  /// every `incy` (not 0; may be negative); yields y.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> axpy(std::int64_t n, double alpha, gpu_ref<float> x,
                                               gpu_ref<float> y, std::int64_t incx = 1,
                                               std::int64_t incy = 1) const;
  asio::awaitable<result<gpu_ref<double>>> axpy(std::int64_t n, double alpha, gpu_ref<double> x,
                                                gpu_ref<double> y, std::int64_t incx = 1,
                                                std::int64_t incy = 1) const;
  /// @}
  /// x = alpha * x over n elements, every `incx`-th (> 0); yields x.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> scal(std::int64_t n, double alpha, gpu_ref<float> x,
                                               std::int64_t incx = 1) const;
  asio::awaitable<result<gpu_ref<double>>> scal(std::int64_t n, double alpha, gpu_ref<double> x,
                                                std::int64_t incx = 1) const;
  /// @}

  // Reductions yield the scalar itself (computed in device pointer mode and
  // copied back by DMA in the same operation: the io thread never blocks).

  /// The dot product of x and y over n elements (increments as axpy's).
  /// @{
  asio::awaitable<result<float>> dot(std::int64_t n, gpu_ref<float> x, gpu_ref<float> y,
                                     std::int64_t incx = 1, std::int64_t incy = 1) const;
  asio::awaitable<result<double>> dot(std::int64_t n, gpu_ref<double> x, gpu_ref<double> y,
                                      std::int64_t incx = 1, std::int64_t incy = 1) const;
  /// @}
  /// The Euclidean norm of n elements of x, every `incx`-th (> 0).
  /// @{
  asio::awaitable<result<float>> nrm2(std::int64_t n, gpu_ref<float> x,
                                      std::int64_t incx = 1) const;
  asio::awaitable<result<double>> nrm2(std::int64_t n, gpu_ref<double> x,
                                       std::int64_t incx = 1) const;
  /// @}
  /// The sum of |x_i| over n elements of x, every `incx`-th (> 0).
  /// @{
  asio::awaitable<result<float>> asum(std::int64_t n, gpu_ref<float> x,
                                      std::int64_t incx = 1) const;
  asio::awaitable<result<double>> asum(std::int64_t n, gpu_ref<double> x,
                                       std::int64_t incx = 1) const;
  /// @}
  /// The 0-based index i (element x[i * incx]) of the first largest |x_i|; n >= 1.
  /// (cuBLAS counts from 1; this converts.)
  /// @{
  asio::awaitable<result<std::int64_t>> iamax(std::int64_t n, gpu_ref<float> x,
                                              std::int64_t incx = 1) const;
  asio::awaitable<result<std::int64_t>> iamax(std::int64_t n, gpu_ref<double> x,
                                              std::int64_t incx = 1) const;
  /// @}

  // ---- Completion tokens (docs/design.md, "Completion tokens") ----
  // Each operation above also takes any Asio completion token as its last
  // argument, after the full argument list (defaulted increments included);
  // the operations with defaulted increments also take the token right
  // after the buffers, for the defaults. It then completes with
  // void(result<V>), V what the awaitable yields, on the handler's associated
  // executor; it runs on the handler's executor when that has one of its own,
  // else on the device's executor. The handler's cancellation slot reaches
  // the wait (terminal, partial, total: errc::cancelled). The operation holds
  // its own copy of this actor. Costs one co_spawn on top of the awaitable.
  // They exist for exactly the element types the awaitables take.

  /// The operation of the same name, completing through an Asio completion
  /// token with void(result<V>) instead of returning an awaitable (see the
  /// comment above these overloads).
  /// @{
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gemm_params p, gpu_ref<T> x) { s.gemm(p, x, x, x); }
  auto gemm(gemm_params p, gpu_ref<T> a, gpu_ref<T> b, gpu_ref<T> c, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.gemm(p, a, b, c); });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gemm_params p, gemm_epilogue e, gpu_ref<T> x) {
    s.gemm_fused(p, e, x, x, x, x);
  }
  auto gemm_fused(gemm_params p, gemm_epilogue e, gpu_ref<T> a, gpu_ref<T> b, gpu_ref<T> bias,
                  gpu_ref<T> c, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const blas_actor& s) {
      return s.gemm_fused(p, e, a, b, bias, c);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gemm_params p, batch_params b, gpu_ref<T> x) {
    s.gemm_strided_batched(p, b, x, x, x);
  }
  auto gemm_strided_batched(gemm_params p, batch_params b, gpu_ref<T> a, gpu_ref<T> bm,
                            gpu_ref<T> c, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const blas_actor& s) {
      return s.gemm_strided_batched(p, b, a, bm, c);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gemv_params p, gpu_ref<T> x) { s.gemv(p, x, x, x); }
  auto gemv(gemv_params p, gpu_ref<T> a, gpu_ref<T> x, gpu_ref<T> y, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.gemv(p, a, x, y); });
  }

  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.axpy(1, 1.0, x, x, 1, 1); }
  auto axpy(std::int64_t n, double alpha, gpu_ref<T> x, gpu_ref<T> y, std::int64_t incx,
            std::int64_t incy, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const blas_actor& s) {
      return s.axpy(n, alpha, x, y, incx, incy);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.axpy(1, 1.0, x, x, 1, 1); }
  auto axpy(std::int64_t n, double alpha, gpu_ref<T> x, gpu_ref<T> y, Token&& token) const {
    return axpy(n, alpha, std::move(x), std::move(y), 1, 1, std::forward<Token>(token));
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.scal(1, 1.0, x, 1); }
  auto scal(std::int64_t n, double alpha, gpu_ref<T> x, std::int64_t incx, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.scal(n, alpha, x, incx); });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.scal(1, 1.0, x, 1); }
  auto scal(std::int64_t n, double alpha, gpu_ref<T> x, Token&& token) const {
    return scal(n, alpha, std::move(x), 1, std::forward<Token>(token));
  }

  template <element T, result_token<T> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.dot(1, x, x, 1, 1); }
  auto dot(std::int64_t n, gpu_ref<T> x, gpu_ref<T> y, std::int64_t incx, std::int64_t incy,
           Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.dot(n, x, y, incx, incy); });
  }
  template <element T, result_token<T> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.dot(1, x, x, 1, 1); }
  auto dot(std::int64_t n, gpu_ref<T> x, gpu_ref<T> y, Token&& token) const {
    return dot(n, std::move(x), std::move(y), 1, 1, std::forward<Token>(token));
  }
  template <element T, result_token<T> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.nrm2(1, x, 1); }
  auto nrm2(std::int64_t n, gpu_ref<T> x, std::int64_t incx, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.nrm2(n, x, incx); });
  }
  template <element T, result_token<T> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.nrm2(1, x, 1); }
  auto nrm2(std::int64_t n, gpu_ref<T> x, Token&& token) const {
    return nrm2(n, std::move(x), 1, std::forward<Token>(token));
  }
  template <element T, result_token<T> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.asum(1, x, 1); }
  auto asum(std::int64_t n, gpu_ref<T> x, std::int64_t incx, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.asum(n, x, incx); });
  }
  template <element T, result_token<T> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.asum(1, x, 1); }
  auto asum(std::int64_t n, gpu_ref<T> x, Token&& token) const {
    return asum(n, std::move(x), 1, std::forward<Token>(token));
  }
  template <element T, result_token<std::int64_t> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.iamax(1, x, 1); }
  auto iamax(std::int64_t n, gpu_ref<T> x, std::int64_t incx, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token),
                                  [=](const blas_actor& s) { return s.iamax(n, x, incx); });
  }
  template <element T, result_token<std::int64_t> Token>
  requires requires(const blas_actor& s, gpu_ref<T> x) { s.iamax(1, x, 1); }
  auto iamax(std::int64_t n, gpu_ref<T> x, Token&& token) const {
    return iamax(n, std::move(x), 1, std::forward<Token>(token));
  }
  /// @}

  /// The shared state behind this handle (the library's, for composed units).
  const std::shared_ptr<detail::blas_state>& state() const noexcept { return st_; }

private:
  explicit blas_actor(std::shared_ptr<detail::blas_state> st) noexcept : st_(std::move(st)) {}
  std::shared_ptr<detail::blas_state> st_;
};

}  // namespace atomr::cuda
