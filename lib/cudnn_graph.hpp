// Internal: a 2-D convolution on cuDNN's graph (backend) API, planned once
// per shape and executed with one call. See docs/design.md ("cuDNN
// convolutions: graph API first").
#pragma once

#include "cuda_graph_record.hpp"

#include <atomr/cuda/error.hpp>

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace atomr::cuda::detail {

/// One cuDNN backend descriptor, destroyed with its owner (move-only).
class backend_desc {
public:
  backend_desc() = default;
  backend_desc(backend_desc&& o) noexcept;
  backend_desc& operator=(backend_desc&& o) noexcept;
  backend_desc(const backend_desc&) = delete;
  backend_desc& operator=(const backend_desc&) = delete;
  ~backend_desc();

  /// A new descriptor of type `t`; `what` names it in an error.
  static result<backend_desc> make(cudnnBackendDescriptorType_t t, std::string_view what);
  cudnnBackendDescriptor_t get() const noexcept { return d_; }
  /// cudnnBackendSetAttribute with `n` values of type `t` at `v`.
  result<void> set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, std::int64_t n,
                   const void* v, std::string_view what);
  result<void> finalize(std::string_view what);

private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

/// One operand: four extents in cuDNN's logical order (N, C, H, W for data;
/// K, C/groups, R, S for the filter), their strides in elements, and the
/// alignment its pointer is known to have (bytes, a power of two <= 16).
struct graph_tensor {
  std::array<std::int64_t, 4> dims{};
  std::array<std::int64_t, 4> strides{};
  std::int64_t alignment = 0;
};

struct graph_conv_spec {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;  ///< of x, w and y; accumulation is f32
  graph_tensor x, w, y;
  std::array<std::int64_t, 2> pad{}, stride{}, dilation{};
  /// f32 contract: skip engines noted as tensor-core, down-converting or
  /// reduced-precision (TF32 and the like). For f16 only the last is skipped.
  bool strict_f32 = true;
  std::size_t workspace_limit = 0;
};

/// How one graph_conv::execute ran.
enum class graph_run : std::uint8_t {
  executed,  ///< cudnnBackendExecute on the stream
  captured,  ///< recorded into a CUDA graph now, and that graph launched
  replayed,  ///< the CUDA graph recorded earlier for these pointers launched
};

/// A finalized execution plan for one convolution shape, and the variant
/// pack of the pointers it last ran with (rebuilt only when they change).
/// Not thread-safe: the owner serializes build and execute (the actor's lock).
class graph_conv {
public:
  /// Builds the operation graph, asks the heuristics (mode A) and keeps the
  /// first engine configuration that passes the spec's filters, finalizes
  /// and needs no more than workspace_limit. not_supported when none does;
  /// any other failure as cuDNN reported it.
  static result<std::unique_ptr<graph_conv>> build(cudnnHandle_t h, const graph_conv_spec& s);

  std::size_t workspace() const noexcept { return workspace_; }
  /// A recording failed: this plan no longer tries to record.
  bool recording_failed() const noexcept { return record_failed_; }
  /// A recording could not point the handle back at its stream: the lane
  /// that owns the handle must refuse further work (lane_base::stuck).
  bool handle_astray() const noexcept { return astray_; }
  /// Enqueues y = conv(x, w) on `stream`, the handle's stream. `ws` holds
  /// workspace() bytes. With a `capture` stream (one that never runs work,
  /// used only to record), the second call in a row with the same pointers
  /// records the execution into a CUDA graph and launches it, and later
  /// calls with those pointers launch it again: one cudaGraphLaunch instead
  /// of cudnnBackendExecute's host work. If recording fails once, this plan
  /// executes directly from then on. `keep` receives the graph the GPU work
  /// uses (null when none), to stay alive until that work is done.
  /// cudnnBackendExecute with these pointers on the stream `h` is on now,
  /// never through a graph (a recording of a whole unit captures it).
  result<graph_run> execute_direct(cudnnHandle_t h, const void* x, const void* w, void* y,
                                   void* ws);
  result<graph_run> execute(cudnnHandle_t h, cudaStream_t stream, cudaStream_t capture,
                            const void* x, const void* w, void* y, void* ws,
                            std::shared_ptr<const recorded_exec>& keep);

private:
  graph_conv() = default;
  std::vector<backend_desc> parts_;  // tensors, convolution, operation, graph
  backend_desc plan_;
  backend_desc pack_;
  std::array<const void*, 4> pack_ptrs_{};  // x, w, y, workspace of pack_
  std::size_t workspace_ = 0;
  std::shared_ptr<const recorded_exec> recorded_;
  std::array<const void*, 4> recorded_ptrs_{};  // of recorded_
  std::array<const void*, 4> last_ptrs_{};      // of the previous call
  bool record_failed_ = false;
  bool astray_ = false;

  result<void> bind(const std::array<const void*, 4>& ptrs);
  /// Records one execution on `capture` into a CUDA graph; null on failure.
  std::shared_ptr<const recorded_exec> record(cudnnHandle_t h, cudaStream_t stream,
                                              cudaStream_t capture);
};

/// The alignment of `p` in bytes, capped at 16 (what cuDNN's engines ask for).
inline std::int64_t pointer_alignment(const void* p) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t low = a & (~a + 1);
  return low == 0 || low > 16 ? 16 : static_cast<std::int64_t>(low);
}

}  // namespace atomr::cuda::detail
