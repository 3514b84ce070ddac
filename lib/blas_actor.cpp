// blas_actor: argument checks, the cuBLAS handle's lifetime, and one
// run_kernel per operation.
#include <atomr/cuda/blas_actor.hpp>

#include "cuda_graph_record.hpp"
#include "device_impl.hpp"
#include "remote.hpp"

#include <atomr/cuda/detail/actor_core.hpp>
#include <atomr/cuda/detail/lru.hpp>
#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/pinned.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace atomr::cuda {

std::string_view to_string(gemm_epilogue e) noexcept {
  switch (e) {
    case gemm_epilogue::bias:
      return "bias";
    case gemm_epilogue::relu:
      return "relu";
    case gemm_epilogue::gelu:
      return "gelu";
    case gemm_epilogue::bias_relu:
      return "bias_relu";
    case gemm_epilogue::bias_gelu:
      return "bias_gelu";
  }
  return "unknown";
}

namespace detail {

/// Everything a recorded gemm baked in: the call's parameters, alpha and
/// beta (bit patterns), the math mode and the three pointers.
struct gemm_key {
  dtype type = dtype::f32;
  bool tf32 = false;
  int ta = 0, tb = 0, m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::uint64_t alpha = 0, beta = 0;
  std::uintptr_t a = 0, b = 0, c = 0;
  friend auto operator<=>(const gemm_key&, const gemm_key&) = default;
};

/// What a cuBLASLt algorithm choice depends on: the shape, the math mode
/// and each pointer's alignment (bytes, up to 256).
struct lt_key {
  bool tf32 = false;
  int ta = 0, tb = 0, m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  unsigned align_a = 0, align_b = 0, align_c = 0;
  /// gemm_fused: the element type, the epilogue (-1: none, a plain f32 gemm)
  /// and the bias's alignment.
  int type = CUDA_R_32F, epilogue = -1;
  unsigned align_bias = 0;
  friend auto operator<=>(const lt_key&, const lt_key&) = default;
};

/// One f32 matmul's cuBLASLt descriptors and the algorithm chosen for them
/// (host objects only: the GPU work does not use them after the call).
struct lt_plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  ///< false: cuBLASLt cannot take this shape; cublasSgemm does
  lt_plan() = default;
  lt_plan(const lt_plan&) = delete;
  lt_plan& operator=(const lt_plan&) = delete;
  ~lt_plan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

/// One lane of a blas_actor (docs/design.md, "One actor, several lanes"):
/// a cuBLAS handle and a cuBLASLt handle bound to the lane's stream, and
/// everything tied to them or to that stream: the math mode, the workspace,
/// the cuBLASLt plans, the recorded graphs and their counts.
struct blas_lane : lane_base {
  blas_lane(device d, stream s, std::size_t graph_cache)
      : lane_base(std::move(s)),
        dev(std::move(d)),
        graph_capacity(graph_cache),
        gemm_graphs(graph_cache),
        gemm_seen(graph_cache) {}
  blas_lane(const blas_lane&) = delete;
  blas_lane& operator=(const blas_lane&) = delete;
  ~blas_lane() {
    gemm_graphs.clear();
    lt_plans.clear();  // host objects: destroyed whatever the context's state
    // Nothing is handed back to a dead context.
    if (dev.health() == health_state::poisoned) return;
    capture.destroy();
    // The graphs and calls using it are done: they keep the actor's state
    // (and so this lane) alive.
    if (work) cudaFree(work);
    if (lt) cublasLtDestroy(lt);
    if (!handle) return;
    cudaSetDevice(dev.ordinal());
    cublasDestroy(handle);  // teardown: errors deliberately ignored
  }

  device dev;
  // Everything below is guarded by mu.
  cublasHandle_t handle = nullptr;
  bool tf32 = false;              ///< the handle's math mode: TF32 or pedantic
  cublasLtHandle_t lt = nullptr;  ///< null: cublasSgemm only
  lru<lt_key, std::shared_ptr<lt_plan>> lt_plans{64};
  std::uint64_t lt_calls = 0, lt_plans_made = 0, lt_fallbacks = 0;
  // Recorded gemm calls.
  const std::size_t graph_capacity;  // 0: recording off
  lru<gemm_key, std::shared_ptr<const recorded_exec>> gemm_graphs;
  lru<gemm_key, bool> gemm_seen;  // calls seen once (recorded when seen again)
  recording_stream capture;
  /// The lane's workspace: its cuBLASLt calls and recorded calls use it (all
  /// on the lane's one stream, so one at a time). Made on first use.
  void* work = nullptr;
  std::size_t work_bytes = 0;
  bool work_failed = false;
  bool recording_failed = false;
  std::uint64_t records = 0, launches = 0, failures = 0;

  /// Puts the handle in TF32 (CUBLAS_TF32_TENSOR_OP_MATH) or pedantic math
  /// unless it is in that mode already. Lock held.
  result<void> use_tf32(bool on) {
    if (on == tf32) return outcome::success();
    const cublasMath_t mode = on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
    if (auto e = cublasSetMathMode(handle, mode); e != CUBLAS_STATUS_SUCCESS)
      return classify(e, "cublasSetMathMode");
    tf32 = on;
    return outcome::success();
  }

  /// Inside a recording (lane_hold): the handle on the recording's stream
  /// with a workspace of the recording's, of the lane's workspace size (so
  /// that cuBLAS and cuBLASLt choose the algorithms they choose for the
  /// lane's direct calls). Lock held.
  result<void> bind(launch& l);
  /// Back on the lane's stream (cublasSetStream, which also gives the handle
  /// back cuBLAS's default workspace, as before bind); false if that failed.
  /// Lock held.
  bool unbind() noexcept {
    rec_work = nullptr;
    return cublasSetStream(handle, strm.native_handle()) == CUBLAS_STATUS_SUCCESS;
  }
  /// The workspace calls use now: the recording's while bound to one.
  void* active_work() const noexcept { return rec_work ? rec_work : work; }
  void* rec_work = nullptr;

  /// The workspace, made once: 32 MiB on compute capability 9 and later,
  /// 4 MiB before (cuBLAS's recommendation for cublasSetWorkspace). Null
  /// when it could not be made.
  void* workspace();

  /// The cuBLASLt plan for an f32 gemm in math mode `t32`, made on first
  /// use; null when the call goes to cublasSgemm (no cuBLASLt handle, empty
  /// shape, no workspace, or no algorithm). Lock held, device current.
  lt_plan* lt_plan_for(bool t32, cublasOperation_t ta, cublasOperation_t tb, const gemm_plan& g,
                       const void* a, const void* b, const void* c);
  /// gemm_fused's plan (made on first use, cached with the f32 ones): the
  /// element type `type`, the epilogue, the layouts and an algorithm; null
  /// when cuBLASLt has none (or no workspace or handle could be made). Lock
  /// held, device current.
  lt_plan* fused_plan_for(bool t32, cudaDataType type, cublasOperation_t ta, cublasOperation_t tb,
                          const gemm_plan& g, gemm_epilogue e, const void* a, const void* b,
                          const void* bias, const void* c);
  /// cublasLtMatmul with `plan` on stream `s`.
  cublasStatus_t lt_sgemm(const lt_plan& plan, cudaStream_t s, float alpha, float beta,
                          const float* a, const float* b, float* c) const {
    return cublasLtMatmul(lt, plan.desc, &alpha, a, plan.la, b, plan.lb, &beta, c, plan.lc, c,
                          plan.lc, &plan.algo, active_work(), work_bytes, s);
  }

  /// Runs `call(stream)` (one cuBLAS enqueue on `stream`, which the handle
  /// is on) directly, or as the CUDA graph recorded for `key`: recorded the
  /// second time `key` is seen, launched from then on. A call pattern wider
  /// than the cache never records (seen and recorded entries age out
  /// alike). `keep` receives the graph the GPU work uses. Lock held, device
  /// current. `name`, the function an error is tagged with, is read after
  /// the call: the call sets it to the function it used.
  template <class Call>
  result<void> run_recorded(const gemm_key& key, const std::string_view& name, Call&& call,
                            std::shared_ptr<const recorded_exec>& keep);
};

/// The shared state of a blas_actor and its copies: the options and the
/// lanes. Operations keep it (and so every lane) alive until the GPU is done
/// with them.
struct blas_state {
  blas_state(device d, completion c, const blas_options& o, lane_policy lp)
      : dev(std::move(d)),
        how(c),
        use_lt(o.lt_matmul),
        graph_capacity(o.cuda_graph_cache),
        lane_streams(lp.streams),
        tf32(o.tf32),
        lanes(lp.max_lanes) {}
  blas_state(const blas_state&) = delete;
  blas_state& operator=(const blas_state&) = delete;

  device dev;
  const completion how;
  const bool use_lt;  ///< f32 gemm through cuBLASLt (blas_options::lt_matmul)
  const std::size_t graph_capacity;
  const stream_policy lane_streams;
  /// What set_tf32 asked for; each lane's handle follows it at its next
  /// gemm (blas_lane::use_tf32), so that a lane made meanwhile cannot miss it.
  std::atomic<bool> tf32;
  lane_set<blas_lane> lanes;

  /// Isolated devices: the actor's id in the worker (which makes its own
  /// actor with these options at the first call); 0 in process.
  std::uint64_t remote_id = 0;
  /// Isolated devices: what get_stream() answers (there are no lanes here),
  /// and the options the worker's actor is made with.
  stream remote_stream;
  std::optional<stream_policy> remote_streams;
  std::size_t remote_max_lanes = 0;
  ~blas_state() {
    if (remote_id && dev.impl()->remote)
      dev.impl()->remote->release(wire::release_kind::actor, remote_id);
  }

