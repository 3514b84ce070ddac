// Supervision policy: what to do after a failure, with a restart budget.
#pragma once

#include <atomr/cuda/error.hpp>

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>

namespace atomr::cuda {

/// At most `max_restarts` restarts within any `window`; one more means stop.
struct restart_budget {
  std::size_t max_restarts = 3;  ///< restarts allowed within one window
  std::chrono::steady_clock::duration window = std::chrono::seconds(60);  ///< the sliding window
};

/// Decides, failure by failure, whether a (planned process-isolated) device
/// resumes, restarts, stops or escalates. The per-code decision comes from
/// supervise(errc); restarts are counted against the budget and turn into
/// decision::stop once it is spent. The clock is injectable for tests.
/// Not thread-safe: one supervisor per device, used from one strand.
class supervisor {
public:
  using clock = std::chrono::steady_clock;            ///< the clock restarts are timed on
  using now_fn = std::function<clock::time_point()>;  ///< where the time comes from

  /// A supervisor with `budget`, reading the time from `now` (tests pass a fake clock).
  explicit supervisor(restart_budget budget = {}, now_fn now = &clock::now)
      : budget_(budget), now_(std::move(now)) {}

  /// The decision for this failure: supervise(code), except that a restart
  /// past the budget (max_restarts already counted within the window)
  /// becomes decision::stop. Counts it if it is a restart.
  /// @{
  decision on_failure(const gpu_error& e) { return on_failure(e.code()); }
  decision on_failure(errc code) {
    decision d = supervise(code);
    if (d != decision::restart) return d;
    const auto t = now_();
    while (!restarts_.empty() && t - restarts_.front() >= budget_.window) restarts_.pop_front();
    if (restarts_.size() >= budget_.max_restarts) return decision::stop;
    restarts_.push_back(t);
    return decision::restart;
  }
  /// @}

  /// Restarts counted in the current window.
  std::size_t recent_restarts() const noexcept { return restarts_.size(); }
  /// The budget the supervisor was made with.
  const restart_budget& budget() const noexcept { return budget_; }

private:
  restart_budget budget_;
  now_fn now_;
  std::deque<clock::time_point> restarts_;
};

}  // namespace atomr::cuda
