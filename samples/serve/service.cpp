// atomr-serve's service: connections, routing, the GPU work of each
// endpoint, health and metrics. See service.hpp.
#include "service.hpp"

#include "deadline.hpp"
#include "json.hpp"
#include "model.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <complex>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace serve {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

static_assert(std::endian::native == std::endian::little,
              "the raw bodies are little-endian f32, read and written as is");

namespace {

using request = http::request<http::string_body>;
using response = http::response<http::string_body>;

/// What the metrics count requests by.
enum endpoint : int { ep_gemm, ep_fft, ep_infer, ep_health, ep_metrics, ep_fault, ep_other, ep_n };
constexpr std::array<std::string_view, ep_n> endpoint_names{"gemm",    "fft",   "infer", "health",
                                                            "metrics", "fault", "other"};

/// A latency histogram (seconds), Prometheus-style cumulative buckets.
struct histogram {
  static constexpr std::array<double, 14> bounds{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};
  std::array<std::atomic<std::uint64_t>, bounds.size() + 1> counts{};
  std::atomic<std::uint64_t> sum_ns{0};
  void add(std::chrono::nanoseconds d) {
    const double s = std::chrono::duration<double>(d).count();
    std::size_t i = 0;
    while (i < bounds.size() && s > bounds[i]) ++i;
    counts[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(static_cast<std::uint64_t>(d.count()), std::memory_order_relaxed);
  }
};

/// Device buffers one connection reuses from request to request (its
/// requests run one after another, so a buffer is free again once a request
/// has succeeded). An allocation and its stream-ordered release cost more
/// host time than the GPU work of a small request (docs/design.md, "The
/// reference service"). A slot is made again when it is too small or stale
/// (a restarted worker), and every slot is dropped after a failed request
/// (a timed-out request's GPU work may still use them: the library keeps
/// them alive until it ends). Requests larger than `cached_bytes` allocate
/// their own, so that many idle connections hold little device memory.
struct scratch {
  static constexpr std::size_t cached_bytes = std::size_t{1} << 20;  // per slot
  std::array<cuda::gpu_ref<float>, 5> f;
  std::array<cuda::gpu_ref<std::complex<float>>, 2> c;

  /// `count` elements of slot `slot` (a fresh allocation if large).
  template <class T>
  static cuda::result<cuda::gpu_ref<T>> take(cuda::device& dev, cuda::gpu_ref<T>& slot,
                                             std::size_t count) {
    if (count * sizeof(T) > cached_bytes) return dev.allocate<T>(count);
    if (slot.size() < count || slot.stale()) {  // stale: another generation, or empty
      slot = {};
      auto fresh = dev.allocate<T>(count);
      if (!fresh) return fresh.error();
      slot = std::move(fresh).value();
    }
    return slot.subspan(0, count);
  }
  cuda::result<cuda::gpu_ref<float>> floats(cuda::device& dev, std::size_t i, std::size_t n) {
    return take(dev, f.at(i), n);
  }
  cuda::result<cuda::gpu_ref<std::complex<float>>> complexes(cuda::device& dev, std::size_t i,
                                                             std::size_t n) {
    return take(dev, c.at(i), n);
  }
  void drop() { *this = {}; }
};

/// An error body: {"error": message, "code": the library's errc name or the HTTP reason}.
std::string error_body(std::string_view message, std::string_view code) {
  return "{\"error\":" + json::quote(message) + ",\"code\":" + json::quote(code) + "}";
}

/// The HTTP status for a library error.
http::status status_of(cuda::errc c) {
  switch (c) {
    case cuda::errc::invalid_argument:
      return http::status::bad_request;
    case cuda::errc::not_supported:
      return http::status::not_implemented;
    case cuda::errc::timeout:
      return http::status::gateway_timeout;
    case cuda::errc::out_of_memory:
      return http::status::insufficient_storage;
    case cuda::errc::device_unavailable:
    case cuda::errc::context_poisoned:
    case cuda::errc::stale_ref:
    case cuda::errc::unrecoverable:
    case cuda::errc::cancelled:
      return http::status::service_unavailable;
    default:
      return http::status::internal_server_error;
  }
}

/// The comma-separated positive integers of header X-Shape.
bool parse_shape(std::string_view s, std::span<std::int64_t> out, std::string& error) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    while (at < s.size() && s[at] == ' ') ++at;
    const char* b = s.data() + at;
    const auto r = std::from_chars(b, s.data() + s.size(), out[i]);
    if (r.ec != std::errc() || out[i] < 1) {
      error = "X-Shape must hold " + std::to_string(out.size()) + " positive integers";
      return false;
    }
    at = static_cast<std::size_t>(r.ptr - s.data());
    while (at < s.size() && s[at] == ' ') ++at;
    if (i + 1 < out.size()) {
      if (at >= s.size() || s[at] != ',') {
        error = "X-Shape must hold " + std::to_string(out.size()) + " comma-separated integers";
        return false;
      }
      ++at;
    }
  }
  if (at != s.size()) {
    error = "X-Shape has more than " + std::to_string(out.size()) + " values";
    return false;
  }
  return true;
}

