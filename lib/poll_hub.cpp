#include "poll_hub.hpp"

#include <boost/asio/defer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>

namespace atomr::cuda::detail {

poll_hub::poll_hub(asio::any_io_executor ex, std::function<bool()> accepting)
    : ex_(std::move(ex)), accepting_(std::move(accepting)) {}

void poll_hub::add(std::shared_ptr<polled_wait> w) {
  std::lock_guard lk(mu_);
  const cudaStream_t s = w->polled_stream();
  auto it =
      std::find_if(lanes_.begin(), lanes_.end(), [&](const lane& l) { return l.stream == s; });
  if (it == lanes_.end()) {
    lanes_.push_back({s, {}});
    it = std::prev(lanes_.end());
  }
  it->waits.push_back(std::move(w));
  ++count_;
  // A new wait starts young: it must be checked on the next turn even when
  // the poller sleeps on its timer for older ones.
  schedule_locked(true, clock::duration::zero());
}

void poll_hub::clear() {
  std::lock_guard lk(mu_);
  lanes_.clear();
  count_ = 0;
}

std::size_t poll_hub::pending() const {
  std::lock_guard lk(mu_);
  return count_;
}

void poll_hub::schedule_locked(bool spin, clock::duration pause) {
  if (step_queued_) return;
  if (spin) {
    step_queued_ = true;
    // defer: a continuation of the running handler when called on an io
    // thread (the thread's private queue, no wake-up of another thread).
    asio::defer(ex_, [self = shared_from_this()] {
      {
        std::lock_guard lk(self->mu_);
        self->step_queued_ = false;
      }
      self->step(false);
    });
    return;
  }
  // One timer per sleep: an earlier wake-up never waits behind a later one
  // (an armed timer is not re-armed from another thread).
  const auto due = clock::now() + pause;
  if (due + std::chrono::microseconds(5) >= timer_due_) return;
  timer_due_ = due;
  auto t = std::make_shared<asio::steady_timer>(ex_, due);
  t->async_wait([self = shared_from_this(), t, due](boost::system::error_code) {
    {
      std::lock_guard lk(self->mu_);
      if (self->timer_due_ == due) self->timer_due_ = clock::time_point::max();
    }
    self->step(true);
  });
}

namespace {
// Predicted completion: start spinning this long before it, and keep
// spinning until this far past it (a sleeping thread takes tens of
// microseconds to wake up on a busy server, so the spin must start early).
constexpr auto k_lead = std::chrono::microseconds(60);
constexpr auto k_window = std::chrono::microseconds(120);
constexpr std::size_t k_idle_lanes = 64;  // lanes kept for their history
}  // namespace

void poll_hub::step(bool full) {
  struct ready {
    std::shared_ptr<polled_wait> w;
    cudaError_t status;
  };
  std::vector<ready> done;
  std::vector<std::shared_ptr<polled_wait>> expired, rejected;
  {
    std::lock_guard lk(mu_);
    if (count_ == 0) return;
    const bool accepting = accepting_();
    const auto now = clock::now();
    bool spin = false;
    clock::duration pause = clock::duration::max();
    for (auto& l : lanes_) {
      bool head = true;  // the oldest still-pending wait of this lane
      for (auto it = l.waits.begin(); it != l.waits.end();) {
        auto& w = *it;
        bool drop = w->polled_done();
        if (!drop && !accepting) {
          rejected.push_back(w);
          drop = true;
        }
        if (!drop && (head || full)) {
          const cudaError_t q = cudaEventQuery(w->polled_event());
          if (q != cudaErrorNotReady) {
            if (q == cudaSuccess) {
              const auto took = now - w->polled_start();
              l.typical = l.typical == clock::duration::zero() ? took : (3 * l.typical + took) / 4;
            }
            done.push_back({w, q});
            drop = true;
          }
        }
        if (!drop && now >= w->polled_deadline()) {
          expired.push_back(w);
          drop = true;
        }
        if (drop) {
          it = l.waits.erase(it);
          --count_;
          continue;
        }
        if (w->polled_deadline() != clock::time_point::max())
          pause = std::min<clock::duration>(pause, w->polled_deadline() - now);
        if (head) {
          // Only the oldest pending wait of a lane decides when to look again.
          head = false;
          const auto waited = now - w->polled_start();
          const auto typical = l.typical;
          if (waited < w->polled_spin()) {
            spin = true;
          } else if (typical > clock::duration::zero() && waited < typical + k_window) {
            const auto cap = std::max(w->polled_max_backoff(), clock::duration::zero());
            if (waited + k_lead >= typical)
              spin = true;
            else
              pause = std::min<clock::duration>(pause, std::min(cap, typical - k_lead - waited));
          } else {
            const auto cap = std::max(w->polled_max_backoff(), clock::duration::zero());
            const auto floor = std::min<clock::duration>(std::chrono::microseconds(10), cap);
            pause = std::min(pause, std::clamp<clock::duration>(waited / 64, floor, cap));
          }
        }
        ++it;
      }
    }
    if (lanes_.size() > k_idle_lanes)
      std::erase_if(lanes_, [](const lane& l) { return l.waits.empty(); });
    if (count_ > 0)
      schedule_locked(spin, std::clamp<clock::duration>(pause, clock::duration::zero(),
                                                        std::chrono::seconds(1)));
  }
  // Outside the lock: handlers may add waits. The last completion runs on
  // this thread; the others are posted so that other io threads can take them.
  for (auto& w : rejected) w->polled_reject();
  for (auto& w : expired) w->polled_expire();
  for (std::size_t i = 0; i < done.size(); ++i)
    done[i].w->polled_complete(done[i].status, i + 1 == done.size());
}

}  // namespace atomr::cuda::detail
