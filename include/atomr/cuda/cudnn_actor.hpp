// cudnn_actor: cuDNN forward operations (2-D convolution with optional bias,
// activation, softmax, pooling, batch normalization inference) as awaitables.
// cuDNN types stay in lib/cudnn_actor.cpp; this header needs no cudnn.h.
#pragma once

#include <atomr/cuda/async.hpp>
#include <atomr/cuda/completion.hpp>
#include <atomr/cuda/detail/actor_core.hpp>
#include <atomr/cuda/device.hpp>
#include <atomr/cuda/element.hpp>
#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <boost/asio/awaitable.hpp>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace atomr::cuda {

/// Memory order of a 4-D tensor: NCHW (w fastest) or NHWC (c fastest).
/// Convolution filters follow the layout: KCRS for nchw, KRSC for nhwc.
enum class tensor_layout : std::uint8_t { nchw, nhwc };

/// A dense 4-D tensor: a plain value. Every extent must be > 0 and fit in an int.
struct tensor_shape {
  /// The extents: images (batch), channels, height, width.
  /// @{
  std::int64_t n = 1, c = 1, h = 1, w = 1;
  /// @}
  tensor_layout layout = tensor_layout::nchw;  ///< the memory order
  /// n * c * h * w (no overflow check: use the detail:: checks first).
  std::int64_t elements() const noexcept { return n * c * h * w; }
  friend auto operator<=>(const tensor_shape&, const tensor_shape&) = default;
};

/// A 2-D cross-correlation (what every deep-learning "convolution" is):
/// y[n,k,p,q] = sum_{c in group, r, s} x[n, c, p*stride_h - pad_h + r*dilation_h,
/// q*stride_w - pad_w + s*dilation_w] * filter[k, c - group start, r, s] (+ bias[k]).
/// Output size per dimension: (in + 2*pad - ((filter-1)*dilation + 1)) / stride + 1.
struct conv2d_params {
  std::int64_t out_channels = 1;  ///< K; divisible by groups
  /// @{
  std::int64_t filter_h = 1, filter_w = 1;  ///< R, S
  /// @}
  /// @{
  std::int64_t pad_h = 0, pad_w = 0;  ///< >= 0
  /// @}
  /// @{
  std::int64_t stride_h = 1, stride_w = 1;  ///< > 0
  /// @}
  /// @{
  std::int64_t dilation_h = 1, dilation_w = 1;  ///< > 0
  /// @}
  std::int64_t groups = 1;  ///< > 0; divides C and K; the filter holds C/groups channels
  friend auto operator<=>(const conv2d_params&, const conv2d_params&) = default;
};

/// The function activation_forward applies: max(x, 0), 1 / (1 + e^-x),
/// tanh(x), elu (x, or coef * (e^x - 1) below 0), clipped_relu
/// (min(max(x, 0), coef)).
enum class activation_mode : std::uint8_t { relu, sigmoid, tanh, elu, clipped_relu };

/// `coef`: alpha of elu (> 0), ceiling of clipped_relu (> 0); unused otherwise, but it
/// must be finite in every mode (a NaN or an infinity is invalid_argument).
struct activation_params {
  activation_mode mode = activation_mode::relu;  ///< the function
  double coef = 0.0;                             ///< see above
};

/// accurate: exp(x - max) / sum; log: the log of that. Always over the channels
/// (for each n, h, w), as CUDNN_SOFTMAX_MODE_CHANNEL.
enum class softmax_algorithm : std::uint8_t { accurate, log };

/// What a pooling window yields: its largest element, or its average.
enum class pooling_mode : std::uint8_t {
  max,                      ///< the largest element of the window
  average_include_padding,  ///< padded zeros count in the divisor
  average_exclude_padding,  ///< only real elements count
};

/// Output size per dimension: (in + 2*pad - window) / stride + 1. pad < window.
struct pooling_params {
  pooling_mode mode = pooling_mode::max;  ///< max or average
  /// @{
  std::int64_t window_h = 2, window_w = 2;  ///< > 0
  /// @}
  /// @{
  std::int64_t pad_h = 0, pad_w = 0;  ///< >= 0 and < the window
  /// @}
  /// @{
  std::int64_t stride_h = 2, stride_w = 2;  ///< > 0
  /// @}
};