/// application/octet-stream, in any case (media types are case-insensitive,
/// RFC 9110 8.3.1), with or without parameters.
bool is_raw(const request& req) {
  constexpr std::string_view raw = "application/octet-stream";
  return beast::iequals(req[http::field::content_type].substr(0, raw.size()), raw);
}

}  // namespace

// ------------------------------------------------------------------ state

struct service::impl : std::enable_shared_from_this<impl> {
  impl(asio::io_context& io, options opt)
      : ioc(io), o(std::move(opt)), acceptor(asio::make_strand(io)) {}

  asio::io_context& ioc;
  const options o;
  /// On a strand of its own: accept_loop's accepts and stop()'s close never
  /// run at once (an acceptor is not safe for concurrent use).
  tcp::acceptor acceptor;
  std::atomic<bool> stopping{false}, done{false};

  // The GPU side, made by start() and dropped by stop() once idle.
  cuda::device dev;
  std::optional<cuda::blas_actor> blas;
  std::optional<cuda::fft_actor> fft;
  std::optional<cuda::cudnn_actor> dnn;
  std::string gpu_note;  // why an actor is missing (guarded by gpu_mu)
  model::weights w = model::make_weights();
  std::optional<cuda::gpu_ref<float>> conv_w, conv_b, dense_w, dense_b;

  // Metrics.
  mutable std::mutex mu;
  std::map<std::pair<int, int>, std::uint64_t> by_code;  // (endpoint, status) -> count
  std::array<histogram, ep_n> latency;
  std::atomic<std::uint64_t> connections{0}, open{0}, gone{0};
  std::set<std::shared_ptr<tcp::socket>> sockets;  // open connections (guarded by mu)

  // ---------------------------------------------------------- start, stop

  std::optional<std::string> start() {
    cuda::device_options dopt;
    if (o.isolated) {
      dopt.isolation.enabled = true;
      if (o.test_faults) dopt.isolation.worker_args = {"--test-faults"};
    }
    dev = cuda::device(ioc.get_executor(), o.device, dopt);
    // An isolated device starts asynchronously; actors and weights are made
    // by the first request that needs them once it serves (ensure_gpu).
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(o.address, ec);
    if (ec) return "bad address " + o.address + ": " + ec.message();
    const tcp::endpoint ep(addr, o.port);
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return "cannot listen on " + o.address + ":" + std::to_string(o.port) + ": " + ec.message();
    asio::co_spawn(acceptor.get_executor(), accept_loop(shared_from_this()), asio::detached);
    return std::nullopt;
  }

  /// The GPU objects one request uses: copies of the handles, so that
  /// stop() may drop the service's own at any time.
  struct gpu {
    cuda::device dev;
    cuda::blas_actor blas;
    std::optional<cuda::fft_actor> fft;
    std::optional<cuda::cudnn_actor> dnn;
    std::string note;  // why an actor is missing
  };

  /// The actors, made by the first request once the device serves (an
  /// isolated device starts asynchronously). They outlive worker restarts:
  /// the worker makes its side of an actor at the actor's first call.
  cuda::result<gpu> ensure_gpu() {
    std::lock_guard lk(gpu_mu);
    if (!dev)
      return cuda::gpu_error(cuda::errc::device_unavailable, "atomr", 0, "the service is stopping");
    BOOST_OUTCOME_TRY(dev.status());
    if (!blas) {
      BOOST_OUTCOME_TRY(auto b, cuda::blas_actor::create(dev));
      if (auto f = cuda::fft_actor::create(dev))
        fft = std::move(f).value();
      else
        gpu_note = f.error().message();
      if (auto d = cuda::cudnn_actor::create(dev))
        dnn = std::move(d).value();
      else
        gpu_note = d.error().message();
      blas = std::move(b);
    }
    return gpu{dev, *blas, fft, dnn, gpu_note};
  }

  struct model_refs {
    cuda::gpu_ref<float> conv_w, conv_b, dense_w, dense_b;
  };

  /// The model's weights on the GPU: uploaded by the first /v1/infer, and
  /// again after an isolated worker's restart made them stale.
  asio::awaitable<cuda::result<model_refs>> ensure_weights(cuda::device d) {
    {
      std::lock_guard lk(gpu_mu);
      if (conv_w && conv_w->generation() == d.generation())
        co_return model_refs{*conv_w, *conv_b, *dense_w, *dense_b};
    }
    BOOST_OUTCOME_CO_TRY(auto cw, d.allocate<float>(w.conv_w.size()));
    BOOST_OUTCOME_CO_TRY(auto cb, d.allocate<float>(w.conv_b.size()));
    BOOST_OUTCOME_CO_TRY(auto dw, d.allocate<float>(w.dense_w.size()));
    BOOST_OUTCOME_CO_TRY(auto db, d.allocate<float>(w.dense_b.size()));
    BOOST_OUTCOME_CO_TRY(
        co_await cuda::compose(d, how(), cuda::upload(w.conv_w, cw), cuda::upload(w.conv_b, cb),
                               cuda::upload(w.dense_w, dw), cuda::upload(w.dense_b, db)));
    std::lock_guard lk(gpu_mu);
    conv_w = cw;
    conv_b = cb;
    dense_w = dw;
    dense_b = db;
    co_return model_refs{cw, cb, dw, db};
  }
  mutable std::mutex gpu_mu;  // the GPU objects above, when made or dropped

