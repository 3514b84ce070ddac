#include "device_impl.hpp"
#include "pinned_pool.hpp"
#include "poll_hub.hpp"
#include "remote.hpp"

#include <atomr/cuda/detail/actor_core.hpp>
#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/gpu_ref.hpp>
#include <atomr/cuda/pinned.hpp>

#include <boost/asio/append.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/system_executor.hpp>

#include <algorithm>
#include <limits>
#include <string>

namespace atomr::cuda {
namespace detail {

namespace {
std::atomic<std::uint64_t> next_stream_id{1};

// One device state per ordinal while any handle lives.
std::mutex registry_mu;
std::map<int, std::weak_ptr<device_impl>>& registry() {
  static std::map<int, std::weak_ptr<device_impl>> r;
  return r;
}

gpu_error unavailable(gpu_error e) {
  return gpu_error(errc::device_unavailable, e.library(), e.native_status(), e.message());
}

// Posts through `via` (which supports blocking.never), then dispatches to the
// handler's own (type-erased) executor.
template <class Handler, class Arg>
void post_to(const asio::any_io_executor& via, Handler h, Arg a) {
  asio::post(via, [h = std::move(h), a = std::move(a), via]() mutable {
    auto ex = asio::get_associated_executor(h, via);
    asio::dispatch(ex, asio::append(std::move(h), std::move(a)));
  });
}

// Ties device states to the lifetime of their executor's execution context
// (Asio calls shutdown() when the context is destroyed).
class device_service : public asio::execution_context::service {
public:
  using key_type = device_service;
  static asio::execution_context::id id;
  explicit device_service(asio::execution_context& ctx) : service(ctx) {}
  void add(std::weak_ptr<device_impl> d) {
    std::lock_guard lk(mu_);
    devices_.push_back(std::move(d));
  }
  void shutdown() override {
    std::vector<std::weak_ptr<device_impl>> all;
    {
      std::lock_guard lk(mu_);
      all.swap(devices_);
    }
    for (auto& w : all)
      if (auto d = w.lock()) d->on_context_shutdown();
  }

private:
  std::mutex mu_;
  std::vector<std::weak_ptr<device_impl>> devices_;
};
asio::execution_context::id device_service::id;

constexpr auto fault_tick = std::chrono::milliseconds(2);
constexpr auto idle_tick = std::chrono::milliseconds(10);
}  // namespace

stream_state::~stream_state() {
  if (native && owner->health.load() != health_state::poisoned) cudaStreamDestroy(native);
}

device_impl::device_impl(const asio::any_io_executor& ex, int ord, const device_options& o)
    : executor(ex),
      completion_executor(ex),
      ordinal(ord),
      options(o),
      polls(std::make_shared<poll_hub>(
          ex, [this] { return health.load() == health_state::healthy; }, o.max_batch,
          o.launch_threads, o.busy_poll_interval, o.launch_spin)),
      strand_(ex),
      monitor_timer_(strand_) {}

device_impl::~device_impl() {
  if (remote) remote->shutdown();
  {
    std::lock_guard lk(bq_->mu);
    bq_->stop = true;
  }
  bq_->cv.notify_all();
  if (bthread_.joinable()) {
    // On the worker itself (its item held the last reference) the thread
    // finishes on its own: it keeps the queue alive and sees `stop`.
    if (bthread_.get_id() == std::this_thread::get_id())
      bthread_.detach();
    else
      bthread_.join();
  }
  const bool alive = context_usable();
  if (alive) make_current();
  for (auto& p : parked_)  // teardown with abandoned work still running: wait for it here
    if (alive && p.done) cudaEventSynchronize(p.done->native_handle());
  parked_.clear();
  stream_pool.clear();
  per_owner_.clear();
  main_stream.reset();
  release_stream.reset();
  if (mem_pool && alive) cudaMemPoolDestroy(mem_pool);
  // Teardown errors are ignored on purpose, but none may stay pending for
  // the caller's next, unrelated CUDA call.
  if (alive) cudaGetLastError();
}

bool device_impl::context_usable() const noexcept {
  return cuda_initialised.load() && health.load() != health_state::poisoned;
}

int device_impl::registry_key() const noexcept {
  return options.isolation.enabled ? ordinal + (1 << 20) : ordinal;
}

void device_impl::init() {
  if (options.isolation.enabled) {
    // No CUDA call in this process: the worker opens the device.
    remote = std::make_shared<remote_device>(*this);
    if (auto ok = remote->start(weak_from_this()); !ok) {
      init_error_ = unavailable(ok.error());
      remote.reset();
      return;
    }
    main_stream = std::make_shared<stream_state>(nullptr, nullptr, next_stream_id++);
    main_stream->owner = this;
    health.store(health_state::starting);
    return;
  }
  int n = 0;
  if (auto st = cudaGetDeviceCount(&n); st != cudaSuccess) {
    cudaGetLastError();
    init_error_ = unavailable(classify(st, "cudaGetDeviceCount"));
    return;
  }
  if (ordinal < 0 || ordinal >= n) {
    init_error_ = make_error(errc::device_unavailable,
                             "cuda: device ordinal " + std::to_string(ordinal) +
                                 " does not exist (" + std::to_string(n) + " devices)");
    return;
  }
  auto fail = [&](cudaError_t st, const char* what) {
    cudaGetLastError();
    init_error_ = unavailable(classify(st, what));
  };
  if (auto st = cudaSetDevice(ordinal); st != cudaSuccess) return fail(st, "cudaSetDevice");
  cuda_initialised.store(true);
  only_device = n == 1;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = ordinal;
  if (auto st = cudaMemPoolCreate(&mem_pool, &props); st != cudaSuccess)
    return fail(st, "cudaMemPoolCreate");
  // Keep freed memory in the pool: returning it to the OS on every
  // synchronisation would make the next allocation pay for it again.
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  if (auto st = cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep);
      st != cudaSuccess)
    return fail(st, "cudaMemPoolSetAttribute");
  events = std::make_shared<event_pool>(ordinal);
  pinned = std::make_shared<pinned_pool>(options.pinned_cache_limit);
  auto make = [&](std::shared_ptr<stream_state>& out) {
    auto s = new_stream(false);
    if (!s) {
      init_error_ = unavailable(s.error());
      return false;
    }
    out = std::move(s).value();
    return true;
  };
  if (!make(main_stream) || !make(release_stream)) return;
  stream_pool.resize(std::max<std::size_t>(1, options.stream_pool_size));
  for (auto& s : stream_pool)
    if (!make(s)) return;
  health.store(health_state::healthy);
}

result<void> device_impl::check_accepting() const {
  switch (health.load(std::memory_order_acquire)) {
    case health_state::healthy:
      return outcome::success();
    case health_state::poisoned:
      return fault_error();
    case health_state::stopped: {
      std::string m = "device " + std::to_string(ordinal) + " was stopped";
      std::lock_guard lk(mu_);
      if (remote && fault_)
        m += " (its worker's restart budget is spent; last failure: " + fault_->message() + ")";
      return make_error(errc::device_unavailable, std::move(m));
    }
    case health_state::starting:
      return outcome::success();
    case health_state::restarting: {
      std::string m = "isolated device " + std::to_string(ordinal) + ": its worker is restarting";
      std::lock_guard lk(mu_);
      if (fault_) m += " after: " + fault_->message();
      return make_error(errc::device_unavailable, std::move(m));
    }
    case health_state::unavailable:
      break;
  }
  std::lock_guard lk(mu_);
  return init_error_;
}

gpu_error device_impl::fault_error() const {
  std::lock_guard lk(mu_);
  if (!fault_) return make_error(errc::context_poisoned, "device poisoned");
  return gpu_error(errc::context_poisoned, fault_->library(), fault_->native_status(),
                   "device " + std::to_string(ordinal) +
                       " is poisoned by an earlier fault: " + fault_->message());
}

void device_impl::note_error(const gpu_error& e) {
  if (e.code() == errc::out_of_memory) ++oom;
  if (e.code() == errc::context_poisoned) poison(e);
}

void device_impl::poison(const gpu_error& e) {
  auto expected = health_state::healthy;
  if (!health.compare_exchange_strong(expected, health_state::poisoned)) return;
  {
    std::lock_guard lk(mu_);
    fault_ = e;
  }
  ++generation;
  ++faults;
  // Nothing may be handed back to a dead context: events and pinned blocks leak.
  if (events) events->abandon();
  if (pinned) pinned->abandon();
  // A dead context may never run the host functions queued on it: they no
  // longer hold io_context::run() (their callbacks, if they come, touch no
  // executor).
  release_host_fn_work();
  set_health(health_state::healthy, health_state::poisoned);
}

void device_impl::stop() {
  if (remote) {
    auto from = health.load();
    while (from != health_state::stopped && from != health_state::unavailable &&
           !health.compare_exchange_weak(from, health_state::stopped)) {
    }
    if (from == health_state::stopped || from == health_state::unavailable) return;
    {
      std::lock_guard lk(mu_);
      fault_.reset();  // stopped by the user, not by a failure
    }
    ++generation;
    remote->stop();
    set_health(from, health_state::stopped);
    return;
  }
  auto expected = health_state::healthy;
  if (!health.compare_exchange_strong(expected, health_state::stopped)) return;
  ++generation;
  set_health(health_state::healthy, health_state::stopped);
}

void device_impl::remote_health(health_state to, const std::optional<gpu_error>& why) {
  const auto from = health.load();
  if (from == health_state::stopped) return;  // final (stop() or a spent budget)
  if (to == health_state::poisoned) {
    {
      std::lock_guard lk(mu_);
      fault_ = why.value_or(make_error(errc::context_poisoned, "the worker ended"));
    }
    ++generation;
    ++faults;
  } else if (to == health_state::stopped && why) {
    std::lock_guard lk(mu_);
    fault_ = *why;
  }
  if (to == health_state::stopped && from != health_state::poisoned) ++generation;
  health.store(to);
  set_health(from, to);
}

std::vector<health_state> device_impl::health_history() const {
  std::lock_guard lk(mu_);
  return history_;
}

void device_impl::remote_unavailable(gpu_error why) {
  {
    std::lock_guard lk(mu_);
    init_error_ = std::move(why);
  }
  const auto from = health.exchange(health_state::unavailable);
  if (from != health_state::unavailable) ++generation;
  set_health(from, health_state::unavailable);
}

void device_impl::set_health(health_state, health_state to) {
  std::vector<std::shared_ptr<health_observer>> obs;
  {
    std::lock_guard lk(mu_);
    obs.swap(observers_);
    if (history_.size() == 64) history_.erase(history_.begin());
    history_.push_back(to);
  }
  for (auto& o : obs)
    if (auto h = o->take()) post_to(executor, std::move(*h), to);
  // Fail every watched wait now rather than at its next tick.
  asio::post(strand_, [self = shared_from_this()] {
    self->on_monitor_tick();
    self->arm_monitor();
  });
}

void device_impl::on_context_shutdown() {
  {
    std::lock_guard lk(registry_mu);
    auto it = registry().find(registry_key());
    if (it != registry().end() && it->second.lock().get() == this) registry().erase(it);
  }
  if (remote) remote->shutdown();
  const bool alive = context_usable();
  if (alive) make_current();
  for (auto& p : parked_)
    if (alive && p.done) cudaEventSynchronize(p.done->native_handle());
  parked_count -= parked_.size();
  parked_.clear();
  {
    std::lock_guard lk(watch_mu_);
    watched_.clear();
  }
  polls->clear();
  // Host functions still queued (the context was stopped with waits in
  // flight): their callbacks must not post into the context being
  // destroyed. Drop their work, then give the GPU a bounded time to reach
  // them, and free the ones that ran here (never on the CUDA thread).
  release_host_fn_work();
  std::vector<std::unique_ptr<host_ticket>> late;
  {
    std::unique_lock lk(host_fns->mu);
    if (alive)
      host_fns->cv.wait_for(lk, std::chrono::seconds(5), [&] { return host_fns->pending.empty(); });
    late.swap(host_fns->late);
  }
  late.clear();
  // The blocking_sync thread finishes its current wait and stops; the items
  // left are dropped here, while the context's services still exist: an
  // item may hold this device's last reference, and destroying the device
  // after its context (its strand and timer) would touch freed services.
  std::deque<blocking_item> dropped;
  {
    std::lock_guard lk(bq_->mu);
    bq_->stop = true;
    dropped.swap(bq_->items);
  }
  bq_->cv.notify_all();
  if (bthread_.joinable() && bthread_.get_id() != std::this_thread::get_id()) bthread_.join();
  dropped.clear();
  std::lock_guard lk(mu_);
  observers_.clear();
}

void device_impl::add_observer(asio::any_completion_handler<void(health_state)> h) {
  std::unique_lock lk(mu_);
  auto now = health.load();
  // Isolated: starting, poisoned and restarting are passing states (a new
  // worker follows), so an observer waits for the next change.
  const bool passing = remote && (now == health_state::starting || now == health_state::poisoned ||
                                  now == health_state::restarting);
  if (now != health_state::healthy && !passing) {
    lk.unlock();
    post_to(executor, std::move(h), now);
    return;
  }
  auto slot = asio::get_associated_cancellation_slot(h);
  auto ob = std::make_shared<health_observer>();
  ob->handler.emplace(std::move(h));
  observers_.push_back(ob);
  lk.unlock();
  // Any cancellation type completes the wait at once with the health of
  // that moment (the signature has no error code): the observer leaves the
  // list, so cancelled watches do not pile up between two changes. The
  // slot is only touched here, on the initiating thread, as Asio requires.
  if (slot.is_connected())
    slot.assign([ob, weak = weak_from_this()](asio::cancellation_type) {
      auto h = ob->take();
      if (!h) return;  // completed by a change already
      auto self = weak.lock();
      if (!self) return;  // the device is gone: its context is shutting down
      {
        std::lock_guard lk(self->mu_);
        std::erase(self->observers_, ob);
      }
      post_to(self->executor, std::move(*h), self->health.load());
    });
}

void device_impl::probe_context() {
  if (health.load() != health_state::healthy || !main_stream) return;
  auto st = cudaStreamQuery(main_stream->native);
  if (st == cudaSuccess || st == cudaErrorNotReady) return;
  auto e = classify(st, "cudaStreamQuery (context probe)");
  if (e.code() == errc::context_poisoned) poison(e);
}

gpu_error device_impl::blame_fault(gpu_error e) {
  if (e.code() != errc::driver && e.code() != errc::library) return e;
  probe_context();
  if (health.load() != health_state::poisoned) return e;
  return gpu_error(
      errc::context_poisoned, e.library(), e.native_status(),
      e.message() + " (the CUDA context is poisoned: " + fault_error().message() + ")");
}

cudaError_t device_impl::make_current() const noexcept {
  // One device: no thread can have another one current (cudaSetDevice
  // accepts only ordinal 0), so the per-launch cudaGetDevice is saved.
  if (only_device) return cudaSuccess;
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == ordinal) return cudaSuccess;
  return cudaSetDevice(ordinal);
}

