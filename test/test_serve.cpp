// atomr-serve (samples/serve/) as a user's service meets it, without needing
// a GPU: it starts on a device that is not there (ordinal 99), answers
// /health and /metrics, rejects every kind of bad request with the documented
// status and a message, keeps serving after each, and shuts down cleanly.
// Issue 21. Also the sample's JSON reader and model reference.
#include "../samples/serve/deadline.hpp"
#include "../samples/serve/json.hpp"
#include "../samples/serve/model.hpp"
#include "../samples/serve/service.hpp"

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
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

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
    svc.emplace(ioc, o);
    auto err = svc->start();
    REQUIRE_MESSAGE(!err, (err ? *err : ""));
    for (int i = 0; i < 2; ++i) threads.emplace_back([this] { ioc.run(); });
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
  if (o.device != 99) return;  // about a missing device
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
      {http::verb::post, "/v1/infer", R"({"x":[1,2,3]})", json, "", 400,
       "\"x\" has 3 numbers, the shape needs 784"},
      {http::verb::post, "/v1/infer", "abcd", raw, "", 400, "the model takes 784 f32"},
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
  if (o.device != 99) return;  // the answers below are those of a missing device
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
