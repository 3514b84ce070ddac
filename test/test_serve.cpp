// atomr-serve (samples/serve/) as a user's service meets it, without needing
// a GPU: it starts on a device that is not there (ordinal 99), answers
// /health and /metrics, rejects every kind of bad request with the documented
// status and a message, keeps serving after each, and shuts down cleanly.
// Issue 21. Also the sample's JSON reader and model reference.
#include "../samples/serve/deadline.hpp"
#include "../samples/serve/json.hpp"
#include "../samples/serve/model.hpp"
#include "../samples/serve/service.hpp"
#include "utf8_check.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using serve_test::printable;
using serve_test::valid_utf8;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

/// A blocking HTTP client on one keep-alive connection (10 s socket timeouts:
/// a service that never answers fails the test instead of hanging it).
struct client {
  asio::io_context io;
  tcp::socket s{io};
  beast::flat_buffer buf;

  explicit client(unsigned short port) {
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    timeval tv{10, 0};
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  http::response<http::string_body> read() {
    http::response_parser<http::string_body> p;
    p.body_limit(64u << 20);
    http::read(s, buf, p);
    return p.release();
  }
  http::response<http::string_body> send(http::verb v, std::string target, std::string body = {},
                                         std::string type = "application/json",
                                         std::string shape = {}) {
    http::request<http::string_body> req{v, target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!body.empty() || v == http::verb::post) {
      req.set(http::field::content_type, type);
      req.body() = std::move(body);
    }
    if (!shape.empty()) req.set("X-Shape", shape);
    req.keep_alive(true);
    req.prepare_payload();
    http::write(s, req);
    return read();
  }
};

/// The error body's message.
std::string message_of(const std::string& body) {
  std::string err;
  serve::json::reader r(body);
  auto v = r.parse(err);
  if (!v) return "(not JSON: " + body + ")";
  const auto* m = v->find("error");
  return m ? std::get<std::string>(m->v) : "(no error member)";
}

/// A service on ordinal 99 (no such GPU anywhere; $ATOMR_SERVE_DEVICE picks
/// a real one: the GPU suite runs the bad-request cases against a working
/// device too), port 0, on 2 io threads.
struct serve_fixture {
  asio::io_context ioc{2};
  serve::options o;
  std::optional<serve::service> svc;
  std::vector<std::thread> threads;

