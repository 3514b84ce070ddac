// atomr-serve: a deadline for one composed socket operation (a whole HTTP
// read or write, which Beast performs as several read_some or write_some
// calls).
#pragma once

#include <boost/asio/append.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>

namespace serve {

/// A socket as one composed operation sees it: each read_some or
/// write_some goes to the socket, unless the operation's deadline has
/// expired, when it fails at once with operation_aborted. Cancelling the
/// socket ends a call that is pending when the deadline expires; this ends
/// the ones a composed operation starts after it (the deadline may expire
/// between two calls, where there is nothing pending to cancel). Used from
/// the socket's strand only, as the deadline's timer is.
class deadline_socket {
public:
  using executor_type = boost::asio::ip::tcp::socket::executor_type;

  deadline_socket(boost::asio::ip::tcp::socket& s, const bool& expired)
      : s_(s), expired_(expired) {}

  executor_type get_executor() noexcept { return s_.get_executor(); }

  template <class Buffers, class Token>
  auto async_read_some(const Buffers& b, Token&& token) {
    return call<true>(b, std::forward<Token>(token));
  }
  template <class Buffers, class Token>
  auto async_write_some(const Buffers& b, Token&& token) {
    return call<false>(b, std::forward<Token>(token));
  }

private:
  template <bool Read, class Buffers, class Token>
  auto call(const Buffers& b, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::system::error_code, std::size_t)>(
        [this](auto handler, const Buffers& bufs) {
          if (expired_) {
            // Completes through the handler's own executor and allocator,
            // never inside this call.
            boost::asio::post(
                s_.get_executor(),
                boost::asio::append(std::move(handler), boost::asio::error::operation_aborted,
                                    std::size_t{0}));
          } else if constexpr (Read) {
            s_.async_read_some(bufs, std::move(handler));
          } else {
            s_.async_write_some(bufs, std::move(handler));
          }
        },
        token, b);
  }

  boost::asio::ip::tcp::socket& s_;
  const bool& expired_;
};

/// Runs `op(deadline_socket&)` (a coroutine on `s`'s executor that reads
/// from or writes to `s` through the deadline_socket it is given) with a
/// deadline of `limit`. Yields the operation's error and whether the
/// deadline expired (an operation that finished just as it expired can
/// have both no error and the flag set). The socket stays open: after a
/// read's deadline a 408 can still be written.
template <class Op>
boost::asio::awaitable<std::pair<boost::system::error_code, bool>> with_deadline(
    std::shared_ptr<boost::asio::ip::tcp::socket> s, std::chrono::milliseconds limit, Op op) {
  struct state {
    bool finished = false, expired = false;
  };
  auto st = std::make_shared<state>();
  boost::asio::steady_timer t(s->get_executor(), limit);
  t.async_wait([st, s](boost::system::error_code ec) {
    if (ec || st->finished) return;
    st->expired = true;
    boost::system::error_code e;
    s->cancel(e);
  });
  deadline_socket guarded(*s, st->expired);
  auto ec = co_await op(guarded);
  st->finished = true;
  t.cancel();
  co_return std::pair{ec, st->expired};
}

}  // namespace serve