/// The enumerator's name ("nchw", "relu", "max", ...); "unknown" for any other value.
/// @{
std::string_view to_string(tensor_layout l) noexcept;
std::string_view to_string(activation_mode m) noexcept;
std::string_view to_string(pooling_mode m) noexcept;
/// @}

/// Which cuDNN API runs convolutions (docs/design.md, "cuDNN convolutions").
enum class conv_api : std::uint8_t {
  /// The graph (backend) API: an execution plan finalized once per shape and
  /// one cudnnBackendExecute per call. A shape for which no graph engine
  /// passes (precision, workspace limit) runs on the legacy API instead.
  graph,
  /// cudnnConvolutionForward with the algorithm cached per shape.
  legacy,
};

/// The enumerator's name ("graph", "legacy"); "unknown" for any other value.
std::string_view to_string(conv_api a) noexcept;

/// How a cudnn_actor is created.
struct cudnn_options {
  /// How the lanes' streams are chosen (owner name "cudnn"). Unset: a fresh
  /// stream per lane (stream_policy::per_actor_fresh), or the device's
  /// policy when max_lanes is 1 or the device's policy is single. single and
  /// per_actor_shared allow one lane, pooled at most stream_pool_size.
  std::optional<stream_policy> streams{};
  /// Completion strategy for every operation; the device's default when empty.
  std::optional<completion> how{};
  /// The largest convolution workspace one lane may own, in bytes:
  /// algorithms needing more are skipped (not_supported if none is left).
  std::size_t workspace_limit = std::size_t{256} << 20;
  /// Convolution algorithm choices kept per lane (per shape key); at least 1.
  std::size_t algo_cache_size = 64;
  /// The API convolutions run on.
  conv_api convolution_api = conv_api::graph;
  /// Graph API only: a convolution run twice in a row on the same buffers
  /// is recorded into a CUDA graph, and later runs on those buffers launch
  /// it (cudaGraphLaunch instead of cudnnBackendExecute's host work).
  bool cuda_graphs = true;
  /// The most lanes (a stream, a cuDNN handle bound to it, its plans and
  /// workspace each) the actor may make: one per io thread that submits to
  /// it, an operation going to the lane its output hashes to, so that operations from
  /// several threads launch in parallel (docs/design.md, "One actor, several
  /// lanes"); a lane makes its handle and plans on first use. 0: the
  /// device's launch_threads (8 by default; 8 without launch threads). 1:
  /// one handle on one stream, as before lanes. At most 64.
  std::size_t max_lanes = 0;
};

/// A snapshot of an actor's algorithm caches and workspaces, summed over its lanes.
struct cudnn_statistics {
  std::uint64_t algo_hits = 0;        ///< convolutions that found their algorithm cached
  std::uint64_t algo_misses = 0;      ///< convolutions that ran the heuristics
  std::size_t algos_cached = 0;       ///< convolution algorithm choices held now
  std::size_t workspace_bytes = 0;    ///< size of the workspace owned now
  std::uint64_t workspace_grows = 0;  ///< times a larger workspace was allocated
  std::uint64_t graph_plans = 0;      ///< convolution plans built on the graph API
  std::uint64_t legacy_plans = 0;     ///< convolution plans on the legacy API
  /// Plans that asked for the graph API and fell back to the legacy one.
  std::uint64_t graph_fallbacks = 0;
  std::uint64_t cuda_graph_records = 0;   ///< convolutions recorded into a CUDA graph
  std::uint64_t cuda_graph_launches = 0;  ///< convolutions run as a recorded CUDA graph
  std::uint64_t cuda_graph_failures = 0;  ///< recordings that failed (the plan then executes)
  std::size_t lanes = 0;                  ///< lanes made so far (cudnn_options::max_lanes)
  /// Times a lane's handle was pointed at another stream for an operation
  /// (cudnnSetStream): to a unit step's stream that it was not on, to a
  /// recording's, or back to the lane's own (docs/design.md, "A cuDNN handle
  /// stays on the stream it was last pointed at"). Not counted: the pair
  /// around a convolution plan's own CUDA graph capture
  /// (cuda_graph_records counts those).
  std::uint64_t stream_switches = 0;
  /// Activations, softmaxes, poolings and batch normalisations that used
  /// their lane's descriptors of the operation before (same kind, type,
  /// shape and parameters) instead of setting them again.
  std::uint64_t descriptors_reused = 0;
};