result<std::shared_ptr<stream_state>> device_impl::new_stream(bool owned_by_caller) {
  if (auto st = make_current(); st != cudaSuccess) return classify(st, "cudaSetDevice");
  cudaStream_t s = nullptr;
  if (auto st = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); st != cudaSuccess) {
    auto e = classify(st, "cudaStreamCreateWithFlags");
    note_error(e);
    return e;
  }
  auto out = std::make_shared<stream_state>(owned_by_caller ? shared_from_this() : nullptr, s,
                                            next_stream_id++);
  out->owner = this;
  return out;
}

result<stream> device_impl::acquire_stream(stream_policy p, std::string_view owner) {
  BOOST_OUTCOME_TRY(check_accepting());
  switch (p) {
    case stream_policy::single:
      return stream(main_stream);
    case stream_policy::pooled:
      return stream(stream_pool[next_pooled++ % stream_pool.size()]);
    case stream_policy::per_actor_shared: {
      std::lock_guard lk(mu_);
      auto it = per_owner_.find(owner);
      if (it != per_owner_.end()) return stream(it->second);
      BOOST_OUTCOME_TRY(auto s, new_stream(false));
      per_owner_.emplace(std::string(owner), s);
      return stream(std::move(s));
    }
    case stream_policy::per_actor_fresh: {
      BOOST_OUTCOME_TRY(auto s, new_stream(true));
      return stream(std::move(s));
    }
  }
  return make_error(errc::invalid_argument, "unknown stream policy");
}

