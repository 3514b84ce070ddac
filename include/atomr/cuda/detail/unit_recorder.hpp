// What a composed unit (compose.hpp) records while its steps enqueue, and the
// executor that tells run_kernel it runs inside one.
#pragma once

#include <atomr/cuda/stream.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/execution.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/require.hpp>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace atomr::cuda::detail {

class pooled_event;
struct unit_capture;

/// The steps of one unit enqueued so far (docs/design.md, "Composed units").
/// Used by one coroutine at a time: the unit's, while it runs its steps.
struct unit_recorder {
  /// One run_kernel of a step: its stream, the event recorded on it after
  /// the enqueue (what later steps on other streams wait on), and the step's
  /// keep-alive with its output, held until the GPU is done.
  struct stage {
    stream on;
    std::shared_ptr<pooled_event> done;
    std::shared_ptr<void> keep;
  };
  std::vector<stage> stages;
  /// Host work to run once every stage finished, in order (a pageable
  /// download's copy out of its staging buffer); dropped if the unit fails.
  std::vector<std::function<void()>> finalizers;
  /// Non-null while the unit is recorded into a CUDA graph (graph.hpp): the
  /// steps enqueue on the recording's stream and nothing runs.
  unit_capture* capture = nullptr;
  /// What the unit's errors call it: "compose" or "record".
  const char* name = "compose";
};

/// An executor that runs as `inner` does and carries the unit whose step the
/// coroutines on it belong to. run_kernel finds it through
/// `co_await asio::this_coro::executor`: the unit is a property of the
/// coroutine's own executor, so no other coroutine (on this thread or
/// another) can enqueue into it by accident.
class unit_executor {
public:
  unit_executor(asio::any_io_executor inner, unit_recorder* rec) noexcept
      : inner_(std::move(inner)), rec_(rec) {}

  unit_recorder* recorder() const noexcept { return rec_; }

  template <class Property>
  requires asio::can_query<const asio::any_io_executor&, const Property&>::value decltype(auto)
  query(const Property& p) const {
    return asio::query(inner_, p);
  }
  template <class Property>
  requires asio::can_require<const asio::any_io_executor&, const Property&>::value unit_executor
  require(const Property& p)
  const { return unit_executor(asio::any_io_executor(asio::require(inner_, p)), rec_); }
  template <class Property>
  requires asio::can_prefer<const asio::any_io_executor&, const Property&>::value unit_executor
  prefer(const Property& p)
  const { return unit_executor(asio::any_io_executor(asio::prefer(inner_, p)), rec_); }
  template <class F>
  void execute(F&& f) const {
    inner_.execute(std::forward<F>(f));
  }
  friend bool operator==(const unit_executor& a, const unit_executor& b) noexcept {
    return a.rec_ == b.rec_ && a.inner_ == b.inner_;
  }
  friend bool operator!=(const unit_executor& a, const unit_executor& b) noexcept {
    return !(a == b);
  }

private:
  asio::any_io_executor inner_;
  unit_recorder* rec_;
};

/// The unit whose step runs on `ex`, or null.
inline unit_recorder* unit_of(const asio::any_io_executor& ex) noexcept {
  auto* u = ex.target<unit_executor>();
  return u ? u->recorder() : nullptr;
}

}  // namespace atomr::cuda::detail