namespace detail {

/// The number of elements of each operand and the output shape of one conv2d.
struct conv2d_layout {
  tensor_shape y;                 ///< n, out_channels, out h, out w; x's layout
  std::int64_t x_elems = 0;       ///< n*c*h*w
  std::int64_t filter_elems = 0;  ///< K * C/groups * R * S
  std::int64_t bias_elems = 0;    ///< K
  std::int64_t y_elems = 0;
};

/// (in + 2*pad - ((filter-1)*dilation + 1)) / stride + 1; <= 0 when the
/// dilated filter does not fit the padded input. Pure; no argument check.
std::int64_t conv_output_dim(std::int64_t in, std::int64_t pad, std::int64_t filter,
                             std::int64_t stride, std::int64_t dilation) noexcept;
/// (in + 2*pad - window) / stride + 1; <= 0 when the window does not fit.
std::int64_t pooling_output_dim(std::int64_t in, std::int64_t pad, std::int64_t window,
                                std::int64_t stride) noexcept;

/// Extents > 0 and <= INT_MAX, a known layout, and the element count fits in
/// an int64; yields the element count. invalid_argument names "<arg>.n" etc.
result<std::int64_t> check_tensor_shape(std::string_view op, std::string_view arg,
                                        const tensor_shape& s);
/// f32 and f16 are supported; anything else is invalid_argument naming `arg`.
result<void> check_dtype(std::string_view op, std::string_view arg, dtype t);
/// A buffer of `have` elements must hold exactly `need`.
result<void> check_exact_size(std::string_view op, std::string_view arg, std::size_t have,
                              std::int64_t need);
/// Byte ranges of one allocation must not overlap (outputs are out of place).
result<void> check_no_overlap(std::string_view op, std::string_view arg, bool same_allocation,
                              std::size_t a, std::size_t a_bytes, std::size_t b,
                              std::size_t b_bytes);

/// Shape of x, every field of p ("params.<field>"), groups dividing C and K,
/// the output size > 0; yields every count.
result<conv2d_layout> check_conv2d(std::string_view op, const tensor_shape& x,
                                   const conv2d_params& p);
/// Window, padding (< window), stride, the output size > 0, y's extents ints and its
/// element count an int64 ("y_shape..."); yields y's shape.
result<tensor_shape> check_pooling(std::string_view op, const tensor_shape& x,
                                   const pooling_params& p);
/// A known mode; coef finite, and > 0 for elu and clipped_relu.
result<void> check_activation(std::string_view op, const activation_params& p);
/// A known algorithm.
result<void> check_softmax(std::string_view op, softmax_algorithm a);
/// Finite and >= CUDNN_BN_MIN_EPSILON (and > 0: a zero variance would divide by zero).
result<void> check_batchnorm_epsilon(std::string_view op, double epsilon);
/// workspace_limit (any), algo_cache_size >= 1, a known convolution_api,
/// max_lanes at most 64.
result<void> check_cudnn_options(const cudnn_options& o);

/// What a convolution's algorithm is cached by.
struct conv_key {
  tensor_shape x;
  conv2d_params p;
  dtype type = dtype::f32;
  bool bias = false;
  /// The alignment (bytes, <= 16) of the x, filter and y pointers: graph
  /// engines are chosen for it.
  std::uint8_t align_x = 0, align_w = 0, align_y = 0;
  friend auto operator<=>(const conv_key&, const conv_key&) = default;
};

struct cudnn_state;

}  // namespace detail