// ---------------------------------------------------------------- monitor

namespace {
/// How soon the monitor must look at a watched wait: at its deadline, and
/// every fault_tick while something polls for faults, else every idle_tick
/// (device failures).
clock::time_point monitor_due(clock::time_point now, clock::time_point deadline, bool fast) {
  const auto tick = fast ? clock::duration(fault_tick) : clock::duration(idle_tick);
  return std::min(deadline, now + tick);
}
}  // namespace

void device_impl::watch(std::shared_ptr<watched_wait> w) {
  // Every wait with a deadline comes here (and every host_fn and
  // blocking_sync wait): no scan and no strand hop unless the armed timer
  // would fire after this wait is due.
  const auto due = monitor_due(clock::now(), w->deadline(), w->polls_for_faults());
  bool rearm = false;
  {
    std::lock_guard lk(watch_mu_);
    watched_.emplace_back(w);
    rearm = monitor_at_ > due;
  }
  if (rearm) asio::post(strand_, [self = shared_from_this()] { self->arm_monitor(); });
}

void device_impl::park(shared_event done, std::shared_ptr<void> keep_alive) {
  ++parked_count;
  asio::post(strand_, [self = shared_from_this(),
                       p = parked_work{std::move(done), std::move(keep_alive)}]() mutable {
    self->parked_.push_back(std::move(p));
    self->arm_monitor();
  });
}