  /// Fails fast (no GPU call) once the device no longer accepts work.
  result<void> accepting() const { return dev.status(); }
  /// Isolated devices: the head of a request running `op` on the worker's
  /// twin of this actor (made there with these options at its first request).
  wire::actor_head remote_head(wire::actor_op op, dtype t) const {
    auto s = lane_settings(remote_streams, remote_max_lanes);
    s.flags = static_cast<std::uint8_t>((tf32.load(std::memory_order_relaxed) ? wire::tf32 : 0) |
                                        (use_lt ? wire::lt_matmul : 0));
    s.cache = graph_capacity;
    return actor_head_of(remote_id, wire::actor_kind::blas, op, t, s);
  }
  /// A new lane: a stream by the lanes' policy, a cuBLAS handle bound to it
  /// (host pointer mode, the current math mode) and, with lt_matmul, a
  /// cuBLASLt handle. Costs a few ms (cublasCreate).
  result<std::unique_ptr<blas_lane>> make_lane();
  /// The lane for the next operation (lane_set::pick).
  /// The lane for an operation writing the buffer `key` (docs/design.md,
  /// "One actor, several lanes"); null: the calling thread's lane.
  blas_lane& lane(const void* key = nullptr) {
    return lanes.pick([this](std::size_t) { return make_lane(); }, key);
  }
};

namespace {

std::string num(std::int64_t v) {
  return std::to_string(v);
}
std::string num(std::size_t v) {
  return std::to_string(v);
}

/// A dimension: >= 0 and fits in int.
result<int> dim(std::string_view op, std::string_view name, std::int64_t v) {
  if (v < 0) return bad_argument(op, name, "(" + num(v) + ") is negative");
  if (v > INT_MAX) return bad_argument(op, name, "(" + num(v) + ") does not fit in int");
  return static_cast<int>(v);
}

/// A leading dimension: 0 means tight; otherwise >= max(1, rows) and fits in int.
result<int> leading(std::string_view op, std::string_view name, std::int64_t ld, int rows,
                    std::string_view rows_name) {
  const int tight = std::max(1, rows);
  if (ld == 0) return tight;
  if (ld < 0) return bad_argument(op, name, "(" + num(ld) + ") is negative");
  if (ld > INT_MAX) return bad_argument(op, name, "(" + num(ld) + ") does not fit in int");
  if (ld < tight)
    return bad_argument(op, name,
                        "(" + num(ld) + ") < max(1, " + std::string(rows_name) + ") (" +
                            std::to_string(tight) + ")");
  return static_cast<int>(ld);
}

/// Elements spanned by a rows x cols column-major matrix with leading dimension ld.
std::size_t span_of(int rows, int cols, int ld) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<std::size_t>(ld) * static_cast<std::size_t>(cols - 1) +
         static_cast<std::size_t>(rows);
}

/// An increment: != 0 (or > 0 when negative ones are not allowed) and fits in int.
result<int> increment(std::string_view op, std::string_view name, std::int64_t inc,
                      bool negative_ok) {
  if (inc == 0) return bad_argument(op, name, "is 0");
  if (inc < 0 && !negative_ok) return bad_argument(op, name, "(" + num(inc) + ") must be > 0");
  if (inc > INT_MAX || inc < -INT_MAX)
    return bad_argument(op, name, "(" + num(inc) + ") does not fit in int");
  return static_cast<int>(inc);
}

/// Elements spanned by a vector of n elements with increment inc.
std::size_t vector_span(int n, int inc) {
  if (n == 0) return 0;
  return 1 + static_cast<std::size_t>(n - 1) * static_cast<std::size_t>(std::abs(inc));
}

result<void> has_size(std::string_view op, std::string_view name, std::size_t have,
                      std::size_t need) {
  if (have >= need) return outcome::success();
  return bad_argument(op, name, "has " + num(have) + " elements, needs " + num(need));
}

result<void> valid_op(std::string_view op, std::string_view name, blas_op o) {
  if (o == blas_op::n || o == blas_op::t) return outcome::success();
  return bad_argument(op, name,
                      "(" + std::to_string(static_cast<int>(o)) + ") is not a blas_op (n or t)");
}

/// The shape part of gemm (no buffer sizes).
result<gemm_plan> gemm_shape(const gemm_params& p, std::string_view op) {
  BOOST_OUTCOME_TRY(valid_op(op, "transa", p.transa));
  BOOST_OUTCOME_TRY(valid_op(op, "transb", p.transb));
  gemm_plan g;
  BOOST_OUTCOME_TRY(g.m, dim(op, "m", p.m));
  BOOST_OUTCOME_TRY(g.n, dim(op, "n", p.n));
  BOOST_OUTCOME_TRY(g.k, dim(op, "k", p.k));
  const bool ta = p.transa == blas_op::t, tb = p.transb == blas_op::t;
  // Stored A is (m x k) or, transposed, (k x m); stored B is (k x n) or (n x k).
  const int a_rows = ta ? g.k : g.m, a_cols = ta ? g.m : g.k;
  const int b_rows = tb ? g.n : g.k, b_cols = tb ? g.k : g.n;
  BOOST_OUTCOME_TRY(g.lda, leading(op, "lda", p.lda, a_rows, ta ? "k" : "m"));
  BOOST_OUTCOME_TRY(g.ldb, leading(op, "ldb", p.ldb, b_rows, tb ? "n" : "k"));
  BOOST_OUTCOME_TRY(g.ldc, leading(op, "ldc", p.ldc, g.m, "m"));
  g.a_elems = span_of(a_rows, a_cols, g.lda);
  g.b_elems = span_of(b_rows, b_cols, g.ldb);
  g.c_elems = span_of(g.m, g.n, g.ldc);
  return g;
}

/// Resolves a batch stride (tight_stride: the matrix's ld * cols) and the span of all batches.
result<long long> batch_stride(std::string_view op, std::string_view name, std::int64_t stride,
                               std::size_t one_matrix_ld_cols) {
  if (stride == tight_stride) return static_cast<long long>(one_matrix_ld_cols);
  if (stride < 0)
    return bad_argument(op, name, "(" + num(stride) + ") is negative (use tight_stride)");
  return static_cast<long long>(stride);
}

result<std::size_t> batch_span(std::string_view op, std::string_view name, int count,
                               long long stride, std::size_t one) {
  if (count == 0 || one == 0) return std::size_t{0};
  std::size_t off = 0, total = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(count - 1), static_cast<std::size_t>(stride),
                             &off) ||
      __builtin_add_overflow(off, one, &total))
    return bad_argument(
        op, name,
        "(" + num(static_cast<std::int64_t>(stride)) + ") times the batch count overflows");
  return total;
}

}  // namespace

result<gemm_plan> check_gemm(const gemm_params& p, std::size_t a_size, std::size_t b_size,
                             std::size_t c_size, std::string_view op) {
  BOOST_OUTCOME_TRY(auto g, gemm_shape(p, op));
  BOOST_OUTCOME_TRY(has_size(op, "a", a_size, g.a_elems));
  BOOST_OUTCOME_TRY(has_size(op, "b", b_size, g.b_elems));
  BOOST_OUTCOME_TRY(has_size(op, "c", c_size, g.c_elems));
  return g;
}

bool epilogue_has_bias(gemm_epilogue e) noexcept {
  return e == gemm_epilogue::bias || e == gemm_epilogue::bias_relu || e == gemm_epilogue::bias_gelu;
}

result<gemm_plan> check_gemm_fused(const gemm_params& p, gemm_epilogue e, std::size_t a_size,
                                   std::size_t b_size, std::size_t bias_size, std::size_t c_size) {
  constexpr std::string_view op = "gemm_fused";
  if (static_cast<unsigned>(e) > static_cast<unsigned>(gemm_epilogue::bias_gelu))
    return bad_argument(op, "epilogue",
                        "(" + std::to_string(static_cast<unsigned>(e)) +
                            ") is not a gemm_epilogue (bias, relu, gelu, bias_relu, bias_gelu)");
  BOOST_OUTCOME_TRY(auto g, check_gemm(p, a_size, b_size, c_size, op));
  if (!epilogue_has_bias(e) && bias_size != 0)
    return bad_argument(op, "bias",
                        "has " + num(bias_size) + " elements, but the epilogue " +
                            std::string(to_string(e)) + " takes none (pass an empty gpu_ref)");
  if (epilogue_has_bias(e) && bias_size != static_cast<std::size_t>(g.m))
    return bad_argument(
        op, "bias",
        "has " + num(bias_size) + " elements; the epilogue " + std::string(to_string(e)) +
            " needs m = " + num(static_cast<std::int64_t>(g.m)) + " (one per row of C)");
  return g;
}

