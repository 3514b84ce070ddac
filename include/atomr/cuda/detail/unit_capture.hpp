// What a unit being recorded into a CUDA graph (graph.hpp) gathers while its
// steps enqueue on the recording's private stream.
#pragma once

#include <atomr/cuda/error.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/stream.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace atomr::cuda::detail {

struct buffer_state;
class device_impl;

/// One recording in progress (docs/design.md, "Recorded units"). Used by one
/// coroutine at a time: the recording's, while its steps enqueue.
struct unit_capture {
  explicit unit_capture(stream s) noexcept : on(std::move(s)) {}
  unit_capture(const unit_capture&) = delete;
  unit_capture& operator=(const unit_capture&) = delete;
  /// Ends a capture still open (the recording was abandoned): the partial
  /// graph is destroyed and the capture's error cleared.
  ~unit_capture();

  /// One buffer the recorded work touches, and whether it writes it: every
  /// replay is ordered against other work on these buffers, as one operation.
  struct access {
    std::shared_ptr<buffer_state> st;
    bool write = false;
  };

  /// The private stream being captured (a fresh stream of the device); the
  /// recorded graph is replayed on it.
  stream on;
  /// True between cudaStreamBeginCapture and cudaStreamEndCapture.
  bool open = false;
  std::vector<access> buffers;
  /// Each step's keep-alive with its output: what the graph's nodes point at
  /// (buffers, pinned host memory, descriptors, plans), kept as long as the graph.
  std::vector<std::shared_ptr<void>> keeps;
  /// Workspaces of the recording's library calls (unit_capture::workspace).
  std::vector<gpu_ref<std::uint8_t>> scratch;

  /// Adds `st` to the buffers (a write upgrades an earlier read).
  void touch(const std::shared_ptr<buffer_state>& st, bool write);
  /// A workspace of at least `bytes` for one step's library calls, from the
  /// device's pool (allocated on the main stream, which is not captured, and
  /// in the buffer set as written, so replays are ordered after the
  /// allocation; freed stream-ordered with the graph). A recorded graph is
  /// replayed on its own stream, so it cannot share a lane's workspace with
  /// the lane's direct calls. Steps are recorded on one stream, so they run
  /// one after another and share it; a larger request adds a larger block
  /// (earlier steps keep theirs).
  result<void*> workspace(std::size_t bytes);
};

}  // namespace atomr::cuda::detail
