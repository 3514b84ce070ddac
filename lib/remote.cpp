// The service side of an isolated device (docs/design.md, "Isolated device").
#include "remote.hpp"

#include "device_impl.hpp"
#include "worker/reply_batch.hpp"
#include "worker/ring.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/detail/unit_recorder.hpp>
#include <atomr/cuda/gpu_ref.hpp>

#include <boost/asio/append.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstring>

namespace atomr::cuda::detail {

using clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- the arena

arena_space::arena_space(worker_arena a) : map_(std::move(a)) {
  const std::size_t usable = map_.size & ~std::size_t{255};
  if (usable) free_.emplace(0, usable);
}

std::optional<std::size_t> arena_space::take(std::size_t bytes) {
  bytes = round(std::max<std::size_t>(bytes, 1));
  std::lock_guard lk(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const std::size_t off = it->first, left = it->second - bytes;
    free_.erase(it);
    if (left) free_.emplace(off + bytes, left);
    return off;
  }
  return std::nullopt;
}

void arena_space::give(std::size_t offset, std::size_t bytes) {
  bytes = round(std::max<std::size_t>(bytes, 1));
  std::lock_guard lk(mu_);
  auto [it, ok] = free_.emplace(offset, bytes);
  if (!ok) return;  // given twice: a bug, but never a corrupted map
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

// ---------------------------------------------------------------- the link

result<void> remote_device::start(const std::weak_ptr<device_impl>& self) {
  const auto& iso = dev_.options.isolation;
  worker_options o;
  o.executable = iso.worker_executable;
  o.ordinal = dev_.ordinal;
  o.extra_args = iso.worker_args;
  o.budget = iso.budget;
  o.heartbeat = iso.heartbeat;
  o.heartbeat_timeout = iso.heartbeat_timeout;
  o.arena_bytes = iso.arena_bytes;
  o.rings = iso.rings;
  o.reply_spin = iso.reply_spin;
  o.start_timeout = iso.start_timeout;
  auto observer = [self](const worker_event& ev) {
    if (auto d = self.lock(); d && d->remote) d->remote->on_event(ev);
  };
  BOOST_OUTCOME_TRY(sup_, worker_supervisor::start(dev_.executor, std::move(o), observer));
  return outcome::success();
}

void remote_device::on_event(const worker_event& ev) {
  switch (ev.state) {
    case worker_state::starting:
      return;  // health is already starting (first) or restarting
    case worker_state::running: {
      const auto st = sup_ ? sup_->statistics() : worker_statistics{};
      if (st.device_status != 0) {
        dev_.remote_unavailable(
            make_error(errc::device_unavailable,
                       "isolated device " + std::to_string(dev_.ordinal) +
                           ": the worker could not open the GPU: " + st.device_message));
        return;
      }
      dev_.remote_health(health_state::healthy, std::nullopt);
      return;
    }
    case worker_state::failed:
      dev_.remote_health(health_state::poisoned, ev.error);
      return;
    case worker_state::restarting:
      dev_.remote_health(health_state::restarting, ev.error);
      return;
    case worker_state::stopped:
      dev_.remote_health(health_state::stopped, ev.error);
      return;
  }
}

void remote_device::shutdown() {
  std::shared_ptr<worker_supervisor> s;
  {
    std::lock_guard lk(mu_);
    s = std::move(sup_);
    arena_.reset();
  }
  // The supervisor's destructor kills and reaps a running worker.
}

void remote_device::stop() {
  if (sup_) sup_->stop();
}

clock::time_point remote_device::deadline(const completion& how) const {
  const auto& iso = dev_.options.isolation;
  const auto own = how.timeout == no_timeout
                       ? std::chrono::duration_cast<clock::duration>(iso.max_op_time)
                       : std::chrono::duration_cast<clock::duration>(how.timeout);
  return clock::now() + own + iso.hang_margin;
}

std::size_t remote_device::piece_bytes() const noexcept {
  // A quarter of the arena at most (four transfers progress at once), and
  // 16 MiB at most, so that a large download's pieces overlap its copies out.
  const std::size_t quarter = (dev_.options.isolation.arena_bytes / 4) & ~std::size_t{255};
  return std::clamp<std::size_t>(quarter, 256, std::size_t{16} << 20);
}

result<std::shared_ptr<arena_block>> remote_device::try_block(std::size_t bytes) {
  if (!sup_) return make_error(errc::device_unavailable, "the isolated device is shut down");
  std::shared_ptr<arena_space> a;
  {
    std::lock_guard lk(mu_);
    const auto now = sup_->arena();
    if (!now.data)
      return make_error(errc::device_unavailable, "the isolated device's worker has no arena");
    if (!arena_ || arena_->incarnation() != now.incarnation)
      arena_ = std::make_shared<arena_space>(now);
    a = arena_;
  }
  const std::size_t want = std::min(bytes, piece_bytes());
  auto off = a->take(want);
  if (!off) return std::shared_ptr<arena_block>{};
  return std::make_shared<arena_block>(a, *off, want);
}

result<void> remote_device::send_alloc(std::uint64_t handle, std::size_t count,
                                       std::uint32_t type) {
  wire::alloc_args a;
  a.handle = handle;
  a.count = count;
  a.type = type;
  if (sup_ && !sup_->notify_worker(static_cast<std::uint16_t>(wire::kind::call),
                                   static_cast<std::uint16_t>(wire::op_code::alloc),
                                   std::string(wire::bytes_of(a))))
    return make_error(errc::out_of_memory,
                      "allocate: " + std::to_string(wire::control_slots) +
                          " allocations and releases already wait for the isolated device's "
                          "worker (is it still starting?)");
  return outcome::success();
}

void remote_device::release(wire::release_kind k, std::uint64_t id) {
  if (sup_)
    sup_->notify_worker(static_cast<std::uint16_t>(wire::kind::release),
                        static_cast<std::uint16_t>(k), std::string(wire::bytes_of(id)));
}

worker_statistics remote_device::worker_stats() const {
  return sup_ ? sup_->statistics() : worker_statistics{};
}

wire::ref_arg ref_of(const buffer_state& st, std::size_t offset, std::size_t count) {
  return {st.remote_handle, offset, count};
}

// ---------------------------------------------------------------- one request

namespace {

using reply_t = result<std::vector<char>>;

/// One request's wait: the answer, the timer and the cancellation race for
/// it; the first one completes the waiter, the others find it done.
struct call_wait : std::enable_shared_from_this<call_wait> {
  explicit call_wait(const std::shared_ptr<device_impl>& d) : dev(d), executor(d->executor) {}

  // Weak: a parked request (its waiter gone after a timeout or a
  // cancellation) must not keep a dropped device, and so its worker, alive
  // until an answer that may never come. While the waiter waits, its
  // operation holds the device.
  std::weak_ptr<device_impl> dev;
  asio::any_io_executor executor;  // the device's
  // Only a request with a timeout has a timer (and the strand that
  // serialises its start and its cancellation): none on the common path.
  std::optional<asio::strand<asio::any_io_executor>> timer_strand;
  std::optional<asio::steady_timer> timer;
  std::mutex mu;
  bool done = false;       // the waiter has been completed
  bool abandoned = false;  // by a timeout or a cancellation: parked until the answer
  // Set once by emplace and taken by move construction: Boost 1.81's
  // any_completion_handler move assignment wraps its argument in another
  // handler, endlessly (it constructs from an lvalue), and overflows the stack.
  std::optional<asio::any_completion_handler<void(reply_t)>> handler;

  /// `answer`: from the worker (or its end), else the timer or a cancellation.
  void finish(reply_t r, bool answer) {
    std::optional<asio::any_completion_handler<void(reply_t)>> h;
    const auto d = dev.lock();
    {
      std::lock_guard lk(mu);
      if (done) {
        if (answer && abandoned) {
          abandoned = false;
          if (d) --d->parked_count;
        }
        return;
      }
      done = true;
      if (!answer) {
        abandoned = true;
        if (d) ++d->parked_count;
      }
      h.emplace(std::move(*handler));
      handler.reset();
    }
    if (d) {
      d->in_flight.add(-1);
      if (r)
        d->completed.add(1);
      else {
        d->failed.add(1);
        if (r.error().code() == errc::out_of_memory) ++d->oom;
      }
    }
    if (timer)
      asio::post(*timer_strand, [self = shared_from_this()] {
        if (self->timer) self->timer->cancel();
      });
    // Never inline (`finish` runs on the reply reader, an io thread polling
    // the reply rings, the supervisor's strand, a timer or a cancellation):
    // a post to the device's executor, then the waiter's own (inline when it
    // is the same io_context). A reply taken in a sweep of the reply rings
    // joins the sweep's batch instead (reply_batch.hpp), which posts it, or
    // runs it on the polling io thread once the sweep is over.
    auto ex = asio::get_associated_executor(*h, executor);
    auto resume = [h = std::move(*h), r = std::move(r), ex]() mutable {
      asio::dispatch(ex, asio::append(std::move(h), std::move(r)));
    };
    if (auto* batch = reply_batch::open(); batch && answer)
      batch->add(executor, reply_batch::completion(std::move(resume)));
    else
      asio::post(executor, std::move(resume));
  }
};

}  // namespace

namespace {

/// A request too large for a ring slot (a unit, a convolution with bias):
/// its payload goes into an arena block and a small op_code::indirect
/// request naming the block takes the ring, instead of the whole request
/// taking the socket (docs/design.md, "The request rings"). The block is
/// held until the answer. Left as it is when the arena has no block for it
/// or its incarnation is not the request's.
void indirect(remote_device& link, wire::op_code& op, std::string& payload,
              std::shared_ptr<void>& keep, std::uint64_t& inc) {
  auto got = link.try_block(payload.size());
  if (!got || !got.value() || got.value()->bytes() < payload.size()) return;
  auto b = std::move(got).value();
  if (inc != 0 && inc != b->incarnation()) return;
  std::memcpy(b->data(), payload.data(), payload.size());
  wire::indirect_args a;
  a.op = static_cast<std::uint16_t>(op);
  a.arena_offset = b->offset();
  a.size = payload.size();
  payload.assign(wire::bytes_of(a));
  op = wire::op_code::indirect;
  inc = b->incarnation();
  keep = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<arena_block>>>(
      std::move(keep), std::move(b));
}

/// One request sent to the worker and awaited (remote_call outside a unit).
asio::awaitable<result<std::vector<char>>> send_call(device_impl& d, wire::op_code op,
                                                     std::string payload, completion how,
                                                     std::shared_ptr<void> keep,
                                                     std::uint64_t inc) {
  auto self = d.shared_from_this();
  auto* link = d.remote.get();
  if (!link || !link->supervisor())
    co_return make_error(errc::device_unavailable, "the isolated device is shut down");
  if (payload.size() > wire::ring_payload) indirect(*link, op, payload, keep, inc);
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>, void(reply_t)>(
      [&](auto handler) {
        auto w = std::make_shared<call_wait>(self);
        auto slot = asio::get_associated_cancellation_slot(handler);
        w->handler.emplace(std::move(handler));
        d.in_flight.add(1);
        if (how.timeout != no_timeout) {
          w->timer_strand.emplace(asio::make_strand(d.executor));
          w->timer.emplace(*w->timer_strand, how.timeout);
          w->timer->async_wait([w](boost::system::error_code ec) {
            if (!ec)
              w->finish(make_error(errc::timeout,
                                   "the isolated device's request timed out (the "
                                   "GPU work goes on in the worker)"),
                        false);
          });
        }
        if (slot.is_connected())
          slot.assign([w](asio::cancellation_type) {
            w->finish(make_error(errc::cancelled,
                                 "the isolated device's request was cancelled "
                                 "(the GPU work goes on in the worker)"),
                      false);
          });
        link->supervisor()->call(
            static_cast<std::uint16_t>(op), std::move(payload), link->deadline(how), inc,
            [w, keep = std::move(keep)](reply_t r) mutable { w->finish(std::move(r), true); });
      },
      asio::use_awaitable);
}

/// A request made by a step of a composed unit: kept in the unit, sent with
/// its other requests as one message at its end (send_remote_unit).
result<std::vector<char>> queue_in_unit(unit_recorder& u, device_impl& d, wire::op_code op,
                                        std::string payload, std::shared_ptr<void> keep,
                                        std::uint64_t inc) {
  if (u.capture) return isolated_not_supported("record");
  if (std::string_view(u.name) == "record" &&
      (op == wire::op_code::upload || op == wire::op_code::download))
    return make_error(errc::not_supported,
                      "transfers to or from host memory cannot be recorded on an isolated device "
                      "(the worker's staging would not outlive the recording): upload into the "
                      "unit's buffers before replay() and download after it");
  if (u.remote_device && u.remote_device.get() != &d)
    return make_error(errc::not_supported,
                      "compose: the steps of one unit may use one isolated device only");
  if (inc != 0) {
    if (u.remote_incarnation != 0 && u.remote_incarnation != inc)
      return make_error(errc::stale_ref,
                        "the request's arena block belongs to an earlier worker (restarted)");
    u.remote_incarnation = inc;
  }
  if (!u.remote_device) u.remote_device = d.shared_from_this();
  u.remote_requests.push_back({static_cast<std::uint16_t>(op), u.step, std::move(payload)});
  if (keep) u.remote_keep.push_back(std::move(keep));
  return std::vector<char>{};
}

}  // namespace

asio::awaitable<result<std::vector<char>>> remote_call(device_impl& d, wire::op_code op,
                                                       std::string payload, completion how,
                                                       std::shared_ptr<void> keep,
                                                       std::uint64_t inc) {
  if (auto* u = unit_of(co_await asio::this_coro::executor))
    co_return queue_in_unit(*u, d, op, std::move(payload), std::move(keep), inc);
  co_return co_await send_call(d, op, std::move(payload), how, std::move(keep), inc);
}

namespace {

/// A unit's requests as one op_code::unit or op_code::record payload.
result<std::string> unit_payload(unit_recorder& rec, std::uint64_t handle) {
  std::string payload;
  wire::unit_head head;
  head.count = static_cast<std::uint32_t>(rec.remote_requests.size());
  head.steps = static_cast<std::uint32_t>(rec.step);
  head.handle = handle;
  payload.append(wire::bytes_of(head));
  for (const auto& q : rec.remote_requests) {
    wire::unit_entry e;
    e.op = q.op;
    e.step = static_cast<std::uint32_t>(q.step);
    e.size = static_cast<std::uint32_t>(q.payload.size());
    payload.append(wire::bytes_of(e));
    payload.append(q.payload);
  }
  rec.remote_requests.clear();
  if (payload.size() > wire::max_payload)
    return make_error(errc::invalid_argument,
                      std::string(rec.name) + ": " + std::to_string(head.count) +
                          " requests for an isolated device take " +
                          std::to_string(payload.size()) + " bytes, over the " +
                          std::to_string(wire::max_payload) + " one message may carry");
  return payload;
}

}  // namespace

asio::awaitable<result<void>> send_remote_unit(unit_recorder& rec, completion how) {
  auto dev = rec.remote_device;
  BOOST_OUTCOME_CO_TRY(auto payload, unit_payload(rec, 0));
  auto keep = std::make_shared<std::vector<std::shared_ptr<void>>>(std::move(rec.remote_keep));
  rec.remote_keep.clear();
  auto r = co_await send_call(*dev, wire::op_code::unit, std::move(payload), how, std::move(keep),
                              rec.remote_incarnation);
  if (!r) co_return r.error();
  co_return outcome::success();
}

asio::awaitable<result<std::uint64_t>> send_remote_record(unit_recorder& rec, std::uint64_t handle,
                                                          completion how) {
  if (!rec.remote_device)
    co_return make_error(errc::invalid_argument,
                         "record: no step made a request of the isolated device");
  auto dev = rec.remote_device;
  BOOST_OUTCOME_CO_TRY(auto payload, unit_payload(rec, handle));
  rec.remote_keep.clear();  // transfers are refused in a recording: nothing to keep
  auto r = co_await send_call(*dev, wire::op_code::record, std::move(payload), how, nullptr, 0);
  if (!r) co_return r.error();
  co_return reply_value<std::uint64_t>(r.value(), "record");
}

// ---------------------------------------------------------------- transfers

bool is_remote(const buffer_state* st) noexcept {
  return st && st->dev->remote != nullptr;
}

std::vector<health_state> health_history(const device_impl& d) {
  return d.health_history();
}

gpu_error isolated_not_supported(std::string_view what) {
  return make_error(errc::not_supported,
                    std::string(what) +
                        " is not available on an isolated device (docs/design.md, \"Isolated "
                        "device\": pinned host buffers and run_kernel run in process only)");
}

struct remote_staging {
  remote_view dst;
  std::size_t bytes = 0;
  /// Piece i covers bytes [i * piece, ...) of the data: in blocks[i] when
  /// the arena had room at the call, else in `rest` (from byte rest_from).
  std::vector<std::shared_ptr<arena_block>> blocks;
  std::vector<std::byte> rest;
  std::size_t rest_from = 0;
};

namespace {

result<void> check_view(std::string_view op, std::string_view arg, const remote_view& v) {
  BOOST_OUTCOME_TRY(check_buffer(v.st.get(), std::string(op) + ": " + std::string(arg)));
  if (!v.st->dev->remote)
    return make_error(errc::invalid_argument, std::string(op) + ": not remote");
  return outcome::success();
}

result<void> check_stream(std::string_view op, const remote_view& v, const stream& on) {
  if (on && on.state()->owner != v.st->dev.get())
    return make_error(errc::invalid_argument,
                      std::string(op) + ": the options' stream belongs to another device");
  return outcome::success();
}

result<completion> resolve_how(const remote_view& v, const std::optional<completion>& how) {
  const completion c = how.value_or(v.st->dev->options.default_completion);
  BOOST_OUTCOME_TRY(check_completion(c));
  return c;
}

/// A block of at least min(bytes, piece) bytes, waiting (100 us steps) while
/// the arena is full; an error when the device stops accepting work.
asio::awaitable<result<std::shared_ptr<arena_block>>> wait_block(device_impl& d,
                                                                 std::size_t bytes) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (;;) {
    BOOST_OUTCOME_CO_TRY(d.check_accepting());
    BOOST_OUTCOME_CO_TRY(auto b, d.remote->try_block(bytes));
    if (b) co_return b;
    t.expires_after(std::chrono::microseconds(100));
    boost::system::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return make_error(errc::cancelled, "cancelled while waiting for arena space");
  }
}

/// A block for a transfer inside a composed unit: the unit keeps its blocks
/// until its end, so one that does not fit now never will.
result<std::shared_ptr<arena_block>> unit_block(device_impl& d, std::size_t bytes) {
  BOOST_OUTCOME_TRY(auto b, d.remote->try_block(bytes));
  if (!b)
    return make_error(errc::out_of_memory,
                      "compose: the transfers of one unit on an isolated device must fit its "
                      "arena together (isolation_options::arena_bytes, " +
                          std::to_string(d.options.isolation.arena_bytes) + " bytes)");
  return b;
}

std::string transfer_payload(const remote_view& v, std::size_t elem_off, std::size_t elems,
                             const arena_block& b) {
  wire::transfer_args a;
  a.ref = ref_of(*v.st, v.offset + elem_off, elems);
  a.arena_offset = b.offset();
  a.type = static_cast<std::uint32_t>(v.st->type);
  return std::string(wire::bytes_of(a));
}

}  // namespace

result<std::shared_ptr<remote_staging>> remote_stage_upload(const remote_view& dst, const void* src,
                                                            std::size_t bytes, const stream& on) {
  BOOST_OUTCOME_TRY(check_view("upload", "dst", dst));
  BOOST_OUTCOME_TRY(check_stream("upload", dst, on));
  auto s = std::make_shared<remote_staging>();
  s->dst = dst;
  s->bytes = bytes;
  auto& link = *dst.st->dev->remote;
  const std::size_t piece = link.piece_bytes();
  const auto* from = static_cast<const std::byte*>(src);
  std::size_t at = 0;
  while (at < bytes) {
    const std::size_t n = std::min(piece, bytes - at);
    BOOST_OUTCOME_TRY(auto b, link.try_block(n));
    if (!b) break;  // the arena is full: the rest waits in host memory
    s->blocks.push_back(std::move(b));
    at += n;
  }
  for_each_run(s->blocks, at, [&](std::byte* arena, std::size_t off, std::size_t n) {
    std::memcpy(arena, from + off, n);
  });
  if (at < bytes) {
    s->rest_from = at;
    s->rest.assign(from + at, from + bytes);
  }
  return s;
}

asio::awaitable<result<void>> remote_upload(std::shared_ptr<remote_staging> s,
                                            std::optional<completion> how) {
  auto& d = *s->dst.st->dev;
  auto* unit = unit_of(co_await asio::this_coro::executor);
  BOOST_OUTCOME_CO_TRY(auto c, resolve_how(s->dst, how));
  const std::size_t es = size_of(s->dst.st->type);
  const std::size_t piece = d.remote->piece_bytes();
  std::size_t at = 0;
  for (std::size_t i = 0; at < s->bytes; ++i) {
    BOOST_OUTCOME_CO_TRY(check_view("upload", "dst", s->dst));
    std::shared_ptr<arena_block> b;
    if (i < s->blocks.size()) {
      b = std::move(s->blocks[i]);
    } else {
      const std::size_t want = std::min(piece, s->bytes - at);
      if (unit) {  // the unit holds its blocks until its end: waiting could never end
        BOOST_OUTCOME_CO_TRY(b, unit_block(d, want));
      } else {
        BOOST_OUTCOME_CO_TRY(b, co_await wait_block(d, want));
      }
      std::memcpy(b->data(), s->rest.data() + (at - s->rest_from), b->bytes());
    }
    const std::size_t n = std::min(b->bytes(), s->bytes - at);
    auto payload = transfer_payload(s->dst, at / es, n / es, *b);
    const auto inc = b->incarnation();
    BOOST_OUTCOME_CO_TRY(
        co_await remote_call(d, wire::op_code::upload, std::move(payload), c, std::move(b), inc));
    at += n;
  }
  co_return outcome::success();
}

asio::awaitable<result<void>> remote_download(remote_view src, void* dst, std::size_t bytes,
                                              const stream& on, std::optional<completion> how) {
  BOOST_OUTCOME_CO_TRY(check_view("download", "src", src));
  BOOST_OUTCOME_CO_TRY(check_stream("download", src, on));
  BOOST_OUTCOME_CO_TRY(auto c, resolve_how(src, how));
  auto& d = *src.st->dev;
  auto* out = static_cast<std::byte*>(dst);
  const std::size_t es = size_of(src.st->type);
  if (auto* unit = unit_of(co_await asio::this_coro::executor)) {
    // In a unit: each piece's request joins the unit's message, and its
    // bytes are copied out (the unit's copies_out) only once the whole
    // unit succeeded (so `dst` is written only then).
    for (std::size_t at = 0; at < bytes;) {
      BOOST_OUTCOME_CO_TRY(auto b, unit_block(d, bytes - at));
      const std::size_t n = std::min(b->bytes(), bytes - at);
      auto payload = transfer_payload(src, at / es, n / es, *b);
      const auto inc = b->incarnation();
      BOOST_OUTCOME_CO_TRY(
          co_await remote_call(d, wire::op_code::download, std::move(payload), c, b, inc));
      unit->copies_out.push_back({b, b->data(), out + at, n});
      at += n;
    }
    co_return outcome::success();
  }
  // In rounds: as many pieces as the arena has room for now (one at least,
  // waited for), each piece's DMA, then the copy out of them all (one
  // memcpy where the blocks are adjacent: for_each_run). The DMA is several
  // times faster than the host copy, so one large copy beats overlapping
  // small ones with the DMA (docs/design.md, the arena).
  std::size_t at = 0;
  std::vector<std::shared_ptr<arena_block>> round;
  while (at < bytes) {
    round.clear();
    BOOST_OUTCOME_CO_TRY(auto first, co_await wait_block(d, bytes - at));
    std::size_t span = std::min(first->bytes(), bytes - at);
    round.push_back(std::move(first));
    while (at + span < bytes) {
      BOOST_OUTCOME_CO_TRY(auto b, d.remote->try_block(bytes - at - span));
      if (!b) break;
      span += std::min(b->bytes(), bytes - at - span);
      round.push_back(std::move(b));
    }
    std::size_t p = at;
    for (const auto& b : round) {
      const std::size_t n = std::min(b->bytes(), bytes - p);
      auto payload = transfer_payload(src, p / es, n / es, *b);
      BOOST_OUTCOME_CO_TRY(co_await remote_call(d, wire::op_code::download, std::move(payload), c,
                                                b, b->incarnation()));
      p += n;
    }
    for_each_run(round, span, [&](std::byte* arena, std::size_t off, std::size_t n) {
      std::memcpy(out + at + off, arena, n);
    });
    at += span;
  }
  co_return outcome::success();
}

asio::awaitable<result<void>> remote_copy(remote_view src, remote_view dst, const stream& on,
                                          std::optional<completion> how) {
  BOOST_OUTCOME_CO_TRY(check_view("copy", "src", src));
  BOOST_OUTCOME_CO_TRY(check_view("copy", "dst", dst));
  BOOST_OUTCOME_CO_TRY(check_stream("copy", dst, on));
  if (src.st->dev != dst.st->dev)
    co_return make_error(errc::invalid_argument, "copy: source and destination on two devices");
  BOOST_OUTCOME_CO_TRY(auto c, resolve_how(dst, how));
  wire::copy_args a;
  a.src = ref_of(*src.st, src.offset, src.count);
  a.dst = ref_of(*dst.st, dst.offset, dst.count);
  a.type = static_cast<std::uint32_t>(dst.st->type);
  BOOST_OUTCOME_CO_TRY(co_await remote_call(*dst.st->dev, wire::op_code::copy,
                                            std::string(wire::bytes_of(a)), c, nullptr));
  co_return outcome::success();
}

asio::awaitable<result<void>> remote_fill(remote_view dst, unsigned char value, const stream& on,
                                          std::optional<completion> how) {
  BOOST_OUTCOME_CO_TRY(check_view("fill_bytes", "dst", dst));
  BOOST_OUTCOME_CO_TRY(check_stream("fill_bytes", dst, on));
  BOOST_OUTCOME_CO_TRY(auto c, resolve_how(dst, how));
  wire::fill_args a;
  a.dst = ref_of(*dst.st, dst.offset, dst.count);
  a.type = static_cast<std::uint32_t>(dst.st->type);
  a.value = value;
  BOOST_OUTCOME_CO_TRY(co_await remote_call(*dst.st->dev, wire::op_code::fill_bytes,
                                            std::string(wire::bytes_of(a)), c, nullptr));
  co_return outcome::success();
}

asio::awaitable<result<void>> inject_isolated_fault(std::shared_ptr<device_impl> dev,
                                                    std::uint16_t kind, completion how) {
  if (!dev || !dev->remote || !dev->remote->supervisor())
    co_return make_error(errc::invalid_argument, "inject_isolated_fault: not an isolated device");
  const auto k = static_cast<wire::fault_kind>(kind);
  if (k != wire::fault_kind::illegal_address && k != wire::fault_kind::hang_kernel) {
    dev->remote->supervisor()->inject_fault(kind);
    co_return outcome::success();
  }
  BOOST_OUTCOME_CO_TRY(co_await remote_call(*dev, wire::op_code::fault,
                                            std::string(wire::bytes_of(kind)), how, nullptr));
  co_return outcome::success();
}

}  // namespace atomr::cuda::detail