result<gemm_batched_plan> check_gemm_batched(const gemm_params& p, const batch_params& b,
                                             std::size_t a_size, std::size_t b_size,
                                             std::size_t c_size) {
  constexpr std::string_view op = "gemm_strided_batched";
  gemm_batched_plan bp;
  BOOST_OUTCOME_TRY(bp.g, gemm_shape(p, op));
  BOOST_OUTCOME_TRY(bp.count, dim(op, "batch.count", b.count));
  auto& g = bp.g;
  const bool ta = p.transa == blas_op::t, tb = p.transb == blas_op::t;
  // The tight stride is ld * (columns of the stored matrix).
  const auto full = [](int ld, int cols) {
    return static_cast<std::size_t>(ld) * static_cast<std::size_t>(cols);
  };
  BOOST_OUTCOME_TRY(bp.stride_a,
                    batch_stride(op, "batch.stride_a", b.stride_a, full(g.lda, ta ? g.m : g.k)));
  BOOST_OUTCOME_TRY(bp.stride_b,
                    batch_stride(op, "batch.stride_b", b.stride_b, full(g.ldb, tb ? g.k : g.n)));
  BOOST_OUTCOME_TRY(bp.stride_c, batch_stride(op, "batch.stride_c", b.stride_c, full(g.ldc, g.n)));
  if (bp.count > 1 && g.c_elems > 0 && static_cast<std::size_t>(bp.stride_c) < g.c_elems)
    return bad_argument(op, "batch.stride_c",
                        "(" + num(static_cast<std::int64_t>(bp.stride_c)) + ") < " +
                            num(g.c_elems) + ", the span of one C: batches of C would overlap");
  BOOST_OUTCOME_TRY(g.a_elems, batch_span(op, "batch.stride_a", bp.count, bp.stride_a, g.a_elems));
  BOOST_OUTCOME_TRY(g.b_elems, batch_span(op, "batch.stride_b", bp.count, bp.stride_b, g.b_elems));
  BOOST_OUTCOME_TRY(g.c_elems, batch_span(op, "batch.stride_c", bp.count, bp.stride_c, g.c_elems));
  BOOST_OUTCOME_TRY(has_size(op, "a", a_size, g.a_elems));
  BOOST_OUTCOME_TRY(has_size(op, "b", b_size, g.b_elems));
  BOOST_OUTCOME_TRY(has_size(op, "c", c_size, g.c_elems));
  return bp;
}

result<gemv_plan> check_gemv(const gemv_params& p, std::size_t a_size, std::size_t x_size,
                             std::size_t y_size) {
  constexpr std::string_view op = "gemv";
  BOOST_OUTCOME_TRY(valid_op(op, "trans", p.trans));
  gemv_plan g;
  BOOST_OUTCOME_TRY(g.m, dim(op, "m", p.m));
  BOOST_OUTCOME_TRY(g.n, dim(op, "n", p.n));
  BOOST_OUTCOME_TRY(g.lda, leading(op, "lda", p.lda, g.m, "m"));
  BOOST_OUTCOME_TRY(g.incx, increment(op, "incx", p.incx, true));
  BOOST_OUTCOME_TRY(g.incy, increment(op, "incy", p.incy, true));
  const bool t = p.trans == blas_op::t;
  g.a_elems = span_of(g.m, g.n, g.lda);
  g.x_elems = vector_span(t ? g.m : g.n, g.incx);
  g.y_elems = vector_span(t ? g.n : g.m, g.incy);
  BOOST_OUTCOME_TRY(has_size(op, "a", a_size, g.a_elems));
  BOOST_OUTCOME_TRY(has_size(op, "x", x_size, g.x_elems));
  BOOST_OUTCOME_TRY(has_size(op, "y", y_size, g.y_elems));
  return g;
}

namespace {
result<level1_plan> two_vectors(std::string_view op, std::int64_t n, std::int64_t incx,
                                std::size_t x_size, std::int64_t incy, std::size_t y_size) {
  level1_plan l;
  BOOST_OUTCOME_TRY(l.n, dim(op, "n", n));
  BOOST_OUTCOME_TRY(l.incx, increment(op, "incx", incx, true));
  BOOST_OUTCOME_TRY(l.incy, increment(op, "incy", incy, true));
  l.x_elems = vector_span(l.n, l.incx);
  l.y_elems = vector_span(l.n, l.incy);
  BOOST_OUTCOME_TRY(has_size(op, "x", x_size, l.x_elems));
  BOOST_OUTCOME_TRY(has_size(op, "y", y_size, l.y_elems));
  return l;
}
}  // namespace

result<level1_plan> check_axpy(std::int64_t n, std::int64_t incx, std::size_t x_size,
                               std::int64_t incy, std::size_t y_size) {
  return two_vectors("axpy", n, incx, x_size, incy, y_size);
}

result<level1_plan> check_dot(std::int64_t n, std::int64_t incx, std::size_t x_size,
                              std::int64_t incy, std::size_t y_size) {
  return two_vectors("dot", n, incx, x_size, incy, y_size);
}

result<level1_plan> check_vector_op(std::string_view op, std::int64_t n, std::int64_t incx,
                                    std::size_t x_size, std::int64_t min_n) {
  level1_plan l;
  BOOST_OUTCOME_TRY(l.n, dim(op, "n", n));
  if (n < min_n) return bad_argument(op, "n", "(" + num(n) + ") must be >= " + num(min_n));
  BOOST_OUTCOME_TRY(l.incx, increment(op, "incx", incx, false));
  l.x_elems = vector_span(l.n, l.incx);
  BOOST_OUTCOME_TRY(has_size(op, "x", x_size, l.x_elems));
  return l;
}

result<void> check_disjoint(std::string_view op, std::string_view out, std::size_t out_begin,
                            std::size_t out_count, std::string_view in, std::size_t in_begin,
                            std::size_t in_count) {
  if (out_count == 0 || in_count == 0) return outcome::success();
  if (out_begin < in_begin + in_count && in_begin < out_begin + out_count)
    return bad_argument(op, out,
                        "overlaps " + std::string(in) + " (the output may not alias an input)");
  return outcome::success();
}

}  // namespace detail

// ---------------------------------------------------------------- operations

namespace {

using detail::blas_state;
using state_ptr = std::shared_ptr<blas_state>;

constexpr std::string_view k_lib = "cublas";

gpu_error tag(gpu_error e) {
  return e.tagged(k_lib);
}

cublasOperation_t to_cublas(blas_op o) {
  return o == blas_op::t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/// check_ref, plus the element type recorded in the buffer.
template <element T>
result<void> check_arg(std::string_view op, std::string_view arg, const gpu_ref<T>& r,
                       const device& dev, std::size_t needed) {
  if (r.state() && r.state()->type != dtype_of<T>)
    return detail::bad_argument(op, arg,
                                "holds " + std::string(to_string(r.state()->type)) +
                                    " elements, not " + std::string(to_string(dtype_of<T>)));
  return detail::check_ref(op, arg, r, dev, needed);
}

/// Output `out` must not alias input `in` where they share an allocation.
template <element T>
result<void> disjoint(std::string_view op, std::string_view out_name, const gpu_ref<T>& out,
                      std::size_t out_n, std::string_view in_name, const gpu_ref<T>& in,
                      std::size_t in_n) {
  if (out.state() != in.state()) return outcome::success();
  return detail::check_disjoint(op, out_name, out.offset(), out_n, in_name, in.offset(), in_n);
}

result<void> cublas_ok(cublasStatus_t st, std::string_view call) {
  if (st == CUBLAS_STATUS_SUCCESS) return outcome::success();
  return classify(st, call);
}

}  // namespace

void* detail::blas_lane::workspace() {
  if (work || work_failed) return work;
  work_failed = true;  // until it is made
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev.ordinal()) !=
      cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  const std::size_t bytes = major >= 9 ? std::size_t{32} << 20 : std::size_t{4} << 20;
  if (cudaMalloc(&work, bytes) != cudaSuccess) {
    cudaGetLastError();
    work = nullptr;
    return nullptr;
  }
  work_bytes = bytes;
  work_failed = false;
  return work;
}

result<void> detail::blas_lane::bind(launch& l) {
  if (!workspace())
    return make_error(errc::out_of_memory, "cublas: the lane's workspace could not be made");
  BOOST_OUTCOME_TRY(void* ws, l.recording_workspace(work_bytes));
  BOOST_OUTCOME_TRY(cublas_ok(cublasSetStream(handle, l.native_stream()), "cublasSetStream"));
  if (auto e = cublasSetWorkspace(handle, ws, work_bytes); e != CUBLAS_STATUS_SUCCESS) {
    // Not bound (lane_hold will not unbind): back here, or the lane is stuck.
    if (cublasSetStream(handle, strm.native_handle()) != CUBLAS_STATUS_SUCCESS) stuck = true;
    return classify(e, "cublasSetWorkspace");
  }
  rec_work = ws;
  return outcome::success();
}

namespace {
/// The largest power of two (up to 256) that divides the address.
unsigned alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  if (v == 0) return 256;
  return static_cast<unsigned>(std::min<std::uintptr_t>(256, v & (~v + 1)));
}
}  // namespace

