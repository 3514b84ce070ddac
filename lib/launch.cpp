#include "device_impl.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <algorithm>
#include <string>

#include <cuda_runtime_api.h>

namespace atomr::cuda {

launch::~launch() {
  if (counted_) stream_.state()->owner->in_flight.add(-1);
}

result<void> launch::begin() {
  if (!stream_) return make_error(errc::invalid_argument, "run_kernel: empty stream");
  auto& d = *stream_.state()->owner;
  BOOST_OUTCOME_TRY(d.check_accepting());
  // The enqueue function is code of this process: it cannot run in the worker.
  if (d.remote) return detail::isolated_not_supported("run_kernel");
  d.in_flight.add(1);
  counted_ = true;
  return outcome::success();
}

result<void> launch::make_current() {
  if (auto st = stream_.state()->owner->make_current(); st != cudaSuccess)
    return classify(st, "cudaSetDevice");
  return outcome::success();
}

result<void*> launch::access(const std::shared_ptr<detail::buffer_state>& st, bool write,
                             bool any_device) {
  BOOST_OUTCOME_TRY(detail::check_buffer(st.get(), write ? "output buffer" : "input buffer"));
  auto* d = stream_.state()->owner;
  if (any_device && st->dev.get() != d && detail::is_remote(st.get()))
    return make_error(errc::not_supported,
                      "a buffer of an isolated device cannot be used on another device's stream");
  if (st->dev.get() != d && !any_device)
    return make_error(errc::invalid_argument,
                      "buffer of device " + std::to_string(st->dev->ordinal) +
                          " used on a stream of device " + std::to_string(d->ordinal));
  // Already ordered by this launch (run_kernel declares outputs, then the
  // enqueue asks again): no second round of stream waits.
  auto* seen = touched_.find(st.get());
  if (seen && (seen->write || !write)) return st->ptr;
  if (capture_) {
    // Recorded, not run: nothing waits now; every replay is ordered against
    // the buffers the recording touched (end_recorded).
    if (seen)
      seen->write = true;
    else
      touched_.add(st, write);
    return st->ptr;
  }
  std::lock_guard lk(st->mu);
  auto wait_for = [&](detail::access_stamp& a) -> result<void> {
    if (!a.done || a.stream_id == stream_.id()) return outcome::success();  // stream order suffices
    // A composed unit's step stamps its buffers with the event of its run of
    // steps on one stream, recorded when the run ends: record it now.
    if (auto e = a.done->settle(); e != cudaSuccess) return classify(e, "cudaEventRecord");
    // Work that has finished needs no GPU-side wait, now or ever again: the
    // stamp is dropped (inputs uploaded once on another stream and read many
    // times would otherwise cost a stream wait on every use).
    if (cudaEventQuery(a.done->native_handle()) == cudaSuccess) {
      a.done.reset();
      return outcome::success();
    }
    if (auto e = cudaStreamWaitEvent(native_stream(), a.done->native_handle(), 0); e != cudaSuccess)
      return classify(e, "cudaStreamWaitEvent");
    return outcome::success();
  };
  BOOST_OUTCOME_TRY(wait_for(st->last_write));
  if (write) {
    for (auto& r : st->reads) {
      BOOST_OUTCOME_TRY(wait_for(r));
    }
  }
  if (seen)
    seen->write = true;  // a read upgraded to a write
  else
    touched_.add(st, write);
  return st->ptr;
}

result<std::shared_ptr<detail::pooled_event>> launch::commit(bool blocking) {
  auto ev = detail::record_event(*stream_.state()->owner, native_stream(), library_, blocking);
  if (!ev) {
    wait_untracked();  // the caller drops the keep-alive next
    return ev.error();
  }
  try {
    stamp(ev.value());
  } catch (...) {
    wait_untracked();  // out of host memory: the exception leaves with the keep-alive
    throw;
  }
  return std::move(ev).value();
}

void launch::wait_untracked() noexcept {
  if (stream_) detail::wait_untracked(*stream_.state()->owner, native_stream());
}

void launch::stamp(const std::shared_ptr<detail::pooled_event>& ev) {
  const auto id = stream_.id();
  touched_.for_each([&](detail::touch_list::entry& t) {
    auto& st = *t.st;
    std::lock_guard lk(st.mu);
    if (t.write) {
      st.last_write = {id, ev};
      st.reads.clear();
      return;
    }
    auto it = std::find_if(st.reads.begin(), st.reads.end(),
                           [&](const detail::access_stamp& a) { return a.stream_id == id; });
    if (it != st.reads.end())
      it->done = ev;
    else
      st.reads.push_back({id, ev});
  });
  touched_.clear();
}

gpu_error launch::fail(gpu_error e) {
  e = e.tagged(library_);
  if (stream_) {
    auto& d = *stream_.state()->owner;
    e = d.blame_fault(std::move(e));
    d.note_error(e);
    if (e.code() != errc::context_poisoned && d.health.load() == health_state::healthy)
      cudaGetLastError();  // a survivable error must not be blamed on the next launch
    if (counted_) {
      d.in_flight.add(-1);
      d.failed.add(1);
      counted_ = false;
    }
  }
  return e;
}

void launch::succeed() {
  if (!counted_) return;
  auto& d = *stream_.state()->owner;
  d.in_flight.add(-1);
  d.completed.add(1);
  counted_ = false;
}

namespace detail {
unit_capture::~unit_capture() {
  if (!open || !on) return;
  // An abandoned recording: end the capture so that the stream can be
  // destroyed; what was captured is thrown away.
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(on.native_handle(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();
}

void unit_capture::touch(const std::shared_ptr<buffer_state>& st, bool write) {
  for (auto& b : buffers)
    if (b.st == st) {
      b.write = b.write || write;
      return;
    }
  buffers.push_back({st, write});
}

result<void*> unit_capture::workspace(std::size_t bytes) {
  if (!scratch.empty() && scratch.back().size() >= bytes) {
    BOOST_OUTCOME_TRY(std::uint8_t * p, scratch.back().unsafe_data());
    return static_cast<void*>(p);
  }
  device dev(on.state()->owner->shared_from_this());
  BOOST_OUTCOME_TRY(auto w, dev.allocate<std::uint8_t>(bytes, dev.main_stream()));
  BOOST_OUTCOME_TRY(std::uint8_t * p, w.unsafe_data());
  touch(w.state(), true);
  scratch.push_back(std::move(w));
  return static_cast<void*>(p);
}

result<void> check_recordable(const unit_capture& c, std::string_view library, const stream& s) {
  if (s && s.state()->owner != c.on.state()->owner)
    return make_error(errc::invalid_argument,
                      std::string(library) + ": a step on another device than the recording's");
  return outcome::success();
}

std::optional<gpu_error> capture_refusal(const unit_capture& c, std::string_view library,
                                         const gpu_error* failed) {
  // A device that does not accept work: its own error stands (no CUDA call).
  if (!c.on.state()->owner->check_accepting()) return std::nullopt;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const auto e = cudaStreamIsCapturing(c.on.native_handle(), &status);
  // Not a capture problem (a fault, say): reported as such, and probed by launch::fail.
  if (e != cudaSuccess) return classify(e, "cudaStreamIsCapturing");
  if (status == cudaStreamCaptureStatusActive) return std::nullopt;
  cudaGetLastError();  // capture errors are not sticky
  std::string m(library);
  m += ": this operation cannot be recorded into a CUDA graph (it made a call that stream "
       "capture does not allow";
  if (failed) {
    m += ": ";
    m += failed->message();
  }
  m += ')';
  return make_error(errc::not_supported, std::move(m));
}

void settle_unit_op(const stream& s, const gpu_error* e) {
  if (!s) return;
  auto& d = *s.state()->owner;
  d.in_flight.add(-1);
  if (e)
    d.failed.add(1);
  else
    d.completed.add(1);
}
}  // namespace detail

result<void*> launch::recording_workspace(std::size_t bytes) {
  if (!capture_)
    return make_error(errc::invalid_argument, "launch: a recording workspace outside a recording");
  return capture_->workspace(bytes);
}

void launch::end_recorded() {
  if (capture_)
    touched_.for_each([&](detail::touch_list::entry& t) { capture_->touch(t.st, t.write); });
  touched_.clear();
  if (counted_) stream_.state()->owner->in_flight.add(-1);
  counted_ = false;
}

void launch::park(std::shared_ptr<detail::pooled_event> done, std::shared_ptr<void> keep_alive) {
  stream_.state()->owner->park(std::move(done), std::move(keep_alive));
}

}  // namespace atomr::cuda
