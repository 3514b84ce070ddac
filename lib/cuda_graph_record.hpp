// Internal: recording one library call into a CUDA graph and launching it
// again, used by the actors for repeated operations on the same buffers
// (docs/design.md, "Replaying repeated operations as CUDA graphs").
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

namespace atomr::cuda::detail {

/// An instantiated CUDA graph holding one recorded library call.
struct recorded_exec {
  cudaGraphExec_t exec = nullptr;
  recorded_exec() = default;
  recorded_exec(const recorded_exec&) = delete;
  recorded_exec& operator=(const recorded_exec&) = delete;
  // Released only after the GPU work that launched it is done (keep-alives).
  ~recorded_exec() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

/// A stream that never runs work: calls are recorded on it. Made on first
/// use (the device current); null when it could not be made.
class recording_stream {
public:
  recording_stream() = default;
  recording_stream(const recording_stream&) = delete;
  recording_stream& operator=(const recording_stream&) = delete;

  cudaStream_t get() {
    if (!tried_) {
      tried_ = true;
      if (cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking) != cudaSuccess) {
        s_ = nullptr;
        cudaGetLastError();
      }
    }
    return s_;
  }
  /// Destroys the stream; the owner skips it when the context is poisoned.
  void destroy() {
    if (s_) cudaStreamDestroy(s_);
    s_ = nullptr;
  }

private:
  cudaStream_t s_ = nullptr;
  bool tried_ = false;
};

/// True when `graph` allocates or frees memory (a library that allocated
/// while being recorded). A graph with allocation nodes can have only one
/// live instantiation at a time (on the H200, 1024 of 1024 further copies
/// of such a cuBLAS recording failed), so the actors do not keep them.
inline bool allocates(cudaGraph_t graph) {
  std::size_t count = 0;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) return true;
  std::vector<cudaGraphNode_t> nodes(count);
  if (cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) return true;
  for (std::size_t i = 0; i < count; ++i) {
    cudaGraphNodeType t{};
    if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess) return true;
    if (t == cudaGraphNodeTypeMemAlloc || t == cudaGraphNodeTypeMemFree) return true;
  }
  return false;
}

/// Runs `enqueue()` (which must enqueue on `capture` and return true on
/// success) inside a thread-local capture of `capture`, and instantiates
/// what it recorded. Null when anything failed: a call of this thread that
/// is not capture-safe fails the recording, other threads are not affected,
/// and no error is left behind for the next CUDA call. A recording that
/// allocates memory is refused too.
template <class F>
std::shared_ptr<const recorded_exec> record_graph(cudaStream_t capture, F&& enqueue) {
  if (!capture ||
      cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  const bool enqueued = enqueue();
  // Always ended, also after a failed enqueue (the capture may be invalidated).
  cudaGraph_t graph = nullptr;
  const bool ended = cudaStreamEndCapture(capture, &graph) == cudaSuccess;
  std::shared_ptr<recorded_exec> rec;
  if (enqueued && ended && graph && !allocates(graph)) {
    rec = std::make_shared<recorded_exec>();
    if (cudaGraphInstantiate(&rec->exec, graph, 0) != cudaSuccess) rec.reset();
  }
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  return rec;
}

}  // namespace atomr::cuda::detail