namespace {
/// Fills `plan`: descriptor (compute type, f32 scaling, transposes, the
/// epilogue and its bias pointer when given), layouts of `type` and the
/// heuristic's first algorithm within the workspace and the alignments in
/// `key`. False when cuBLASLt refuses any of it.
bool build_lt_plan(detail::lt_plan& plan, cublasLtHandle_t lt, std::size_t work_bytes,
                   const detail::lt_key& key, cublasComputeType_t compute, cudaDataType type,
                   cublasOperation_t ta, cublasOperation_t tb, const detail::gemm_plan& g,
                   const cublasLtEpilogue_t* epilogue, const void* bias) {
  if (cublasLtMatmulDescCreate(&plan.desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
    return false;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, std::size_t n) {
    return cublasLtMatmulDescSetAttribute(plan.desc, attr, v, n) == CUBLAS_STATUS_SUCCESS;
  };
  if (!set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
      !set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))
    return false;
  if (epilogue && !set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, sizeof *epilogue)) return false;
  if (bias && !set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) return false;
  // The layouts describe the stored matrices.
  const bool at = ta == CUBLAS_OP_T, bt = tb == CUBLAS_OP_T;
  if (cublasLtMatrixLayoutCreate(&plan.la, type, at ? g.k : g.m, at ? g.m : g.k, g.lda) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&plan.lb, type, bt ? g.n : g.k, bt ? g.k : g.n, g.ldb) !=
          CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&plan.lc, type, g.m, g.n, g.ldc) != CUBLAS_STATUS_SUCCESS)
    return false;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
  const std::uint64_t ws = work_bytes;
  const std::uint32_t al_a = key.align_a, al_b = key.align_b, al_c = key.align_c;
  bool ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS;
  // Algorithms that need more alignment than the buffers have are excluded.
  for (auto [attr, v] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c},
                         std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c}})
    ok = ok &&
         cublasLtMatmulPreferenceSetAttribute(pref, attr, v, sizeof *v) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const bool chosen =
      ok &&
      cublasLtMatmulAlgoGetHeuristic(lt, plan.desc, plan.la, plan.lb, plan.lc, plan.lc, pref, 1,
                                     &heur, &found) == CUBLAS_STATUS_SUCCESS &&
      found > 0 && heur.state == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulPreferenceDestroy(pref);
  if (chosen) plan.algo = heur.algo;
  return chosen;
}

cublasLtEpilogue_t lt_epilogue(gemm_epilogue e) {
  switch (e) {
    case gemm_epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case gemm_epilogue::relu:
      return CUBLASLT_EPILOGUE_RELU;
    case gemm_epilogue::gelu:
      return CUBLASLT_EPILOGUE_GELU;
    case gemm_epilogue::bias_relu:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case gemm_epilogue::bias_gelu:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
}  // namespace

detail::lt_plan* detail::blas_lane::lt_plan_for(bool t32, cublasOperation_t ta,
                                                cublasOperation_t tb, const gemm_plan& g,
                                                const void* a, const void* b, const void* c) {
  if (!lt || g.m == 0 || g.n == 0 || g.k == 0) return nullptr;
  const lt_key key{
      t32,   static_cast<int>(ta), static_cast<int>(tb), g.m,         g.n, g.k, g.lda, g.ldb,
      g.ldc, alignment(a),         alignment(b),         alignment(c)};
  if (auto* found = lt_plans.find(key)) return (*found)->usable ? found->get() : nullptr;
  if (!workspace()) return nullptr;
  auto plan = std::make_shared<lt_plan>();
  ++lt_plans_made;
  plan->usable = build_lt_plan(*plan, lt, work_bytes, key,
                               t32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC,
                               CUDA_R_32F, ta, tb, g, nullptr, nullptr);
  cudaGetLastError();
  auto& kept = lt_plans.insert(key, std::move(plan));
  return kept->usable ? kept.get() : nullptr;
}

detail::lt_plan* detail::blas_lane::fused_plan_for(bool t32, cudaDataType type,
                                                   cublasOperation_t ta, cublasOperation_t tb,
                                                   const gemm_plan& g, gemm_epilogue e,
                                                   const void* a, const void* b, const void* bias,
                                                   const void* c) {
  if (!lt && cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    lt = nullptr;
    return nullptr;
  }
  lt_key key{t32,   static_cast<int>(ta), static_cast<int>(tb), g.m,         g.n, g.k, g.lda, g.ldb,
             g.ldc, alignment(a),         alignment(b),         alignment(c)};
  key.type = type;
  key.epilogue = static_cast<int>(e);
  key.align_bias = bias ? alignment(bias) : 0;
  if (type != CUDA_R_32F) key.tf32 = false;  // the math mode is f32's only
  if (auto* found = lt_plans.find(key)) return (*found)->usable ? found->get() : nullptr;
  if (!workspace()) return nullptr;
  auto plan = std::make_shared<lt_plan>();
  ++lt_plans_made;
  const cublasComputeType_t compute = type != CUDA_R_32F ? CUBLAS_COMPUTE_32F
                                      : t32              ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                         : CUBLAS_COMPUTE_32F_PEDANTIC;
  const cublasLtEpilogue_t epi = lt_epilogue(e);
  plan->usable = build_lt_plan(*plan, lt, work_bytes, key, compute, type, ta, tb, g, &epi, bias);
  cudaGetLastError();
  auto& kept = lt_plans.insert(key, std::move(plan));
  return kept->usable ? kept.get() : nullptr;
}

template <class Call>
result<void> detail::blas_lane::run_recorded(const gemm_key& key, const std::string_view& name,
                                             Call&& call,
                                             std::shared_ptr<const recorded_exec>& keep) {
  const cudaStream_t own = strm.native_handle();
  auto direct = [&] {
    const cublasStatus_t r = call(own);  // first: it sets `name`
    return cublas_ok(r, name);
  };
  if (graph_capacity == 0 || recording_failed) return direct();
  if (auto* rec = gemm_graphs.find(key)) {
    keep = *rec;
  } else if (gemm_seen.find(key) == nullptr) {
    gemm_seen.insert(key, true);
    return direct();
  } else {
    // Seen before: record it on the recording stream, then launch it. The
    // recording uses a workspace of the actor's own: with cuBLAS's default
    // one, cuBLAS 12.2 and later put a memory allocation and a free into
    // the graph (cudaMallocAsync), and each instantiated copy then holds
    // graph memory of its own (docs/design.md). All recorded calls of this
    // lane run on its one stream, so they can share it.
    const cudaStream_t cap = capture.get();
    void* ws = workspace();
    std::shared_ptr<const recorded_exec> rec;
    if (cap && ws && cublasSetStream(handle, cap) == CUBLAS_STATUS_SUCCESS) {
      if (cublasSetWorkspace(handle, ws, work_bytes) == CUBLAS_STATUS_SUCCESS)
        rec = record_graph(cap, [&] { return call(cap) == CUBLAS_STATUS_SUCCESS; });
      // The handle goes back to its stream whatever happened (this also
      // resets it to cuBLAS's default workspace, which it used before); if
      // it cannot, the lane refuses further work (lane_base::stuck), as
      // lane_hold's does.
      if (auto e = cublasSetStream(handle, own); e != CUBLAS_STATUS_SUCCESS) {
        stuck = true;
        return cublas_ok(e, "cublasSetStream");
      }
    }
    if (!rec) {
      recording_failed = true;
      ++failures;
      return direct();
    }
    ++records;
    keep = gemm_graphs.insert(key, std::move(rec));
  }
  if (auto e = cudaGraphLaunch(keep->exec, own); e != cudaSuccess)
    return classify(e, "cudaGraphLaunch (a recorded " + std::string(name) + ")");
  ++launches;
  return outcome::success();
}

namespace {

namespace wire = detail::wire;

// --- gemm, by element type

template <class T>
struct gemm_traits;

template <>
struct gemm_traits<float> {
  static constexpr std::string_view name = "cublasSgemm";
  static constexpr std::string_view batched_name = "cublasSgemmStridedBatched";
  static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                             const detail::gemm_plan& g, double alpha, double beta, const float* a,
                             const float* b, float* c) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    return cublasSgemm(h, ta, tb, g.m, g.n, g.k, &al, a, g.lda, b, g.ldb, &be, c, g.ldc);
  }
  static cublasStatus_t batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                const detail::gemm_batched_plan& p, double alpha, double beta,
                                const float* a, const float* b, float* c) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    const auto& g = p.g;
    return cublasSgemmStridedBatched(h, ta, tb, g.m, g.n, g.k, &al, a, g.lda, p.stride_a, b, g.ldb,
                                     p.stride_b, &be, c, g.ldc, p.stride_c, p.count);
  }
};

template <>
struct gemm_traits<double> {
  static constexpr std::string_view name = "cublasDgemm";
  static constexpr std::string_view batched_name = "cublasDgemmStridedBatched";
  static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                             const detail::gemm_plan& g, double alpha, double beta, const double* a,
                             const double* b, double* c) {
    return cublasDgemm(h, ta, tb, g.m, g.n, g.k, &alpha, a, g.lda, b, g.ldb, &beta, c, g.ldc);
  }
  static cublasStatus_t batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                const detail::gemm_batched_plan& p, double alpha, double beta,
                                const double* a, const double* b, double* c) {
    const auto& g = p.g;
    return cublasDgemmStridedBatched(h, ta, tb, g.m, g.n, g.k, &alpha, a, g.lda, p.stride_a, b,
                                     g.ldb, p.stride_b, &beta, c, g.ldc, p.stride_c, p.count);
  }
};

/// f16 and bf16: cublasGemmEx with f32 accumulation and f32 alpha/beta.
template <class T, cudaDataType Type>
struct gemm_ex_traits {
  static constexpr std::string_view name = "cublasGemmEx";
  static constexpr std::string_view batched_name = "cublasGemmStridedBatchedEx";
  static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                             const detail::gemm_plan& g, double alpha, double beta, const T* a,
                             const T* b, T* c) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    return cublasGemmEx(h, ta, tb, g.m, g.n, g.k, &al, a, Type, g.lda, b, Type, g.ldb, &be, c, Type,
                        g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  static cublasStatus_t batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                const detail::gemm_batched_plan& p, double alpha, double beta,
                                const T* a, const T* b, T* c) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    const auto& g = p.g;
    return cublasGemmStridedBatchedEx(h, ta, tb, g.m, g.n, g.k, &al, a, Type, g.lda, p.stride_a, b,
                                      Type, g.ldb, p.stride_b, &be, c, Type, g.ldc, p.stride_c,
                                      p.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
};
template <>
struct gemm_traits<half> : gemm_ex_traits<half, CUDA_R_16F> {};
template <>
struct gemm_traits<bfloat16> : gemm_ex_traits<bfloat16, CUDA_R_16BF> {};

