// A 2-D convolution on cuDNN's graph (backend) API. The legacy
// cudnnConvolutionForward rebuilds its engine inside every call (75 to 88 us
// of host time for a ResNet-50 layer on the H200, docs/history/performance.md); a
// finalized execution plan is built once per shape and each call is one
// cudnnBackendExecute.
#include "cudnn_graph.hpp"

#include <atomr/cuda/cudnn_error.hpp>

#include <algorithm>
#include <string>
#include <utility>

// The HANDLE attributes of the operation graph and the execution plan are
// marked deprecated in cuDNN 9.19 (a device-property descriptor may replace
// them); the GPU machine runs 9.14, where they are the way to bind a handle.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace atomr::cuda::detail {

namespace {

result<void> ok(cudnnStatus_t st, std::string_view what) {
  if (st == CUDNN_STATUS_SUCCESS) return outcome::success();
  return classify(st, what);
}

constexpr std::int64_t uid_x = 1, uid_w = 2, uid_y = 3;

result<backend_desc> make_tensor(std::int64_t uid, const graph_tensor& t, cudnnDataType_t type) {
  BOOST_OUTCOME_TRY(auto d, backend_desc::make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor"));
  BOOST_OUTCOME_TRY(
      d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type"));
  BOOST_OUTCOME_TRY(
      d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data(), "tensor dims"));
  BOOST_OUTCOME_TRY(
      d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data(), "tensor strides"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &t.alignment,
                          "tensor alignment"));
  BOOST_OUTCOME_TRY(d.finalize("tensor"));
  return d;
}

result<backend_desc> make_convolution(const graph_conv_spec& s) {
  BOOST_OUTCOME_TRY(auto d,
                    backend_desc::make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution"));
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t dims = 2;
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp,
                          "convolution compute type"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode,
                          "convolution mode"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims,
                          "convolution spatial dims"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, s.dilation.data(),
                          "convolution dilations"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2,
                          s.stride.data(), "convolution strides"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, s.pad.data(),
                          "convolution pre-paddings"));
  BOOST_OUTCOME_TRY(d.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, s.pad.data(),
                          "convolution post-paddings"));
  BOOST_OUTCOME_TRY(d.finalize("convolution"));
  return d;
}

/// Whether the engine of `cfg` keeps the precision contract of the spec.
result<bool> precision_ok(cudnnBackendDescriptor_t cfg, bool strict_f32) {
  BOOST_OUTCOME_TRY(auto engine, backend_desc::make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine"));
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  BOOST_OUTCOME_TRY(ok(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
                       "cudnnBackendGetAttribute(engine config's engine)"));
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  BOOST_OUTCOME_TRY(
      ok(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                  static_cast<std::int64_t>(notes.size()), &n, notes.data()),
         "cudnnBackendGetAttribute(engine numerical notes)"));
  n = std::clamp<std::int64_t>(n, 0, static_cast<std::int64_t>(notes.size()));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto note = notes[static_cast<std::size_t>(i)];
    if (note == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
    if (strict_f32 && (note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                       note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS))
      return false;
  }
  return true;
}

}  // namespace

backend_desc::backend_desc(backend_desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}

backend_desc& backend_desc::operator=(backend_desc&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(o.d_, nullptr);
  }
  return *this;
}

backend_desc::~backend_desc() {
  // Host objects: destroying one never touches the GPU.
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

result<backend_desc> backend_desc::make(cudnnBackendDescriptorType_t t, std::string_view what) {
  backend_desc d;
  if (auto st = cudnnBackendCreateDescriptor(t, &d.d_); st != CUDNN_STATUS_SUCCESS)
    return classify(st, "cudnnBackendCreateDescriptor(" + std::string(what) + ")");
  return d;
}

result<void> backend_desc::set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                               std::int64_t n, const void* v, std::string_view what) {
  if (auto st = cudnnBackendSetAttribute(d_, a, t, n, v); st != CUDNN_STATUS_SUCCESS)
    return classify(st, "cudnnBackendSetAttribute(" + std::string(what) + ")");
  return outcome::success();
}