  void stop() {
    if (stopping.exchange(true)) return;
    // On the acceptor's strand: the close never meets an accept in progress.
    asio::post(acceptor.get_executor(), [self = shared_from_this()] {
      boost::system::error_code ec;
      self->acceptor.close(ec);
      std::vector<std::shared_ptr<tcp::socket>> open_now;
      {
        std::lock_guard lk(self->mu);
        open_now.assign(self->sockets.begin(), self->sockets.end());
      }
      for (auto& s : open_now)
        asio::post(s->get_executor(), [s] {
          boost::system::error_code e;
          s->shutdown(tcp::socket::shutdown_both, e);
          s->close(e);
        });
      self->drain(std::make_shared<asio::steady_timer>(self->ioc), 0);
    });
  }

  /// Waits (up to 5 s) for the connections to end, then drops the GPU objects.
  void drain(std::shared_ptr<asio::steady_timer> t, int rounds) {
    if (open.load() == 0 || rounds > 500) {
      std::unique_lock lk(gpu_mu);
      blas.reset();
      fft.reset();
      dnn.reset();
      conv_w.reset();
      conv_b.reset();
      dense_w.reset();
      dense_b.reset();
      dev.stop();
      dev = cuda::device{};
      lk.unlock();
      done.store(true);
      return;
    }
    t->expires_after(10ms);
    t->async_wait([self = shared_from_this(), t, rounds](boost::system::error_code) {
      self->drain(t, rounds + 1);
    });
  }

  // ---------------------------------------------------------- connections