void device_impl::arm_monitor() {
  const auto now = clock::now();
  clock::time_point next;
  {
    std::lock_guard lk(watch_mu_);
    if (watched_.empty() && parked_.empty()) return;
    bool fast = !parked_.empty();
    auto deadline = clock::time_point::max();
    for (auto& weak : watched_) {
      auto w = weak.lock();
      if (!w) continue;
      fast = fast || w->polls_for_faults();
      deadline = std::min(deadline, w->deadline());
    }
    next = monitor_due(now, deadline, fast);
    if (monitor_at_ <= next) return;  // armed early enough
    monitor_at_ = next;
  }
  monitor_timer_.expires_at(next);
  monitor_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
        if (ec == asio::error::operation_aborted) return;  // re-armed earlier
        {
          std::lock_guard lk(self->watch_mu_);
          self->monitor_at_ = clock::time_point::max();
        }
        self->on_monitor_tick();
        self->arm_monitor();
      }));
}

void device_impl::on_monitor_tick() {
  const auto now = clock::now();
  {
    // on_tick only posts its wait's handler (and may note a fault): nothing
    // under it comes back to watch_mu_.
    std::lock_guard lk(watch_mu_);
    std::erase_if(watched_, [&](auto& weak) {
      auto w = weak.lock();
      return !w || w->on_tick(now);
    });
  }
  if (parked_.empty()) return;
  const bool dead = health.load() == health_state::poisoned;
  if (!dead) make_current();
  std::erase_if(parked_, [&](parked_work& p) {
    // A dead context runs nothing more, so its abandoned work is over too.
    if (!dead && cudaEventQuery(p.done->native_handle()) == cudaErrorNotReady) return false;
    --parked_count;
    return true;
  });
}

// ---------------------------------------------------------------- host functions

