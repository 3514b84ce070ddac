// compose: the non-template half of a composed unit's end.
#include "device_impl.hpp"
#include "remote.hpp"

#include <atomr/cuda/compose.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <boost/system/system_error.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

namespace atomr::cuda::detail {

namespace {
std::string step_prefix(std::size_t k, std::size_t n, std::string_view unit) {
  return std::string(unit) + ": step " + std::to_string(k) + " of " + std::to_string(n) + ": ";
}

/// An exception as an error: `prefix` then what it was (`aborted` for Asio's
/// operation_aborted, which a cancellation throws at a co_await).
gpu_error exception_error(std::exception_ptr e, const std::string& prefix,
                          std::string_view aborted) {
  try {
    std::rethrow_exception(e);
  } catch (const boost::system::system_error& se) {
    if (se.code() == asio::error::operation_aborted)
      return make_error(errc::cancelled, prefix + std::string(aborted));
    return make_error(errc::library, prefix + se.what());
  } catch (const std::bad_alloc&) {
    return make_error(errc::out_of_memory, prefix + "out of host memory");
  } catch (const std::exception& x) {
    return make_error(errc::library, prefix + x.what());
  } catch (...) {
    return make_error(errc::library, prefix + "an exception");
  }
}

/// Parks every stage's keep-alive (and output) until its own event completes
/// (the event of its run, recorded after it: close_runs() first).
void park_all(unit_recorder& rec) {
  for (auto& st : rec.stages)
    if (st.on && st.done) st.on.state()->owner->park(st.done, std::move(st.keep));
}

void settle_all(unit_recorder& rec, const gpu_error* e) {
  for (auto& st : rec.stages) settle_unit_op(st.on, e);
}

/// Records the deferred event of the run that `st` belongs to. When that
/// fails, no event tracks the run, which then reads as complete to whoever
/// parks on it or is ordered after it: its stream is waited for here, on
/// this thread, before any keep-alive of the unit goes (docs/design.md,
/// "Work that no event tracks").
result<void> settle_run(const unit_recorder::stage& st) {
  const auto e = st.done->settle();
  if (e == cudaSuccess) return outcome::success();
  auto& d = *st.on.state()->owner;
  auto err = classify(e, "cudaEventRecord");
  d.note_error(err);
  wait_untracked(d, st.on.native_handle());
  return err;
}
}  // namespace

result<void> unit_recorder::close_runs() {
  result<void> r = outcome::success();
  for (auto& st : stages) {
    if (!st.done) continue;
    if (auto ok = settle_run(st); !ok && r) r = ok.error();
  }
  return r;
}

result<void> flush_pending(unit_recorder& u, const stream& on) {
  auto pending = std::move(u.pending);
  u.pending.clear();
  stream pooled;
  for (auto& p : pending) {
    stream where = on;
    if (!stream_of(where, p.dev.impl().get())) {
      if (!stream_of(pooled, p.dev.impl().get())) {
        auto got = p.dev.acquire_stream(stream_policy::pooled);
        if (!got) {
          u.pending_failure.emplace(p.step, got.error());
          return got.error();
        }
        pooled = std::move(got).value();
      }
      where = pooled;
    }
    if (auto ok = begin_unit_step(u, where); !ok) {
      u.pending_failure.emplace(p.step, ok.error());
      return ok.error();
    }
    launch l(where, p.library);
    if (auto ran = p.run(p.state.get(), l); !ran) {
      auto e = l.fail(ran.error());
      u.pending_failure.emplace(p.step, e);
      return e;
    }
    auto done = join_unit_run(u, l);
    if (!done) {
      auto e = l.fail(done.error());
      u.pending_failure.emplace(p.step, e);
      return e;
    }
    // The stage first, as in enqueue_in_unit: its event is then recorded by the unit.
    try {
      u.room_for_stage();  // no temporary stage dies before the catch
      u.stages.push_back({l.get_stream(), std::move(done).value(), std::move(p.state)});
    } catch (...) {
      l.wait_untracked();
      throw;
    }
    l.hand_over();
    l.stamp(u.stages.back().done);
  }
  return outcome::success();
}

result<void> begin_unit_step(unit_recorder& u, const stream& s) {
  // Pending transfers first: they go on this step's stream, just before it.
  if (!u.pending.empty()) {
    BOOST_OUTCOME_TRY(flush_pending(u, s));
  }
  // A step on another stream ends the previous stage's run: its event is
  // recorded now, not after whatever other coroutines put on that stream
  // while this unit runs its later steps.
  if (!u.stages.empty() && u.stages.back().on.id() != s.id()) return settle_run(u.stages.back());
  return outcome::success();
}

result<std::shared_ptr<pooled_event>> join_unit_run(unit_recorder& u, launch& l) {
  if (!u.stages.empty()) {
    auto& last = u.stages.back();
    if (last.on.id() == l.get_stream().id() && last.done->still_deferred()) return last.done;
  }
  auto& d = *l.get_stream().state()->owner;
  shared_event ev;
  if (auto st = d.events->acquire(ev, false); st != cudaSuccess) {
    auto e = classify(st, "cudaEventCreateWithFlags");
    d.note_error(e);
    wait_untracked(d, l.native_stream());  // the step's keep-alive is dropped next
    return e;
  }
  ev->defer_record(l.native_stream());
  d.unit_events.add(1);
  return ev;
}

void abandon_unit(unit_recorder& rec, const gpu_error& e) {
  if (rec.ended) return;
  rec.ended = true;
  (void)rec.close_runs();
  park_all(rec);
  settle_all(rec, &e);
}

gpu_error unit_step_error(const gpu_error& e, std::size_t k, std::size_t n, std::string_view unit) {
  return gpu_error(e.code(), e.library(), e.native_status(), step_prefix(k, n, unit) + e.message());
}

gpu_error unit_step_exception(std::exception_ptr e, std::size_t k, std::size_t n,
                              std::string_view unit) {
  return exception_error(std::move(e), step_prefix(k, n, unit), "cancelled before its enqueue");
}

gpu_error unit_interrupted(std::exception_ptr e, std::size_t started, std::size_t n,
                           std::string_view unit) {
  if (started < n) return unit_step_exception(std::move(e), started + 1, n, unit);
  return exception_error(
      std::move(e),
      std::string(unit) + ": after its " + std::to_string(n) + " steps were enqueued: ",
      "cancelled before the unit's wait began");
}

asio::awaitable<result<void>> finish_unit(unit_recorder& rec, completion how,
                                          std::optional<gpu_error> failed) {
  // Every run's event is recorded before anything waits on it or parks on it.
  if (auto closed = rec.close_runs(); !closed && !failed) failed = closed.error();
  if (rec.remote_device) {
    // An isolated device's steps: one message now, unless a step failed
    // first (then nothing of the unit reaches the worker).
    if (!failed) {
      try {
        if (auto sent = co_await send_remote_unit(rec, how); !sent) failed = sent.error();
      } catch (...) {
        failed = make_error(errc::cancelled, std::string(rec.name) +
                                                 ": the unit's wait was abandoned by an exception");
      }
    }
    rec.remote_requests.clear();
    rec.remote_keep.clear();
  }
  rec.ended = true;
  if (failed) {
    // Steps before the failed one are on the GPU: their inputs and outputs
    // stay alive until it is done with them.
    park_all(rec);
    settle_all(rec, &*failed);
    co_return *failed;
  }
  // The last stage first: in a chain of dependent steps it finishes last, so
  // the other streams' stages are found done without a second wait.
  // `how`'s timeout is the unit's: each further wait gets what is left of it.
  const auto start = std::chrono::steady_clock::now();
  result<void> waited = outcome::success();
  try {
    for (std::size_t i = rec.stages.size(); i-- > 0;) {
      auto& st = rec.stages[i];
      // Only each stream's last stage: the ones before it on that stream
      // finished before it (stream order). A unit has a few stages, so the
      // scan costs less than remembering the streams seen.
      const auto later = rec.stages.begin() + static_cast<std::ptrdiff_t>(i) + 1;
      if (std::any_of(later, rec.stages.end(),
                      [&](const unit_recorder::stage& o) { return o.on.state() == st.on.state(); }))
        continue;
      if (already_done(*st.done)) continue;
      completion left = how;
      if (how.timeout != no_timeout) {
        const auto spent = std::chrono::steady_clock::now() - start;
        left.timeout =
            spent >= how.timeout
                ? std::chrono::nanoseconds{0}
                : std::chrono::duration_cast<std::chrono::nanoseconds>(how.timeout - spent);
      }
      waited = co_await async_wait_event(st.on, st.done, left, "cuda", asio::use_awaitable);
      if (!waited) break;
    }
  } catch (...) {
    park_all(rec);
    const auto e = make_error(errc::cancelled, "compose: wait abandoned by an exception");
    settle_all(rec, &e);
    throw;
  }
  if (!waited) {
    // Whatever ended the wait (a timeout, a cancellation, stop(), a fault),
    // the GPU may still be running the stages: their keep-alives (a pinned
    // staging block among them) wait for it; after a fault the device's
    // monitor lets them go at once.
    park_all(rec);
    settle_all(rec, &waited.error());
    co_return waited.error();
  }
  for (const auto& c : rec.copies_out) std::memcpy(c.to, c.from, c.bytes);
  settle_all(rec, nullptr);
  co_return outcome::success();
}

}  // namespace atomr::cuda::detail