  serve_fixture() {
    o.port = 0;
    const char* d = std::getenv("ATOMR_SERVE_DEVICE");
    o.device = d && *d ? std::atoi(d) : 99;
    o.read_timeout = 300ms;
    o.body_limit = 4096;
    o.json_limit = 3000;
    svc.emplace(ioc, o);
    auto err = svc->start();
    REQUIRE_MESSAGE(!err, (err ? *err : ""));
    for (int i = 0; i < 2; ++i) threads.emplace_back([this] { ioc.run(); });
  }
  /// True (with a SKIP line) when ATOMR_SERVE_DEVICE names a device: the
  /// cases about a missing device then have nothing to check.
  bool device_named() const {
    if (o.device == 99) return false;
    MESSAGE("SKIP: ATOMR_SERVE_DEVICE names a device; this case is about a missing one");
    return true;
  }
  ~serve_fixture() {
    svc->stop();
    for (auto& t : threads) t.join();  // returns once the service let go of everything
  }
};

}  // namespace

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve without its GPU: /health says why (503), GPU requests get 503 "
                  "device_unavailable, /metrics counts them") {
  if (device_named()) return;  // about a missing device
  client c(svc->port());
  auto h = c.send(http::verb::get, "/health");
  CHECK(h.result_int() == 503);
  std::string err;
  serve::json::reader r(h.body());
  auto v = r.parse(err);
  REQUIRE_MESSAGE(v, err);
  CHECK(std::get<std::string>(v->find("health")->v) == "unavailable");
  CHECK(std::get<bool>(v->find("accepting")->v) == false);
  CHECK_FALSE(std::get<std::string>(v->find("status")->v).empty());

  auto g =
      c.send(http::verb::post, "/v1/gemm", R"({"m":2,"n":2,"k":2,"a":[1,2,3,4],"b":[1,0,0,1]})");
  CHECK(g.result_int() == 503);
  CHECK(g.body().find("\"code\":\"device_unavailable\"") != std::string::npos);

  auto m = c.send(http::verb::get, "/metrics");
  CHECK(m.result_int() == 200);
  CHECK(m[http::field::content_type].starts_with("text/plain"));
  CHECK(m.body().find("atomr_serve_requests_total{endpoint=\"gemm\",code=\"503\"} 1") !=
        std::string::npos);
  CHECK(m.body().find("atomr_serve_requests_total{endpoint=\"health\",code=\"503\"} 1") !=
        std::string::npos);
  CHECK(m.body().find("atomr_device_health{state=\"unavailable\"} 1") != std::string::npos);
  // Threads: none of the device's own without a GPU, and no worker process.
  CHECK(m.body().find("\natomr_device_library_threads 0\n") != std::string::npos);
  CHECK(m.body().find("\natomr_device_blocking_threads 0\n") != std::string::npos);
  CHECK(m.body().find("\natomr_device_worker_threads 0\n") != std::string::npos);
  CHECK(m.body().find("atomr_serve_request_seconds_bucket{endpoint=\"gemm\",le=\"+Inf\"} 1") !=
        std::string::npos);
}

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve: each bad request gets its 4xx and a message, on the same "
                  "connection, and the service keeps serving") {
  client c(svc->port());
  struct bad_case {
    http::verb verb;
    std::string target, body, type, shape;
    int status;
    std::string says;
  };
  const std::string json = "application/json", raw = "application/octet-stream";
  const std::vector<bad_case> cases = {
      {http::verb::post, "/v1/gemm", R"({"m":2,"n":2)", json, "", 400, "malformed JSON"},
      {http::verb::post, "/v1/gemm", R"({"m":2,"n":2,"k":2,"a":[1,2,3],"b":[1,0,0,1]})", json, "",
       400, "\"a\" has 3 numbers, the shape needs 4"},
      {http::verb::post, "/v1/gemm", R"({"m":0,"n":2,"k":2,"a":[],"b":[1,0,0,1]})", json, "", 400,
       "\"m\" must be an integer in 1..4096"},
      {http::verb::post, "/v1/gemm", R"({"m":5000,"n":1,"k":1,"a":[1],"b":[1]})", json, "", 400,
       "\"m\" must be an integer in 1..4096"},
      {http::verb::post, "/v1/gemm", R"({"m":1,"n":1,"k":1,"a":["x"],"b":[1]})", json, "", 400,
       "\"a\"[0] is not a number"},
      {http::verb::post, "/v1/gemm", R"({"m":1,"n":1,"k":1,"a":[1e39],"b":[1]})", json, "", 400,
       "does not fit a float"},
      {http::verb::post, "/v1/gemm", "abcd", raw, "2,2", 400, "X-Shape must hold 3"},
      {http::verb::post, "/v1/gemm", "abcd", raw, "1,1,1", 400, "needs (m*k + k*n) * 4 = 8"},
      {http::verb::post, "/v1/gemm", "abcd", raw, "1,-1,1", 400, "X-Shape must hold 3"},
      {http::verb::post, "/v1/fft", R"({"n":4,"re":[1,2,3,4],"im":[0,0]})", json, "", 400,
       "\"im\" has 2 numbers"},
      {http::verb::post, "/v1/fft", "abc", raw, "1", 400, "needs n * 8"},
      // Media types are case-insensitive: raw, not "malformed JSON".
      {http::verb::post, "/v1/fft", "abc", "Application/Octet-Stream", "1", 400, "needs n * 8"},
      {http::verb::post, "/v1/infer", R"({"x":[1,2,3]})", json, "", 400,
       "\"x\" has 3 numbers, the shape needs 784"},
      {http::verb::post, "/v1/infer", "abcd", raw, "", 400, "the model takes 784 f32"},
      // Over json_limit (3000) as JSON: 413 without parsing; the same size raw is read.
      {http::verb::post, "/v1/fft", "[" + std::string(3100, ' ') + "]", json, "", 413,
       "a JSON body is larger than the limit of 3000 bytes"},
      {http::verb::post, "/v1/fft", std::string(3100, 'x'), raw, "1", 400, "needs n * 8"},
      {http::verb::get, "/v1/gemm", "", json, "", 405, "use POST"},
      {http::verb::post, "/health", "", json, "", 405, "use GET /health"},
      {http::verb::get, "/nowhere", "", json, "", 404, "no such endpoint: /nowhere"},
      // Fault injection exists only with --test-faults.
      {http::verb::post, "/v1/fault?kind=abort", "", json, "", 404, "no such endpoint"},
  };
  for (const auto& b : cases) {
    CAPTURE(b.target);
    CAPTURE(b.body);
    auto res = c.send(b.verb, b.target, b.body, b.type, b.shape);
    CHECK(res.result_int() == b.status);
    const auto msg = message_of(res.body());
    CHECK_MESSAGE(msg.find(b.says) != std::string::npos, msg);
  }
  // Still serving, on the same connection (the device's state unchanged).
  const int health = c.send(http::verb::get, "/health").result_int();
  CHECK(health == (svc->device().accepting() ? 200 : 503));
  const auto st = svc->stats();
  CHECK(st.client_errors == cases.size());
  CHECK(st.ok + st.server_errors == 1);  // the /health above
}

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve: a body over the limit gets 413, a stalled client 408, a "
                  "malformed request 400; each closes only its own connection") {
  {
    client c(svc->port());
    auto res = c.send(http::verb::post, "/v1/gemm", std::string(5000, ' '));
    CHECK(res.result_int() == 413);
    CHECK(message_of(res.body()).find("larger than the limit of 4096 bytes") != std::string::npos);
  }
  {
    // Half a request, then silence: 408 after the read timeout (300 ms).
    client c(svc->port());
    const std::string partial =
        "POST /v1/gemm HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"m\":";
    asio::write(c.s, asio::buffer(partial));
    const auto t0 = std::chrono::steady_clock::now();
    auto res = c.read();
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(res.result_int() == 408);
    CHECK(message_of(res.body()).find("did not arrive within 300 ms") != std::string::npos);
    CHECK(took >= 250ms);
    CHECK(took < 5s);
    CHECK_FALSE(res.keep_alive());
  }
  {
    client c(svc->port());
    asio::write(c.s, asio::buffer(std::string("THIS IS NOT HTTP\r\n\r\n")));
    auto res = c.read();
    CHECK(res.result_int() == 400);
    CHECK(message_of(res.body()).find("malformed HTTP request") != std::string::npos);
  }
  {
    // Two requests in one write (pipelined): two answers, in order.
    client c(svc->port());
    const std::string two =
        "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    asio::write(c.s, asio::buffer(two));
    CHECK(c.read().result_int() == 404);
    CHECK(c.read().result_int() == (svc->device().accepting() ? 200 : 503));
  }
  client again(svc->port());
  CHECK(again.send(http::verb::get, "/metrics").result_int() == 200);
}

TEST_CASE(
    "atomr-serve's deadline ends a read or a write that expires between two of its socket "
    "calls, where there is nothing pending to cancel") {
  // Beast reads a request and writes a response as several read_some or
  // write_some calls on the stream it is given. The op below does what such
  // a composed operation does, with its gap made long: one call that
  // completes, a pause past the deadline (no call pending, so cancelling the
  // socket finds nothing), then a call the peer never satisfies. The
  // deadline must still end it.
  for (const bool reading : {true, false}) {
    CAPTURE(reading);
    asio::io_context ioc;
    tcp::acceptor acc(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    tcp::socket peer(ioc);
    peer.connect(acc.local_endpoint());
    auto s = std::make_shared<tcp::socket>(acc.accept());
    // The peer sends one byte (the first read's) and then neither sends nor
    // reads: a write of 64 MiB fills the socket buffers and waits.
    asio::write(peer, asio::buffer("x", 1));
    std::pair<boost::system::error_code, bool> got{};
    bool finished = false;
    auto op = [&](serve::deadline_socket& g) -> asio::awaitable<boost::system::error_code> {
      char byte = 0;
      auto [e1, n1] =
          co_await g.async_read_some(asio::buffer(&byte, 1), asio::as_tuple(asio::use_awaitable));
      if (e1 || n1 != 1) co_return e1 ? e1 : asio::error::eof;
      asio::steady_timer gap(s->get_executor(), 150ms);
      co_await gap.async_wait(asio::as_tuple(asio::use_awaitable));
      if (reading) {
        auto [e2, n2] =
            co_await g.async_read_some(asio::buffer(&byte, 1), asio::as_tuple(asio::use_awaitable));
        (void)n2;
        co_return e2 ? e2 : asio::error::message_size;  // a byte nobody sent
      }
      std::vector<char> big(std::size_t{64} << 20);
      auto [e2, n2] =
          co_await asio::async_write(g, asio::buffer(big), asio::as_tuple(asio::use_awaitable));
      (void)n2;
      co_return e2;
    };
    asio::co_spawn(
        ioc,
        [&]() -> asio::awaitable<void> {
          got = co_await serve::with_deadline(s, 50ms, op);
          finished = true;
        },
        asio::detached);
    const auto t0 = std::chrono::steady_clock::now();
    ioc.run_for(3s);  // without the guard the op waits for the peer: the whole 3 s
    const auto took = std::chrono::steady_clock::now() - t0;
    REQUIRE(finished);
    CHECK(got.second);  // the deadline expired
    CHECK(got.first == asio::error::operation_aborted);
    CHECK(took < 2s);
    // The socket is still open: a 408 can go out after a read's deadline.
    if (reading) {
      asio::write(*s, asio::buffer("408", 3));
      char back[3] = {};
      asio::read(peer, asio::buffer(back));
      CHECK(std::string(back, 3) == "408");
    }
  }
}

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve: a client that trickles its request a byte at a time past the "
                  "read timeout gets 408 in time") {
  // Each byte completes one of Beast's reads, so the deadline may expire
  // between two of them (about 1 connection in 100 in a review's run before
  // the fix): an end-to-end check of the 408; the case above is the one that
  // fails deterministically without deadline_socket.
  const std::string head = "POST /v1/gemm HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
  std::vector<std::unique_ptr<client>> cs;
  for (int i = 0; i < 20; ++i) cs.push_back(std::make_unique<client>(svc->port()));
  std::vector<std::thread> senders;
  std::atomic<bool> quit{false};
  for (auto& c : cs)
    senders.emplace_back([fd = c->s.native_handle(), &head, &quit] {
      // Plain send(2): the test thread reads the same socket meanwhile.
      bool ok =
          ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size());
      for (int i = 0; i < 400 && ok && !quit.load(); ++i) {
        ok = ::send(fd, "1", 1, MSG_NOSIGNAL) == 1;
        std::this_thread::sleep_for(2ms);
      }
    });
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& c : cs) {
    auto res = c->read();
    CHECK(res.result_int() == 408);
    CHECK_FALSE(res.keep_alive());
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  quit = true;
  for (auto& t : senders) t.join();
  CHECK(took < 3s);  // the read timeout is 300 ms; the clients' socket timeout 10 s
}