namespace {
// The host function itself (a CUDA thread: no CUDA call allowed here).
void host_fn_trampoline(void* p) {
  auto* t = static_cast<host_ticket*>(p);
  const auto gate = t->gate;  // outlives the lock below, whatever the completion drops
  auto& g = *gate;
  std::unique_lock lk(g.mu);
  std::erase(g.pending, t);
  g.cv.notify_all();
  if (!t->work) {
    // Poisoned or shut down: the executor may be gone. Touch nothing; the
    // ticket is freed at context shutdown, off this thread.
    g.late.emplace_back(t);
    return;
  }
  asio::any_io_executor work = std::move(*t->work);
  t->work.reset();
  std::unique_ptr<host_ticket> own(t);
  // The completion is posted under the gate's lock: a context shutting
  // down (on_context_shutdown) takes the lock in release_host_fn_work and
  // so either dropped this ticket's work first (the branch above) or waits
  // there until the post is made, while the context's scheduler still
  // takes posts. Unlocked first, the post could reach a context already
  // torn down. The posts only queue handlers; none runs here.
  own->complete(own->op, work);
}
}  // namespace

cudaError_t device_impl::launch_host_fn(cudaStream_t s, std::unique_ptr<host_ticket>& t) {
  t->gate = host_fns;
  t->work.emplace(asio::prefer(executor, asio::execution::outstanding_work.tracked));
  {
    std::lock_guard lk(host_fns->mu);
    host_fns->pending.push_back(t.get());
  }
  host_ticket* raw = t.release();
  if (auto st = cudaLaunchHostFunc(s, &host_fn_trampoline, raw); st != cudaSuccess) {
    {
      std::lock_guard lk(host_fns->mu);
      std::erase(host_fns->pending, raw);
    }
    t.reset(raw);
    t->work.reset();
    return st;
  }
  return cudaSuccess;
}

void device_impl::release_host_fn_work() {
  std::vector<asio::any_io_executor> dropped;  // released outside the lock
  {
    std::lock_guard lk(host_fns->mu);
    for (auto* t : host_fns->pending)
      if (t->work) {
        dropped.push_back(std::move(*t->work));
        t->work.reset();
      }
  }
}

std::size_t device_impl::host_fns_pending() const {
  std::lock_guard lk(host_fns->mu);
  return host_fns->pending.size();
}

// ---------------------------------------------------------------- blocking_sync worker

void device_impl::submit_blocking(blocking_item item) {
  {
    std::lock_guard lk(bq_->mu);
    bq_->items.push_back(std::move(item));
    if (!bthread_.joinable()) {
      bq_->running.store(true);
      bthread_ = std::thread([q = bq_, ord = ordinal] { blocking_loop(q, ord); });
    }
  }
  bq_->cv.notify_one();
}

// Touches nothing of the device: finishing an item can drop the device's
// last reference and destroy it on this thread (found by a fault test that
// crashed at exit when this loop still used the device's own mutex).
void device_impl::blocking_loop(const std::shared_ptr<blocking_queue>& q, int ordinal) {
  cudaSetDevice(ordinal);
  for (;;) {
    blocking_item item;
    {
      std::unique_lock lk(q->mu);
      q->cv.wait(lk, [&] { return q->stop || !q->items.empty(); });
      if (q->items.empty()) {
        q->running.store(false);
        return;
      }
      item = std::move(q->items.front());
      q->items.pop_front();
    }
    auto st = cudaEventSynchronize(item.ev->native_handle());
    item.on_done(st);
    item = {};  // may destroy the device; `q` stays valid
  }
}

result<shared_event> record_event(device_impl& d, cudaStream_t s, std::string_view library,
                                  bool blocking) {
  shared_event ev;
  if (auto st = d.events->acquire(ev, blocking); st != cudaSuccess) {
    auto e = classify(st, "cudaEventCreateWithFlags").tagged(library);
    d.note_error(e);
    return e;
  }
  if (auto st = cudaEventRecord(ev->native_handle(), s); st != cudaSuccess) {
    auto e = classify(st, "cudaEventRecord").tagged(library);
    d.note_error(e);
    return e;
  }
  return ev;
}

void wait_untracked(device_impl& d, cudaStream_t s) noexcept {
  if (!d.context_usable() || d.make_current() != cudaSuccess) return;
  d.untracked_waits.fetch_add(1, std::memory_order_relaxed);
  (void)cudaStreamSynchronize(s);
  // Its error (if any) is the fault's, reported through the health probe;
  // none may stay pending for the caller's next CUDA call.
  cudaGetLastError();
}

// ---------------------------------------------------------------- buffers

