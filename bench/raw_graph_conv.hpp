// The raw baseline for a convolution on cuDNN's graph (backend) API, written
// against cuDNN alone: the operation graph for one NHWC f16 convolution, the
// engine chosen by the rule cudnn_actor applies (heuristics mode A, the
// first configuration whose engine is not noted reduced-precision, that
// finalizes and whose workspace fits the limit), one variant pack made for
// fixed pointers, and each call one cudnnBackendExecute.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

// The HANDLE attributes are marked deprecated in cuDNN 9.19; the GPU machine
// runs 9.14, where they are how a handle is bound (as in lib/cudnn_graph.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace raw_graph {

/// Owns every backend descriptor it made; destroys them in reverse order.
class arena {
public:
  arena() = default;
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  ~arena() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  /// A new descriptor, or nullptr with `err` set.
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    if (!step(cudnnBackendCreateDescriptor(t, &d), "cudnnBackendCreateDescriptor")) return nullptr;
    made_.push_back(d);
    return d;
  }
  /// Records the first failure; true while none happened.
  bool step(cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS && status == CUDNN_STATUS_SUCCESS) {
      status = st;
      failed_call = what;
    }
    return status == CUDNN_STATUS_SUCCESS;
  }
  template <class V>
  void put(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
           std::int64_t n, const V* v) {
    if (status == CUDNN_STATUS_SUCCESS)
      step(cudnnBackendSetAttribute(d, a, t, n, v), "cudnnBackendSetAttribute");
  }
  void done(cudnnBackendDescriptor_t d) {
    if (status == CUDNN_STATUS_SUCCESS) step(cudnnBackendFinalize(d), "cudnnBackendFinalize");
  }

  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::string failed_call;

private:
  std::vector<cudnnBackendDescriptor_t> made_;
};

struct conv {
  arena a;
  cudnnBackendDescriptor_t plan = nullptr, pack = nullptr;
  std::int64_t workspace = 0;
  std::int64_t engine = -1;  ///< the chosen engine's global index
  int candidates = 0;

  /// NHWC x (n, c, h, w), KRSC filter (k, c, r, s), stride 1, `pad` on
  /// every side, f16 data with f32 accumulation. Then call `bind`.
  bool plan_for(cudnnHandle_t h, std::int64_t n, std::int64_t c, std::int64_t hh, std::int64_t ww,
                std::int64_t k, std::int64_t r, std::int64_t s, std::int64_t pad,
                std::size_t workspace_limit) {
    const std::int64_t oh = hh + 2 * pad - r + 1, ow = ww + 2 * pad - s + 1;
    auto tensor = [&](std::int64_t uid, std::array<std::int64_t, 4> d) {
      // d is (N, C, H, W) logically; stored NHWC.
      const std::array<std::int64_t, 4> st{d[1] * d[2] * d[3], 1, d[1] * d[3], d[1]};
      const cudnnDataType_t t = CUDNN_DATA_HALF;
      const std::int64_t align = 16;
      auto* td = a.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
      a.put(td, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t);
      a.put(td, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, d.data());
      a.put(td, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, st.data());
      a.put(td, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
      a.put(td, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
      a.done(td);
      return td;
    };
    cudnnBackendDescriptor_t x = tensor('x', {n, c, hh, ww});
    cudnnBackendDescriptor_t w = tensor('w', {k, c, r, s});
    cudnnBackendDescriptor_t y = tensor('y', {n, k, oh, ow});

    auto* cd = a.make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    const cudnnDataType_t acc = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t xcorr = CUDNN_CROSS_CORRELATION;
    const std::int64_t two = 2;
    const std::array<std::int64_t, 2> ones{1, 1}, pads{pad, pad};
    a.put(cd, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &acc);
    a.put(cd, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &xcorr);
    a.put(cd, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &two);
    a.put(cd, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, ones.data());
    a.put(cd, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, ones.data());
    a.put(cd, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads.data());
    a.put(cd, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads.data());
    a.done(cd);

    auto* op = a.make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    const float one = 1, zero = 0;
    a.put(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    a.put(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    a.put(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    a.put(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &cd);
    a.put(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &one);
    a.put(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &zero);
    a.done(op);

    auto* g = a.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    a.put(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    a.put(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    a.done(g);

    auto* heur = a.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    a.put(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    a.put(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    a.done(heur);
    std::int64_t count = 0;
    if (!a.step(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                "heuristics count"))
      return false;
    std::vector<cudnnBackendDescriptor_t> cfgs;
    for (std::int64_t i = 0; i < count; ++i)
      cfgs.push_back(a.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    std::int64_t got = 0;
    if (count == 0 ||
        !a.step(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data()),
                "heuristics results"))
      return false;
    candidates = static_cast<int>(got);
    for (std::int64_t i = 0; i < got && i < count; ++i) {
      // The engine's numerical notes and index (failures here skip the config).
      cudnnBackendDescriptor_t eng = a.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      std::int64_t one_n = 0, notes_n = 0, index = -1;
      std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
      if (cudnnBackendGetAttribute(cfgs[static_cast<std::size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one_n,
                                   &eng) != CUDNN_STATUS_SUCCESS ||
          cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   static_cast<std::int64_t>(notes.size()), &notes_n,
                                   notes.data()) != CUDNN_STATUS_SUCCESS)
        continue;
      cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &one_n,
                               &index);
      bool reduced = false;
      for (std::int64_t j = 0; j < notes_n && j < static_cast<std::int64_t>(notes.size()); ++j)
        reduced = reduced || notes[static_cast<std::size_t>(j)] ==
                                 CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
      if (reduced) continue;
      cudnnBackendDescriptor_t p = nullptr;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) !=
          CUDNN_STATUS_SUCCESS)
        continue;
      std::int64_t ws = 0;
      if (cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) ==
              CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                   &cfgs[static_cast<std::size_t>(i)]) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendFinalize(p) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                   &one_n, &ws) == CUDNN_STATUS_SUCCESS &&
          ws >= 0 && static_cast<std::uint64_t>(ws) <= workspace_limit) {
        plan = p;
        workspace = ws;
        engine = index;
        return true;
      }
      cudnnBackendDestroyDescriptor(p);
    }
    a.step(CUDNN_STATUS_NOT_SUPPORTED, "no engine configuration finalizes within the limit");
    return false;
  }

  /// The variant pack for fixed pointers (made once, outside the timed call).
  bool bind(const void* x, const void* w, void* y, void* ws) {
    pack = a.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    const std::int64_t uids[] = {'x', 'w', 'y'};
    void* ptrs[] = {const_cast<void*>(x), const_cast<void*>(w), y};
    a.put(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    a.put(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    a.put(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    a.done(pack);
    return a.status == CUDNN_STATUS_SUCCESS;
  }

  ~conv() {
    if (plan) cudnnBackendDestroyDescriptor(plan);
  }
};

}  // namespace raw_graph

#pragma GCC diagnostic pop