result<void> backend_desc::finalize(std::string_view what) {
  if (auto st = cudnnBackendFinalize(d_); st != CUDNN_STATUS_SUCCESS)
    return classify(st, "cudnnBackendFinalize(" + std::string(what) + ")");
  return outcome::success();
}

result<std::unique_ptr<graph_conv>> graph_conv::build(cudnnHandle_t h, const graph_conv_spec& s) {
  std::unique_ptr<graph_conv> g(new graph_conv);
  BOOST_OUTCOME_TRY(auto x, make_tensor(uid_x, s.x, s.type));
  BOOST_OUTCOME_TRY(auto w, make_tensor(uid_w, s.w, s.type));
  BOOST_OUTCOME_TRY(auto y, make_tensor(uid_y, s.y, s.type));
  BOOST_OUTCOME_TRY(auto conv, make_convolution(s));

  BOOST_OUTCOME_TRY(auto op,
                    backend_desc::make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                       "convolution forward operation"));
  const float alpha = 1.0f, beta = 0.0f;
  const std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t> operands[] = {
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x.get()},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w.get()},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y.get()},
      {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv.get()}};
  for (const auto& [attr, d] : operands) {
    BOOST_OUTCOME_TRY(op.set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d, "operation operand"));
  }
  BOOST_OUTCOME_TRY(op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1,
                           &alpha, "operation alpha"));
  BOOST_OUTCOME_TRY(op.set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1,
                           &beta, "operation beta"));
  BOOST_OUTCOME_TRY(op.finalize("convolution forward operation"));

  BOOST_OUTCOME_TRY(auto graph,
                    backend_desc::make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph"));
  cudnnBackendDescriptor_t op_d = op.get();
  BOOST_OUTCOME_TRY(graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h,
                              "operation graph handle"));
  BOOST_OUTCOME_TRY(graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                              &op_d, "operation graph ops"));
  BOOST_OUTCOME_TRY(graph.finalize("operation graph"));

  BOOST_OUTCOME_TRY(auto heur,
                    backend_desc::make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics"));
  cudnnBackendDescriptor_t graph_d = graph.get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  BOOST_OUTCOME_TRY(heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             1, &graph_d, "heuristics graph"));
  BOOST_OUTCOME_TRY(
      heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode"));
  BOOST_OUTCOME_TRY(heur.finalize("engine heuristics"));

  std::int64_t count = 0;
  BOOST_OUTCOME_TRY(ok(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                       "cudnnBackendGetAttribute(heuristics result count)"));
  std::vector<backend_desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> cfg_d;
  for (std::int64_t i = 0; i < count; ++i) {
    BOOST_OUTCOME_TRY(auto c,
                      backend_desc::make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    cfg_d.push_back(c.get());
    cfgs.push_back(std::move(c));
  }
  std::int64_t got = 0;
  if (count > 0) {
    BOOST_OUTCOME_TRY(
        ok(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg_d.data()),
           "cudnnBackendGetAttribute(heuristics results)"));
  }
  got = std::clamp<std::int64_t>(got, 0, count);
  for (std::int64_t i = 0; i < got; ++i) {
    cudnnBackendDescriptor_t cfg = cfg_d[static_cast<std::size_t>(i)];
    // An engine that cannot say what it does is skipped, as one that breaks the contract.
    auto precise = precision_ok(cfg, s.strict_f32);
    if (!precise || !precise.value()) continue;
    auto plan = backend_desc::make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    if (!plan) return plan.error();
    if (!plan.value().set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h,
                          "plan handle"))
      continue;
    if (!plan.value().set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                          &cfg, "plan engine config"))
      continue;
    // Engines the heuristics list may still refuse this shape or device here.
    if (!plan.value().finalize("execution plan")) continue;
    std::int64_t ws = 0, n = 0;
    if (cudnnBackendGetAttribute(plan.value().get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &n, &ws) != CUDNN_STATUS_SUCCESS ||
        ws < 0 || static_cast<std::uint64_t>(ws) > s.workspace_limit)
      continue;
    g->plan_ = std::move(plan.value());
    g->workspace_ = static_cast<std::size_t>(ws);
    g->parts_.reserve(6);
    for (auto* d : {&x, &w, &y, &conv, &op, &graph}) g->parts_.push_back(std::move(*d));
    return g;
  }
  return make_error(errc::not_supported,
                    "cudnn graph API: none of the " + std::to_string(got) +
                        " engine configurations from the heuristics builds this convolution" +
                        (s.strict_f32 ? " in strict f32" : "") + " within the workspace limit (" +
                        std::to_string(s.workspace_limit) + " bytes)");
}