/// A, B and C checked (device, type, size) and C disjoint from A and B.
template <class T>
result<void> check_abc(std::string_view op, const device& dev, const gpu_ref<T>& a,
                       const gpu_ref<T>& b, const gpu_ref<T>& c, const detail::gemm_plan& g) {
  BOOST_OUTCOME_TRY(check_arg(op, "a", a, dev, g.a_elems));
  BOOST_OUTCOME_TRY(check_arg(op, "b", b, dev, g.b_elems));
  BOOST_OUTCOME_TRY(check_arg(op, "c", c, dev, g.c_elems));
  BOOST_OUTCOME_TRY(disjoint(op, "c", c, g.c_elems, "a", a, g.a_elems));
  BOOST_OUTCOME_TRY(disjoint(op, "c", c, g.c_elems, "b", b, g.b_elems));
  return outcome::success();
}

/// gemm on an isolated device, checked: one request to the worker, which
/// runs it on its own blas_actor made with this actor's options.
template <class T>
asio::awaitable<result<gpu_ref<T>>> remote_gemm(state_ptr st, gemm_params p, gpu_ref<T> a,
                                                gpu_ref<T> b, gpu_ref<T> c) {
  detail::wire::gemm_args w;
  w.actor = st->remote_id;
  w.type = static_cast<std::uint32_t>(dtype_of<T>);
  w.tf32 = st->tf32.load(std::memory_order_relaxed) ? 1 : 0;
  w.lt_matmul = st->use_lt ? 1 : 0;
  w.has_streams = st->remote_streams.has_value() ? 1 : 0;
  w.streams = static_cast<std::uint8_t>(st->remote_streams.value_or(stream_policy::pooled));
  w.max_lanes = st->remote_max_lanes;
  w.cuda_graph_cache = st->graph_capacity;
  w.transa = static_cast<std::uint8_t>(p.transa);
  w.transb = static_cast<std::uint8_t>(p.transb);
  w.m = p.m;
  w.n = p.n;
  w.k = p.k;
  w.lda = p.lda;
  w.ldb = p.ldb;
  w.ldc = p.ldc;
  w.alpha = p.alpha;
  w.beta = p.beta;
  w.a = detail::ref_of(*a.state(), a.offset(), a.size());
  w.b = detail::ref_of(*b.state(), b.offset(), b.size());
  w.c = detail::ref_of(*c.state(), c.offset(), c.size());
  auto r = co_await detail::remote_call(*st->dev.impl(), detail::wire::op_code::gemm,
                                        std::string(detail::wire::bytes_of(w)), st->how, nullptr);
  if (!r) co_return tag(r.error());
  co_return c;
}

/// An operation yielding `out`, on an isolated device: one request to the
/// worker's twin of the actor; `refs` are held until its answer.
template <class T, class P, class... Refs>
asio::awaitable<result<gpu_ref<T>>> remote_op(state_ptr st, wire::actor_head h, P params,
                                              gpu_ref<T> out, Refs... refs) {
  auto r = co_await detail::remote_actor_call(*st->dev.impl(), h, params, st->how, refs...);
  if (!r) co_return tag(r.error());
  co_return out;
}

/// A reduction on an isolated device: the worker answers with the value.
/// Refused inside compose() and record(), as in process.
template <class R, class T, class... Refs>
asio::awaitable<result<R>> remote_value(state_ptr st, wire::actor_op op, std::string_view name,
                                        wire::level1_args a, Refs... refs) {
  if (detail::unit_of(co_await asio::this_coro::executor))
    co_return tag(make_error(errc::not_supported,
                             std::string(name) +
                                 ": yields a host value the GPU computes, known only after its "
                                 "wait: not available as a step of compose() or record() (await "
                                 "it alone)"));
  auto r = co_await detail::remote_actor_call(*st->dev.impl(), st->remote_head(op, dtype_of<T>), a,
                                              st->how, refs...);
  if (!r) co_return tag(r.error());
  auto v = detail::reply_value<R>(r.value(), name);
  if (!v) co_return tag(v.error());
  co_return v.value();
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> do_gemm(state_ptr st, gemm_params p, gpu_ref<T> a, gpu_ref<T> b,
                                            gpu_ref<T> c) {
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto g = detail::check_gemm(p, a.size(), b.size(), c.size());
  if (!g) co_return tag(g.error());
  if (auto ok = check_abc("gemm", st->dev, a, b, c, g.value()); !ok) co_return tag(ok.error());
  if (st->remote_id) co_return co_await remote_gemm(st, p, a, b, c);
  auto& lane = st->lane(c.state().get());
  using keep =
      std::tuple<gpu_ref<T>, gpu_ref<T>, std::shared_ptr<const detail::recorded_exec>, state_ptr>;
  co_return co_await run_kernel(k_lib, lane.strm, st->how, c, [&](launch& l) -> result<keep> {
    BOOST_OUTCOME_TRY(const T* pa, l.read(a));
    BOOST_OUTCOME_TRY(const T* pb, l.read(b));
    BOOST_OUTCOME_TRY(T * pc, l.write(c));
    const auto& gp = g.value();
    const auto ta = to_cublas(p.transa), tb = to_cublas(p.transb);
    detail::lt_plan* lt = nullptr;
    std::string_view used = gemm_traits<T>::name;  // what an error names
    // `s`: the stream the handle is on now (the lane's, or the recording one).
    auto call = [&](cudaStream_t s) {
      used = gemm_traits<T>::name;
      if constexpr (std::is_same_v<T, float>) {
        if (lt) {
          const auto r = lane.lt_sgemm(*lt, s, static_cast<float>(p.alpha),
                                       static_cast<float>(p.beta), pa, pb, pc);
          if (r != CUBLAS_STATUS_NOT_SUPPORTED && r != CUBLAS_STATUS_INVALID_VALUE) {
            if (r == CUBLAS_STATUS_SUCCESS) ++lane.lt_calls;
            used = "cublasLtMatmul";
            return r;
          }
          // Refused before any launch: this shape goes to cublasSgemm from now on.
          lt->usable = false;
          lt = nullptr;
          ++lane.lt_fallbacks;
        }
      }
      return gemm_traits<T>::gemm(lane.handle, ta, tb, gp, p.alpha, p.beta, pa, pb, pc);
    };
    std::shared_ptr<const detail::recorded_exec> rec;
    {
      detail::lane_hold hold(lane, l);
      BOOST_OUTCOME_TRY(hold.status());
      const bool t32 = st->tf32.load(std::memory_order_relaxed);
      BOOST_OUTCOME_TRY(lane.use_tf32(t32));
      if constexpr (std::is_same_v<T, float>) {
        if (st->use_lt) {
          lt = lane.lt_plan_for(t32, ta, tb, gp, pa, pb, pc);
          if (!lt) ++lane.lt_fallbacks;
        }
      }
      const detail::gemm_key key{dtype_of<T>,
                                 t32,
                                 static_cast<int>(ta),
                                 static_cast<int>(tb),
                                 gp.m,
                                 gp.n,
                                 gp.k,
                                 gp.lda,
                                 gp.ldb,
                                 gp.ldc,
                                 std::bit_cast<std::uint64_t>(p.alpha),
                                 std::bit_cast<std::uint64_t>(p.beta),
                                 reinterpret_cast<std::uintptr_t>(pa),
                                 reinterpret_cast<std::uintptr_t>(pb),
                                 reinterpret_cast<std::uintptr_t>(pc)};
      if (l.recording()) {
        // Into the unit's graph: the call itself (never a graph of its own),
        // on the recording's stream with the recording's workspace.
        const cublasStatus_t r = call(l.native_stream());
        BOOST_OUTCOME_TRY(cublas_ok(r, used));
      } else {
        BOOST_OUTCOME_TRY(lane.run_recorded(key, used, call, rec));
      }
    }
    return keep{a, b, std::move(rec), st};
  });
}

template <class T>
constexpr cudaDataType lt_type() {
  if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, half>)
    return CUDA_R_16F;
  else
    return CUDA_R_16BF;
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> do_gemm_fused(state_ptr st, gemm_params p, gemm_epilogue e,
                                                  gpu_ref<T> a, gpu_ref<T> b, gpu_ref<T> bias,
                                                  gpu_ref<T> c) {
  constexpr std::string_view op = "gemm_fused";
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto g = detail::check_gemm_fused(p, e, a.size(), b.size(), bias.size(), c.size());
  if (!g) co_return tag(g.error());
  if (auto ok = check_abc(op, st->dev, a, b, c, g.value()); !ok) co_return tag(ok.error());
  const bool with_bias = detail::epilogue_has_bias(e);
  if (with_bias) {
    const auto m = static_cast<std::size_t>(g.value().m);
    if (auto ok = check_arg(op, "bias", bias, st->dev, m); !ok) co_return tag(ok.error());
    if (auto ok = disjoint(op, "c", c, g.value().c_elems, "bias", bias, m); !ok)
      co_return tag(ok.error());
  }
  if (st->remote_id) {
    auto h = st->remote_head(wire::actor_op::gemm_fused, dtype_of<T>);
    h.option = static_cast<std::uint32_t>(e);
    co_return co_await remote_op(st, h, p, c, a, b, c, with_bias ? bias : gpu_ref<T>{});
  }
  auto& lane = st->lane(c.state().get());
  using keep = std::tuple<gpu_ref<T>, gpu_ref<T>, gpu_ref<T>, state_ptr>;
  co_return co_await run_kernel(k_lib, lane.strm, st->how, c, [&](launch& l) -> result<keep> {
    BOOST_OUTCOME_TRY(const T* pa, l.read(a));
    BOOST_OUTCOME_TRY(const T* pb, l.read(b));
    const T* pbias = nullptr;
    if (with_bias) {
      BOOST_OUTCOME_TRY(pbias, l.read(bias));
    }
    BOOST_OUTCOME_TRY(T * pc, l.write(c));
    const auto& gp = g.value();
    const auto ta = to_cublas(p.transa), tb = to_cublas(p.transb);
    detail::lane_hold hold(lane, l);
    BOOST_OUTCOME_TRY(hold.status());
    const bool t32 = st->tf32.load(std::memory_order_relaxed);
    auto* plan = lane.fused_plan_for(t32, lt_type<T>(), ta, tb, gp, e, pa, pb, pbias, pc);
    if (!plan)
      return make_error(errc::not_supported,
                        "gemm_fused: cuBLASLt has no algorithm for m = " + std::to_string(gp.m) +
                            ", n = " + std::to_string(gp.n) + ", k = " + std::to_string(gp.k) +
                            " with the epilogue " + std::string(to_string(e)) + " on " +
                            std::string(to_string(dtype_of<T>)) +
                            " (or no cuBLASLt handle or workspace could be made)");
    // The plan is shared by the calls of its shape: this call's bias goes in now.
    if (with_bias && cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &pbias, sizeof pbias) != CUBLAS_STATUS_SUCCESS)
      return make_error(errc::library, "gemm_fused: cuBLASLt refused the bias pointer");
    const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
    BOOST_OUTCOME_TRY(
        cublas_ok(cublasLtMatmul(lane.lt, plan->desc, &alpha, pa, plan->la, pb, plan->lb, &beta, pc,
                                 plan->lc, pc, plan->lc, &plan->algo, lane.active_work(),
                                 lane.work_bytes, l.native_stream()),
                  "cublasLtMatmul"));
    ++lane.lt_calls;
    return keep{a, b, bias, st};
  });
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> do_gemm_batched(state_ptr st, gemm_params p, batch_params bp,
                                                    gpu_ref<T> a, gpu_ref<T> b, gpu_ref<T> c) {
  constexpr std::string_view op = "gemm_strided_batched";
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto plan = detail::check_gemm_batched(p, bp, a.size(), b.size(), c.size());
  if (!plan) co_return tag(plan.error());
  if (auto ok = check_abc(op, st->dev, a, b, c, plan.value().g); !ok) co_return tag(ok.error());
  if (st->remote_id)
    co_return co_await remote_op(st, st->remote_head(wire::actor_op::gemm_batched, dtype_of<T>),
                                 wire::blas_batched_args{p, bp}, c, a, b, c);
  auto& lane = st->lane(c.state().get());
  using keep = std::tuple<gpu_ref<T>, gpu_ref<T>, state_ptr>;
  co_return co_await run_kernel(k_lib, lane.strm, st->how, c, [&](launch& l) -> result<keep> {
    BOOST_OUTCOME_TRY(const T* pa, l.read(a));
    BOOST_OUTCOME_TRY(const T* pb, l.read(b));
    BOOST_OUTCOME_TRY(T * pc, l.write(c));
    cublasStatus_t s;
    {
      detail::lane_hold hold(lane, l);
      BOOST_OUTCOME_TRY(hold.status());
      BOOST_OUTCOME_TRY(lane.use_tf32(st->tf32.load(std::memory_order_relaxed)));
      s = gemm_traits<T>::batched(lane.handle, to_cublas(p.transa), to_cublas(p.transb),
                                  plan.value(), p.alpha, p.beta, pa, pb, pc);
    }
    BOOST_OUTCOME_TRY(cublas_ok(s, gemm_traits<T>::batched_name));
    return keep{a, b, st};
  });
}

// --- level 2 and 1, f32 and f64

template <class T>
struct level_traits;

template <>
struct level_traits<float> {
  static cublasStatus_t gemv(cublasHandle_t h, cublasOperation_t t, const detail::gemv_plan& g,
                             double alpha, double beta, const float* a, const float* x, float* y) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    return cublasSgemv(h, t, g.m, g.n, &al, a, g.lda, x, g.incx, &be, y, g.incy);
  }
  static cublasStatus_t axpy(cublasHandle_t h, int n, double alpha, const float* x, int incx,
                             float* y, int incy) {
    const float al = static_cast<float>(alpha);
    return cublasSaxpy(h, n, &al, x, incx, y, incy);
  }
  static cublasStatus_t scal(cublasHandle_t h, int n, double alpha, float* x, int incx) {
    const float al = static_cast<float>(alpha);
    return cublasSscal(h, n, &al, x, incx);
  }
  static cublasStatus_t dot(cublasHandle_t h, int n, const float* x, int incx, const float* y,
                            int incy, float* r) {
    return cublasSdot(h, n, x, incx, y, incy, r);
  }
  static cublasStatus_t nrm2(cublasHandle_t h, int n, const float* x, int incx, float* r) {
    return cublasSnrm2(h, n, x, incx, r);
  }
  static cublasStatus_t asum(cublasHandle_t h, int n, const float* x, int incx, float* r) {
    return cublasSasum(h, n, x, incx, r);
  }
  static cublasStatus_t iamax(cublasHandle_t h, int n, const float* x, int incx, int* r) {
    return cublasIsamax(h, n, x, incx, r);
  }
  static constexpr std::string_view gemv_name = "cublasSgemv", axpy_name = "cublasSaxpy",
                                    scal_name = "cublasSscal", dot_name = "cublasSdot",
                                    nrm2_name = "cublasSnrm2", asum_name = "cublasSasum",
                                    iamax_name = "cublasIsamax";
};