namespace {
/// Descriptors this process has open now.
std::size_t open_fds() {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}
/// Closes the client's socket with a reset (SO_LINGER 0), not a FIN.
void reset(client& c) {
  linger l{1, 0};
  ::setsockopt(c.s.native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
  boost::system::error_code ec;
  c.s.close(ec);
}
}  // namespace

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve under churn: 8 client threads open, use, abandon and reset "
                  "connections at random; every answer as specified, then no connection or "
                  "descriptor left and the service still answers") {
  if (device_named()) return;  // the answers below are those of a missing device
  constexpr int threads = 8, per_thread = 300;
  // A raw gemm 8 x 8 x 8 (512 bytes of body, under the fixture's 4096 limit).
  const std::string gemm_raw(2 * 8 * 8 * sizeof(float), '\0');
  // One round of every endpoint first, so that whatever the service opens
  // once (on its first request) is open before the count.
  {
    client warm(svc->port());
    warm.send(http::verb::get, "/health");
    warm.send(http::verb::post, "/v1/gemm", gemm_raw, "application/octet-stream", "8,8,8");
    warm.send(http::verb::get, "/metrics");
  }
  const auto settle = std::chrono::steady_clock::now() + 10s;
  while (svc->stats().open_connections != 0 && std::chrono::steady_clock::now() < settle)
    std::this_thread::sleep_for(1ms);
  const std::size_t fds_before = open_fds();
  std::atomic<int> wrong{0}, answered{0}, opened{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t)
    clients.emplace_back([&, t] {
      std::uint32_t x = 0x9e3779b9u * static_cast<std::uint32_t>(t + 1);
      auto next = [&x] {  // xorshift32
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        return x;
      };
      for (int i = 0; i < per_thread; ++i) {
        try {
          client c(svc->port());
          ++opened;
          const std::uint32_t what = next() % 5;
          if (what == 0) {  // a keep-alive connection with three requests
            wrong += c.send(http::verb::get, "/health").result_int() != 503;
            auto g =
                c.send(http::verb::post, "/v1/gemm", gemm_raw, "application/octet-stream", "8,8,8");
            wrong += g.result_int() != 503 ||
                     g.body().find("\"code\":\"device_unavailable\"") == std::string::npos;
            wrong += c.send(http::verb::get, "/metrics").result_int() != 200;
            answered += 3;
          } else if (what == 1) {  // half a body, then a reset
            const std::string head =
                "POST /v1/gemm HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                "X-Shape: 8,8,8\r\nContent-Length: 512\r\n\r\n";
            asio::write(c.s, asio::buffer(head + gemm_raw.substr(0, next() % 512)));
            reset(c);
          } else if (what == 2) {  // connect, then go
            if (next() % 2) reset(c);
          } else if (what == 3) {  // a whole request, gone before its answer
            http::request<http::string_body> req{http::verb::post, "/v1/gemm", 11};
            req.set(http::field::host, "127.0.0.1");
            req.set(http::field::content_type, "application/octet-stream");
            req.set("X-Shape", "8,8,8");
            req.body() = gemm_raw;
            req.prepare_payload();
            http::write(c.s, req);
            reset(c);
          } else {  // not HTTP: 400, and the service closes the connection
            asio::write(c.s, asio::buffer(std::string("NOT HTTP AT ALL\r\n\r\n")));
            auto res = c.read();
            wrong += res.result_int() != 400 || res.keep_alive();
            ++answered;
            beast::flat_buffer b;
            http::response<http::string_body> more;
            boost::system::error_code ec;
            http::read(c.s, b, more, ec);
            wrong += !ec;  // closed by the service after its 400
          }
        } catch (const std::exception& e) {
          ++wrong;
          MESSAGE("client " << t << ", connection " << i << ": " << e.what());
        }
      }
    });
  for (auto& c : clients) c.join();
  CHECK(wrong.load() == 0);
  // The service accepts every connection and lets go of each (a reset or an
  // end of stream ends its read; one that sent half a request ends by the
  // reset, not by the read timeout). A client that connected and left at
  // once may still wait in the listen backlog when the last thread joins:
  // its accept (and count) comes later, so the wait includes the count.
  const auto expected = static_cast<std::uint64_t>(opened.load()) + 1;  // and the warm-up
  const auto limit = std::chrono::steady_clock::now() + 10s;
  auto pending = [&] {
    const auto s = svc->stats();
    return s.connections < expected || s.open_connections != 0 || open_fds() > fds_before;
  };
  while (pending() && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(5ms);
  const auto st = svc->stats();
  CHECK(st.open_connections == 0);
  CHECK(st.connections == expected);
  CHECK(open_fds() == fds_before);
  CHECK(st.requests >= static_cast<std::uint64_t>(answered.load()));
  client after(svc->port());
  CHECK(after.send(http::verb::get, "/health").result_int() == 503);
}

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve: a client that closes in order halfway through its request is "
                  "gone: no answer, not counted as a request or a 400") {
  // Beast reports an orderly close mid-message as partial_message, not as
  // eof: it was answered 400 (written to a closed peer) and counted.
  const std::string head =
      "POST /v1/gemm HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
      "X-Shape: 8,8,8\r\nContent-Length: 512\r\n\r\n";
  constexpr int clients = 5;
  for (int i = 0; i < clients; ++i) {
    client c(svc->port());
    asio::write(c.s, asio::buffer(head + std::string(3, '\0')));
    c.s.shutdown(asio::ip::tcp::socket::shutdown_send);  // FIN: an orderly close
    beast::flat_buffer b;
    http::response<http::string_body> res;
    boost::system::error_code ec;
    http::read(c.s, b, res, ec);
    CAPTURE(res.result_int());
    CHECK(ec);  // the service closed the connection without an answer
  }
  const auto limit = std::chrono::steady_clock::now() + 10s;
  while (svc->stats().open_connections != 0 && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(1ms);
  const auto st = svc->stats();
  CHECK(st.open_connections == 0);
  CHECK(st.requests == 0);
  CHECK(st.client_errors == 0);
}

TEST_CASE("atomr-serve: stop() closes open connections and lets the io_context run out of work") {
  asio::io_context ioc{2};
  serve::options o;
  o.port = 0;
  o.device = 99;
  serve::service svc(ioc, o);
  REQUIRE_FALSE(svc.start());
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&] { ioc.run(); });
  std::vector<std::unique_ptr<client>> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<client>(svc.port()));
  CHECK(idle[0]->send(http::verb::get, "/health").result_int() == 503);
  // A client's connect completes in the kernel's backlog before the service
  // accepts it: wait until all eight are the service's open connections.
  const auto limit = std::chrono::steady_clock::now() + 5s;
  while (svc.stats().open_connections < 8 && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(1ms);
  REQUIRE(svc.stats().open_connections == 8);
  const auto t0 = std::chrono::steady_clock::now();
  svc.stop();
  for (auto& t : threads) t.join();  // would hang if anything kept the io_context busy
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(svc.stopped());
  CHECK(svc.stats().open_connections == 0);
  CHECK(svc.stats().connections == 8);
  // The idle clients see their connection closed.
  beast::flat_buffer b;
  http::response<http::string_body> res;
  boost::system::error_code ec;
  http::read(idle[1]->s, b, res, ec);
  CHECK(ec);
}

