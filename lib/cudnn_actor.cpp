#include <atomr/cuda/cudnn_actor.hpp>

#include "cudnn_graph.hpp"
#include "device_impl.hpp"
#include "remote.hpp"

#include <atomr/cuda/cudnn_error.hpp>
#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/detail/lru.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

// cuDNN 9 marks the whole legacy "ops/cnn" API (descriptor types included)
// deprecated in favour of the graph API. It is the API present in every
// cuDNN 9 release we run on (9.14 on the GPU machine), so the warnings are
// silenced for this file only, where every cuDNN call lives.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace atomr::cuda {

std::string_view to_string(tensor_layout l) noexcept {
  switch (l) {
    case tensor_layout::nchw:
      return "nchw";
    case tensor_layout::nhwc:
      return "nhwc";
  }
  return "unknown";
}

std::string_view to_string(activation_mode m) noexcept {
  switch (m) {
    case activation_mode::relu:
      return "relu";
    case activation_mode::sigmoid:
      return "sigmoid";
    case activation_mode::tanh:
      return "tanh";
    case activation_mode::elu:
      return "elu";
    case activation_mode::clipped_relu:
      return "clipped_relu";
  }
  return "unknown";
}

std::string_view to_string(conv_api a) noexcept {
  switch (a) {
    case conv_api::graph:
      return "graph";
    case conv_api::legacy:
      return "legacy";
  }
  return "unknown";
}

std::string_view to_string(pooling_mode m) noexcept {
  switch (m) {
    case pooling_mode::max:
      return "max";
    case pooling_mode::average_include_padding:
      return "average_include_padding";
    case pooling_mode::average_exclude_padding:
      return "average_exclude_padding";
  }
  return "unknown";
}