template <>
struct level_traits<double> {
  static cublasStatus_t gemv(cublasHandle_t h, cublasOperation_t t, const detail::gemv_plan& g,
                             double alpha, double beta, const double* a, const double* x,
                             double* y) {
    return cublasDgemv(h, t, g.m, g.n, &alpha, a, g.lda, x, g.incx, &beta, y, g.incy);
  }
  static cublasStatus_t axpy(cublasHandle_t h, int n, double alpha, const double* x, int incx,
                             double* y, int incy) {
    return cublasDaxpy(h, n, &alpha, x, incx, y, incy);
  }
  static cublasStatus_t scal(cublasHandle_t h, int n, double alpha, double* x, int incx) {
    return cublasDscal(h, n, &alpha, x, incx);
  }
  static cublasStatus_t dot(cublasHandle_t h, int n, const double* x, int incx, const double* y,
                            int incy, double* r) {
    return cublasDdot(h, n, x, incx, y, incy, r);
  }
  static cublasStatus_t nrm2(cublasHandle_t h, int n, const double* x, int incx, double* r) {
    return cublasDnrm2(h, n, x, incx, r);
  }
  static cublasStatus_t asum(cublasHandle_t h, int n, const double* x, int incx, double* r) {
    return cublasDasum(h, n, x, incx, r);
  }
  static cublasStatus_t iamax(cublasHandle_t h, int n, const double* x, int incx, int* r) {
    return cublasIdamax(h, n, x, incx, r);
  }
  static constexpr std::string_view gemv_name = "cublasDgemv", axpy_name = "cublasDaxpy",
                                    scal_name = "cublasDscal", dot_name = "cublasDdot",
                                    nrm2_name = "cublasDnrm2", asum_name = "cublasDasum",
                                    iamax_name = "cublasIdamax";
};