TEST_CASE("atomr-serve's JSON reader: values, errors with their place, depth limit") {
  std::string err;
  serve::json::reader r(R"( {"a":[1,-2.5e3,0],"b":{"c":"x\ny\u00e9"},"t":true,"n":null} )");
  auto v = r.parse(err);
  REQUIRE_MESSAGE(v, err);
  const auto& a = v->find("a")->items();
  REQUIRE(a.size() == 3);
  CHECK(a[1].number() == -2500.0);
  CHECK(std::get<std::string>(v->find("b")->find("c")->v) == "x\ny\xc3\xa9");
  CHECK(std::get<bool>(v->find("t")->v));
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "[1] x", "\"abc", "nul",
                          "{\"a\":1,}", "1e999"}) {
    CAPTURE(bad);
    serve::json::reader rb(bad);
    CHECK_FALSE(rb.parse(err));
    CHECK_FALSE(err.empty());
  }
  std::string deep(100, '[');
  serve::json::reader rd(deep);
  CHECK_FALSE(rd.parse(err));
  CHECK(err.find("nesting too deep") != std::string::npos);
  std::string out;
  serve::json::append_number(out, 0.1f);
  CHECK(out == "0.1");  // the shortest form that reads back as the same float
  CHECK(serve::json::quote("a\"b\\\x01") == "\"a\\\"b\\\\\\u0001\"");
}

TEST_CASE("atomr-serve's model: fixed weights from the seed; the reference is a distribution") {
  const auto w1 = serve::model::make_weights(), w2 = serve::model::make_weights();
  CHECK(w1.dense_w == w2.dense_w);
  CHECK(w1.conv_w.size() == 72);
  CHECK(w1.dense_w.size() == 15680);
  std::vector<float> x(serve::model::input_size);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 100.0f;
  const auto p = serve::model::reference(w1, x.data());
  CHECK(std::accumulate(p.begin(), p.end(), 0.0) == doctest::Approx(1.0).epsilon(1e-12));
  for (double q : p) CHECK(q > 0.0);
  // Not the same answer for every input.
  std::vector<float> y(x.rbegin(), x.rend());
  CHECK(serve::model::reference(w1, y.data()) != p);
}

namespace {

/// One request of the service-level fuzz: what goes out, and the statuses
/// its answer may have (this service, without a GPU: a request it would
/// run gets 503 device_unavailable).
/// Whether the service reads a body of this Content-Type raw: written here
/// as the service's documentation says (any case, parameters allowed).
bool raw_media_type(std::string_view type) {
  constexpr std::string_view raw = "application/octet-stream";
  return beast::iequals(type.substr(0, raw.size()), raw);
}

struct fuzz_request {
  std::string method = "POST", target, body;
  std::optional<std::string> type, shape;  // Content-Type, X-Shape (absent if empty)
  std::string extra;                       // one more header line's value (X-Pad)
  bool close = false;                      // Connection: close
  unsigned version = 11;
  std::set<int> allowed;
  bool read_whole = false;  // a 413 for the JSON limit: the body was read, the connection stays
  std::string endpoint;     // how /metrics counts it
  std::string what;         // for a failure message
};

/// The fuzz's requests: valid bodies of each endpoint, bodies broken on
/// purpose, random mutations of valid ones, raw bodies with random X-Shape
/// headers and sizes, random content types, targets and methods, bodies
/// over the limit and headers over theirs.
struct request_maker {
  std::mt19937_64 g;
  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(g() % n) : 0; }
  bool coin(unsigned in = 2) { return g() % in == 0; }

