// Completion tokens: the library's awaitable operations as Asio asynchronous
// operations, usable with any completion token (callbacks, use_future,
// deferred, use_awaitable, awaitable operators), as Asio's own operations are.
#pragma once

#include <atomr/cuda/error.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/associator.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_state.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/system/system_error.hpp>

#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace atomr::cuda {

namespace asio = boost::asio;

/// A completion token for an operation that completes with void(result<R>):
/// a callback taking result<R>, asio::use_future, asio::deferred,
/// asio::use_awaitable, asio::detached, or any of them wrapped (bind_executor,
/// bind_cancellation_slot, ...). Plain values (numbers, option structs,
/// buffers, enqueue functions) never satisfy it, so an overload ending in a
/// token cannot capture an ordinary trailing argument.
template <class Token, class R>
concept result_token = asio::completion_token_for<Token, void(result<R>)>;

namespace detail {

/// The gpu_error that an exception escaping an awaited operation stands for:
/// operation_aborted (what a co_await inside a cancelled coroutine throws) is
/// cancelled, bad_alloc is out_of_memory, a gpu_exception keeps its error,
/// anything else is unrecoverable with its what().
inline gpu_error error_from_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const gpu_exception& x) {
    return x.error();
  } catch (const boost::system::system_error& x) {
    if (x.code() == asio::error::operation_aborted)
      return make_error(errc::cancelled, std::string("operation cancelled: ") + x.what());
    return make_error(errc::unrecoverable, std::string("operation threw: ") + x.what());
  } catch (const std::bad_alloc& x) {
    return make_error(errc::out_of_memory, std::string("host allocation failed: ") + x.what());
  } catch (const std::exception& x) {
    return make_error(errc::unrecoverable, std::string("operation threw: ") + x.what());
  } catch (...) {
    return make_error(errc::unrecoverable, "operation threw an exception of unknown type");
  }
}

/// The cancellation of one operation started through a token: the handler's
/// slot forwards into `to_op`, whose slot is the spawned coroutine's. Until
/// the coroutine has started, an emission is only recorded (`pending`), and
/// the coroutine then completes with cancelled without starting the
/// operation: a cancellation that reaches a co_spawned coroutine before it
/// starts would otherwise throw out of the executor's run() and the handler
/// would never be called (Boost 1.81 and 1.83). Touched only on the spawn
/// executor.
struct cancel_bridge {
  asio::cancellation_signal to_op;
  asio::cancellation_type_t pending = asio::cancellation_type::none;
  bool started = false;
  bool finished = false;
};

/// What the handler's cancellation slot holds: hands each emission to the
/// bridge on the spawn executor (Asio's cancellation is not thread-safe).
class forward_cancellation {
public:
  forward_cancellation(std::shared_ptr<cancel_bridge> b, asio::any_io_executor where)
      : bridge_(std::move(b)), where_(std::move(where)) {}

  void operator()(asio::cancellation_type_t type) {
    asio::dispatch(where_, [b = bridge_, type] {
      if (b->finished) return;
      if (b->started)
        b->to_op.emit(type);
      else
        b->pending |= type;
    });
  }

private:
  std::shared_ptr<cancel_bridge> bridge_;
  asio::any_io_executor where_;
};

/// What co_spawn runs for async_from: awaits `op` with every cancellation type
/// let through to its waits (a spawned coroutine lets only terminal ones
/// through by default). The value is an optional because co_spawn needs a
/// default-constructible one, which result<R> is not.
template <class R>
asio::awaitable<std::optional<result<R>>> await_into_optional(asio::awaitable<result<R>> op,
                                                              std::shared_ptr<cancel_bridge> b) {
  co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
  struct mark_finished {
    cancel_bridge* b;
    ~mark_finished() {
      if (b) b->finished = true;
    }
  } finish{b.get()};
  if (b) {
    b->started = true;
    if (b->pending != asio::cancellation_type::none)
      co_return result<R>(
          outcome::failure(make_error(errc::cancelled, "operation cancelled before it started")));
  }
  co_return std::optional<result<R>>(co_await std::move(op));
}

/// co_spawn's completion handler for async_from: turns co_spawn's
/// (exception, value) into the one result<R> the user's handler gets. Its
/// associated executor, allocator and cancellation slot are the user
/// handler's (see the associator below; async_from binds the slot to the
/// cancel_bridge instead when the user's is connected), so co_spawn
/// completes on the handler's executor. `keep` holds the cancel_bridge,
/// whose signal co_spawn's coroutine uses, until co_spawn is done with it.
template <class R, class Handler>
class deliver_result {
public:
  deliver_result(Handler h, std::shared_ptr<void> keep)
      : handler_(std::move(h)), keep_(std::move(keep)) {}

  void operator()(std::exception_ptr e, std::optional<result<R>> r) {
    if (e) {
      std::move(handler_)(result<R>(outcome::failure(error_from_exception(std::move(e)))));
    } else if (r) {
      std::move(handler_)(std::move(*r));
    } else {  // co_spawn gives a value whenever it gives no exception
      std::move(handler_)(result<R>(outcome::failure(
          make_error(errc::unrecoverable, "async_from: the operation ended without a result"))));
    }
  }