buffer_state::~buffer_state() {
  --dev->live_buffers;
  if (remote_handle != 0) {
    // The worker frees it (stream-ordered, after the work that uses it);
    // a worker of a later generation never had it.
    if (dev->remote && generation == dev->generation.load())
      dev->remote->release(wire::release_kind::buffer, remote_handle);
    return;
  }
  // After a sticky fault nothing is handed back to the dead context.
  if (dev->health.load() == health_state::poisoned || !dev->release_stream) return;
  dev->make_current();
  cudaStream_t rs = dev->release_stream->native;
  // Stream-ordered free: the release stream waits (on the GPU) for every
  // tracked access, so the memory is reused only after they finished.
  // (settle(): an event of a unit's run that is not recorded yet.)
  if (last_write.done && last_write.done->settle() == cudaSuccess)
    cudaStreamWaitEvent(rs, last_write.done->native_handle(), 0);
  for (auto& r : reads)
    if (r.done && r.done->settle() == cudaSuccess)
      cudaStreamWaitEvent(rs, r.done->native_handle(), 0);
  cudaFreeAsync(ptr, rs);  // teardown: errors deliberately ignored
}

result<void> check_buffer(const buffer_state* st, std::string_view what) {
  if (!st) return make_error(errc::invalid_argument, std::string(what) + " is empty");
  const auto& d = *st->dev;
  const auto gen = d.generation.load(std::memory_order_acquire);
  const auto h = d.health.load(std::memory_order_acquire);
  if (st->generation == gen && device_impl::accepts(h)) return outcome::success();
  std::string why = std::string(to_string(h));
  if (h == health_state::poisoned) why += ": " + d.fault_error().message();
  return make_error(errc::stale_ref, std::string(what) + " is stale: allocated in generation " +
                                         std::to_string(st->generation) + ", device " +
                                         std::to_string(d.ordinal) + " is at generation " +
                                         std::to_string(gen) + " (" + why + ")");
}

result<void> check_buffer(const buffer_state* st, dtype t) {
  if (st && st->generation == st->dev->generation.load(std::memory_order_acquire) &&
      device_impl::accepts(st->dev->health.load(std::memory_order_acquire)))
    return outcome::success();
  return check_buffer(st, "gpu_ref<" + std::string(to_string(t)) + ">");
}

}  // namespace detail

// ---------------------------------------------------------------- device

std::string_view to_string(health_state h) noexcept {
  switch (h) {
    case health_state::healthy:
      return "healthy";
    case health_state::poisoned:
      return "poisoned";
    case health_state::stopped:
      return "stopped";
    case health_state::unavailable:
      return "unavailable";
    case health_state::starting:
      return "starting";
    case health_state::restarting:
      return "restarting";
  }
  return "unknown";
}

std::string_view to_string(stream_policy p) noexcept {
  switch (p) {
    case stream_policy::single:
      return "single";
    case stream_policy::pooled:
      return "pooled";
    case stream_policy::per_actor_shared:
      return "per_actor_shared";
    case stream_policy::per_actor_fresh:
      return "per_actor_fresh";
  }
  return "unknown";
}

result<void> check_device_options(const device_options& o) {
  constexpr std::string_view op = "device::open";
  if (auto ok = check_completion(o.default_completion); !ok)
    return detail::bad_argument(op, "options.default_completion", ok.error().message());
  if (o.launch_threads > 64)
    return detail::bad_argument(op, "options.launch_threads",
                                "(" + std::to_string(o.launch_threads) + ") is more than 64");
  const auto poll = o.busy_poll_interval.count();
  if (poll < 0 || poll > 1000)
    return detail::bad_argument(op, "options.busy_poll_interval",
                                "(" + std::to_string(poll) + " us) is not within 0..1000 us");
  const auto spin = o.launch_spin.count();
  if (spin < 0 || spin > 10000)
    return detail::bad_argument(op, "options.launch_spin",
                                "(" + std::to_string(spin) + " us) is not within 0..10000 us");
  const auto& iso = o.isolation;
  if (!iso.enabled) return outcome::success();
  auto ms_range = [&](std::string_view name, std::chrono::milliseconds v) -> result<void> {
    if (v.count() >= 1 && v.count() <= 3600000) return outcome::success();
    return detail::bad_argument(
        op, name, "(" + std::to_string(v.count()) + " ms) is not within 1..3600000 ms");
  };
  BOOST_OUTCOME_TRY(ms_range("options.isolation.heartbeat", iso.heartbeat));
  BOOST_OUTCOME_TRY(ms_range("options.isolation.heartbeat_timeout", iso.heartbeat_timeout));
  BOOST_OUTCOME_TRY(ms_range("options.isolation.hang_margin", iso.hang_margin));
  BOOST_OUTCOME_TRY(ms_range("options.isolation.max_op_time", iso.max_op_time));
  BOOST_OUTCOME_TRY(ms_range("options.isolation.start_timeout", iso.start_timeout));
  if (iso.rings < 1 || iso.rings > 16)
    return detail::bad_argument(op, "options.isolation.rings",
                                "(" + std::to_string(iso.rings) + ") is not within 1..16");
  if (iso.reply_spin.count() < 0 || iso.reply_spin > std::chrono::milliseconds(10))
    return detail::bad_argument(
        op, "options.isolation.reply_spin",
        "(" + std::to_string(iso.reply_spin.count()) + " us) is not within 0..10000 us");
  if (iso.heartbeat_timeout <= iso.heartbeat)
    return detail::bad_argument(op, "options.isolation.heartbeat_timeout",
                                "must be longer than options.isolation.heartbeat");
  if (iso.arena_bytes < (std::size_t{1} << 20) || iso.arena_bytes > (std::size_t{16} << 30))
    return detail::bad_argument(
        op, "options.isolation.arena_bytes",
        "(" + std::to_string(iso.arena_bytes) + ") is not within 1 MiB..16 GiB");
  return outcome::success();
}