/// One cuDNN user: a copyable handle over a shared state (its device and its
/// lanes: each a stream, a cuDNN handle bound to it, a cache of convolution
/// algorithms and a workspace). The actor uses one lane per io thread that
/// submits to it (up to cudnn_options::max_lanes), an operation going to the
/// lane its output hashes to, so one actor shared by many io threads
/// launches on as many streams.
///
/// Every operation checks all its arguments before any GPU call
/// (invalid_argument naming the argument), fails at once when the device no
/// longer accepts work, then enqueues through run_kernel; the lane's enqueue
/// lock is held only around the synchronous cuDNN calls. Descriptors and the
/// workspace an operation used live in its keep-alive until the GPU is done.
/// Ordering is per buffer (events across lanes): an operation awaited before
/// the next one is issued is seen by it.
/// f32 convolutions use FMA math only (no TF32); f16 ones may use tensor cores
/// and accumulate in f32. Outputs are written whole and out of place.
///
/// Thread safety: all members may be called from any thread.
class cudnn_actor {
public:
  /// An actor on `dev`: acquires its first lane's stream (the cuDNN handle
  /// is created on first use). invalid_argument for bad options (before
  /// anything else), device_unavailable when the device does not accept
  /// work, not_supported when its library_set disables cuDNN.
  static result<cudnn_actor> create(device dev, cudnn_options options = {});