  static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self) {
    for (;;) {
      auto s = std::make_shared<tcp::socket>(asio::make_strand(self->ioc));
      auto [ec] = co_await self->acceptor.async_accept(*s, asio::as_tuple(asio::use_awaitable));
      if (ec) {
        if (self->stopping.load() || ec == asio::error::operation_aborted) co_return;
        continue;  // e.g. too many open files: keep serving the others
      }
      {
        // Under `mu`, as stop() takes its list of sockets to close: a
        // connection accepted as stop() runs is either on that list or
        // closed here, never left serving after the service drained.
        std::lock_guard lk(self->mu);
        if (self->stopping.load()) {
          boost::system::error_code e;
          s->close(e);
          co_return;
        }
        ++self->connections;
        ++self->open;
        self->sockets.insert(s);
      }
      asio::co_spawn(s->get_executor(), session(self, s), asio::detached);
    }
  }

  /// Watches a connection while its request's GPU work runs: returns when
  /// the client has gone (end of stream, reset). Bytes of a next, pipelined
  /// request are kept in `buf` for the next read.
  static asio::awaitable<void> watch_close(std::shared_ptr<tcp::socket> s,
                                           beast::flat_buffer& buf) {
    for (;;) {
      if (buf.size() > (std::size_t{1} << 20)) {
        // Enough read ahead: wait without reading (until cancelled).
        asio::steady_timer t(s->get_executor(), std::chrono::hours(24));
        co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
        continue;
      }
      auto [ec, n] =
          co_await s->async_read_some(buf.prepare(16384), asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;  // gone (or cancelled because the answer is ready)
      buf.commit(n);
    }
  }

  static asio::awaitable<void> session(std::shared_ptr<impl> self, std::shared_ptr<tcp::socket> s) {
    try {
      co_await serve_requests(self, s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "atomr-serve: a connection ended with an exception: %s\n", e.what());
    }
    boost::system::error_code ec;
    s->shutdown(tcp::socket::shutdown_send, ec);
    s->close(ec);
    {
      std::lock_guard lk(self->mu);
      self->sockets.erase(s);
    }
    --self->open;
  }

  static asio::awaitable<void> serve_requests(std::shared_ptr<impl> self,
                                              std::shared_ptr<tcp::socket> s) {
    using namespace asio::experimental::awaitable_operators;
    beast::flat_buffer buf;
    // Beast reads max(512, free capacity) bytes at a time: room for 64 KiB
    // takes a raw gemm 64 request (32 KiB) in one or two reads, not 64.
    buf.reserve(std::size_t{1} << 16);
    scratch sc;  // this connection's device buffers
    for (;;) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(self->o.body_limit);
      parser.header_limit(16 * 1024);
      auto [rec, timed_out] = co_await with_deadline(
          s, self->o.read_timeout,
          [&](deadline_socket& g) -> asio::awaitable<boost::system::error_code> {
            auto [e, n] =
                co_await http::async_read(g, buf, parser, asio::as_tuple(asio::use_awaitable));
            (void)n;
            co_return e;
          });
      if (rec) {
        if (rec == http::error::end_of_stream || self->stopping.load() || !s->is_open()) break;
        http::status st = http::status::bad_request;
        std::string why = "malformed HTTP request: " + rec.message();
        if (timed_out) {
          st = http::status::request_timeout;
          why = "the request did not arrive within " +
                std::to_string(self->o.read_timeout.count()) + " ms";
        } else if (rec == http::error::body_limit) {
          st = http::status::payload_too_large;
          why = "the body is larger than the limit of " + std::to_string(self->o.body_limit) +
                " bytes";
        } else if (rec == http::error::header_limit) {
          st = http::status::request_header_fields_too_large;
          why = "the header is larger than 16 KiB";
        } else if (rec == asio::error::eof || rec == asio::error::connection_reset ||
                   rec == http::error::partial_message) {
          break;  // gone mid-request (partial_message: closed in order, part of it sent)
        }
        response res{st, 11};
        res.set(http::field::content_type, "application/json");
        res.body() = error_body(why, http::obsolete_reason(st));
        res.keep_alive(false);
        res.prepare_payload();
        co_await write(self, s, res, ep_other, std::chrono::nanoseconds(0));
        break;
      }
      request req = parser.release();
      const auto t0 = std::chrono::steady_clock::now();
      int ep = ep_other;
      auto out = co_await (self->handle(req, ep, sc) || watch_close(s, buf));
      if (out.index() == 1) {
        ++self->gone;  // the client left: its GPU wait was cancelled
        break;
      }
      response res = std::get<0>(std::move(out));
      // A failed request's GPU work may still use the buffers (a timeout's
      // goes on, parked): the next request gets new ones.
      if (res.result_int() >= 300) sc.drop();
      res.version(req.version());
      res.keep_alive(req.keep_alive() && !self->stopping.load());
      res.prepare_payload();
      // An answer to HEAD is its head only (RFC 9110 9.3.2), with the
      // Content-Length of the body it would have: a client reads no body
      // after it, and bytes sent anyway would begin its next answer.
      if (req.method() == http::verb::head) res.body().clear();
      if (!co_await write(self, s, res, ep, std::chrono::steady_clock::now() - t0)) break;
      if (!res.keep_alive()) break;
    }
  }

  /// Writes `res` (counted in the metrics first); false when the connection failed.
  static asio::awaitable<bool> write(std::shared_ptr<impl> self, std::shared_ptr<tcp::socket> s,
                                     response& res, int ep, std::chrono::nanoseconds took) {
    {
      std::lock_guard lk(self->mu);
      ++self->by_code[{ep, static_cast<int>(res.result_int())}];
    }
    if (ep != ep_other) self->latency[ep].add(took);
    auto [ec, late] = co_await with_deadline(
        s, self->o.write_timeout,
        [&](deadline_socket& g) -> asio::awaitable<boost::system::error_code> {
          auto [e, n] = co_await http::async_write(g, res, asio::as_tuple(asio::use_awaitable));
          (void)n;
          co_return e;
        });
    (void)late;
    co_return !ec;
  }

  // ---------------------------------------------------------- routing

  static response reply(http::status st, std::string body,
                        std::string_view type = "application/json") {
    response res{st, 11};
    res.set(http::field::content_type, type);
    res.body() = std::move(body);
    return res;
  }
  /// 200 with `v`'s bytes as they are (little-endian f32 or complex f32) and
  /// the named header (X-Shape, X-Class).
  template <class T>
  static response raw_reply(const std::vector<T>& v, std::string_view header, std::string value) {
    return raw_body(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)),
                    header, std::move(value));
  }
  /// The same for bytes already in a string.
  static response raw_body(std::string bytes, std::string_view header, std::string value) {
    auto res = reply(http::status::ok, std::move(bytes), "application/octet-stream");
    res.set(header, std::move(value));
    return res;
  }
  static response bad(http::status st, std::string_view why) {
    return reply(st, error_body(why, http::obsolete_reason(st)));
  }
  static response failed(const cuda::gpu_error& e) {
    return reply(status_of(e.code()), error_body(e.message(), cuda::to_string(e.code())));
  }

  asio::awaitable<response> handle(const request& req, int& ep, scratch& sc) {
    const std::string_view target = req.target();
    const auto q = target.find('?');
    const std::string_view path = target.substr(0, q);
    const std::string_view query = q == std::string_view::npos ? "" : target.substr(q + 1);
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    if (path == "/health") {
      ep = ep_health;
      if (!get) co_return bad(http::status::method_not_allowed, "use GET /health");
      int st = 200;
      auto body = health_json(st);
      co_return reply(static_cast<http::status>(st), std::move(body));
    }
    if (path == "/metrics") {
      ep = ep_metrics;
      if (!get) co_return bad(http::status::method_not_allowed, "use GET /metrics");
      co_return reply(http::status::ok, metrics_text(), "text/plain; version=0.0.4");
    }
    if (path == "/v1/gemm" || path == "/v1/fft" || path == "/v1/infer") {
      ep = path == "/v1/gemm" ? ep_gemm : path == "/v1/fft" ? ep_fft : ep_infer;
      if (!post) co_return bad(http::status::method_not_allowed, "use POST");
      if (!is_raw(req) && req.body().size() > o.json_limit)
        co_return bad(http::status::payload_too_large,
                      "a JSON body is larger than the limit of " + std::to_string(o.json_limit) +
                          " bytes (--json-limit); send large arrays as "
                          "application/octet-stream with X-Shape");
      if (ep == ep_gemm) co_return co_await gemm(req, sc);
      if (ep == ep_fft) co_return co_await fft_forward(req, sc);
      co_return co_await infer(req, sc);
    }
    if (path == "/v1/fault" && o.test_faults) {
      ep = ep_fault;
      if (!post) co_return bad(http::status::method_not_allowed, "use POST");
      co_return co_await fault(query);
    }
    co_return bad(http::status::not_found, "no such endpoint: " + std::string(path));
  }

  cuda::completion how() const {
    cuda::completion c;
    c.kind = o.strategy;
    c.spin = o.spin;
    c.timeout = o.gpu_timeout;
    return c;
  }

  // ---------------------------------------------------------- gemm

  asio::awaitable<response> gemm(const request& req, scratch& sc) {
    std::int64_t m = 0, n = 0, k = 0;
    std::vector<float> a, b;
    std::string err;
    const bool raw = is_raw(req);
    if (raw) {
      std::array<std::int64_t, 3> shape{};
      if (!parse_shape(req["X-Shape"], shape, err)) co_return bad(http::status::bad_request, err);
      m = shape[0];
      n = shape[1];
      k = shape[2];
    } else {
      json::reader r(req.body());
      auto v = r.parse(err);
      if (!v) co_return bad(http::status::bad_request, "malformed JSON: " + err);
      if (!json::positive(*v, "m", o.max_gemm_dim, m, err) ||
          !json::positive(*v, "n", o.max_gemm_dim, n, err) ||
          !json::positive(*v, "k", o.max_gemm_dim, k, err) ||
          !json::floats(*v, "a", static_cast<std::size_t>(m * k), a, err) ||
          !json::floats(*v, "b", static_cast<std::size_t>(k * n), b, err))
        co_return bad(http::status::bad_request, err);
    }
    if (m > o.max_gemm_dim || n > o.max_gemm_dim || k > o.max_gemm_dim)
      co_return bad(http::status::bad_request,
                    "m, n and k must each be at most " + std::to_string(o.max_gemm_dim));
    if (raw) {
      const std::size_t want = static_cast<std::size_t>(m * k + k * n) * sizeof(float);
      if (req.body().size() != want)
        co_return bad(http::status::bad_request,
                      "the body has " + std::to_string(req.body().size()) +
                          " bytes; X-Shape m,n,k needs (m*k + k*n) * 4 = " + std::to_string(want));
    }
    // Raw bodies go up from the request's bytes and the answer comes down
    // into the response's body: no copies of either here (the library
    // copies bytes, so float views of the strings' heap storage serve).
    const auto mk = static_cast<std::size_t>(m * k), kn = static_cast<std::size_t>(k * n),
               mn = static_cast<std::size_t>(m * n);
    std::span<const float> av(a), bv(b);
    if (raw) {
      const auto* body = reinterpret_cast<const float*>(req.body().data());
      av = {body, mk};
      bv = {body + mk, kn};
    }
    auto g = ensure_gpu();
    if (!g) co_return failed(g.error());
    auto& dev = g.value().dev;
    auto& blas = g.value().blas;
    std::vector<float> c(raw ? 0 : mn);
    std::string raw_c(raw ? mn * sizeof(float) : 0, '\0');
    const std::span<float> cv =
        raw ? std::span<float>(reinterpret_cast<float*>(raw_c.data()), mn) : std::span<float>(c);
    auto run = [&]() -> asio::awaitable<cuda::result<void>> {
      BOOST_OUTCOME_CO_TRY(auto ga, sc.floats(dev, 0, mk));
      BOOST_OUTCOME_CO_TRY(auto gb, sc.floats(dev, 1, kn));
      BOOST_OUTCOME_CO_TRY(auto gc, sc.floats(dev, 2, mn));
      // Row-major C = A B is column-major C^T = B^T A^T: cuBLAS sees the
      // row-major arrays as their transposes, so B goes first.
      cuda::gemm_params p;
      p.m = n;
      p.n = m;
      p.k = k;
      p.lda = n;
      p.ldb = k;
      p.ldc = n;
      BOOST_OUTCOME_CO_TRY(co_await cuda::compose(dev, how(), cuda::upload(av, ga),
                                                  cuda::upload(bv, gb), blas.gemm(p, gb, ga, gc),
                                                  cuda::download(gc, cv)));
      co_return cuda::outcome::success();
    };
    if (auto ok = co_await run(); !ok) co_return failed(ok.error());
    if (raw)
      co_return raw_body(std::move(raw_c), "X-Shape", std::to_string(m) + "," + std::to_string(n));
    std::string body = "{\"m\":" + std::to_string(m) + ",\"n\":" + std::to_string(n) + ",\"c\":";
    json::append_array<float>(body, c);
    body += "}";
    co_return reply(http::status::ok, std::move(body));
  }

  // ---------------------------------------------------------- fft

  asio::awaitable<response> fft_forward(const request& req, scratch& sc) {
    std::int64_t n = 0;
    std::vector<std::complex<float>> x;
    std::string err;
    const bool raw = is_raw(req);
    if (raw) {
      std::array<std::int64_t, 1> shape{};
      if (!parse_shape(req["X-Shape"], shape, err)) co_return bad(http::status::bad_request, err);
      n = shape[0];
      if (n > o.max_fft)
        co_return bad(http::status::bad_request, "n must be at most " + std::to_string(o.max_fft));
      const std::size_t want = static_cast<std::size_t>(n) * 8;
      if (req.body().size() != want)
        co_return bad(http::status::bad_request,
                      "the body has " + std::to_string(req.body().size()) +
                          " bytes; X-Shape n needs n * 8 (interleaved complex f32) = " +
                          std::to_string(want));
    } else {
      json::reader r(req.body());
      auto v = r.parse(err);
      if (!v) co_return bad(http::status::bad_request, "malformed JSON: " + err);
      std::vector<float> re, im;
      if (!json::positive(*v, "n", o.max_fft, n, err) ||
          !json::floats(*v, "re", static_cast<std::size_t>(n), re, err) ||
          !json::floats(*v, "im", static_cast<std::size_t>(n), im, err))
        co_return bad(http::status::bad_request, err);
      x.resize(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = {re[i], im[i]};
    }
    auto g = ensure_gpu();
    if (!g) co_return failed(g.error());
    auto& dev = g.value().dev;
    auto& fft = g.value().fft;
    if (!fft)
      co_return failed(cuda::gpu_error(cuda::errc::not_supported, "atomr", 0,
                                       "/v1/fft: no FFT actor on this device: " + g.value().note));
    // As in gemm: a raw body goes up from the request's bytes and the
    // answer comes down into the response's body.
    using cf = std::complex<float>;
    const auto count = static_cast<std::size_t>(n);
    const std::span<const cf> xv =
        raw ? std::span<const cf>(reinterpret_cast<const cf*>(req.body().data()), count)
            : std::span<const cf>(x);
    std::vector<cf> y(raw ? 0 : count);
    std::string raw_y(raw ? count * sizeof(cf) : 0, '\0');
    const std::span<cf> yv =
        raw ? std::span<cf>(reinterpret_cast<cf*>(raw_y.data()), count) : std::span<cf>(y);
    auto run = [&]() -> asio::awaitable<cuda::result<void>> {
      BOOST_OUTCOME_CO_TRY(auto gx, sc.complexes(dev, 0, count));
      BOOST_OUTCOME_CO_TRY(auto gy, sc.complexes(dev, 1, count));
      cuda::fft_shape sh;
      sh.dims[0] = n;
      BOOST_OUTCOME_CO_TRY(co_await cuda::compose(dev, how(), cuda::upload(xv, gx),
                                                  fft->c2c(sh, gx, gy), cuda::download(gy, yv)));
      co_return cuda::outcome::success();
    };
    if (auto ok = co_await run(); !ok) co_return failed(ok.error());
    if (raw) co_return raw_body(std::move(raw_y), "X-Shape", std::to_string(n));
    std::vector<float> re(y.size()), im(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      re[i] = y[i].real();
      im[i] = y[i].imag();
    }
    std::string body = "{\"n\":" + std::to_string(n) + ",\"re\":";
    json::append_array<float>(body, re);
    body += ",\"im\":";
    json::append_array<float>(body, im);
    body += "}";
    co_return reply(http::status::ok, std::move(body));
  }

  // ---------------------------------------------------------- infer

  asio::awaitable<response> infer(const request& req, scratch& sc) {
    std::vector<float> x;
    std::string err;
    const bool raw = is_raw(req);
    if (raw) {
      if (req.body().size() != model::input_size * sizeof(float))
        co_return bad(http::status::bad_request,
                      "the body has " + std::to_string(req.body().size()) +
                          " bytes; the model takes " + std::to_string(model::input_size) +
                          " f32 (" + std::to_string(model::input_size * sizeof(float)) + " bytes)");
      x.resize(model::input_size);
      std::memcpy(x.data(), req.body().data(), req.body().size());
    } else {
      json::reader r(req.body());
      auto v = r.parse(err);
      if (!v) co_return bad(http::status::bad_request, "malformed JSON: " + err);
      if (!json::floats(*v, "x", model::input_size, x, err))
        co_return bad(http::status::bad_request, err + " (a 28 x 28 image, row by row)");
    }
    auto g = ensure_gpu();
    if (!g) co_return failed(g.error());
    auto& dev = g.value().dev;
    auto& blas = g.value().blas;
    auto& dnn = g.value().dnn;
    if (!dnn)
      co_return failed(
          cuda::gpu_error(cuda::errc::not_supported, "atomr", 0,
                          "/v1/infer: no cuDNN actor on this device: " + g.value().note));
    auto wts = co_await ensure_weights(dev);
    if (!wts) co_return failed(wts.error());
    const auto& mr = wts.value();
    std::vector<float> probs(model::classes);
    auto run = [&]() -> asio::awaitable<cuda::result<void>> {
      using namespace model;
      BOOST_OUTCOME_CO_TRY(auto gx, sc.floats(dev, 0, input_size));
      BOOST_OUTCOME_CO_TRY(auto act,
                           sc.floats(dev, 1, static_cast<std::size_t>(filters) * in_h * in_w));
      BOOST_OUTCOME_CO_TRY(auto pooled, sc.floats(dev, 2, features));
      BOOST_OUTCOME_CO_TRY(auto logits, sc.floats(dev, 3, classes));
      BOOST_OUTCOME_CO_TRY(auto gp, sc.floats(dev, 4, classes));
      const cuda::tensor_shape xs{1, 1, in_h, in_w};
      const cuda::tensor_shape as{1, filters, in_h, in_w};
      cuda::conv2d_params cp;
      cp.out_channels = filters;
      cp.filter_h = cp.filter_w = kernel;
      cp.pad_h = cp.pad_w = 1;
      cuda::pooling_params pp;  // max 2x2, stride 2
      cuda::gemm_params gp_;    // logits (10 x 1) = W (10 x 1568, ld 10) pooled (1568 x 1)
      gp_.m = classes;
      gp_.n = 1;
      gp_.k = features;
      gp_.lda = classes;
      gp_.ldb = features;
      gp_.ldc = classes;
      BOOST_OUTCOME_CO_TRY(co_await cuda::compose(
          dev, how(), cuda::upload(x, gx),
          dnn->conv2d_forward(xs, cp, gx, mr.conv_w, mr.conv_b, act),
          dnn->activation_forward(as, {}, act, act), dnn->pooling_forward(as, pp, act, pooled),
          blas.gemm_fused(gp_, cuda::gemm_epilogue::bias, mr.dense_w, pooled, mr.dense_b, logits),
          dnn->softmax_forward(cuda::tensor_shape{1, classes, 1, 1},
                               cuda::softmax_algorithm::accurate, logits, gp),
          cuda::download(gp, probs)));
      co_return cuda::outcome::success();
    };
    if (auto ok = co_await run(); !ok) co_return failed(ok.error());
    const auto best = std::max_element(probs.begin(), probs.end()) - probs.begin();
    // Raw in, raw out: the probabilities as f32, the class in a header.
    if (raw) co_return raw_reply(probs, "X-Class", std::to_string(best));
    std::string body = "{\"probs\":";
    json::append_array<float>(body, probs);
    body += ",\"class\":" + std::to_string(best) + "}";
    co_return reply(http::status::ok, std::move(body));
  }

  // ---------------------------------------------------------- fault

  asio::awaitable<response> fault(std::string_view query) {
    const auto dev = device_now();
    if (!dev.isolated())
      co_return bad(http::status::conflict,
                    "fault injection needs --isolated: in process a sticky fault would end the "
                    "GPU work of this service for good");
    static constexpr std::pair<std::string_view, std::uint16_t> kinds[] = {
        {"abort", 1}, {"kill", 2}, {"hang", 3}, {"illegal_address", 4}};
    std::string_view kind = "illegal_address";
    if (query.starts_with("kind=")) kind = query.substr(5);
    for (const auto& [name, code] : kinds) {
      if (name != kind) continue;
      cuda::completion c;
      c.timeout = 5s;
      auto r = co_await cuda::detail::inject_isolated_fault(dev.impl(), code, c);
      std::string body = "{\"injected\":" + json::quote(name) +
                         ",\"result\":" + json::quote(r ? "ok" : r.error().message()) + "}";
      co_return reply(http::status::accepted, std::move(body));
    }
    co_return bad(http::status::bad_request,
                  "kind must be one of illegal_address, abort, kill, hang");
  }

  // ---------------------------------------------------------- health, metrics

  /// The device handle (stop() drops it once idle).
  cuda::device device_now() const {
    std::lock_guard lk(gpu_mu);
    return dev;
  }

  std::string health_json(int& status) const {
    const auto dev = device_now();
    const auto s = dev.statistics();
    const auto st = dev.status();
    status = dev.accepting() ? 200 : 503;
    std::string out = "{\"health\":" + json::quote(cuda::to_string(dev.health())) +
                      ",\"accepting\":" + (dev.accepting() ? "true" : "false") +
                      ",\"generation\":" + std::to_string(s.generation) +
                      ",\"isolated\":" + (s.isolated ? "true" : "false") +
                      ",\"worker_restarts\":" + std::to_string(s.worker_restarts) +
                      ",\"restarts_left\":" + std::to_string(s.restarts_left) +
                      ",\"worker_pid\":" + std::to_string(s.worker_pid) +
                      ",\"stopping\":" + (stopping.load() ? "true" : "false");
    if (!st) out += ",\"status\":" + json::quote(st.error().message());
    return out + "}";
  }

  std::string metrics_text() const {
    const auto dev = device_now();
    std::string m;
    auto line = [&](std::string_view name, std::string_view labels, double v) {
      m += name;
      if (!labels.empty()) m += "{" + std::string(labels) + "}";
      m += ' ';
      json::append_number(m, v);
      m += '\n';
    };
    auto head = [&](std::string_view name, std::string_view type, std::string_view help) {
      m += "# HELP " + std::string(name) + " " + std::string(help) + "\n# TYPE " +
           std::string(name) + " " + std::string(type) + "\n";
    };
    head("atomr_serve_requests_total", "counter",
         "Requests answered, by endpoint and status code.");
    {
      std::lock_guard lk(mu);
      for (const auto& [k, v] : by_code)
        line("atomr_serve_requests_total",
             "endpoint=\"" + std::string(endpoint_names[k.first]) + "\",code=\"" +
                 std::to_string(k.second) + "\"",
             static_cast<double>(v));
    }
    head("atomr_serve_request_seconds", "histogram",
         "Time from a request's arrival to its answer being ready.");
    for (int e = 0; e < ep_n; ++e) {
      const auto& h = latency[e];
      std::uint64_t cum = 0;
      const std::string ep = "endpoint=\"" + std::string(endpoint_names[e]) + "\"";
      for (std::size_t i = 0; i <= histogram::bounds.size(); ++i) {
        cum += h.counts[i].load();
        std::string le = "+Inf";
        if (i < histogram::bounds.size()) {
          char text[32];
          std::snprintf(text, sizeof text, "%g", histogram::bounds[i]);
          le = text;
        }
        line("atomr_serve_request_seconds_bucket", ep + ",le=\"" + le + "\"",
             static_cast<double>(cum));
      }
      line("atomr_serve_request_seconds_sum", ep, static_cast<double>(h.sum_ns.load()) * 1e-9);
      line("atomr_serve_request_seconds_count", ep, static_cast<double>(cum));
    }
    head("atomr_serve_connections_total", "counter", "Connections accepted.");
    line("atomr_serve_connections_total", "", static_cast<double>(connections.load()));
    head("atomr_serve_connections_open", "gauge", "Connections open now.");
    line("atomr_serve_connections_open", "", static_cast<double>(open.load()));
    head("atomr_serve_client_gone_total", "counter",
         "Requests whose client disconnected before the answer (their GPU wait was cancelled).");
    line("atomr_serve_client_gone_total", "", static_cast<double>(gone.load()));

    const auto s = dev.statistics();
    head("atomr_device_health", "gauge", "1 for the device's current health state.");
    line("atomr_device_health", "state=\"" + std::string(cuda::to_string(s.health)) + "\"", 1);
    auto gauge = [&](std::string_view name, std::string_view help, double v,
                     std::string_view type = "gauge") {
      head(name, type, help);
      line(name, "", v);
    };
    gauge("atomr_device_generation", "Device generation (bumps after each fault).",
          static_cast<double>(s.generation));
    gauge("atomr_device_ops_in_flight", "GPU operations in flight.",
          static_cast<double>(s.ops_in_flight));
    gauge("atomr_device_ops_completed_total", "GPU operations finished with success.",
          static_cast<double>(s.ops_completed), "counter");
    gauge("atomr_device_ops_failed_total", "GPU operations finished with an error.",
          static_cast<double>(s.ops_failed), "counter");
    gauge("atomr_device_faults_total", "Sticky faults seen.", static_cast<double>(s.faults),
          "counter");
    gauge("atomr_device_out_of_memory_total", "Out-of-memory errors.",
          static_cast<double>(s.out_of_memory), "counter");
    gauge("atomr_device_live_buffers", "Device buffers alive.",
          static_cast<double>(s.live_buffers));
    gauge("atomr_device_parked", "Keep-alives waiting for abandoned GPU work.",
          static_cast<double>(s.parked));
    gauge("atomr_device_free_bytes", "Free device memory.", static_cast<double>(s.free_bytes));
    gauge("atomr_device_total_bytes", "Device memory.", static_cast<double>(s.total_bytes));
    gauge("atomr_device_worker_restarts_total", "Isolated: worker restarts.",
          static_cast<double>(s.worker_restarts), "counter");
    gauge("atomr_device_restarts_left", "Isolated: restarts the budget still allows.",
          static_cast<double>(s.restarts_left));
    gauge("atomr_device_worker_calls_pending",
          "Isolated: requests sent to the worker and not answered.",
          static_cast<double>(s.worker_calls_pending));
    gauge("atomr_device_library_threads",
          "Threads of the device's own: launch threads, or the isolated reply reader.",
          static_cast<double>(s.library_threads));
    gauge("atomr_device_blocking_threads",
          "The device's blocking_sync thread (1 from its first blocking_sync wait).",
          static_cast<double>(s.blocking_threads));
    gauge("atomr_device_worker_threads",
          "Isolated: threads of the worker process (its io and ring threads, the device's "
          "launch threads, the CUDA driver's).",
          static_cast<double>(s.worker_threads));
    std::optional<cuda::blas_actor> b;
    {
      std::lock_guard lk(gpu_mu);
      b = blas;
    }
    if (b)
      gauge("atomr_blas_lanes", "Lanes of the blas actor.",
            static_cast<double>(b->statistics().lanes));
    return m;
  }
};

// ------------------------------------------------------------------ service

service::service(asio::io_context& ioc, options o)
    : p_(std::make_shared<impl>(ioc, std::move(o))) {}
service::~service() = default;
std::optional<std::string> service::start() {
  return p_->start();
}
unsigned short service::port() const {
  boost::system::error_code ec;
  const auto ep = p_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}
void service::stop() {
  p_->stop();
}
bool service::stopped() const {
  return p_->done.load();
}
counters service::stats() const {
  counters c;
  {
    std::lock_guard lk(p_->mu);
    for (const auto& [k, v] : p_->by_code) {
      c.requests += v;
      if (k.second < 300)
        c.ok += v;
      else if (k.second < 500)
        c.client_errors += v;
      else
        c.server_errors += v;
    }
  }
  c.client_gone = p_->gone.load();
  c.connections = p_->connections.load();
  c.open_connections = p_->open.load();
  return c;
}
cuda::device& service::device() {
  return p_->dev;
}
std::string service::health_json(int& status) const {
  return p_->health_json(status);
}
std::string service::metrics_text() const {
  return p_->metrics_text();
}

}  // namespace serve