template <class T>
asio::awaitable<result<gpu_ref<T>>> do_gemv(state_ptr st, gemv_params p, gpu_ref<T> a, gpu_ref<T> x,
                                            gpu_ref<T> y) {
  constexpr std::string_view op = "gemv";
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto gr = detail::check_gemv(p, a.size(), x.size(), y.size());
  if (!gr) co_return tag(gr.error());
  const auto& g = gr.value();
  auto checked = [&]() -> result<void> {
    BOOST_OUTCOME_TRY(check_arg(op, "a", a, st->dev, g.a_elems));
    BOOST_OUTCOME_TRY(check_arg(op, "x", x, st->dev, g.x_elems));
    BOOST_OUTCOME_TRY(check_arg(op, "y", y, st->dev, g.y_elems));
    BOOST_OUTCOME_TRY(disjoint(op, "y", y, g.y_elems, "a", a, g.a_elems));
    BOOST_OUTCOME_TRY(disjoint(op, "y", y, g.y_elems, "x", x, g.x_elems));
    return outcome::success();
  }();
  if (!checked) co_return tag(checked.error());
  if (st->remote_id)
    co_return co_await remote_op(st, st->remote_head(wire::actor_op::gemv, dtype_of<T>), p, y, a, x,
                                 y);
  using keep = std::tuple<gpu_ref<T>, gpu_ref<T>, state_ptr>;
  auto& lane = st->lane(y.state().get());
  co_return co_await run_kernel(k_lib, lane.strm, st->how, y, [&](launch& l) -> result<keep> {
    BOOST_OUTCOME_TRY(const T* pa, l.read(a));
    BOOST_OUTCOME_TRY(const T* px, l.read(x));
    BOOST_OUTCOME_TRY(T * py, l.write(y));
    cublasStatus_t s;
    {
      detail::lane_hold hold(lane, l);
      BOOST_OUTCOME_TRY(hold.status());
      s = level_traits<T>::gemv(lane.handle, to_cublas(p.trans), g, p.alpha, p.beta, pa, px, py);
    }
    BOOST_OUTCOME_TRY(cublas_ok(s, level_traits<T>::gemv_name));
    return keep{a, x, st};
  });
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> do_axpy(state_ptr st, std::int64_t n, double alpha,
                                            gpu_ref<T> x, gpu_ref<T> y, std::int64_t incx,
                                            std::int64_t incy) {
  constexpr std::string_view op = "axpy";
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto pr = detail::check_axpy(n, incx, x.size(), incy, y.size());
  if (!pr) co_return tag(pr.error());
  const auto& p = pr.value();
  auto checked = [&]() -> result<void> {
    BOOST_OUTCOME_TRY(check_arg(op, "x", x, st->dev, p.x_elems));
    BOOST_OUTCOME_TRY(check_arg(op, "y", y, st->dev, p.y_elems));
    BOOST_OUTCOME_TRY(disjoint(op, "y", y, p.y_elems, "x", x, p.x_elems));
    return outcome::success();
  }();
  if (!checked) co_return tag(checked.error());
  if (st->remote_id)
    co_return co_await remote_op(st, st->remote_head(wire::actor_op::axpy, dtype_of<T>),
                                 wire::level1_args{n, alpha, incx, incy}, y, x, y);
  using keep = std::tuple<gpu_ref<T>, state_ptr>;
  auto& lane = st->lane(y.state().get());
  co_return co_await run_kernel(k_lib, lane.strm, st->how, y, [&](launch& l) -> result<keep> {
    BOOST_OUTCOME_TRY(const T* px, l.read(x));
    BOOST_OUTCOME_TRY(T * py, l.write(y));
    cublasStatus_t s;
    {
      detail::lane_hold hold(lane, l);
      BOOST_OUTCOME_TRY(hold.status());
      s = level_traits<T>::axpy(lane.handle, p.n, alpha, px, p.incx, py, p.incy);
    }
    BOOST_OUTCOME_TRY(cublas_ok(s, level_traits<T>::axpy_name));
    return keep{x, st};
  });
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> do_scal(state_ptr st, std::int64_t n, double alpha,
                                            gpu_ref<T> x, std::int64_t incx) {
  constexpr std::string_view op = "scal";
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto pr = detail::check_vector_op(op, n, incx, x.size());
  if (!pr) co_return tag(pr.error());
  const auto& p = pr.value();
  if (auto ok = check_arg(op, "x", x, st->dev, p.x_elems); !ok) co_return tag(ok.error());
  if (st->remote_id)
    co_return co_await remote_op(st, st->remote_head(wire::actor_op::scal, dtype_of<T>),
                                 wire::level1_args{n, alpha, incx, 1}, x, x);
  auto& lane = st->lane(x.state().get());
  co_return co_await run_kernel(k_lib, lane.strm, st->how, x, [&](launch& l) -> result<state_ptr> {
    BOOST_OUTCOME_TRY(T * px, l.write(x));
    cublasStatus_t s;
    {
      detail::lane_hold hold(lane, l);
      BOOST_OUTCOME_TRY(hold.status());
      s = level_traits<T>::scal(lane.handle, p.n, alpha, px, p.incx);
    }
    BOOST_OUTCOME_TRY(cublas_ok(s, level_traits<T>::scal_name));
    return st;
  });
}

/// A reduction computed in device pointer mode into a one-element scratch
/// buffer, copied (DMA, same stream) into pinned host memory: one operation,
/// one wait, and the io thread never blocks. `prepare(launch&)` reads the
/// inputs and returns the call `(cublasHandle_t, R*) -> cublasStatus_t`.
template <class R, class Keep, class Prepare>
asio::awaitable<result<R>> scalar_op(state_ptr st, std::string_view call_name, Keep inputs,
                                     Prepare prepare) {
  if (detail::unit_of(co_await asio::this_coro::executor))
    co_return tag(
        make_error(errc::not_supported,
                   std::string(call_name) +
                       ": yields a host value the GPU computes, known only after its "
                       "wait: not available as a step of compose() or record() (await it alone)"));
  // The scratch scalar is allocated on the lane's stream: no cross-stream wait.
  auto& lane = st->lane();
  auto scratch = st->dev.allocate<R>(1, lane.strm);
  if (!scratch) co_return tag(scratch.error());
  auto host = st->dev.allocate_pinned<R>(1);
  if (!host) co_return tag(host.error());
  using keep = std::tuple<Keep, gpu_ref<R>, pinned_buffer<R>, state_ptr>;
  auto got =
      co_await run_kernel(k_lib, lane.strm, st->how, host.value(), [&](launch& l) -> result<keep> {
        BOOST_OUTCOME_TRY(R * pr, l.write(scratch.value()));
        BOOST_OUTCOME_TRY(auto call, prepare(l));
        cublasStatus_t mode, s = CUBLAS_STATUS_SUCCESS;
        {
          std::lock_guard lk(lane.mu);
          // Not through lane_hold (a unit refuses these, so the handle is
          // never bound elsewhere), but a stuck lane is refused all the same.
          if (lane.stuck) return detail::stuck_lane_error();
          mode = cublasSetPointerMode(lane.handle, CUBLAS_POINTER_MODE_DEVICE);
          if (mode == CUBLAS_STATUS_SUCCESS) {
            s = call(lane.handle, pr);
            // Back to host mode for every other operation; cannot fail on a valid handle.
            mode = cublasSetPointerMode(lane.handle, CUBLAS_POINTER_MODE_HOST);
          }
        }
        BOOST_OUTCOME_TRY(cublas_ok(s, call_name));
        BOOST_OUTCOME_TRY(cublas_ok(mode, "cublasSetPointerMode"));
        if (auto e = cudaMemcpyAsync(host.value().data(), pr, sizeof(R), cudaMemcpyDeviceToHost,
                                     l.native_stream());
            e != cudaSuccess)
          return classify(e, "cudaMemcpyAsync");
        return keep{inputs, scratch.value(), host.value(), st};
      });
  if (!got) co_return got.error();
  co_return got.value()[0];
}

template <class T>
asio::awaitable<result<T>> do_dot(state_ptr st, std::int64_t n, gpu_ref<T> x, gpu_ref<T> y,
                                  std::int64_t incx, std::int64_t incy) {
  constexpr std::string_view op = "dot";
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto pr = detail::check_dot(n, incx, x.size(), incy, y.size());
  if (!pr) co_return tag(pr.error());
  const auto p = pr.value();
  if (auto ok = check_arg(op, "x", x, st->dev, p.x_elems); !ok) co_return tag(ok.error());
  if (auto ok = check_arg(op, "y", y, st->dev, p.y_elems); !ok) co_return tag(ok.error());
  if (st->remote_id)
    co_return co_await remote_value<T, T>(st, wire::actor_op::dot, op,
                                          wire::level1_args{n, 0.0, incx, incy}, x, y);
  co_return co_await scalar_op<T>(
      st, level_traits<T>::dot_name, std::tuple{x, y},
      [x, y, p](launch& l) -> result<std::function<cublasStatus_t(cublasHandle_t, T*)>> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        BOOST_OUTCOME_TRY(const T* py, l.read(y));
        return [px, py, p](cublasHandle_t h, T* r) {
          return level_traits<T>::dot(h, p.n, px, p.incx, py, p.incy, r);
        };
      });
}

/// nrm2, asum and iamax: one vector in, one scalar out.
enum class reduction { nrm2, asum, iamax };

template <class T, reduction Red>
auto do_reduce(state_ptr st, std::int64_t n, gpu_ref<T> x, std::int64_t incx)
    -> asio::awaitable<result<std::conditional_t<Red == reduction::iamax, int, T>>> {
  using R = std::conditional_t<Red == reduction::iamax, int, T>;
  constexpr std::string_view op = Red == reduction::nrm2   ? "nrm2"
                                  : Red == reduction::asum ? "asum"
                                                           : "iamax";
  constexpr std::string_view call_name = Red == reduction::nrm2   ? level_traits<T>::nrm2_name
                                         : Red == reduction::asum ? level_traits<T>::asum_name
                                                                  : level_traits<T>::iamax_name;
  if (auto ok = st->accepting(); !ok) co_return tag(ok.error());
  auto pr = detail::check_vector_op(op, n, incx, x.size(), Red == reduction::iamax ? 1 : 0);
  if (!pr) co_return tag(pr.error());
  const auto p = pr.value();
  if (auto ok = check_arg(op, "x", x, st->dev, p.x_elems); !ok) co_return tag(ok.error());
  if (st->remote_id) {
    constexpr auto wop = Red == reduction::nrm2   ? wire::actor_op::nrm2
                         : Red == reduction::asum ? wire::actor_op::asum
                                                  : wire::actor_op::iamax;
    const wire::level1_args w{n, 0.0, incx, 1};
    if constexpr (Red == reduction::iamax) {
      // The worker's iamax counts from 0; do_iamax takes cuBLAS's count from 1.
      auto r = co_await remote_value<std::int64_t, T>(st, wop, op, w, x);
      if (!r) co_return r.error();
      co_return static_cast<int>(r.value() + 1);
    } else {
      co_return co_await remote_value<T, T>(st, wop, op, w, x);
    }
  }
  co_return co_await scalar_op<R>(
      st, call_name, x,
      [x, p](launch& l) -> result<std::function<cublasStatus_t(cublasHandle_t, R*)>> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        return [px, p](cublasHandle_t h, R* r) {
          if constexpr (Red == reduction::nrm2)
            return level_traits<T>::nrm2(h, p.n, px, p.incx, r);
          else if constexpr (Red == reduction::asum)
            return level_traits<T>::asum(h, p.n, px, p.incx, r);
          else
            return level_traits<T>::iamax(h, p.n, px, p.incx, r);
        };
      });
}