namespace detail {

namespace {
std::string num(std::int64_t v) {
  return "(" + std::to_string(v) + ")";
}
/// "arg" or "arg.f": built only for an error message (the checks run on
/// every operation, before its launch, and allocate nothing when they pass).
std::string field(std::string_view arg, std::string_view f = {}) {
  std::string s(arg);
  if (!f.empty()) {
    s += '.';
    s += f;
  }
  return s;
}
result<void> positive_int(std::string_view op, std::string_view arg, std::int64_t v,
                          std::string_view f = {}) {
  if (v <= 0) return bad_argument(op, field(arg, f), num(v) + " is not > 0");
  if (v > INT_MAX) return bad_argument(op, field(arg, f), num(v) + " does not fit in an int");
  return outcome::success();
}
result<void> non_negative_int(std::string_view op, std::string_view arg, std::int64_t v) {
  if (v < 0) return bad_argument(op, arg, num(v) + " is negative");
  if (v > INT_MAX) return bad_argument(op, arg, num(v) + " does not fit in an int");
  return outcome::success();
}
}  // namespace

std::int64_t conv_output_dim(std::int64_t in, std::int64_t pad, std::int64_t filter,
                             std::int64_t stride, std::int64_t dilation) noexcept {
  const std::int64_t span = (filter - 1) * dilation + 1;
  const std::int64_t room = in + 2 * pad - span;
  if (room < 0 || stride <= 0) return 0;
  return room / stride + 1;
}

std::int64_t pooling_output_dim(std::int64_t in, std::int64_t pad, std::int64_t window,
                                std::int64_t stride) noexcept {
  const std::int64_t room = in + 2 * pad - window;
  if (room < 0 || stride <= 0) return 0;
  return room / stride + 1;
}

result<std::int64_t> check_tensor_shape(std::string_view op, std::string_view arg,
                                        const tensor_shape& s) {
  BOOST_OUTCOME_TRY(positive_int(op, arg, s.n, "n"));
  BOOST_OUTCOME_TRY(positive_int(op, arg, s.c, "c"));
  BOOST_OUTCOME_TRY(positive_int(op, arg, s.h, "h"));
  BOOST_OUTCOME_TRY(positive_int(op, arg, s.w, "w"));
  if (s.layout != tensor_layout::nchw && s.layout != tensor_layout::nhwc)
    return bad_argument(op, field(arg, "layout"),
                        num(static_cast<int>(s.layout)) + " is neither nchw nor nhwc");
  std::int64_t e = 0;
  if (__builtin_mul_overflow(s.n, s.c, &e) || __builtin_mul_overflow(e, s.h, &e) ||
      __builtin_mul_overflow(e, s.w, &e))
    return bad_argument(op, arg, "has more elements than an int64 can count");
  return e;
}

result<void> check_dtype(std::string_view op, std::string_view arg, dtype t) {
  if (t == dtype::f32 || t == dtype::f16) return outcome::success();
  return bad_argument(op, arg,
                      "has element type " + std::string(to_string(t)) +
                          "; only f32 and f16 are "
                          "supported");
}

result<void> check_exact_size(std::string_view op, std::string_view arg, std::size_t have,
                              std::int64_t need) {
  if (need >= 0 && static_cast<std::uint64_t>(need) == have) return outcome::success();
  return bad_argument(
      op, arg,
      "has " + std::to_string(have) + " elements, the shape needs exactly " + std::to_string(need));
}

result<void> check_no_overlap(std::string_view op, std::string_view arg, bool same_allocation,
                              std::size_t a, std::size_t a_bytes, std::size_t b,
                              std::size_t b_bytes) {
  if (!same_allocation || a_bytes == 0 || b_bytes == 0) return outcome::success();
  if (a + a_bytes <= b || b + b_bytes <= a) return outcome::success();
  return bad_argument(op, arg, "overlaps an input (this operation is out of place)");
}

result<conv2d_layout> check_conv2d(std::string_view op, const tensor_shape& x,
                                   const conv2d_params& p) {
  BOOST_OUTCOME_TRY(auto x_elems, check_tensor_shape(op, "x_shape", x));
  BOOST_OUTCOME_TRY(positive_int(op, "params.out_channels", p.out_channels));
  BOOST_OUTCOME_TRY(positive_int(op, "params.filter_h", p.filter_h));
  BOOST_OUTCOME_TRY(positive_int(op, "params.filter_w", p.filter_w));
  BOOST_OUTCOME_TRY(non_negative_int(op, "params.pad_h", p.pad_h));
  BOOST_OUTCOME_TRY(non_negative_int(op, "params.pad_w", p.pad_w));
  BOOST_OUTCOME_TRY(positive_int(op, "params.stride_h", p.stride_h));
  BOOST_OUTCOME_TRY(positive_int(op, "params.stride_w", p.stride_w));
  BOOST_OUTCOME_TRY(positive_int(op, "params.dilation_h", p.dilation_h));
  BOOST_OUTCOME_TRY(positive_int(op, "params.dilation_w", p.dilation_w));
  BOOST_OUTCOME_TRY(positive_int(op, "params.groups", p.groups));
  if (x.c % p.groups != 0)
    return bad_argument(op, "params.groups",
                        num(p.groups) + " does not divide the input channels " + num(x.c));
  if (p.out_channels % p.groups != 0)
    return bad_argument(
        op, "params.groups",
        num(p.groups) + " does not divide params.out_channels " + num(p.out_channels));
  // All of these are ints (< 2^31), so the arithmetic below cannot overflow an int64.
  const std::int64_t oh = conv_output_dim(x.h, p.pad_h, p.filter_h, p.stride_h, p.dilation_h);
  const std::int64_t ow = conv_output_dim(x.w, p.pad_w, p.filter_w, p.stride_w, p.dilation_w);
  if (oh <= 0)
    return bad_argument(op, "params.filter_h",
                        "dilated (" + std::to_string((p.filter_h - 1) * p.dilation_h + 1) +
                            ") is larger than the padded input height (" +
                            std::to_string(x.h + 2 * p.pad_h) + ")");
  if (ow <= 0)
    return bad_argument(op, "params.filter_w",
                        "dilated (" + std::to_string((p.filter_w - 1) * p.dilation_w + 1) +
                            ") is larger than the padded input width (" +
                            std::to_string(x.w + 2 * p.pad_w) + ")");
  conv2d_layout lay;
  lay.y = tensor_shape{x.n, p.out_channels, oh, ow, x.layout};
  lay.x_elems = x_elems;
  std::int64_t f = 0;
  if (__builtin_mul_overflow(p.out_channels, x.c / p.groups, &f) ||
      __builtin_mul_overflow(f, p.filter_h, &f) || __builtin_mul_overflow(f, p.filter_w, &f))
    return bad_argument(op, "params", "makes the filter element count overflow an int64");
  lay.filter_elems = f;
  lay.bias_elems = p.out_channels;
  BOOST_OUTCOME_TRY(lay.y_elems, check_tensor_shape(op, "y_shape", lay.y));
  return lay;
}

result<tensor_shape> check_pooling(std::string_view op, const tensor_shape& x,
                                   const pooling_params& p) {
  BOOST_OUTCOME_TRY(check_tensor_shape(op, "x_shape", x));
  if (p.mode != pooling_mode::max && p.mode != pooling_mode::average_include_padding &&
      p.mode != pooling_mode::average_exclude_padding)
    return bad_argument(op, "params.mode",
                        num(static_cast<int>(p.mode)) + " is not a pooling mode");
  BOOST_OUTCOME_TRY(positive_int(op, "params.window_h", p.window_h));
  BOOST_OUTCOME_TRY(positive_int(op, "params.window_w", p.window_w));
  BOOST_OUTCOME_TRY(non_negative_int(op, "params.pad_h", p.pad_h));
  BOOST_OUTCOME_TRY(non_negative_int(op, "params.pad_w", p.pad_w));
  if (p.pad_h >= p.window_h)
    return bad_argument(op, "params.pad_h", num(p.pad_h) + " is not < params.window_h");
  if (p.pad_w >= p.window_w)
    return bad_argument(op, "params.pad_w", num(p.pad_w) + " is not < params.window_w");
  BOOST_OUTCOME_TRY(positive_int(op, "params.stride_h", p.stride_h));
  BOOST_OUTCOME_TRY(positive_int(op, "params.stride_w", p.stride_w));
  const std::int64_t oh = pooling_output_dim(x.h, p.pad_h, p.window_h, p.stride_h);
  const std::int64_t ow = pooling_output_dim(x.w, p.pad_w, p.window_w, p.stride_w);
  if (oh <= 0)
    return bad_argument(op, "params.window_h",
                        num(p.window_h) + " is larger than the padded input height");
  if (ow <= 0)
    return bad_argument(op, "params.window_w",
                        num(p.window_w) + " is larger than the padded input width");
  // With padding up to window - 1 the output can be larger than the input: past INT_MAX per
  // extent, past an int64 in all (cuDNN takes int extents; elements() must not overflow).
  const tensor_shape y{x.n, x.c, oh, ow, x.layout};
  BOOST_OUTCOME_TRY(check_tensor_shape(op, "y_shape", y));
  return y;
}

result<void> check_activation(std::string_view op, const activation_params& p) {
  switch (p.mode) {
    case activation_mode::relu:
    case activation_mode::sigmoid:
    case activation_mode::tanh:
      if (!std::isfinite(p.coef)) return bad_argument(op, "params.coef", "is not finite");
      return outcome::success();
    case activation_mode::elu:
    case activation_mode::clipped_relu:
      if (!std::isfinite(p.coef) || p.coef <= 0)
        return bad_argument(op, "params.coef",
                            "(" + std::to_string(p.coef) + ") must be finite and > 0 for " +
                                std::string(to_string(p.mode)));
      return outcome::success();
  }
  return bad_argument(op, "params.mode",
                      num(static_cast<int>(p.mode)) + " is not an activation mode");
}

result<void> check_softmax(std::string_view op, softmax_algorithm a) {
  if (a == softmax_algorithm::accurate || a == softmax_algorithm::log) return outcome::success();
  return bad_argument(op, "algorithm", num(static_cast<int>(a)) + " is neither accurate nor log");
}

result<void> check_batchnorm_epsilon(std::string_view op, double epsilon) {
  if (!std::isfinite(epsilon) || epsilon < CUDNN_BN_MIN_EPSILON || epsilon <= 0)
    return bad_argument(op, "epsilon",
                        "(" + std::to_string(epsilon) + ") must be finite, > 0 and >= " +
                            "CUDNN_BN_MIN_EPSILON (" + std::to_string(CUDNN_BN_MIN_EPSILON) + ")");
  return outcome::success();
}

result<void> check_cudnn_options(const cudnn_options& o) {
  if (o.algo_cache_size == 0) return bad_argument("cudnn_actor::create", "algo_cache_size", "is 0");
  if (o.convolution_api != conv_api::graph && o.convolution_api != conv_api::legacy)
    return bad_argument("cudnn_actor::create", "convolution_api",
                        num(static_cast<int>(o.convolution_api)) + " is not a conv_api");
  return check_max_lanes("cudnn_actor::create", o.max_lanes);
}

namespace {

result<void> ok(cudnnStatus_t st, std::string_view call) {
  if (st == CUDNN_STATUS_SUCCESS) return outcome::success();
  return classify(st, call);
}

/// One cuDNN descriptor, destroyed with its owner (descriptors are host
/// objects: destroying one never touches the GPU).
template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
struct descriptor {
  H h = nullptr;
  descriptor() = default;
  descriptor(const descriptor&) = delete;
  descriptor& operator=(const descriptor&) = delete;
  ~descriptor() {
    if (h) Destroy(h);
  }
  result<void> create(std::string_view call) {
    if (h) return outcome::success();
    return ok(Create(&h), call);
  }
};

using tensor_desc =
    descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using filter_desc =
    descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using conv_desc = descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                             cudnnDestroyConvolutionDescriptor>;
using activation_desc = descriptor<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                                   cudnnDestroyActivationDescriptor>;
using pooling_desc = descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                                cudnnDestroyPoolingDescriptor>;

template <class T>
constexpr cudnnDataType_t data_type() noexcept {
  if constexpr (std::is_same_v<T, half>) return CUDNN_DATA_HALF;
  return CUDNN_DATA_FLOAT;
}

cudnnTensorFormat_t format(tensor_layout l) noexcept {
  return l == tensor_layout::nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

result<void> set_tensor(tensor_desc& d, const tensor_shape& s, cudnnDataType_t t) {
  BOOST_OUTCOME_TRY(d.create("cudnnCreateTensorDescriptor"));
  return ok(cudnnSetTensor4dDescriptor(d.h, format(s.layout), t, static_cast<int>(s.n),
                                       static_cast<int>(s.c), static_cast<int>(s.h),
                                       static_cast<int>(s.w)),
            "cudnnSetTensor4dDescriptor");
}

/// A cached convolution: the graph-API plan when there is one, else the
/// legacy descriptors and the algorithm the heuristics picked. The y and
/// bias descriptors serve the bias addition on either path.
struct conv_plan {
  std::unique_ptr<graph_conv> graph;
  tensor_desc x, y, bias;
  filter_desc filter;
  conv_desc conv;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  std::size_t workspace = 0;
};

/// The descriptors of one non-convolution operation. cuDNN reads them only
/// during the call that takes them (the launch copies what the kernel
/// needs), so a lane keeps the last ones and sets them again only for an
/// operation with another key (cudnn_lane::descs_for).
struct op_descs {
  tensor_desc x, y, param;
  activation_desc act;
  pooling_desc pool;
};

/// Everything an operation's descriptors are made from: its kind, element
/// type, shapes and parameters (an operation leaves the same entries unused
/// on every call: a second shape it lacks is {1, 1, 1, 1}, missing
/// parameters are 0). Equal keys make equal descriptors.
struct op_key {
  std::array<std::int64_t, 17> v{};
  friend bool operator==(const op_key&, const op_key&) = default;
};
enum class op_kind : std::int64_t { activation = 1, softmax, pooling, batchnorm };

/// The key of an operation of `kind` on `type` with the shape `a` (and `b`,
/// pooling's output) and up to seven parameters.
op_key make_op_key(op_kind kind, cudnnDataType_t type, const tensor_shape& a, const tensor_shape& b,
                   std::initializer_list<std::int64_t> params) {
  op_key k;
  k.v = {static_cast<std::int64_t>(kind),
         static_cast<std::int64_t>(type),
         a.n,
         a.c,
         a.h,
         a.w,
         static_cast<std::int64_t>(a.layout),
         b.n,
         b.c,
         b.h};
  assert(params.size() <= k.v.size() - 10);
  std::size_t i = 10;
  for (auto p : params) k.v[i++] = p;
  // (b.w and b.layout: pooling's output has x's layout, and its width follows
  // from x's and the window's, which are in the key.)
  return k;
}

}  // namespace

/// What every lane of a cudnn_actor is configured with (cudnn_options).
struct cudnn_config {
  std::size_t workspace_limit = 0;
  conv_api api = conv_api::graph;
  bool cuda_graphs = true;
  std::size_t algo_cache_size = 1;
};

/// One lane of a cudnn_actor (docs/design.md, "One actor, several lanes"):
/// a cuDNN handle bound to the lane's stream (made on its first operation)
/// and everything tied to it or to that stream: the convolution plans (graph
/// execution plans are built with the handle), the workspace, the recording
/// stream and their counts.
struct cudnn_lane : lane_base {
  cudnn_lane(device d, stream s, const cudnn_config& c)
      : lane_base(std::move(s)), dev(std::move(d)), cfg(c), plans(c.algo_cache_size) {}
  cudnn_lane(const cudnn_lane&) = delete;
  cudnn_lane& operator=(const cudnn_lane&) = delete;
  ~cudnn_lane() {
    // The last keep-alive holding the actor's state (and so this lane) is
    // released only after the GPU finished with it; nothing is handed back
    // to a dead context. Plans first: graph-API execution plans were made
    // with the handle.
    plans.clear();
    if (dev.health() == health_state::poisoned) return;
    if (handle) cudnnDestroy(handle);
    capture.destroy();
  }