  std::string numbers(std::size_t n, bool ints = false) {
    std::string s = "[";
    for (std::size_t i = 0; i < n; ++i) {
      if (i) s += ',';
      if (ints)
        s += std::to_string(below(10));
      else
        serve::json::append_number(s,
                                   static_cast<float>(static_cast<double>(below(2001)) / 125 - 8));
    }
    return s + "]";
  }
  /// A valid JSON body of `ep`.
  std::string valid_json(const std::string& ep) {
    if (ep == "gemm") {
      const std::size_t m = 1 + below(4), n = 1 + below(4), k = 1 + below(4);
      return "{\"m\":" + std::to_string(m) + ",\"n\":" + std::to_string(n) +
             ",\"k\":" + std::to_string(k) + ",\"a\":" + numbers(m * k) +
             ",\"b\":" + numbers(k * n) + "}";
    }
    if (ep == "fft") {
      const std::size_t n = 1 + below(8);
      return "{\"n\":" + std::to_string(n) + ",\"re\":" + numbers(n) + ",\"im\":" + numbers(n) +
             "}";
    }
    return "{\"x\":" + numbers(serve::model::input_size, true) + "}";
  }
  /// A JSON body of `ep` that is wrong in one known way (400).
  std::string invalid_json(const std::string& ep) {
    static const std::vector<std::string> gemm = {
        R"({"m":0,"n":1,"k":1,"a":[],"b":[1]})",
        R"({"m":4097,"n":1,"k":1,"a":[1],"b":[1]})",
        R"({"m":-1,"n":1,"k":1,"a":[1],"b":[1]})",
        R"({"m":1.5,"n":1,"k":1,"a":[1],"b":[1]})",
        R"({"m":"1","n":1,"k":1,"a":[1],"b":[1]})",
        R"({"m":1e300,"n":1,"k":1,"a":[1],"b":[1]})",
        R"({"m":4096,"n":4096,"k":4096,"a":[1],"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[1,2],"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[null],"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[1e39],"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[-3.5e38],"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":1,"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[[1]],"b":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[1]})",
        R"({"m":1,"n":1,"k":1,"a":[1],"b":[1],"m":0})",  // the last m counts
        R"([1,2,3])",
        R"("gemm")",
        R"(null)",
        R"({})",
        R"({"m":1,"n":1,"k":1,"a":[1],"b":[1e400]})",
        R"({"m":1,"n":1,"k":1,"a":[1],"b":[1]} {})",
        R"({"m":1,"n":1,"k":1,"a":["\ud800"],"b":[1]})",
        ""};
    static const std::vector<std::string> fft = {
        R"({"n":0,"re":[],"im":[]})",
        R"({"n":4194305,"re":[1],"im":[1]})",
        R"({"n":9007199254740993,"re":[1],"im":[1]})",
        R"({"n":2,"re":[1,2],"im":[1]})",
        R"({"n":1,"re":[1],"im":["0"]})",
        R"({"n":1,"re":[1]})",
        R"({"n":-0,"re":[],"im":[]})",
        R"({"n":1,"re":[1],"im":[1],"n":2})",
        "{\"n\":1,\"re\":[1],\"im\":[1]}\x01",
        "[" + std::string(40, '[') + std::string(40, ']') + "]"};
    static const std::vector<std::string> infer = {
        R"({"x":[]})",
        R"({"x":[1,2,3]})",
        R"({"y":[1]})",
        "{\"x\":" + numbers(serve::model::input_size + 1, true) + "}",
        "{\"x\":" + numbers(serve::model::input_size - 1, true) + "}",
        R"({"x":{}})"};
    const auto& list = ep == "gemm" ? gemm : ep == "fft" ? fft : infer;
    return list[below(list.size())];
  }
  /// A random change to `s` (the result may or may not be valid).
  void mutate(std::string& s) {
    static const std::vector<std::string> odd = {"1e309",
                                                 "-0",
                                                 "1e-400",
                                                 "0x10",
                                                 "01",
                                                 "NaN",
                                                 "Infinity",
                                                 "\"\\ud800\"",
                                                 "\"\\u0000\"",
                                                 "\"\xff\"",
                                                 "[",
                                                 "]",
                                                 "{",
                                                 "}",
                                                 ",",
                                                 ":",
                                                 "\"",
                                                 "\\",
                                                 "null",
                                                 "true",
                                                 "1e39",
                                                 "4097",
                                                 "-1",
                                                 "0",
                                                 std::string(3000, '9'),
                                                 std::string(60, '['),
                                                 std::string("\0", 1)};
    const std::size_t at = below(s.size() + 1);
    switch (below(7)) {
      case 0:
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1u << below(8));
        break;
      case 1:
        if (!s.empty()) s[below(s.size())] = static_cast<char>(g() & 0xff);
        break;
      case 2:
        s.insert(at, odd[below(odd.size())]);
        break;
      case 3:
        s.erase(at, 1 + below(16));
        break;
      case 4:
        s.resize(at);
        break;
      case 5:
        s.insert(at, s.substr(at, 1 + below(64)));
        break;
      default: {  // a number replaced
        const auto b = s.find_first_of("-0123456789", at);
        if (b == std::string::npos) break;
        const auto e = s.find_first_of(",]}", b);
        s.replace(b, (e == std::string::npos ? s.size() : e) - b, odd[below(odd.size())]);
      }
    }
  }
  /// A valid X-Shape for dims, with random spaces.
  std::string shape_of(const std::vector<std::int64_t>& dims) {
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (i) s += coin(4) ? " , " : ",";
      s += std::to_string(dims[i]);
    }
    return coin(4) ? " " + s + " " : s;
  }
  /// An X-Shape that does not describe `count` positive integers within
  /// the limits (gemm: 3 of at most 4096; fft: 1 of at most 2^22).
  std::string bad_shape(std::size_t count) {
    static const std::vector<std::string> gemm = {"",
                                                  "0,1,1",
                                                  "1,0,1",
                                                  "1,1,0",
                                                  "-1,2,3",
                                                  "1,-2,3",
                                                  "1,2",
                                                  "1,2,3,4",
                                                  "a,b,c",
                                                  "1;2;3",
                                                  "1,,3",
                                                  "1,2,3,",
                                                  "+1,2,3",
                                                  "0x10,1,1",
                                                  "1e3,1,1",
                                                  "1.5,1,1",
                                                  "1,1,1x",
                                                  "4097,1,1",
                                                  "1,4097,1",
                                                  "1,1,4097",
                                                  "99999999999999999999,1,1",
                                                  "9223372036854775807,1,1",
                                                  "-9223372036854775808,1,1",
                                                  "4096,4096,4096,",
                                                  ",1,1,1",
                                                  "1 1 1",
                                                  "\xff,1,1"};
    static const std::vector<std::string> fft = {"",
                                                 "0",
                                                 "-5",
                                                 "4194305",
                                                 "9223372036854775807",
                                                 "99999999999999999999",
                                                 "1,1",
                                                 "x",
                                                 "1.0",
                                                 "+1",
                                                 "0x1",
                                                 "1 ,",
                                                 "\xc3\xa9",
                                                 "1e2"};
    const auto& list = count == 3 ? gemm : fft;
    return list[below(list.size())];
  }
  std::string bytes(std::size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(g() & 0xff);
    return s;
  }

  fuzz_request make() {
    fuzz_request r;
    static const std::vector<std::string> others = {"/",
                                                    "/v1",
                                                    "/v1/",
                                                    "/v1/gemm/",
                                                    "/V1/GEMM",
                                                    "/v1/gemmx",
                                                    "/v1/fault?kind=abort",
                                                    "/v1/fault",
                                                    "*",
                                                    "http://127.0.0.1/v1/gemm",
                                                    "/health/",
                                                    "/metrics.txt",
                                                    "/%00",
                                                    "/v1/fft#x",
                                                    "/\xff\xfe/\xc3",
                                                    "/\xed\xa0\x80",
                                                    "/caf\xc3\xa9",
                                                    "//v1/gemm"};
    static const std::vector<std::string> methods = {"GET",   "PUT",     "DELETE", "HEAD",
                                                     "PATCH", "OPTIONS", "BREW",   "TRACE"};
    static const std::vector<std::string> types = {"application/json",
                                                   "application/octet-stream",
                                                   "application/octet-stream; x=1",
                                                   "text/plain",
                                                   "",
                                                   "APPLICATION/OCTET-STREAM",
                                                   "application/x-www-form-urlencoded",
                                                   "application/json; charset=utf-8",
                                                   "multipart/form-data; boundary=x"};
    const std::size_t pick = below(100);
    std::string ep = "other";
    if (pick < 84) {
      static const char* eps[] = {"gemm", "fft", "infer"};
      ep = eps[below(3)];
      r.target = "/v1/" + ep;
      if (coin(10)) r.target += "?q=" + std::to_string(below(100));
    } else if (pick < 90) {
      ep = coin() ? "health" : "metrics";
      r.target = "/" + ep;
    } else {
      r.target = others[below(others.size())];
      if (coin(8)) r.target = "/" + std::string(1000 + below(3000), 'p');
    }
    r.endpoint = ep;
    const bool gpu = ep == "gemm" || ep == "fft" || ep == "infer";
    if (!gpu || coin(12)) r.method = methods[below(methods.size())];
    if (ep == "health" || ep == "metrics") r.method = coin(5) ? r.method : "GET";
    const bool post = r.method == "POST", get = r.method == "GET";
    if (coin(20)) r.close = true;
    if (coin(25)) r.version = 10;  // keep-alive asked for with a header
    if (ep == "other") {
      r.allowed = {404};
    } else if (ep == "health") {
      r.allowed = {get ? 503 : 405};
    } else if (ep == "metrics") {
      r.allowed = {get ? 200 : 405};
    } else if (!post) {
      r.allowed = {405};
    }
    // The body and its headers.
    const std::size_t kind = below(10);
    if (!gpu || !post) {
      r.what = "no body";
      if (coin(4) && r.method != "TRACE") r.body = bytes(below(64));  // Beast sends none with TRACE
      if (coin(3)) r.type = types[below(types.size())];
    } else if (kind < 2) {
      r.what = "valid JSON";
      r.body = valid_json(ep);
      if (coin(3))
        r.type = types[below(2) == 0 ? 0 : 3];  // else no Content-Type
      else
        r.type = "application/json";
      r.allowed = {503};
    } else if (kind < 4) {
      r.what = "invalid JSON";
      r.body = invalid_json(ep);
      r.type = "application/json";
      r.allowed = {400};
    } else if (kind < 7) {
      r.what = "mutated JSON";
      r.body = valid_json(ep);
      for (std::size_t n = 1 + below(3); n > 0; --n) mutate(r.body);
      r.type = coin(4) ? types[below(types.size())] : "application/json";
      if (raw_media_type(*r.type)) r.type = "application/json";
      r.allowed = {400, 503};
    } else {
      // Raw: an X-Shape and a body of the right size, or a wrong one.
      r.type = coin(3) ? "application/octet-stream; q=1" : "application/octet-stream";
      std::vector<std::int64_t> dims;
      std::size_t want = serve::model::input_size * sizeof(float);
      // Now and then a shape as large as the limits allow (up to 128 MiB of
      // body for gemm, 32 MiB for FFT), sent with a small body: 400, with
      // nothing the size of the shape made first.
      const bool large = coin(6);
      auto dim = [&](std::size_t small, std::size_t max) {
        return 1 + static_cast<std::int64_t>(below(large ? max : small));
      };
      if (ep == "gemm") {
        const std::int64_t m = dim(16, 4096), n = dim(16, 4096), k = dim(16, 4096);
        dims = {m, n, k};
        want = static_cast<std::size_t>(m * k + k * n) * sizeof(float);
      } else if (ep == "fft") {
        dims = {dim(512, std::size_t{1} << 22)};
        want = static_cast<std::size_t>(dims[0]) * 8;
      }
      const bool right_shape = !coin(3);
      if (ep == "infer") {
        if (coin()) r.shape = bad_shape(coin() ? 3 : 1);  // not read for infer
      } else if (right_shape) {
        r.shape = shape_of(dims);
      } else if (!coin(6)) {
        r.shape = bad_shape(dims.size());
      }  // else no X-Shape at all
      const bool right_size = !coin(3);
      std::size_t size = want;
      if (!right_size || want > 4096) {
        do size = below(4097);
        while (size == want);
      }
      r.body = bytes(size);
      r.what = "raw, X-Shape " + (r.shape ? "\"" + *r.shape + "\"" : std::string("absent")) + ", " +
               std::to_string(size) + " bytes (" + std::to_string(want) + " expected)";
      const bool shape_ok = ep == "infer" || right_shape;
      r.allowed = {shape_ok && size == want ? 503 : 400};
    }
    // A JSON body of a /v1/ POST over the fixture's json_limit (3000): 413
    // before it is parsed, with the body read (the connection stays).
    const bool raw_type = r.type && raw_media_type(*r.type);
    if (gpu && post && !raw_type && r.body.size() > 3000) {
      r.what += ", over the JSON limit";
      r.allowed = {413};
      r.read_whole = true;
    }
    // Bodies over the limit (413) and headers over theirs (431): the
    // request is not read, so whatever else it was does not count.
    if (r.body.size() > 4096) {  // the fixture's limit (a mutation made it so)
      r.what += ", over the limit";
      r.allowed = {413};
      r.read_whole = false;
      r.endpoint = "other";
    } else if (coin(40) && r.method != "TRACE") {
      r.what = "body over the limit";
      r.body = bytes(4097 + below(8000));
      r.allowed = {413};
      r.read_whole = false;
      r.endpoint = "other";
    } else if (coin(60)) {
      r.what = "header over the limit";
      r.extra = std::string(16 * 1024 + below(4096), 'h');
      r.allowed = {431};
      r.read_whole = false;
      r.endpoint = "other";
    }
    return r;
  }
};

