#include "poll_hub.hpp"

#include "cpu_relax.hpp"
#include "run_each.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <condition_variable>

namespace atomr::cuda::detail {

/// The stream queues a launch thread drains, in the order they asked. Shared by the
/// hub and the thread: the thread may drop the hub's last reference during a
/// drain (destroying the hub on that thread) and still needs its queue.
struct poll_hub::launcher {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<deferred_queue>> ready;  // a drain due; guarded by mu
  std::atomic<std::size_t> queued{0};                 // ready.size(), read while spinning
  bool sleeping = false;                              // in cv.wait; guarded by mu
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sleeps{0};  // found nothing within `spin` and slept
  poll_hub::clock::duration spin{};      // device_options::launch_spin
  std::thread thread;
};

poll_hub::poll_hub(asio::any_io_executor ex, std::function<bool()> accepting, std::size_t max_batch,
                   std::size_t launch_threads, clock::duration busy_poll_interval,
                   clock::duration launch_spin)
    : ex_(std::move(ex)),
      accepting_(std::move(accepting)),
      max_batch_(std::max<std::size_t>(1, max_batch)),
      launch_threads_(launch_threads),
      busy_poll_interval_(busy_poll_interval),
      launch_spin_(launch_spin),
      launchers_(launch_threads) {}

poll_hub::~poll_hub() {
  stop_launchers();
}

void poll_hub::stop_launchers() {
  std::vector<std::shared_ptr<launcher>> all;
  {
    std::lock_guard lk(mu_);
    launchers_stopped_.store(true);
    all = launchers_;
  }
  for (auto& w : all) {
    if (!w) continue;
    {
      std::lock_guard lk(w->mu);
      w->stop.store(true);
    }
    w->cv.notify_all();
  }
  for (auto& w : all) {
    if (!w || !w->thread.joinable()) continue;
    // On the launch thread itself (its drain dropped the hub's last
    // reference) the thread ends on its own: it holds its state and sees `stop`.
    if (w->thread.get_id() == std::this_thread::get_id())
      w->thread.detach();
    else
      w->thread.join();
  }
}

std::uint64_t poll_hub::launch_sleeps() const {
  std::lock_guard lk(mu_);
  std::uint64_t n = 0;
  for (const auto& w : launchers_)
    if (w) n += w->sleeps.load(std::memory_order_relaxed);
  return n;
}

std::size_t poll_hub::launch_threads_running() const {
  std::lock_guard lk(mu_);
  if (launchers_stopped_.load()) return 0;
  return static_cast<std::size_t>(std::count_if(launchers_.begin(), launchers_.end(),
                                                [](const auto& w) { return w != nullptr; }));
}

void poll_hub::launcher_loop(const std::shared_ptr<launcher>& me,
                             const std::weak_ptr<poll_hub>& hub) {
  for (;;) {
    const auto until = clock::now() + me->spin;
    while (me->queued.load(std::memory_order_acquire) == 0 && !me->stop.load() &&
           clock::now() < until)
      cpu_relax();
    std::shared_ptr<deferred_queue> q;
    {
      std::unique_lock lk(me->mu);
      if (me->ready.empty() && !me->stop.load()) me->sleeps.fetch_add(1, std::memory_order_relaxed);
      me->sleeping = true;
      me->cv.wait(lk, [&] { return me->stop.load() || !me->ready.empty(); });
      me->sleeping = false;
      if (me->stop.load()) return;  // the queued work is dropped by clear()
      q = std::move(me->ready.front());
      me->ready.pop_front();
      me->queued.fetch_sub(1, std::memory_order_relaxed);
    }
    if (auto h = hub.lock()) {
      h->launching_.fetch_add(1, std::memory_order_relaxed);
      h->run_drain(q);
      h->launching_.fetch_sub(1, std::memory_order_relaxed);
    }  // `h` may be the hub's last reference
  }
}

poll_hub::lane& poll_hub::lane_locked(cudaStream_t s) {
  auto it =
      std::find_if(lanes_.begin(), lanes_.end(), [&](const lane& l) { return l.stream == s; });
  if (it != lanes_.end()) return *it;
  lane fresh;
  fresh.stream = s;
  lanes_.push_back(std::move(fresh));
  return lanes_.back();
}

void poll_hub::add_locked(std::shared_ptr<polled_wait> w) {
  lane_locked(w->polled_stream()).waits.push_back(std::move(w));
  ++count_;
}

void poll_hub::add(std::shared_ptr<polled_wait> w) {
  std::lock_guard lk(mu_);
  add_locked(std::move(w));
  // A new wait starts young: it must be checked on the next turn even when
  // the poller sleeps on its timer for older ones.
  schedule_locked(true, clock::duration::zero());
}

void poll_hub::add_all(std::vector<std::shared_ptr<polled_wait>>& ws) {
  if (ws.empty()) return;
  std::lock_guard lk(mu_);
  for (auto& w : ws) add_locked(std::move(w));
  ws.clear();
  schedule_locked(true, clock::duration::zero());
}

void poll_hub::register_queue(const std::shared_ptr<deferred_queue>& q) {
  std::lock_guard lk(mu_);
  if (q->registered.load()) return;
  if (launch_threads_ > 0) {
    q->launcher = next_launcher_++ % launch_threads_;
    auto& w = launchers_[q->launcher];
    if (!w && !launchers_stopped_.load()) {
      w = std::make_shared<launcher>();
      w->spin = launch_spin_;
      w->thread = std::thread([w = w, hub = weak_from_this()] { launcher_loop(w, hub); });
    }
  }
  if (queues_.size() >= 64) std::erase_if(queues_, [](const auto& x) { return x.expired(); });
  queues_.push_back(q);
  q->registered.store(true, std::memory_order_release);
}

void poll_hub::defer(std::shared_ptr<polled_wait> w, const std::shared_ptr<deferred_queue>& q) {
  if (!q->registered.load(std::memory_order_acquire)) register_queue(q);
  bool post = false;
  {
    std::lock_guard lk(q->mu);
    q->items.push_back(std::move(w));
    post = !std::exchange(q->draining, true);
  }
  if (post) post_drain(q);
}

void poll_hub::post_drain(const std::shared_ptr<deferred_queue>& q) {
  if (launch_threads_ > 0 && !launchers_stopped_.load()) {
    // The stream's launch thread runs the drain (and the library calls in
    // it) while the io threads go on resuming coroutines: docs/design.md.
    // Its slot was filled before the queue was marked registered.
    if (const auto& w = launchers_[q->launcher]) {
      bool wake = false;
      {
        std::lock_guard lk(w->mu);
        w->ready.push_back(q);
        w->queued.fetch_add(1, std::memory_order_release);
        wake = w->sleeping;
      }
      if (wake) w->cv.notify_one();
      return;
    }
  }
  // post: the drain runs after the handlers already queued, so that every
  // coroutine resumed meanwhile adds its work to the same batch.
  asio::post(ex_, [self = shared_from_this(), q] { self->run_drain(q); });
}

void poll_hub::run_drain(const std::shared_ptr<deferred_queue>& q) {
  std::vector<std::shared_ptr<polled_wait>> batch;
  {
    std::lock_guard lk(q->mu);
    // At most max_batch_ ops per run, then the drain is due again: one
    // event per max_batch_ ops lets the hub find the first ones done (and their
    // coroutines submit more) while the GPU still runs the later ones. With
    // one event per whole queue, nothing could resume before the queue's
    // last op finished, and the GPU had nothing to run while they did (the
    // profile showed the launch path on the floor, yet 78% of raw).
    const auto n = std::min(q->items.size(), max_batch_);
    batch.assign(std::make_move_iterator(q->items.begin()),
                 std::make_move_iterator(q->items.begin() + static_cast<std::ptrdiff_t>(n)));
    q->items.erase(q->items.begin(), q->items.begin() + static_cast<std::ptrdiff_t>(n));
  }
  // `draining` stays set while the batch is enqueued, so work submitted
  // meanwhile (other io threads) queues behind it instead of racing it.
  if (!batch.empty()) drain_deferred(batch);
  bool again = false;
  {
    std::lock_guard lk(q->mu);
    again = !q->items.empty();
    if (!again) q->draining = false;
  }
  if (again) post_drain(q);
}

std::vector<std::shared_ptr<polled_wait>> poll_hub::take_deferred() {
  std::vector<std::shared_ptr<deferred_queue>> qs;
  {
    std::lock_guard lk(mu_);
    for (auto& w : queues_)
      if (auto q = w.lock()) qs.push_back(std::move(q));
  }
  std::vector<std::shared_ptr<polled_wait>> out;
  for (auto& q : qs) {
    std::lock_guard lk(q->mu);
    for (auto& w : q->items) out.push_back(std::move(w));
    q->items.clear();
    // No drain can run any more (the launch threads are joined, a posted
    // drain is destroyed with the context's handlers): a queue left marked
    // as draining would hold every later operation on its stream forever.
    q->draining = false;
  }
  return out;
}

void poll_hub::clear() {
  stop_launchers();  // first: a running drain takes the locks below
  std::vector<std::shared_ptr<polled_wait>> dropped = take_deferred();
  std::lock_guard st(step_mu_);  // never under a step's queries (they use the waits' events)
  std::lock_guard lk(mu_);
  ++clears_;
  lanes_.clear();  // waits are dropped with their handlers (shutdown)
  count_ = 0;
}

void poll_hub::schedule_locked(bool spin, clock::duration pause) {
  if (step_queued_) return;
  if (spin) {
    step_queued_ = true;
    // post, not defer: the next look must be open to every io thread at once,
    // not only after the handler now running on this one returns.
    asio::post(ex_, [self = shared_from_this()] {
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
constexpr auto k_lead = std::chrono::microseconds(100);
constexpr auto k_window = std::chrono::microseconds(120);
constexpr std::size_t k_idle_lanes = 64;  // lanes kept for their history
constexpr std::size_t k_batch = 16;       // events of a lane looked at per step
constexpr std::size_t k_full_batch = 64;  // the same, on a timer step
constexpr std::size_t k_max_waits = 512;  // waits of a lane taken per step
constexpr std::size_t k_chunk = 16;       // completions run by one handler

/// A wait a step found finished, with its event's status.
struct finished {
  std::shared_ptr<polled_wait> w;
  cudaError_t status;
};
}  // namespace

void poll_hub::look_again() {
  if (!again_.exchange(false)) return;
  std::lock_guard lk(mu_);
  if (count_ > 0) schedule_locked(true, clock::duration::zero());
}

void poll_hub::step(bool full) {
  // One step at a time; a step that finds another running leaves the next
  // look to it (it schedules one whenever waits remain).
  // The flag is raised before trying: a step that loses the race is never
  // lost (the running one may already have decided not to look again: it
  // re-checks the flag after releasing step_mu_).
  again_.store(true);
  std::unique_lock step_lock(step_mu_, std::try_to_lock);
  if (!step_lock.owns_lock()) return;
  again_.store(false);

  // 1. Under the lock: which events to query: each lane's oldest pending
  //    events (a few more on a timer step), as runs of consecutive waits
  //    sharing one event (a batch). Only the event handles and run lengths
  //    are taken, no references to the waits: the waits stay in their lanes,
  //    which nothing but a step (or clear(), seen through clears_) shortens,
  //    so the runs are still at the front in step 3. (Copying the waits cost
  //    an atomic increment and decrement per wait per step: up to k_max_waits
  //    of them on every turn of a spinning poller.) Waits that finished
  //    otherwise (cancelled, timed out by the device monitor) leave when they
  //    reach the front. O(lanes), not O(waits): add() contends for this lock.
  auto& probes = probes_;  // guarded by step_mu_
  probes.clear();
  std::vector<std::shared_ptr<polled_wait>> rejected;
  std::uint64_t epoch = 0;
  {
    std::unique_lock lk(mu_);
    if (count_ == 0) {
      // Nothing to look at. A wait added once mu_ is let go here has its
      // step turned away while this one still holds step_mu_: this exit too
      // checks again_ after letting go. (It returned without, and such a
      // wait stayed unpolled until a later add or timer came, for ever if
      // every waiter was behind it.)
      lk.unlock();
      if (empty_step_hook) empty_step_hook(*this);
      step_lock.unlock();
      return look_again();
    }
    if (!accepting_()) {
      // Queued work (not enqueued yet) is failed by its drain, which is due:
      // each enqueue checks the device first.
      for (auto& l : lanes_) {
        for (auto& w : l.waits)
          if (!w->polled_done()) rejected.push_back(w);
      }
      lanes_.clear();
      count_ = 0;
    }
    epoch = clears_;
    const std::size_t batch = full ? k_full_batch : k_batch;
    // While a launch thread makes library calls, fewer queries: each one
    // competes with those calls for the driver's locks.
    const bool sparse = !full && busy_poll_interval_ > clock::duration::zero() &&
                        launching_.load(std::memory_order_relaxed) > 0;
    const auto asked = sparse ? clock::now() : clock::time_point{};
    for (auto& l : lanes_) {
      while (!l.waits.empty() && l.waits.front()->polled_done()) {
        l.waits.pop_front();
        --count_;
      }
      if (sparse) {
        if (asked - l.last_query < busy_poll_interval_) continue;
        l.last_query = asked;
      }
      std::size_t i = 0, events = 0;
      while (i < l.waits.size() && i < k_max_waits && ++events <= batch) {
        const cudaEvent_t ev = l.waits[i]->polled_event();
        std::size_t j = i + 1;
        while (j < l.waits.size() && j < k_max_waits && l.waits[j]->polled_event() == ev) ++j;
        probes.push_back({l.stream, ev, j - i, cudaErrorNotReady});
        i = j;
      }
    }
  }

  // 2. Without the lock (other threads keep adding waits): one query per
  //    run. On a lane, once one is not done, no later one is (in order); a
  //    full step asks them all anyway (waits added out of recording order).
  for (std::size_t k = 0; k < probes.size(); ++k) {
    auto& p = probes[k];
    if (!full && k > 0 && probes[k - 1].stream == p.stream &&
        probes[k - 1].status == cudaErrorNotReady)
      continue;  // left not ready, unasked
    p.status = cudaEventQuery(p.ev);
  }

  // 3. Under the lock: take the finished runs out of their lanes, follow
  //    each lane past its finished oldest, and decide when to look again.
  std::vector<finished> done;
  const auto now = clock::now();
  {
    std::lock_guard lk(mu_);
    for (std::size_t k = 0; epoch == clears_ && k < probes.size();) {
      // The runs of one lane, in order from its front.
      const cudaStream_t s = probes[k].stream;
      auto it =
          std::find_if(lanes_.begin(), lanes_.end(), [&](const lane& l) { return l.stream == s; });
      std::size_t at = 0, taken = 0;
      for (; k < probes.size() && probes[k].stream == s; ++k) {
        const auto& p = probes[k];
        if (it != lanes_.end() && p.status != cudaErrorNotReady) {
          for (std::size_t i = at; i < at + p.waits; ++i) {
            auto& w = it->waits[i];
            if (p.status == cudaSuccess) {
              const auto took = now - w->polled_start();
              // Down at once, up slowly: a completion found late (the thread
              // woke after the kernel ended) overstates `took`, and an average
              // would carry that lateness into the next prediction, and so on.
              if (it->typical == clock::duration::zero() || took < it->typical)
                it->typical = took;
              else
                it->typical += (took - it->typical) / 8;
            }
            done.push_back({std::move(w), p.status});
          }
          taken += p.waits;
        }
        at += p.waits;
      }
      if (taken == 0) continue;
      auto& l = *it;
      if (taken == at)
        l.waits.erase(l.waits.begin(), l.waits.begin() + static_cast<std::ptrdiff_t>(at));
      else  // a full step found a later run done before an earlier one
        l.waits.erase(std::remove(l.waits.begin(),
                                  l.waits.begin() + static_cast<std::ptrdiff_t>(at), nullptr),
                      l.waits.begin() + static_cast<std::ptrdiff_t>(at));
      count_ -= taken;
      l.last_done = now;
    }
    bool spin = false;
    clock::duration pause = clock::duration::max();
    for (auto& l : lanes_) {
      if (l.waits.empty()) continue;
      const auto& head = l.waits.front();
      // Keep looking on every turn while work streams through this lane or
      // its newest wait (waits are added in time order) is young.
      if (now - l.last_done < head->polled_spin() ||
          now - l.waits.back()->polled_start() < l.waits.back()->polled_spin())
        spin = true;
      // Past the spin budget, the oldest wait of the lane decides the pause.
      const auto waited = now - head->polled_start();
      const auto cap = std::max(head->polled_max_backoff(), clock::duration::zero());
      if (l.typical > clock::duration::zero() && waited < l.typical + k_window) {
        if (waited + k_lead >= l.typical)
          spin = true;
        else
          pause = std::min<clock::duration>(pause, std::min(cap, l.typical - k_lead - waited));
      } else {
        const auto floor = std::min<clock::duration>(std::chrono::microseconds(10), cap);
        pause = std::min(pause, std::clamp<clock::duration>(waited / 64, floor, cap));
      }
    }
    if (lanes_.size() > k_idle_lanes)
      std::erase_if(lanes_, [](const lane& l) { return l.waits.empty(); });
    if (count_ > 0)
      schedule_locked(spin, std::clamp<clock::duration>(pause, clock::duration::zero(),
                                                        std::chrono::seconds(1)));
  }
  step_lock.unlock();
  look_again();

  // 4. The handlers, outside both locks (they may add waits), in chunks of
  //    k_chunk: the first chunk on this thread, the others posted so that
  //    every io thread can take some. (One post per completion cost a queue
  //    round trip each; a batch of a few hundred completes at once.) A
  //    handler runs inline and may throw (a co_spawn completion handler that
  //    rethrows): the rest of its chunk is posted before the exception
  //    leaves (run_each), so no other wait is dropped with it.
  for (auto& w : rejected) w->polled_reject();
  if (done.empty()) return;
  const auto complete = [](finished& d) { d.w->polled_complete(d.status, true); };
  const std::size_t first = std::min(done.size(), k_chunk);
  for (std::size_t i = first; i < done.size(); i += k_chunk) {
    std::vector<finished> chunk(
        std::make_move_iterator(done.begin() + static_cast<std::ptrdiff_t>(i)),
        std::make_move_iterator(done.begin() +
                                static_cast<std::ptrdiff_t>(std::min(done.size(), i + k_chunk))));
    asio::post(ex_, [ex = ex_, chunk = std::move(chunk), complete]() mutable {
      run_each(ex, std::move(chunk), complete);
    });
  }
  done.resize(first);
  run_each(ex_, std::move(done), complete);
}

}  // namespace atomr::cuda::detail