  device dev;
  const cudnn_config cfg;
  // Everything below is guarded by mu.
  cudnnHandle_t handle = nullptr;
  /// The stream the handle is on: the lane's, a recording's while one
  /// records, or the stream of the last unit step that followed its previous
  /// step (left there until an enqueue on the lane's own stream comes).
  cudaStream_t on_now = nullptr;
  stream kept;                        // that unit step's stream, while the handle is on it
  std::uint64_t stream_switches = 0;  // cudnnSetStream calls after the handle's first
  /// For each kind of non-convolution operation, the last one's descriptors
  /// and their key (a slot per kind: a model's relu, pooling and softmax
  /// on one lane each keep theirs).
  struct desc_slot {
    op_descs descs;
    op_key key;
    bool set = false;
  };
  std::array<desc_slot, 4> desc_slots;
  std::uint64_t descs_reused = 0;
  lru<conv_key, std::shared_ptr<conv_plan>> plans;
  gpu_ref<std::uint8_t> workspace;  // replaced (never resized) when a larger one is needed
  std::uint64_t workspace_grows = 0;
  std::uint64_t graph_plans = 0, legacy_plans = 0, graph_fallbacks = 0;
  std::uint64_t graph_records = 0, graph_launches = 0, graph_failures = 0;
  recording_stream capture;  // CUDA graphs are recorded on it

  /// The recording stream (null when cuda_graphs is off). Lock held, device current.
  cudaStream_t capture_stream() { return cfg.cuda_graphs ? capture.get() : nullptr; }

  /// Runs a graph-API plan and counts how it ran. Inside a recording
  /// (graph.hpp) it is executed into the recording's stream, never as a
  /// graph of its own.
  result<void> run_graph(launch& l, conv_plan& plan, const void* x, const void* w, void* y,
                         void* ws, std::shared_ptr<const recorded_exec>& keep) {
    if (l.recording()) {
      BOOST_OUTCOME_TRY(plan.graph->execute_direct(handle, x, w, y, ws));
      return outcome::success();
    }
    const bool could_record = !plan.graph->recording_failed();
    auto ran =
        plan.graph->execute(handle, strm.native_handle(), capture_stream(), x, w, y, ws, keep);
    if (plan.graph->handle_astray()) stuck = true;  // as lane_hold does
    BOOST_OUTCOME_TRY(auto how, std::move(ran));
    if (how == graph_run::captured) ++graph_records;
    if (how != graph_run::executed) ++graph_launches;
    if (could_record && plan.graph->recording_failed()) ++graph_failures;
    return outcome::success();
  }