template <class T>
asio::awaitable<result<std::int64_t>> do_iamax(state_ptr st, std::int64_t n, gpu_ref<T> x,
                                               std::int64_t incx) {
  auto r = co_await do_reduce<T, reduction::iamax>(std::move(st), n, std::move(x), incx);
  if (!r) co_return r.error();
  co_return static_cast<std::int64_t>(r.value()) - 1;  // cuBLAS counts from 1
}

}  // namespace

// ---------------------------------------------------------------- blas_actor

result<void> detail::check_blas_options(const blas_options& o) {
  return check_max_lanes("blas_actor::create", o.max_lanes);
}

result<std::unique_ptr<detail::blas_lane>> detail::blas_state::make_lane() {
  BOOST_OUTCOME_TRY(auto s, dev.acquire_stream(lane_streams, k_lib));
  auto lane = std::make_unique<blas_lane>(dev, std::move(s), graph_capacity);
  if (auto e = cudaSetDevice(dev.ordinal()); e != cudaSuccess) return classify(e, "cudaSetDevice");
  cublasHandle_t h = nullptr;
  if (auto e = cublasCreate(&h); e != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();
    return classify(e, "cublasCreate");
  }
  lane->handle = h;  // destroyed with the lane from here on
  if (auto e = cublasSetStream(h, lane->strm.native_handle()); e != CUBLAS_STATUS_SUCCESS)
    return classify(e, "cublasSetStream");
  if (auto e = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST); e != CUBLAS_STATUS_SUCCESS)
    return classify(e, "cublasSetPointerMode");
  // Set whichever mode is asked for: a new handle's default is neither.
  const bool t32 = tf32.load();
  if (auto e = cublasSetMathMode(h, t32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH);
      e != CUBLAS_STATUS_SUCCESS)
    return classify(e, "cublasSetMathMode");
  lane->tf32 = t32;
  if (use_lt) {
    cublasLtHandle_t lt = nullptr;
    if (cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS)
      lane->lt = lt;
    else
      cudaGetLastError();  // f32 gemm then goes to cublasSgemm (counted as fallbacks)
  }
  return lane;
}

result<blas_actor> blas_actor::create(device dev, blas_options options) {
  if (!dev.impl()) return make_error(errc::invalid_argument, "blas_actor: empty device");
  if (auto ok = detail::check_blas_options(options); !ok) return tag(ok.error());
  if (auto ok = dev.status(); !ok) return tag(ok.error());
  if (!dev.options().libraries.cublas)
    return tag(make_error(errc::not_supported,
                          "blas_actor: cuBLAS is disabled in this device's library_set"));
  const completion how = options.how.value_or(dev.options().default_completion);
  const auto lanes = detail::resolve_lanes(options.streams, options.max_lanes, dev.options());
  auto st = std::make_shared<blas_state>(dev, how, options, lanes);
  if (dev.isolated()) {
    // No lane here: the worker makes the actor (and its lanes) at its first call.
    st->remote_id = dev.impl()->remote->next_id();
    st->remote_stream = dev.main_stream();
    st->remote_streams = options.streams;
    st->remote_max_lanes = options.max_lanes;
    return blas_actor(std::move(st));
  }
  auto first = st->make_lane();
  // cublasCreate in a context a fault just poisoned fails as a library error.
  if (!first) return tag(dev.impl()->blame_fault(first.error()));
  st->lanes.install_first(std::move(first).value());
  return blas_actor(std::move(st));
}

const device& blas_actor::get_device() const noexcept {
  return st_->dev;
}
const stream& blas_actor::get_stream() const noexcept {
  if (st_->remote_id) return st_->remote_stream;
  return st_->lanes.first().strm;
}
const completion& blas_actor::get_completion() const noexcept {
  return st_->how;
}
bool blas_actor::tf32() const noexcept {
  return st_->tf32.load();
}

blas_statistics blas_actor::statistics() const {
  blas_statistics s;
  st_->lanes.for_each_locked([&](const detail::blas_lane& l) {
    s.gemm_graph_records += l.records;
    s.gemm_graph_launches += l.launches;
    s.gemm_graph_failures += l.failures;
    s.gemm_graphs_cached += l.gemm_graphs.size();
    s.gemm_lt_calls += l.lt_calls;
    s.gemm_lt_plans += l.lt_plans_made;
    s.gemm_lt_fallbacks += l.lt_fallbacks;
    ++s.lanes;
  });
  return s;
}

result<void> blas_actor::set_tf32(bool on) {
  if (auto ok = st_->accepting(); !ok) return tag(ok.error());
  st_->tf32.store(on);
  // Every lane now; a lane made meanwhile follows at its next gemm.
  result<void> r = outcome::success();
  st_->lanes.for_each_locked([&](detail::blas_lane& l) {
    if (auto ok = l.use_tf32(on); !ok && r) r = ok.error();
  });
  return r;
}

#define ATOMR_BLAS_GEMM(T)                                                                        \
  asio::awaitable<result<gpu_ref<T>>> blas_actor::gemm(gemm_params p, gpu_ref<T> a, gpu_ref<T> b, \
                                                       gpu_ref<T> c) const {                      \
    return do_gemm<T>(st_, p, std::move(a), std::move(b), std::move(c));                          \
  }                                                                                               \
  asio::awaitable<result<gpu_ref<T>>> blas_actor::gemm_strided_batched(                           \
      gemm_params p, batch_params b, gpu_ref<T> a, gpu_ref<T> bm, gpu_ref<T> c) const {           \
    return do_gemm_batched<T>(st_, p, b, std::move(a), std::move(bm), std::move(c));              \
  }
ATOMR_BLAS_GEMM(float)
ATOMR_BLAS_GEMM(double)
ATOMR_BLAS_GEMM(half)
ATOMR_BLAS_GEMM(bfloat16)
#undef ATOMR_BLAS_GEMM

#define ATOMR_BLAS_GEMM_FUSED(T)                                                                   \
  asio::awaitable<result<gpu_ref<T>>> blas_actor::gemm_fused(                                      \
      gemm_params p, gemm_epilogue e, gpu_ref<T> a, gpu_ref<T> b, gpu_ref<T> bias, gpu_ref<T> c)   \
      const {                                                                                      \
    return do_gemm_fused<T>(st_, p, e, std::move(a), std::move(b), std::move(bias), std::move(c)); \
  }
ATOMR_BLAS_GEMM_FUSED(float)
ATOMR_BLAS_GEMM_FUSED(half)
ATOMR_BLAS_GEMM_FUSED(bfloat16)
#undef ATOMR_BLAS_GEMM_FUSED

#define ATOMR_BLAS_LEVEL12(T)                                                                      \
  asio::awaitable<result<gpu_ref<T>>> blas_actor::gemv(gemv_params p, gpu_ref<T> a, gpu_ref<T> x,  \
                                                       gpu_ref<T> y) const {                       \
    return do_gemv<T>(st_, p, std::move(a), std::move(x), std::move(y));                           \
  }                                                                                                \
  asio::awaitable<result<gpu_ref<T>>> blas_actor::axpy(std::int64_t n, double alpha, gpu_ref<T> x, \
                                                       gpu_ref<T> y, std::int64_t incx,            \
                                                       std::int64_t incy) const {                  \
    return do_axpy<T>(st_, n, alpha, std::move(x), std::move(y), incx, incy);                      \
  }                                                                                                \
  asio::awaitable<result<gpu_ref<T>>> blas_actor::scal(std::int64_t n, double alpha, gpu_ref<T> x, \
                                                       std::int64_t incx) const {                  \
    return do_scal<T>(st_, n, alpha, std::move(x), incx);                                          \
  }                                                                                                \
  asio::awaitable<result<T>> blas_actor::dot(std::int64_t n, gpu_ref<T> x, gpu_ref<T> y,           \
                                             std::int64_t incx, std::int64_t incy) const {         \
    return do_dot<T>(st_, n, std::move(x), std::move(y), incx, incy);                              \
  }                                                                                                \
  asio::awaitable<result<T>> blas_actor::nrm2(std::int64_t n, gpu_ref<T> x, std::int64_t incx)     \
      const {                                                                                      \
    return do_reduce<T, reduction::nrm2>(st_, n, std::move(x), incx);                              \
  }                                                                                                \
  asio::awaitable<result<T>> blas_actor::asum(std::int64_t n, gpu_ref<T> x, std::int64_t incx)     \
      const {                                                                                      \
    return do_reduce<T, reduction::asum>(st_, n, std::move(x), incx);                              \
  }                                                                                                \
  asio::awaitable<result<std::int64_t>> blas_actor::iamax(std::int64_t n, gpu_ref<T> x,            \
                                                          std::int64_t incx) const {               \
    return do_iamax<T>(st_, n, std::move(x), incx);                                                \
  }
ATOMR_BLAS_LEVEL12(float)
ATOMR_BLAS_LEVEL12(double)
#undef ATOMR_BLAS_LEVEL12

}  // namespace atomr::cuda