/// Writes `r` on `c`'s connection and reads its answer (a HEAD's without a body).
http::response<http::string_body> exchange(client& c, const fuzz_request& r) {
  http::request<http::string_body> req;
  req.method_string(r.method);
  req.target(r.target);
  req.version(r.version);
  req.set(http::field::host, "127.0.0.1");
  if (r.type) req.set(http::field::content_type, *r.type);
  if (r.shape) req.set("X-Shape", *r.shape);
  if (!r.extra.empty()) req.set("X-Pad", r.extra);
  req.body() = r.body;
  req.keep_alive(!r.close);
  req.prepare_payload();
  http::write(c.s, req);
  http::response_parser<http::string_body> p;
  p.body_limit(64u << 20);
  p.skip(r.method == "HEAD");
  http::read(c.s, c.buf, p);
  return p.release();
}

/// What is wrong with answer `res` to `r`, or "".
std::string judge(const fuzz_request& r, const http::response<http::string_body>& res) {
  const int st = res.result_int();
  if (!r.allowed.count(st)) return "status " + std::to_string(st);
  // The connection closes after a request that was not read whole (408,
  // 413 but the JSON limit's, 431; 400 for a malformed one, which none of
  // these requests is) or
  // when the client asked; else it stays.
  const bool unread = st == 408 || (st == 413 && !r.read_whole) || st == 431;
  if (res.keep_alive() != (!unread && !r.close))
    return "keep-alive " + std::to_string(res.keep_alive());
  if (r.method == "HEAD") return "";  // headers only
  if (r.endpoint == "metrics" && st == 200)
    return res.body().find("atomr_serve_requests_total") == std::string::npos ? "metrics text" : "";
  if (!res[http::field::content_type].starts_with("application/json")) return "content type";
  if (!valid_utf8(res.body())) return "body not UTF-8";
  std::string err;
  serve::json::reader rd(res.body());
  const auto v = rd.parse(err);
  if (!v) return "body not JSON: " + err;
  auto text = [&](std::string_view key) -> std::string {
    const auto* m = v->find(key);
    const auto* s = m ? std::get_if<std::string>(&m->v) : nullptr;
    return s ? *s : std::string();
  };
  if (r.endpoint == "health" && st == 503) return text("health").empty() ? "no health" : "";
  if (text("error").empty()) return "no error message";
  if (text("code").empty()) return "no error code";
  return "";
}