  /// An enqueue on another stream than the lane's (lane_hold: a recording,
  /// or a unit's step following its previous step): the handle on that
  /// stream, unless it is there already (a unit's step left it there). Lock
  /// held.
  result<void> bind(launch& l) {
    BOOST_OUTCOME_TRY(auto h, get_handle());
    if (on_now == l.native_stream()) return outcome::success();
    BOOST_OUTCOME_TRY(ok(cudnnSetStream(h, l.native_stream()), "cudnnSetStream"));
    ++stream_switches;
    on_now = l.native_stream();
    // Held while the handle is on it: no handle of ours points at a
    // destroyed stream (the lane's destructor destroys the handle first).
    kept = l.recording() ? stream{} : l.get_stream();
    return outcome::success();
  }
  /// A unit step's stream stays the handle's after the step (lane_hold does
  /// not call unbind()); a recording's never does.
  static bool leaves_bound(const launch& l) noexcept { return !l.recording(); }
  /// Back on the lane's stream; false if that failed. Lock held.
  bool unbind() noexcept {
    if (cudnnSetStream(handle, strm.native_handle()) != CUDNN_STATUS_SUCCESS) return false;
    back_on_own();
    return true;
  }
  /// An enqueue on the lane's own stream: the handle back on it if a unit's
  /// step left it elsewhere. Lock held.
  result<void> to_own() {
    if (!handle || on_now == strm.native_handle()) return outcome::success();
    const auto st = cudnnSetStream(handle, strm.native_handle());
    if (st != CUDNN_STATUS_SUCCESS) return ok(st, "cudnnSetStream");
    back_on_own();
    return outcome::success();
  }
  /// After cudnnSetStream put the handle back on the lane's stream.
  void back_on_own() noexcept {
    ++stream_switches;
    on_now = strm.native_handle();
    kept = stream{};
  }

  /// Creates the handle on first use and binds it to the lane's stream.
  /// Called with the lock held and the device current.
  result<cudnnHandle_t> get_handle() {
    if (handle) return handle;
    cudnnHandle_t h = nullptr;
    BOOST_OUTCOME_TRY(ok(cudnnCreate(&h), "cudnnCreate"));
    if (auto r = ok(cudnnSetStream(h, strm.native_handle()), "cudnnSetStream"); !r) {
      cudnnDestroy(h);
      return r.error();
    }
    handle = h;
    on_now = strm.native_handle();
    return handle;
  }

  /// The descriptors for an operation with `key`: those of the last
  /// operation of its kind when its key was the same, else made again by
  /// `make(descs)`. Lock held.
  template <class Make>
  result<const op_descs*> descs_for(const op_key& key, Make&& make) {
    const auto kind = static_cast<std::size_t>(key.v[0] - 1);  // op_kind, from 1
    assert(kind < desc_slots.size());
    auto& slot = desc_slots[kind];
    if (slot.set && key == slot.key) {
      ++descs_reused;
      return &slot.descs;
    }
    slot.set = false;  // until `make` has set every descriptor of the new key
    BOOST_OUTCOME_TRY(make(slot.descs));
    slot.key = key;
    slot.set = true;
    return &slot.descs;
  }

  /// A workspace of at least `bytes` (empty if 0), on the lane's stream. Lock held.
  result<gpu_ref<std::uint8_t>> workspace_for(std::size_t bytes) {
    if (bytes == 0) return gpu_ref<std::uint8_t>{};
    if (workspace.size() < bytes) {
      // The old workspace lives on in the keep-alives of the ops that used it;
      // the pool frees it after their GPU work (ordered as writes).
      BOOST_OUTCOME_TRY(auto w, dev.allocate<std::uint8_t>(bytes, strm));
      workspace = std::move(w);
      ++workspace_grows;
    }
    return workspace;
  }

  template <class T>
  result<std::shared_ptr<conv_plan>> plan_for(cudnnHandle_t h, const conv_key& key,
                                              const conv2d_layout& lay);
};

struct cudnn_state {
  cudnn_state(device d, completion c, const cudnn_options& o, lane_policy lp)
      : dev(std::move(d)),
        how(c),
        cfg{o.workspace_limit, o.convolution_api, o.cuda_graphs, o.algo_cache_size},
        lane_streams(lp.streams),
        lanes(lp.max_lanes) {}
  cudnn_state(const cudnn_state&) = delete;
  cudnn_state& operator=(const cudnn_state&) = delete;

  device dev;
  const completion how;
  const cudnn_config cfg;
  const stream_policy lane_streams;
  lane_set<cudnn_lane> lanes;

  /// Isolated devices: the actor's id in the worker (whose twin is made with
  /// `remote` at its first request; docs/design.md, "Isolated device"), and
  /// what get_stream() answers (there are no lanes here). 0 in process.
  std::uint64_t remote_id = 0;
  wire::actor_settings remote;
  stream remote_stream;
  ~cudnn_state() {
    if (remote_id && dev.impl()->remote)
      dev.impl()->remote->release(wire::release_kind::actor, remote_id);
  }