void detail::device_impl::reject(gpu_error why) {
  std::lock_guard lk(mu_);
  init_error_ = std::move(why);
}

device::device(const executor_type& ex, int ordinal, const device_options& options) {
  if (auto ok = check_device_options(options); !ok) {
    // Refused before any CUDA call and before the registry: the handle is
    // unavailable with the reason, and a later open with valid options
    // opens the ordinal as usual. (The state gets the default options: the
    // given ones are out of range, e.g. thousands of launch thread slots.)
    impl_ = std::make_shared<detail::device_impl>(ex, ordinal, device_options{});
    impl_->reject(ok.error());
    return;
  }
  std::lock_guard lk(detail::registry_mu);
  auto& slot = detail::registry()[options.isolation.enabled ? ordinal + (1 << 20) : ordinal];
  if (auto live = slot.lock()) {
    impl_ = std::move(live);
    return;
  }
  impl_ = std::make_shared<detail::device_impl>(ex, ordinal, options);
  impl_->init();
  slot = impl_;
  asio::use_service<detail::device_service>(asio::query(ex, asio::execution::context)).add(impl_);
}

result<device> device::open(const executor_type& ex, int ordinal, const device_options& options) {
  device d(ex, ordinal, options);
  BOOST_OUTCOME_TRY(d.status());
  return d;
}

namespace {
gpu_error empty_device(std::string_view what) {
  return make_error(errc::invalid_argument, std::string(what) + ": empty device handle");
}
}  // namespace

device::executor_type device::get_executor() const noexcept {
  return impl_ ? impl_->executor : executor_type{};
}
int device::ordinal() const noexcept {
  return impl_ ? impl_->ordinal : -1;
}
const device_options& device::options() const noexcept {
  static const device_options defaults{};
  return impl_ ? impl_->options : defaults;
}
health_state device::health() const noexcept {
  return impl_ ? impl_->health.load() : health_state::unavailable;
}
bool device::accepting() const noexcept {
  return detail::device_impl::accepts(health());
}
bool device::isolated() const noexcept {
  return impl_ && impl_->options.isolation.enabled;
}
std::uint64_t device::generation() const noexcept {
  return impl_ ? impl_->generation.load() : 0;
}
result<void> device::status() const {
  if (!impl_) return empty_device("device");
  return impl_->check_accepting();
}

std::optional<gpu_error> device::fault() const {
  if (!impl_ || health() != health_state::poisoned) return std::nullopt;
  return impl_->fault_error();
}

device_statistics device::statistics() const {
  if (!impl_) return {};
  auto& d = *impl_;
  device_statistics s;
  s.health = d.health.load();
  s.generation = d.generation.load();
  s.ops_in_flight = d.in_flight.load();
  s.ops_completed = d.completed.load();
  s.ops_failed = d.failed.load();
  s.faults = d.faults.load();
  s.out_of_memory = d.oom.load();
  s.live_buffers = d.live_buffers.load();
  s.parked = d.parked_count.load();
  s.events_created = d.events ? d.events->created() : 0;
  s.ops_batched = d.ops_batched.load();
  s.unit_events = d.unit_events.load();
  s.untracked_waits = d.untracked_waits.load();
  s.batches = d.batches.load();
  s.launch_sleeps = d.polls ? d.polls->launch_sleeps() : 0;
  s.library_threads = d.polls ? d.polls->launch_threads_running() : 0;
  s.blocking_threads = d.blocking_threads_running();
  s.pinned_cached_bytes = d.pinned ? d.pinned->cached_bytes() : 0;
  s.host_fns_pending = d.host_fns_pending();
  if (d.options.isolation.enabled) {
    s.isolated = true;
    if (d.remote) {
      const auto w = d.remote->worker_stats();
      s.worker_restarts = w.restarts;
      s.restarts_left = w.restarts_left;
      s.worker_pid = w.pid;
      s.worker_calls_pending = w.calls_pending;
      s.worker_threads = w.worker_threads;
      s.library_threads += w.reader_threads;
      s.free_bytes = w.free_bytes;
      s.total_bytes = w.total_bytes;
    }
    return s;
  }
  if (s.health == health_state::healthy && d.make_current() == cudaSuccess) {
    if (cudaMemGetInfo(&s.free_bytes, &s.total_bytes) != cudaSuccess) cudaGetLastError();
  }
  return s;
}