/// The counts of /metrics' atomr_serve_requests_total: (endpoint, code) -> n.
std::map<std::pair<std::string, int>, std::uint64_t> requests_by_code(const std::string& text) {
  std::map<std::pair<std::string, int>, std::uint64_t> out;
  const std::string head = "atomr_serve_requests_total{endpoint=\"";
  for (std::size_t at = text.find(head); at != std::string::npos; at = text.find(head, at + 1)) {
    const auto ep_end = text.find('"', at + head.size());
    const auto code_at = text.find("code=\"", ep_end) + 6;
    const auto value_at = text.find("} ", code_at) + 2;
    out[{text.substr(at + head.size(), ep_end - at - head.size()),
         std::stoi(text.substr(code_at))}] = std::stoull(text.substr(value_at));
  }
  return out;
}

}  // namespace

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve fuzzed over loopback: random request bodies, X-Shape headers, "
                  "content types, targets and methods each get a documented status and a "
                  "message; keep-alive holds; the counts add up") {
  if (device_named()) return;  // the answers below are those of a missing device
  constexpr int threads = 4, per_thread = 120;
  std::mutex mu;
  std::vector<std::string> wrong;
  std::map<std::pair<std::string, int>, std::uint64_t> sent;  // what /metrics should count
  std::atomic<std::uint64_t> connects{0};
  auto note = [&](const std::string& s) {
    std::lock_guard lk(mu);
    if (wrong.size() < 20) wrong.push_back(s);
  };
  const auto t0 = std::chrono::steady_clock::now();

  // Structured requests: each on a keep-alive connection that goes on until
  // the service (or the client, now and then) ends it.
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      request_maker mk{std::mt19937_64(0xf022'5e7e'0000u + static_cast<std::uint64_t>(t))};
      std::unique_ptr<client> c;
      for (int i = 0; i < per_thread; ++i) {
        const auto r = mk.make();
        const std::string where = "thread " + std::to_string(t) + " request " + std::to_string(i) +
                                  ": " + printable(r.method + " " + r.target + ", " + r.what);
        try {
          if (!c) {
            c = std::make_unique<client>(svc->port());
            ++connects;
          }
          const auto res = exchange(*c, r);
          {
            std::lock_guard lk(mu);
            ++sent[{r.endpoint, res.result_int()}];
          }
          if (const auto why = judge(r, res); !why.empty())
            note(where + ": " + why + "; answer " + std::to_string(res.result_int()) + " " +
                 res.body().substr(0, 300));
          if (!res.keep_alive()) {  // the service closes it: nothing more comes
            http::response<http::string_body> more;
            boost::system::error_code ec;
            http::read(c->s, c->buf, more, ec);
            if (!ec) note(where + ": an answer after Connection: close");
            c.reset();
          } else if (mk.coin(10)) {
            c.reset();  // the client goes, between requests
          }
        } catch (const std::exception& e) {
          note(where + ": " + e.what());
          c.reset();
        }
      }
    });
  for (auto& t : ts) t.join();
  ts.clear();

  // Let the service see the last connections end (the client closed them),
  // then compare its counts with what was sent, endpoint by endpoint.
  auto settle = [&] {
    const auto limit = std::chrono::steady_clock::now() + 10s;
    while ((svc->stats().open_connections != 0 || svc->stats().connections < connects.load()) &&
           std::chrono::steady_clock::now() < limit)
      std::this_thread::sleep_for(1ms);
  };
  settle();
  {
    const auto counted = requests_by_code(svc->metrics_text());
    for (const auto& [k, n] : sent) {
      CAPTURE(k.first);
      CAPTURE(k.second);
      CHECK(counted.count(k) == 1);
      if (counted.count(k)) CHECK(counted.at(k) == n);
    }
    CHECK(counted.size() == sent.size());
  }

  // Raw HTTP, mutated: a valid request with bytes changed, then a request
  // that ends the connection. Every answer is one of the documented ones;
  // the service closes the connection in the end (after the last request,
  // an error, or 408 for a request that never completes).
  std::atomic<std::uint64_t> raw_answers{0};
  std::map<int, std::uint64_t> raw_codes;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      request_maker mk{std::mt19937_64(0xf022'5e7e'1000u + static_cast<std::uint64_t>(t))};
      for (int i = 0; i < 25; ++i) {
        std::string body = mk.valid_json(mk.coin() ? "gemm" : "fft");
        std::string req =
            "POST /v1/gemm HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: " +
            std::to_string(body.size()) + "\r\n\r\n" + body;
        const std::size_t head = req.size() - body.size();
        // Every 8th request promises more body than it sends: 408 after the
        // read timeout, and the connection closed.
        const bool stall = i % 8 == 7;
        if (stall)
          req.replace(req.find("Content-Length: ") + 16, std::to_string(body.size()).size(),
                      std::to_string(body.size() + 1 + mk.below(100)));
        for (std::size_t n = stall ? 0 : 1 + mk.below(3); n > 0; --n) {
          const std::size_t at = mk.below(head);  // in the head, mostly
          switch (mk.below(4)) {
            case 0:
              req[at] ^= static_cast<char>(1u << mk.below(8));
              break;
            case 1:
              req[at] = static_cast<char>(mk.g() & 0xff);
              break;
            case 2:
              req.insert(at, mk.bytes(1 + mk.below(4)));
              break;
            default:
              req.erase(at, 1 + mk.below(4));
          }
        }
        if (!stall) req += "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        const std::string where = "raw thread " + std::to_string(t) + " connection " +
                                  std::to_string(i) + ": " + printable(req.substr(0, 200));
        try {
          client c(svc->port());
          ++connects;
          asio::write(c.s, asio::buffer(req));
          for (int answers = 0;; ++answers) {
            http::response_parser<http::string_body> p;
            boost::system::error_code ec;
            http::read(c.s, c.buf, p, ec);
            if (ec) {
              if (answers == 0) note(where + ": no answer: " + ec.message());
              break;
            }
            const auto res = p.release();
            const int st = res.result_int();
            ++raw_answers;
            {
              std::lock_guard lk(mu);
              ++raw_codes[st];
            }
            static const std::set<int> documented = {400, 404, 405, 408, 413, 431, 503};
            std::string err;
            serve::json::reader rd(res.body());
            const auto v = rd.parse(err);
            const bool message =
                v && ((v->find("error") && !std::get<std::string>(v->find("error")->v).empty()) ||
                      v->find("health"));
            if (!documented.count(st) || !message || !valid_utf8(res.body()) ||
                (stall && (st != 408 || answers > 0)))
              note(where + ": answer " + std::to_string(st) + " " + res.body().substr(0, 200));
            if (answers > 8) {
              note(where + ": more answers than requests");
              break;
            }
          }
        } catch (const std::exception& e) {
          note(where + ": " + e.what());
        }
      }
    });
  for (auto& t : ts) t.join();
  settle();
  std::uint64_t read_total = raw_answers.load();  // the answers the clients read
  for (const auto& [k, n] : sent) read_total += n;
  std::map<int, std::uint64_t> structured_codes;
  for (const auto& [k, n] : sent) structured_codes[k.second] += n;
  std::string codes = "structured:";
  for (const auto& [code, n] : structured_codes)
    codes += " " + std::to_string(code) + ":" + std::to_string(n);
  codes += "; raw:";
  for (const auto& [code, n] : raw_codes)
    codes += " " + std::to_string(code) + ":" + std::to_string(n);
  INFO(read_total << " answers to " << threads * per_thread << " structured requests and "
                  << raw_answers.load() << " on mutated raw ones (" << codes << "), "
                  << connects.load() << " connections, "
                  << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                  << " s");

  // Still serving; the counts add up: every answer the clients read was
  // counted once, by its class; no client left early; nothing open.
  client after(svc->port());
  ++connects;
  auto h = after.send(http::verb::get, "/health");
  CHECK(h.result_int() == 503);
  {
    std::string err;
    serve::json::reader rd(h.body());
    const auto v = rd.parse(err);
    CHECK((v && v->find("health")));
  }
  auto m = after.send(http::verb::get, "/metrics");
  CHECK(m.result_int() == 200);
  const auto counted = requests_by_code(m.body());
  std::uint64_t total = 0, by_class[6] = {};
  for (const auto& [k, n] : counted) {
    total += n;
    by_class[k.second / 100] += n;
  }
  const auto st = svc->stats();
  CHECK(total == read_total + 1);   // and the /health above
  CHECK(st.requests == total + 1);  // and the /metrics above, counted after its text was made
  CHECK(st.ok == by_class[2] + 1);
  CHECK(st.client_errors == by_class[4]);
  CHECK(st.server_errors == by_class[5]);
  CHECK(st.requests == st.ok + st.client_errors + st.server_errors);
  CHECK(st.client_gone == 0);
  CHECK(st.connections == connects.load());
  CHECK(st.open_connections == 1);  // `after`
  // Every kind of answer came up.
  for (const int code : {200, 400, 404, 405, 413, 431, 503}) CHECK(structured_codes.count(code));
  for (const int code : {400, 408, 503}) CHECK(raw_codes.count(code));
  std::string first;
  for (const auto& w : wrong) first += "\n  " + w;
  CHECK_MESSAGE(wrong.empty(), "answers not as documented:" << first);
}