  /// A new lane: only its stream (the handle is made at its first operation).
  result<std::unique_ptr<cudnn_lane>> make_lane() {
    BOOST_OUTCOME_TRY(auto s, dev.acquire_stream(lane_streams, "cudnn"));
    return std::make_unique<cudnn_lane>(dev, std::move(s), cfg);
  }
  /// The lane for the next operation (lane_set::pick).
  /// The lane for an operation writing the buffer `key` (docs/design.md,
  /// "One actor, several lanes"); null: the calling thread's lane.
  cudnn_lane& lane(const void* key = nullptr) {
    return lanes.pick([this](std::size_t) { return make_lane(); }, key);
  }
};

namespace {

/// A packed 4-D operand in cuDNN's logical order (N, C, H, W or K, C, R, S)
/// stored as `l` says (NCHW/KCRS or NHWC/KRSC).
graph_tensor packed(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, tensor_layout l,
                    std::uint8_t alignment) {
  graph_tensor t;
  t.dims = {n, c, h, w};
  if (l == tensor_layout::nhwc)
    t.strides = {h * w * c, 1, w * c, c};
  else
    t.strides = {c * h * w, h * w, w, 1};
  t.alignment = alignment;
  return t;
}

template <class T>
graph_conv_spec graph_spec(const conv_key& key, const conv2d_layout& lay, std::size_t ws_limit) {
  const auto& x = key.x;
  const auto& p = key.p;
  graph_conv_spec s;
  s.type = data_type<T>();
  s.x = packed(x.n, x.c, x.h, x.w, x.layout, key.align_x);
  s.w = packed(p.out_channels, x.c / p.groups, p.filter_h, p.filter_w, x.layout, key.align_w);
  s.y = packed(lay.y.n, lay.y.c, lay.y.h, lay.y.w, x.layout, key.align_y);
  s.pad = {p.pad_h, p.pad_w};
  s.stride = {p.stride_h, p.stride_w};
  s.dilation = {p.dilation_h, p.dilation_w};
  s.strict_f32 = std::is_same_v<T, float>;
  s.workspace_limit = ws_limit;
  return s;
}

}  // namespace

template <class T>
result<std::shared_ptr<conv_plan>> cudnn_lane::plan_for(cudnnHandle_t h, const conv_key& key,
                                                        const conv2d_layout& lay) {
  if (auto* p = plans.find(key)) return *p;
  auto plan = std::make_shared<conv_plan>();
  const auto t = data_type<T>();
  const auto& x = key.x;
  const auto& p = key.p;
  BOOST_OUTCOME_TRY(set_tensor(plan->x, x, t));
  BOOST_OUTCOME_TRY(set_tensor(plan->y, lay.y, t));
  if (key.bias) {
    BOOST_OUTCOME_TRY(set_tensor(plan->bias, tensor_shape{1, p.out_channels, 1, 1, x.layout}, t));
  }
  if (cfg.api == conv_api::graph) {
    // Any failure here (no engine passes, or cuDNN refuses the graph) leaves
    // the shape to the legacy API, which reports its own errors.
    if (auto g = graph_conv::build(h, graph_spec<T>(key, lay, cfg.workspace_limit))) {
      plan->graph = std::move(g).value();
      plan->workspace = plan->graph->workspace();
      ++graph_plans;
      return plans.insert(key, std::move(plan));
    }
    ++graph_fallbacks;
  }
  BOOST_OUTCOME_TRY(plan->filter.create("cudnnCreateFilterDescriptor"));
  BOOST_OUTCOME_TRY(ok(
      cudnnSetFilter4dDescriptor(plan->filter.h, t, format(x.layout),
                                 static_cast<int>(p.out_channels), static_cast<int>(x.c / p.groups),
                                 static_cast<int>(p.filter_h), static_cast<int>(p.filter_w)),
      "cudnnSetFilter4dDescriptor"));
  BOOST_OUTCOME_TRY(plan->conv.create("cudnnCreateConvolutionDescriptor"));
  // Accumulation in f32 for both element types.
  BOOST_OUTCOME_TRY(ok(cudnnSetConvolution2dDescriptor(
                           plan->conv.h, static_cast<int>(p.pad_h), static_cast<int>(p.pad_w),
                           static_cast<int>(p.stride_h), static_cast<int>(p.stride_w),
                           static_cast<int>(p.dilation_h), static_cast<int>(p.dilation_w),
                           CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                       "cudnnSetConvolution2dDescriptor"));
  BOOST_OUTCOME_TRY(ok(cudnnSetConvolutionGroupCount(plan->conv.h, static_cast<int>(p.groups)),
                       "cudnnSetConvolutionGroupCount"));
  // f32: FMA kernels only. CUDNN_DEFAULT_MATH would allow TF32 tensor cores
  // on Ampere and later, which cannot meet the 1e-5 f32 contract.
  constexpr bool is_f32 = std::is_same_v<T, float>;
  const cudnnMathType_t math = is_f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
  BOOST_OUTCOME_TRY(
      ok(cudnnSetConvolutionMathType(plan->conv.h, math), "cudnnSetConvolutionMathType"));

  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int count = 0;
  BOOST_OUTCOME_TRY(ok(
      cudnnGetConvolutionForwardAlgorithm_v7(h, plan->x.h, plan->filter.h, plan->conv.h, plan->y.h,
                                             CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
      "cudnnGetConvolutionForwardAlgorithm_v7"));
  bool found = false;
  for (int i = 0; i < count && !found; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (is_f32 && (perf[i].mathType == CUDNN_TENSOR_OP_MATH ||
                   perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    // The math type the heuristics assumed for this algorithm (f16 only; f32 stays FMA).
    if (!is_f32 &&
        cudnnSetConvolutionMathType(plan->conv.h, perf[i].mathType) != CUDNN_STATUS_SUCCESS)
      continue;
    std::size_t ws = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(h, plan->x.h, plan->filter.h, plan->conv.h,
                                                plan->y.h, perf[i].algo,
                                                &ws) != CUDNN_STATUS_SUCCESS)
      continue;
    if (ws > cfg.workspace_limit) continue;
    plan->algo = perf[i].algo;
    plan->workspace = ws;
    found = true;
  }
  if (found) ++legacy_plans;
  if (!found)
    return make_error(errc::not_supported,
                      "cudnn_actor::conv2d_forward: no forward algorithm for this shape within "
                      "cfg.workspace_limit (" +
                          std::to_string(cfg.workspace_limit) + " bytes)" +
                          (is_f32 ? " without TF32" : ""));
  return plans.insert(key, std::move(plan));
}

namespace {

constexpr float one = 1.0f;
constexpr float zero = 0.0f;

/// An operation on an isolated device, checked here: one request to the
/// worker's twin of the actor, `refs` held until its answer; yields `y`.
template <class T, class P, class... Refs>
asio::awaitable<result<gpu_ref<T>>> remote_op(std::shared_ptr<cudnn_state> st, wire::actor_op op,
                                              P params, gpu_ref<T> y, Refs... refs) {
  auto r = co_await remote_actor_call(
      *st->dev.impl(),
      actor_head_of(st->remote_id, wire::actor_kind::cudnn, op, dtype_of<T>, st->remote), params,
      st->how, refs...);
  if (!r) co_return r.error();
  co_return y;
}

template <element A, element B>
result<void> not_overlapping(std::string_view op, std::string_view arg, const gpu_ref<A>& out,
                             const gpu_ref<B>& in) {
  return check_no_overlap(op, arg, out.state() && out.state() == in.state(),
                          out.offset() * sizeof(A), out.size_bytes(), in.offset() * sizeof(B),
                          in.size_bytes());
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> conv2d(std::shared_ptr<cudnn_state> st, tensor_shape xs,
                                           conv2d_params p, gpu_ref<T> x, gpu_ref<T> filter,
                                           gpu_ref<T> bias, gpu_ref<T> y) {
  constexpr std::string_view op = "cudnn_actor::conv2d_forward";
  BOOST_OUTCOME_CO_TRY(st->dev.status());
  BOOST_OUTCOME_CO_TRY(check_dtype(op, "x", dtype_of<T>));
  BOOST_OUTCOME_CO_TRY(auto lay, check_conv2d(op, xs, p));
  const auto& dev = st->dev;
  BOOST_OUTCOME_CO_TRY(check_ref(op, "x", x, dev, 0));
  BOOST_OUTCOME_CO_TRY(check_exact_size(op, "x", x.size(), lay.x_elems));
  BOOST_OUTCOME_CO_TRY(check_ref(op, "filter", filter, dev, 0));
  BOOST_OUTCOME_CO_TRY(check_exact_size(op, "filter", filter.size(), lay.filter_elems));
  const bool has_bias = static_cast<bool>(bias.state());
  if (has_bias) {
    BOOST_OUTCOME_CO_TRY(check_ref(op, "bias", bias, dev, 0));
    BOOST_OUTCOME_CO_TRY(check_exact_size(op, "bias", bias.size(), lay.bias_elems));
  }
  BOOST_OUTCOME_CO_TRY(check_ref(op, "y", y, dev, 0));
  BOOST_OUTCOME_CO_TRY(check_exact_size(op, "y", y.size(), lay.y_elems));
  BOOST_OUTCOME_CO_TRY(not_overlapping(op, "y", y, x));
  BOOST_OUTCOME_CO_TRY(not_overlapping(op, "y", y, filter));
  if (has_bias) {
    BOOST_OUTCOME_CO_TRY(not_overlapping(op, "y", y, bias));
  }

  if (st->remote_id)
    co_return co_await remote_op(st, wire::actor_op::conv2d, wire::conv_args{xs, p}, y, x, filter,
                                 bias, y);
  const conv_key shape_key{xs, p, dtype_of<T>, has_bias};
  using keep_t = std::tuple<gpu_ref<T>, gpu_ref<T>, gpu_ref<T>, std::shared_ptr<conv_plan>,
                            gpu_ref<std::uint8_t>, std::shared_ptr<const recorded_exec>,
                            std::shared_ptr<cudnn_state>>;
  cudnn_lane* lane = &st->lane(y.state().get());
  co_return co_await run_kernel(
      "cudnn", lane->strm, st->how, y,
      [st, lane, shape_key, lay, x, filter, bias, y, has_bias](launch& l) -> result<keep_t> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        BOOST_OUTCOME_TRY(const T* pf, l.read(filter));
        const T* pb = nullptr;
        if (has_bias) {
          BOOST_OUTCOME_TRY(pb, l.read(bias));
        }
        BOOST_OUTCOME_TRY(T * py, l.write(y));
        conv_key key = shape_key;
        key.align_x = static_cast<std::uint8_t>(pointer_alignment(px));
        key.align_w = static_cast<std::uint8_t>(pointer_alignment(pf));
        key.align_y = static_cast<std::uint8_t>(pointer_alignment(py));
        lane_hold hold(*lane, l);
        BOOST_OUTCOME_TRY(hold.status());
        BOOST_OUTCOME_TRY(auto h, lane->get_handle());
        BOOST_OUTCOME_TRY(auto plan, lane->plan_for<T>(h, key, lay));
        BOOST_OUTCOME_TRY(auto ws, lane->workspace_for(plan->workspace));
        void* pws = nullptr;
        if (!ws.empty()) {
          // A write, so that the pool frees a replaced workspace only after this op.
          BOOST_OUTCOME_TRY(std::uint8_t * w, l.write(ws));
          pws = w;
        }
        std::shared_ptr<const recorded_exec> rec;
        if (plan->graph) {
          BOOST_OUTCOME_TRY(lane->run_graph(l, *plan, px, pf, py, pws, rec));
        } else {
          BOOST_OUTCOME_TRY(
              ok(cudnnConvolutionForward(h, &one, plan->x.h, px, plan->filter.h, pf, plan->conv.h,
                                         plan->algo, pws, plan->workspace, &zero, plan->y.h, py),
                 "cudnnConvolutionForward"));
        }
        if (has_bias) {
          BOOST_OUTCOME_TRY(
              ok(cudnnAddTensor(h, &one, plan->bias.h, pb, &one, plan->y.h, py), "cudnnAddTensor"));
        }
        return keep_t{x, filter, bias, std::move(plan), std::move(ws), std::move(rec), st};
      });
}

/// Checks of the one input and one output of the elementwise/softmax/pooling ops.
template <class T>
result<void> check_io(std::string_view op, const cudnn_state& st, const gpu_ref<T>& x,
                      std::int64_t x_elems, const gpu_ref<T>& y, std::int64_t y_elems,
                      bool in_place_ok) {
  BOOST_OUTCOME_TRY(check_dtype(op, "x", dtype_of<T>));
  BOOST_OUTCOME_TRY(check_ref(op, "x", x, st.dev, 0));
  BOOST_OUTCOME_TRY(check_exact_size(op, "x", x.size(), x_elems));
  BOOST_OUTCOME_TRY(check_ref(op, "y", y, st.dev, 0));
  BOOST_OUTCOME_TRY(check_exact_size(op, "y", y.size(), y_elems));
  const bool same_view = x.state() == y.state() && x.offset() == y.offset() && x.size() == y.size();
  if (!(in_place_ok && same_view)) {
    BOOST_OUTCOME_TRY(not_overlapping(op, "y", y, x));
  }
  return outcome::success();
}

using keep_io = std::tuple<std::shared_ptr<cudnn_state>>;

template <class T>
asio::awaitable<result<gpu_ref<T>>> activation(std::shared_ptr<cudnn_state> st, tensor_shape s,
                                               activation_params p, gpu_ref<T> x, gpu_ref<T> y) {
  constexpr std::string_view op = "cudnn_actor::activation_forward";
  BOOST_OUTCOME_CO_TRY(st->dev.status());
  BOOST_OUTCOME_CO_TRY(auto elems, check_tensor_shape(op, "shape", s));
  BOOST_OUTCOME_CO_TRY(check_activation(op, p));
  BOOST_OUTCOME_CO_TRY(check_io(op, *st, x, elems, y, elems, true));
  if (st->remote_id)
    co_return co_await remote_op(st, wire::actor_op::activation, wire::activation_args{s, p}, y, x,
                                 y);
  cudnn_lane* lane = &st->lane(y.state().get());
  // No workspace or plan: in a unit, on its previous step's stream.
  const stream on = unit_step_stream(unit_of(co_await asio::this_coro::executor), lane->strm);
  co_return co_await run_kernel(
      "cudnn", on, st->how, y,
      [st, lane, s, p, x, y](launch& l) -> result<std::tuple<gpu_ref<T>, keep_io>> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        BOOST_OUTCOME_TRY(T * py, l.write(y));
        cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
        switch (p.mode) {
          case activation_mode::relu:
            mode = CUDNN_ACTIVATION_RELU;
            break;
          case activation_mode::sigmoid:
            mode = CUDNN_ACTIVATION_SIGMOID;
            break;
          case activation_mode::tanh:
            mode = CUDNN_ACTIVATION_TANH;
            break;
          case activation_mode::elu:
            mode = CUDNN_ACTIVATION_ELU;
            break;
          case activation_mode::clipped_relu:
            mode = CUDNN_ACTIVATION_CLIPPED_RELU;
            break;
        }
        lane_hold hold(*lane, l);
        BOOST_OUTCOME_TRY(hold.status());
        BOOST_OUTCOME_TRY(auto h, lane->get_handle());
        const auto key =
            make_op_key(op_kind::activation, data_type<T>(), s, {},
                        {static_cast<std::int64_t>(mode), std::bit_cast<std::int64_t>(p.coef)});
        BOOST_OUTCOME_TRY(auto d, lane->descs_for(key, [&](op_descs& n) -> result<void> {
          BOOST_OUTCOME_TRY(set_tensor(n.x, s, data_type<T>()));
          BOOST_OUTCOME_TRY(n.act.create("cudnnCreateActivationDescriptor"));
          return ok(cudnnSetActivationDescriptor(n.act.h, mode, CUDNN_PROPAGATE_NAN, p.coef),
                    "cudnnSetActivationDescriptor");
        }));
        BOOST_OUTCOME_TRY(
            ok(cudnnActivationForward(h, d->act.h, &one, d->x.h, px, &zero, d->x.h, py),
               "cudnnActivationForward"));
        return std::tuple{x, keep_io{st}};
      });
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> softmax(std::shared_ptr<cudnn_state> st, tensor_shape s,
                                            softmax_algorithm a, gpu_ref<T> x, gpu_ref<T> y) {
  constexpr std::string_view op = "cudnn_actor::softmax_forward";
  BOOST_OUTCOME_CO_TRY(st->dev.status());
  BOOST_OUTCOME_CO_TRY(auto elems, check_tensor_shape(op, "shape", s));
  BOOST_OUTCOME_CO_TRY(check_softmax(op, a));
  BOOST_OUTCOME_CO_TRY(check_io(op, *st, x, elems, y, elems, false));
  if (st->remote_id)
    co_return co_await remote_op(st, wire::actor_op::softmax, wire::softmax_args{s, a}, y, x, y);
  cudnn_lane* lane = &st->lane(y.state().get());
  // No workspace or plan: in a unit, on its previous step's stream.
  const stream on = unit_step_stream(unit_of(co_await asio::this_coro::executor), lane->strm);
  co_return co_await run_kernel(
      "cudnn", on, st->how, y,
      [st, lane, s, a, x, y](launch& l) -> result<std::tuple<gpu_ref<T>, keep_io>> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        BOOST_OUTCOME_TRY(T * py, l.write(y));
        const auto algo = a == softmax_algorithm::log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE;
        lane_hold hold(*lane, l);
        BOOST_OUTCOME_TRY(hold.status());
        BOOST_OUTCOME_TRY(auto h, lane->get_handle());
        BOOST_OUTCOME_TRY(
            auto d,
            lane->descs_for(make_op_key(op_kind::softmax, data_type<T>(), s, {}, {}),
                            [&](op_descs& n) { return set_tensor(n.x, s, data_type<T>()); }));
        BOOST_OUTCOME_TRY(ok(cudnnSoftmaxForward(h, algo, CUDNN_SOFTMAX_MODE_CHANNEL, &one, d->x.h,
                                                 px, &zero, d->x.h, py),
                             "cudnnSoftmaxForward"));
        return std::tuple{x, keep_io{st}};
      });
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> pooling(std::shared_ptr<cudnn_state> st, tensor_shape xs,
                                            pooling_params p, gpu_ref<T> x, gpu_ref<T> y) {
  constexpr std::string_view op = "cudnn_actor::pooling_forward";
  BOOST_OUTCOME_CO_TRY(st->dev.status());
  BOOST_OUTCOME_CO_TRY(auto ys, check_pooling(op, xs, p));
  BOOST_OUTCOME_CO_TRY(check_io(op, *st, x, xs.elements(), y, ys.elements(), false));
  if (st->remote_id)
    co_return co_await remote_op(st, wire::actor_op::pooling, wire::pooling_args{xs, p}, y, x, y);
  cudnn_lane* lane = &st->lane(y.state().get());
  // No workspace or plan: in a unit, on its previous step's stream.
  const stream on = unit_step_stream(unit_of(co_await asio::this_coro::executor), lane->strm);
  co_return co_await run_kernel(
      "cudnn", on, st->how, y,
      [st, lane, xs, ys, p, x, y](launch& l) -> result<std::tuple<gpu_ref<T>, keep_io>> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        BOOST_OUTCOME_TRY(T * py, l.write(y));
        const auto mode = p.mode == pooling_mode::max ? CUDNN_POOLING_MAX
                          : p.mode == pooling_mode::average_include_padding
                              ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                              : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
        lane_hold hold(*lane, l);
        BOOST_OUTCOME_TRY(hold.status());
        BOOST_OUTCOME_TRY(auto h, lane->get_handle());
        const auto key = make_op_key(op_kind::pooling, data_type<T>(), xs, ys,
                                     {static_cast<std::int64_t>(mode), p.window_h, p.window_w,
                                      p.pad_h, p.pad_w, p.stride_h, p.stride_w});
        BOOST_OUTCOME_TRY(auto d, lane->descs_for(key, [&](op_descs& n) -> result<void> {
          BOOST_OUTCOME_TRY(set_tensor(n.x, xs, data_type<T>()));
          BOOST_OUTCOME_TRY(set_tensor(n.y, ys, data_type<T>()));
          BOOST_OUTCOME_TRY(n.pool.create("cudnnCreatePoolingDescriptor"));
          return ok(cudnnSetPooling2dDescriptor(
                        n.pool.h, mode, CUDNN_PROPAGATE_NAN, static_cast<int>(p.window_h),
                        static_cast<int>(p.window_w), static_cast<int>(p.pad_h),
                        static_cast<int>(p.pad_w), static_cast<int>(p.stride_h),
                        static_cast<int>(p.stride_w)),
                    "cudnnSetPooling2dDescriptor");
        }));
        BOOST_OUTCOME_TRY(ok(cudnnPoolingForward(h, d->pool.h, &one, d->x.h, px, &zero, d->y.h, py),
                             "cudnnPoolingForward"));
        return std::tuple{x, keep_io{st}};
      });
}

template <class T>
asio::awaitable<result<gpu_ref<T>>> batchnorm(std::shared_ptr<cudnn_state> st, tensor_shape s,
                                              double eps, gpu_ref<T> x, gpu_ref<float> scale,
                                              gpu_ref<float> bias, gpu_ref<float> mean,
                                              gpu_ref<float> var, gpu_ref<T> y) {
  constexpr std::string_view op = "cudnn_actor::batchnorm_inference";
  BOOST_OUTCOME_CO_TRY(st->dev.status());
  BOOST_OUTCOME_CO_TRY(auto elems, check_tensor_shape(op, "shape", s));
  BOOST_OUTCOME_CO_TRY(check_batchnorm_epsilon(op, eps));
  BOOST_OUTCOME_CO_TRY(check_io(op, *st, x, elems, y, elems, false));
  const std::pair<std::string_view, const gpu_ref<float>*> params[] = {
      {"scale", &scale}, {"bias", &bias}, {"mean", &mean}, {"var", &var}};
  for (const auto& [name, r] : params) {
    BOOST_OUTCOME_CO_TRY(check_ref(op, name, *r, st->dev, 0));
    BOOST_OUTCOME_CO_TRY(check_exact_size(op, name, r->size(), s.c));
    BOOST_OUTCOME_CO_TRY(not_overlapping(op, "y", y, *r));
  }
  if (st->remote_id)
    co_return co_await remote_op(st, wire::actor_op::batchnorm, wire::batchnorm_args{s, eps}, y, x,
                                 scale, bias, mean, var, y);
  using keep_t = std::tuple<gpu_ref<T>, gpu_ref<float>, gpu_ref<float>, gpu_ref<float>,
                            gpu_ref<float>, keep_io>;
  cudnn_lane* lane = &st->lane(y.state().get());
  // No workspace or plan: in a unit, on its previous step's stream.
  const stream on = unit_step_stream(unit_of(co_await asio::this_coro::executor), lane->strm);
  co_return co_await run_kernel(
      "cudnn", on, st->how, y,
      [st, lane, s, eps, x, scale, bias, mean, var, y](launch& l) -> result<keep_t> {
        BOOST_OUTCOME_TRY(const T* px, l.read(x));
        BOOST_OUTCOME_TRY(const float* ps, l.read(scale));
        BOOST_OUTCOME_TRY(const float* pb, l.read(bias));
        BOOST_OUTCOME_TRY(const float* pm, l.read(mean));
        BOOST_OUTCOME_TRY(const float* pv, l.read(var));
        BOOST_OUTCOME_TRY(T * py, l.write(y));
        lane_hold hold(*lane, l);
        BOOST_OUTCOME_TRY(hold.status());
        BOOST_OUTCOME_TRY(auto h, lane->get_handle());
        BOOST_OUTCOME_TRY(
            auto d, lane->descs_for(make_op_key(op_kind::batchnorm, data_type<T>(), s, {}, {}),
                                    [&](op_descs& n) -> result<void> {
                                      BOOST_OUTCOME_TRY(set_tensor(n.x, s, data_type<T>()));
                                      // Per-channel parameters: 1 x C x 1 x 1 floats
                                      // (also for half data).
                                      return set_tensor(
                                          n.param, tensor_shape{1, s.c, 1, 1, tensor_layout::nchw},
                                          CUDNN_DATA_FLOAT);
                                    }));
        BOOST_OUTCOME_TRY(ok(cudnnBatchNormalizationForwardInference(
                                 h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, d->x.h, px, d->x.h, py,
                                 d->param.h, ps, pb, pm, pv, eps),
                             "cudnnBatchNormalizationForwardInference"));
        return keep_t{x, scale, bias, mean, var, keep_io{st}};
      });
}

}  // namespace
}  // namespace detail

result<cudnn_actor> cudnn_actor::create(device dev, cudnn_options options) {
  BOOST_OUTCOME_TRY(detail::check_cudnn_options(options));
  BOOST_OUTCOME_TRY(dev.status());
  if (!dev.options().libraries.cudnn)
    return make_error(errc::not_supported,
                      "cudnn_actor::create: cuDNN is disabled in this device's library_set");
  const completion how = options.how.value_or(dev.options().default_completion);
  const auto lanes = detail::resolve_lanes(options.streams, options.max_lanes, dev.options());
  auto st = std::make_shared<detail::cudnn_state>(dev, how, options, lanes);
  if (dev.isolated()) {
    // No lane here: the worker makes the actor's twin at its first request.
    namespace wire = detail::wire;
    st->remote_id = dev.impl()->remote->next_id();
    st->remote_stream = dev.main_stream();
    auto& r = st->remote = detail::lane_settings(options.streams, options.max_lanes);
    r.flags = options.cuda_graphs ? wire::cuda_graphs : 0;
    r.variant = static_cast<std::uint8_t>(options.convolution_api);
    r.cache = options.algo_cache_size;
    r.limit = options.workspace_limit;
    return cudnn_actor(std::move(st));
  }
  auto first = st->make_lane();
  if (!first) return dev.impl()->blame_fault(first.error());
  st->lanes.install_first(std::move(first).value());
  return cudnn_actor(std::move(st));
}

asio::awaitable<result<gpu_ref<float>>> cudnn_actor::conv2d_forward(
    tensor_shape x_shape, conv2d_params p, gpu_ref<float> x, gpu_ref<float> filter,
    gpu_ref<float> bias, gpu_ref<float> y) const {
  return detail::conv2d<float>(st_, x_shape, p, std::move(x), std::move(filter), std::move(bias),
                               std::move(y));
}
asio::awaitable<result<gpu_ref<half>>> cudnn_actor::conv2d_forward(tensor_shape x_shape,
                                                                   conv2d_params p, gpu_ref<half> x,
                                                                   gpu_ref<half> filter,
                                                                   gpu_ref<half> bias,
                                                                   gpu_ref<half> y) const {
  return detail::conv2d<half>(st_, x_shape, p, std::move(x), std::move(filter), std::move(bias),
                              std::move(y));
}

asio::awaitable<result<gpu_ref<float>>> cudnn_actor::activation_forward(tensor_shape shape,
                                                                        activation_params p,
                                                                        gpu_ref<float> x,
                                                                        gpu_ref<float> y) const {
  return detail::activation<float>(st_, shape, p, std::move(x), std::move(y));
}
asio::awaitable<result<gpu_ref<half>>> cudnn_actor::activation_forward(tensor_shape shape,
                                                                       activation_params p,
                                                                       gpu_ref<half> x,
                                                                       gpu_ref<half> y) const {
  return detail::activation<half>(st_, shape, p, std::move(x), std::move(y));
}

asio::awaitable<result<gpu_ref<float>>> cudnn_actor::softmax_forward(tensor_shape shape,
                                                                     softmax_algorithm a,
                                                                     gpu_ref<float> x,
                                                                     gpu_ref<float> y) const {
  return detail::softmax<float>(st_, shape, a, std::move(x), std::move(y));
}
asio::awaitable<result<gpu_ref<half>>> cudnn_actor::softmax_forward(tensor_shape shape,
                                                                    softmax_algorithm a,
                                                                    gpu_ref<half> x,
                                                                    gpu_ref<half> y) const {
  return detail::softmax<half>(st_, shape, a, std::move(x), std::move(y));
}

asio::awaitable<result<gpu_ref<float>>> cudnn_actor::pooling_forward(tensor_shape x_shape,
                                                                     pooling_params p,
                                                                     gpu_ref<float> x,
                                                                     gpu_ref<float> y) const {
  return detail::pooling<float>(st_, x_shape, p, std::move(x), std::move(y));
}
asio::awaitable<result<gpu_ref<half>>> cudnn_actor::pooling_forward(tensor_shape x_shape,
                                                                    pooling_params p,
                                                                    gpu_ref<half> x,
                                                                    gpu_ref<half> y) const {
  return detail::pooling<half>(st_, x_shape, p, std::move(x), std::move(y));
}

asio::awaitable<result<gpu_ref<float>>> cudnn_actor::batchnorm_inference(
    tensor_shape shape, double epsilon, gpu_ref<float> x, gpu_ref<float> scale, gpu_ref<float> bias,
    gpu_ref<float> mean, gpu_ref<float> var, gpu_ref<float> y) const {
  return detail::batchnorm<float>(st_, shape, epsilon, std::move(x), std::move(scale),
                                  std::move(bias), std::move(mean), std::move(var), std::move(y));
}
asio::awaitable<result<gpu_ref<half>>> cudnn_actor::batchnorm_inference(
    tensor_shape shape, double epsilon, gpu_ref<half> x, gpu_ref<float> scale, gpu_ref<float> bias,
    gpu_ref<float> mean, gpu_ref<float> var, gpu_ref<half> y) const {
  return detail::batchnorm<half>(st_, shape, epsilon, std::move(x), std::move(scale),
                                 std::move(bias), std::move(mean), std::move(var), std::move(y));
}

cudnn_statistics cudnn_actor::statistics() const {
  cudnn_statistics s;
  st_->lanes.for_each_locked([&](const detail::cudnn_lane& l) {
    s.algo_hits += l.plans.hits();
    s.algo_misses += l.plans.misses();
    s.algos_cached += l.plans.size();
    s.workspace_bytes += l.workspace.size();
    s.workspace_grows += l.workspace_grows;
    s.graph_plans += l.graph_plans;
    s.legacy_plans += l.legacy_plans;
    s.graph_fallbacks += l.graph_fallbacks;
    s.cuda_graph_records += l.graph_records;
    s.cuda_graph_launches += l.graph_launches;
    s.cuda_graph_failures += l.graph_failures;
    s.stream_switches += l.stream_switches;
    s.descriptors_reused += l.descs_reused;
    ++s.lanes;
  });
  return s;
}

const device& cudnn_actor::get_device() const noexcept {
  return st_->dev;
}
const stream& cudnn_actor::get_stream() const noexcept {
  if (st_->remote_id) return st_->remote_stream;
  return st_->lanes.first().strm;
}

}  // namespace atomr::cuda

#pragma GCC diagnostic pop