result<void> graph_conv::bind(const std::array<const void*, 4>& ptrs) {
  if (pack_.get() && ptrs == pack_ptrs_) return outcome::success();
  // The pack holds only host values; the old one may go even while work
  // enqueued with it still runs.
  BOOST_OUTCOME_TRY(auto pack,
                    backend_desc::make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack"));
  const std::int64_t uids[] = {uid_x, uid_w, uid_y};
  const void* data[] = {ptrs[0], ptrs[1], ptrs[2]};
  BOOST_OUTCOME_TRY(
      pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids, "variant pack uids"));
  BOOST_OUTCOME_TRY(pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, data,
                             "variant pack pointers"));
  BOOST_OUTCOME_TRY(pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ptrs[3],
                             "variant pack workspace"));
  BOOST_OUTCOME_TRY(pack.finalize("variant pack"));
  pack_ = std::move(pack);
  pack_ptrs_ = ptrs;
  return outcome::success();
}

std::shared_ptr<const recorded_exec> graph_conv::record(cudnnHandle_t h, cudaStream_t stream,
                                                        cudaStream_t capture) {
  if (cudnnSetStream(h, capture) != CUDNN_STATUS_SUCCESS) return nullptr;
  auto rec = record_graph(capture, [&] {
    return cudnnBackendExecute(h, plan_.get(), pack_.get()) == CUDNN_STATUS_SUCCESS;
  });
  // The handle goes back to its stream whatever happened.
  if (cudnnSetStream(h, stream) != CUDNN_STATUS_SUCCESS) {
    astray_ = true;
    return nullptr;
  }
  return rec;
}

result<graph_run> graph_conv::execute_direct(cudnnHandle_t h, const void* x, const void* w, void* y,
                                             void* ws) {
  BOOST_OUTCOME_TRY(bind({x, w, y, ws}));
  BOOST_OUTCOME_TRY(ok(cudnnBackendExecute(h, plan_.get(), pack_.get()), "cudnnBackendExecute"));
  return graph_run::executed;
}

result<graph_run> graph_conv::execute(cudnnHandle_t h, cudaStream_t stream, cudaStream_t capture,
                                      const void* x, const void* w, void* y, void* ws,
                                      std::shared_ptr<const recorded_exec>& keep) {
  const std::array<const void*, 4> ptrs{x, w, y, ws};
  graph_run how = graph_run::executed;
  if (recorded_ && recorded_ptrs_ == ptrs) {
    how = graph_run::replayed;
  } else if (capture && !record_failed_ && ptrs == last_ptrs_) {
    BOOST_OUTCOME_TRY(bind(ptrs));
    if (auto rec = record(h, stream, capture)) {
      recorded_ = std::move(rec);
      recorded_ptrs_ = ptrs;
      how = graph_run::captured;
    } else {
      record_failed_ = true;
      if (astray_)  // nothing more on a handle that is not on its stream
        return make_error(errc::library,
                          "cudnnSetStream: the handle could not be pointed back at its stream "
                          "after a recording");
    }
  }
  last_ptrs_ = ptrs;
  if (how == graph_run::executed) {
    BOOST_OUTCOME_TRY(bind(ptrs));
    BOOST_OUTCOME_TRY(ok(cudnnBackendExecute(h, plan_.get(), pack_.get()), "cudnnBackendExecute"));
    keep.reset();
    return how;
  }
  if (auto e = cudaGraphLaunch(recorded_->exec, stream); e != cudaSuccess)
    return classify(e, "cudaGraphLaunch (a recorded cuDNN convolution)");
  keep = recorded_;
  return how;
}

}  // namespace atomr::cuda::detail

#pragma GCC diagnostic pop