TEST_CASE_FIXTURE(serve_fixture,
                  "atomr-serve answers HEAD with headers only: the next answer on the "
                  "connection is read whole") {
  // A HEAD response has no body whatever its Content-Length says (RFC 9110
  // 9.3.2, RFC 9112 6.3): a body sent anyway is read as the start of the
  // next response.
  client c(svc->port());
  for (const std::string target : {"/health", "/v1/gemm", "/nowhere", "/metrics"}) {
    CAPTURE(target);
    fuzz_request head;
    head.method = "HEAD";
    head.target = target;
    const auto res = exchange(c, head);
    CHECK(res.result_int() == (target == "/nowhere" ? 404 : 405));
    CHECK(res.has_content_length());  // the length a GET's answer would have
    const auto next = c.send(http::verb::get, "/nowhere");
    CHECK(next.result_int() == 404);
    CHECK(message_of(next.body()) == "no such endpoint: /nowhere");
  }
  // A target's bytes outside UTF-8 come back as U+FFFD in valid JSON.
  const auto res = c.send(http::verb::get, "/caf\xc3\xa9/\xff");
  CHECK(res.result_int() == 404);
  CHECK(valid_utf8(res.body()));
  CHECK(message_of(res.body()) == "no such endpoint: /caf\xc3\xa9/\xef\xbf\xbd");
}