  Handler handler_;

private:
  std::shared_ptr<void> keep_;
};

/// Where an operation started through a token runs: the handler's own
/// associated executor (a strand it is bound to, the awaiting coroutine's
/// executor), unless it has none or it belongs to the system context (Asio's
/// default for handlers without one, and use_future's promise executor); then
/// `ex` (the device's), and a strand of the system executor only when there
/// is no `ex` either.
template <class Handler>
asio::any_io_executor spawn_executor(const Handler& h, const asio::any_io_executor& ex) {
  const asio::any_io_executor system = asio::system_executor();
  using own_type = asio::associated_executor_t<Handler, asio::any_io_executor>;
  if constexpr (std::is_convertible_v<own_type, asio::any_io_executor>) {
    asio::any_io_executor own = asio::get_associated_executor(h, ex ? ex : system);
    if (own && &asio::query(own, asio::execution::context) !=
                   &asio::query(system, asio::execution::context))
      return own;
  }
  if (ex) return ex;
  return asio::make_strand(asio::system_executor());
}

template <class R>
class initiate_async_from {
public:
  using executor_type = asio::any_io_executor;

  explicit initiate_async_from(asio::any_io_executor ex) : ex_(std::move(ex)) {}

  executor_type get_executor() const noexcept {
    return ex_ ? ex_ : asio::any_io_executor(asio::system_executor());
  }

  template <class Handler>
  void operator()(Handler&& handler, asio::awaitable<result<R>> op) const {
    using deliver_type = deliver_result<R, std::decay_t<Handler>>;
    auto where = spawn_executor(handler, ex_);
    auto slot = asio::get_associated_cancellation_slot(handler);
    if (!slot.is_connected()) {
      asio::co_spawn(where, await_into_optional<R>(std::move(op), nullptr),
                     deliver_type(std::forward<Handler>(handler), nullptr));
      return;
    }
    auto bridge = std::make_shared<cancel_bridge>();
    slot.template emplace<forward_cancellation>(bridge, where);
    auto to_op = bridge->to_op.slot();
    asio::co_spawn(
        where, await_into_optional<R>(std::move(op), bridge),
        asio::bind_cancellation_slot(to_op, deliver_type(std::forward<Handler>(handler), bridge)));
  }

private:
  asio::any_io_executor ex_;
};

}  // namespace detail

/// Runs the awaitable `op` as an Asio asynchronous operation with completion
/// signature void(result<R>), so that any completion token works with it.
/// The initiation co_spawns `op` on the handler's associated executor, or on
/// `ex` when the handler has none of its own or only one of the system
/// context (use_future's), or on a strand of the system executor when `ex`
/// is empty too; the handler is then called exactly once with the result, on
/// its associated executor, never from within the initiating call. The
/// handler's cancellation slot reaches the waits inside `op` (terminal,
/// partial and total; a cancelled wait yields errc::cancelled); a
/// cancellation before `op` started yields cancelled without starting it.
/// An exception escaping `op` becomes a gpu_error (detail::error_from_exception).
/// As with every Asio operation, the handler is not called if the execution
/// context is destroyed first. What `op` refers to must stay valid until the
/// handler is called. Costs one co_spawn (two coroutine frames, a
/// dispatch) on top of `op`: plain `co_await op` stays the fast path.
template <class R, result_token<R> Token>
auto async_from(asio::any_io_executor ex, asio::awaitable<result<R>> op, Token&& token) {
  return asio::async_initiate<Token, void(result<R>)>(detail::initiate_async_from<R>(std::move(ex)),
                                                      token, std::move(op));
}

namespace detail {

/// Awaits `make(self)` in a frame that owns a copy of the actor `self`: the
/// operation never refers to the caller's actor object, which a callback's
/// caller may drop as soon as the initiating call returns.
template <class Actor, class Make>
auto await_on_copy(Actor self, Make make) -> std::invoke_result_t<Make&, const Actor&> {
  co_return co_await make(std::as_const(self));
}

/// An actor's awaitable operation `make(actor)` through `token`, on the
/// actor's device executor (async_from). Every token overload of the actors
/// forwards here.
template <class Actor, class Token, class Make>
auto async_actor_op(const Actor& actor, Token&& token, Make make) {
  return async_from(actor.get_device().get_executor(), await_on_copy(actor, std::move(make)),
                    std::forward<Token>(token));
}

}  // namespace detail

}  // namespace atomr::cuda

namespace boost::asio {
/// deliver_result has its user handler's associated executor, allocator,
/// cancellation slot (and whatever else Asio associates with a handler).
template <template <class, class> class Associator, class R, class Handler, class Default>
struct associator<Associator, atomr::cuda::detail::deliver_result<R, Handler>, Default>
    : Associator<Handler, Default> {
  static typename Associator<Handler, Default>::type get(
      const atomr::cuda::detail::deliver_result<R, Handler>& h) noexcept {
    return Associator<Handler, Default>::get(h.handler_);
  }
  static auto get(const atomr::cuda::detail::deliver_result<R, Handler>& h,
                  const Default& d) noexcept
      -> decltype(Associator<Handler, Default>::get(h.handler_, d)) {
    return Associator<Handler, Default>::get(h.handler_, d);
  }
};
}  // namespace boost::asio