result<stream> device::acquire_stream(stream_policy policy, std::string_view owner) {
  if (!impl_) return empty_device("acquire_stream");
  if (impl_->remote) {
    // Isolated: a handle that names the device; the worker chooses its own
    // streams (docs/design.md, "Isolated device").
    BOOST_OUTCOME_TRY(impl_->check_accepting());
    return impl_->main_stream ? stream(impl_->main_stream) : main_stream();
  }
  return impl_->acquire_stream(policy, owner);
}

stream device::main_stream() const {
  if (!impl_) return stream{};
  if (impl_->main_stream) return stream(impl_->main_stream);
  // Unavailable device: a handle with no CUDA stream, so that work on it
  // reports the device's status instead of crashing.
  auto st = std::make_shared<detail::stream_state>(impl_, nullptr, 0);
  st->owner = impl_.get();
  return stream(std::move(st));
}

void device::stop() {
  if (impl_) impl_->stop();
}

void device::add_health_observer(const std::shared_ptr<detail::device_impl>& impl,
                                 asio::any_completion_handler<void(health_state)> h) {
  if (!impl) {
    // No device, so no executor of its own: hop through the system executor
    // to the handler's associated one (never inline in the initiating call).
    // The handler's executor counts the hop as outstanding work.
    auto work =
        asio::prefer(asio::get_associated_executor(h), asio::execution::outstanding_work.tracked);
    asio::post(asio::system_executor(), [h = std::move(h), work]() mutable {
      asio::dispatch(work, asio::append(std::move(h), health_state::unavailable));
    });
    return;
  }
  impl->add_observer(std::move(h));
}

result<std::shared_ptr<detail::buffer_state>> device::allocate_state(std::size_t count, dtype t,
                                                                     const stream& on) {
  if (!impl_) return empty_device("allocate");
  auto& d = *impl_;
  BOOST_OUTCOME_TRY(d.check_accepting());
  if (count == 0) return make_error(errc::invalid_argument, "allocate: count must be > 0");
  const std::size_t es = size_of(t);
  if (count > std::numeric_limits<std::size_t>::max() / es)
    return make_error(errc::invalid_argument,
                      "allocate: " + std::to_string(count) + " elements overflow the byte count");
  if (d.remote) {
    if (!on || on.state()->owner != &d)
      return make_error(errc::invalid_argument,
                        "allocate: the stream is not one of device " + std::to_string(d.ordinal));
    // Isolated: the worker allocates when the message arrives, before any
    // later request (docs/design.md, "Isolated device").
    auto state =
        std::make_shared<detail::buffer_state>(impl_, nullptr, count, t, d.generation.load());
    state->remote_handle = d.remote->next_id();
    ++d.live_buffers;  // the state's destructor counts it down, sent or not
    if (auto sent =
            d.remote->send_alloc(state->remote_handle, count, static_cast<std::uint32_t>(t));
        !sent) {
      state->remote_handle = 0;  // nothing to release
      return sent.error();
    }
    return state;
  }
  if (!on || on.state()->owner != &d || !on.native_handle())
    return make_error(errc::invalid_argument,
                      "allocate: the stream is not one of device " + std::to_string(d.ordinal));
  if (auto st = d.make_current(); st != cudaSuccess) {
    auto e = classify(st, "cudaSetDevice");
    d.note_error(e);
    return e;
  }
  void* p = nullptr;
  const std::size_t bytes = count * es;
  if (auto st = cudaMallocFromPoolAsync(&p, bytes, d.mem_pool, on.native_handle());
      st != cudaSuccess) {
    cudaGetLastError();
    auto e = classify(st, "cudaMallocFromPoolAsync(" + std::to_string(bytes) + " bytes)");
    d.note_error(e);
    return e;
  }
  auto state = std::make_shared<detail::buffer_state>(impl_, p, count, t, d.generation.load());
  ++d.live_buffers;
  // The allocation is ordered on `on`: other streams must wait for it like a write.
  BOOST_OUTCOME_TRY(auto ev, detail::record_event(d, on.native_handle(), "cuda"));
  state->last_write = {on.id(), std::move(ev)};
  return state;
}

result<std::shared_ptr<detail::pinned_block>> device::allocate_pinned_block(std::size_t bytes) {
  if (!impl_) return empty_device("allocate_pinned");
  BOOST_OUTCOME_TRY(impl_->check_accepting());
  if (impl_->remote) return detail::isolated_not_supported("allocate_pinned");
  impl_->make_current();
  auto b = impl_->pinned->acquire(bytes);
  if (!b) impl_->note_error(b.error());
  return b;
}

// ---------------------------------------------------------------- stream

cudaStream_t stream::native_handle() const noexcept {
  return st_ ? st_->native : nullptr;
}
std::uint64_t stream::id() const noexcept {
  return st_ ? st_->id : 0;
}
device stream::get_device() const {
  if (!st_) return device{};
  return device(st_->owner->shared_from_this());
}

namespace detail {
bool stream_of(const stream& s, const device_impl* d) noexcept {
  return s && s.state()->owner == d;
}
bool same_device(const stream& a, const stream& b) noexcept {
  return a && b && a.state()->owner == b.state()->owner;
}
}  // namespace detail

}  // namespace atomr::cuda