  /// y = conv2d(x, filter) (+ bias[k] when `bias` is not empty). x has
  /// x_shape; filter K x C/groups x R x S (KCRS for nchw, KRSC for nhwc); bias K
  /// elements; y exactly n x K x P x Q in x's layout. Yields `y`.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> conv2d_forward(tensor_shape x_shape, conv2d_params p,
                                                         gpu_ref<float> x, gpu_ref<float> filter,
                                                         gpu_ref<float> bias,
                                                         gpu_ref<float> y) const;
  asio::awaitable<result<gpu_ref<half>>> conv2d_forward(tensor_shape x_shape, conv2d_params p,
                                                        gpu_ref<half> x, gpu_ref<half> filter,
                                                        gpu_ref<half> bias, gpu_ref<half> y) const;
  /// @}

  /// y = f(x), elementwise; x and y both have `shape` (y may be x itself).
  /// @{
  asio::awaitable<result<gpu_ref<float>>> activation_forward(tensor_shape shape,
                                                             activation_params p, gpu_ref<float> x,
                                                             gpu_ref<float> y) const;
  asio::awaitable<result<gpu_ref<half>>> activation_forward(tensor_shape shape, activation_params p,
                                                            gpu_ref<half> x, gpu_ref<half> y) const;
  /// @}

  /// Softmax over the channels for each (n, h, w); y has `shape`, out of place.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> softmax_forward(tensor_shape shape, softmax_algorithm a,
                                                          gpu_ref<float> x, gpu_ref<float> y) const;
  asio::awaitable<result<gpu_ref<half>>> softmax_forward(tensor_shape shape, softmax_algorithm a,
                                                         gpu_ref<half> x, gpu_ref<half> y) const;
  /// @}

  /// 2-D pooling; y exactly n x c x P x Q in x's layout. Out of place.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> pooling_forward(tensor_shape x_shape, pooling_params p,
                                                          gpu_ref<float> x, gpu_ref<float> y) const;
  asio::awaitable<result<gpu_ref<half>>> pooling_forward(tensor_shape x_shape, pooling_params p,
                                                         gpu_ref<half> x, gpu_ref<half> y) const;
  /// @}

  /// y = scale[c] * (x - mean[c]) / sqrt(var[c] + epsilon) + bias[c] (spatial
  /// batch norm, inference). scale, bias, mean, var: C floats each (also for
  /// half data, as cuDNN requires). y has `shape`, out of place.
  /// @{
  asio::awaitable<result<gpu_ref<float>>> batchnorm_inference(
      tensor_shape shape, double epsilon, gpu_ref<float> x, gpu_ref<float> scale,
      gpu_ref<float> bias, gpu_ref<float> mean, gpu_ref<float> var, gpu_ref<float> y) const;
  asio::awaitable<result<gpu_ref<half>>> batchnorm_inference(
      tensor_shape shape, double epsilon, gpu_ref<half> x, gpu_ref<float> scale,
      gpu_ref<float> bias, gpu_ref<float> mean, gpu_ref<float> var, gpu_ref<half> y) const;
  /// @}

  // ---- Completion tokens (docs/design.md, "Completion tokens") ----
  // Each operation above also takes any Asio completion token as its last
  // argument: it then completes with void(result<gpu_ref<T>>) (y) on the
  // handler's associated executor; it runs on the handler's executor when
  // that has one of its own, else on the device's executor. The handler's
  // cancellation slot reaches the wait (terminal, partial, total:
  // errc::cancelled). The operation holds its own copy of this actor. Costs
  // one co_spawn on top of the awaitable. They exist for exactly the element
  // types the awaitables take.

  /// The operation of the same name, completing through an Asio completion
  /// token with void(result<gpu_ref<T>>) instead of returning an awaitable
  /// (see the comment above these overloads).
  /// @{
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const cudnn_actor& s, tensor_shape sh, conv2d_params p, gpu_ref<T> x) {
    s.conv2d_forward(sh, p, x, x, x, x);
  }
  auto conv2d_forward(tensor_shape x_shape, conv2d_params p, gpu_ref<T> x, gpu_ref<T> filter,
                      gpu_ref<T> bias, gpu_ref<T> y, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const cudnn_actor& s) {
      return s.conv2d_forward(x_shape, p, x, filter, bias, y);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const cudnn_actor& s, tensor_shape sh, activation_params p, gpu_ref<T> x) {
    s.activation_forward(sh, p, x, x);
  }
  auto activation_forward(tensor_shape shape, activation_params p, gpu_ref<T> x, gpu_ref<T> y,
                          Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const cudnn_actor& s) {
      return s.activation_forward(shape, p, x, y);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const cudnn_actor& s, tensor_shape sh, softmax_algorithm a, gpu_ref<T> x) {
    s.softmax_forward(sh, a, x, x);
  }
  auto softmax_forward(tensor_shape shape, softmax_algorithm a, gpu_ref<T> x, gpu_ref<T> y,
                       Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const cudnn_actor& s) {
      return s.softmax_forward(shape, a, x, y);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const cudnn_actor& s, tensor_shape sh, pooling_params p, gpu_ref<T> x) {
    s.pooling_forward(sh, p, x, x);
  }
  auto pooling_forward(tensor_shape x_shape, pooling_params p, gpu_ref<T> x, gpu_ref<T> y,
                       Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const cudnn_actor& s) {
      return s.pooling_forward(x_shape, p, x, y);
    });
  }
  template <element T, result_token<gpu_ref<T>> Token>
  requires requires(const cudnn_actor& s, tensor_shape sh, gpu_ref<T> x, gpu_ref<float> f) {
    s.batchnorm_inference(sh, 1e-5, x, f, f, f, f, x);
  }
  auto batchnorm_inference(tensor_shape shape, double epsilon, gpu_ref<T> x, gpu_ref<float> scale,
                           gpu_ref<float> bias, gpu_ref<float> mean, gpu_ref<float> var,
                           gpu_ref<T> y, Token&& token) const {
    return detail::async_actor_op(*this, std::forward<Token>(token), [=](const cudnn_actor& s) {
      return s.batchnorm_inference(shape, epsilon, x, scale, bias, mean, var, y);
    });
  }
  /// @}

  /// Algorithm cache and workspace counts, summed over the lanes. Takes each
  /// lane's lock briefly; no GPU call.
  cudnn_statistics statistics() const;

  /// The device the actor was created on.
  const device& get_device() const noexcept;
  /// The first lane's stream. With more than one lane, operations may run on
  /// the others' streams too (their buffers are ordered by events).
  const stream& get_stream() const noexcept;

  /// Wraps the library's state; create() is how users make an actor.
  explicit cudnn_actor(std::shared_ptr<detail::cudnn_state> st) noexcept : st_(std::move(st)) {}

private:
  std::shared_ptr<detail::cudnn_state> st_;
};

}  // namespace atomr::cuda
