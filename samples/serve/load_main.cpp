// atomr-load: a load generator for atomr-serve. Many keep-alive connections,
// each a coroutine (Boost.Beast client) on a few io threads, send requests
// for a bounded time and count; every answer's numbers can be checked against
// a CPU reference in double precision. Loopback only.
#include "../cli.hpp"
#include "json.hpp"
#include "model.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <numbers>
#include <string>
#include <thread>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

constexpr cli::program prog{"atomr-load"};

struct cli_options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int connections = 16;
  int threads = 2;
  long long requests = 0;  // 0: until --seconds
  double seconds = 5;
  std::string endpoint = "gemm";
  int size = 64;
  bool raw = false;
  bool check = false;
  long long fault_every = 0;
  long long fault_every_ms = 0;  // a fault each time this much more has passed (0: none)
  std::string fault_kind = "illegal_address";
  long long wait_healthy = 0;  // seconds
  std::string json;
  bool quiet = false;
};

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "Usage: %s [--host H] [--port P] [--connections C] [--threads T]\n"
      "          [--requests N] [--seconds S] [--endpoint gemm|fft|infer|mix]\n"
      "          [--size N] [--raw] [--check] [--fault-every N] [--fault-every-ms MS]\n"
      "          [--fault-kind K] [--wait-healthy S] [--json FILE] [--quiet]\n"
      "\n"
      "Drives an atomr-serve on this machine: C keep-alive connections, each sending\n"
      "one request after another until N requests (all connections together) or S\n"
      "seconds, whichever comes first; a live progress line (req/s, p50, p99, errors)\n"
      "each second on stderr, then a summary. Loopback addresses only.\n"
      "\n"
      "Options:\n"
      "  --host H           127.0.0.1, ::1 or localhost (default 127.0.0.1)\n"
      "  --port P           the service's port (default 8080)\n"
      "  --connections C    1..4096 (default 16)\n"
      "  --threads T        io threads of this program, 1..64 (default 2)\n"
      "  --requests N       stop after N requests, 0: no limit but time (default 0)\n"
      "  --seconds S        stop after S seconds, 1..3600 (default 5)\n"
      "  --endpoint E       gemm (n x n x n), fft (n points), infer (the fixed\n"
      "                     model) or mix (in turn) (default gemm)\n"
      "  --size N           gemm n 1..1024, fft n 1..1048576 (default 64)\n"
      "  --raw              binary bodies (application/octet-stream) instead of JSON\n"
      "                     (JSON bodies over the service's --json-limit, 1 MiB by\n"
      "                     default, about gemm n 200 or fft n 45000, get 413)\n"
      "  --check            check every answer's numbers against a double-precision\n"
      "                     CPU reference (wrong answers are counted)\n"
      "  --fault-every N    every N requests, one POST /v1/fault (the service must run\n"
      "                     with --isolated --test-faults)\n"
      "  --fault-every-ms MS  one POST /v1/fault each time MS more milliseconds have\n"
      "                     passed (first at MS)\n"
      "  --fault-kind K     illegal_address, abort, kill or hang (default illegal_address)\n"
      "  --wait-healthy S   first wait up to S seconds for GET /health to answer 200 (an\n"
      "                     isolated device's worker starting); exit 69 if it never does\n"
      "  --json FILE        write the summary as JSON (with each failing status's first\n"
      "                     answer, which names the failure, as the summary prints it)\n"
      "  --quiet            no progress line\n"
      "  --help             print this help and exit\n"
      "\n"
      "Exit status: 69 when --wait-healthy ran out (the service's /health is printed);\n"
      "0 when every request succeeded (faults excepted: requests failing\n"
      "with 503 around an injected fault are counted, not fatal) and no answer was\n"
      "wrong; 1 on connection failures or unexpected errors; 2 on a wrong answer;\n"
      "64 bad command line.\n",
      prog.name);
}

/// splitmix64: a small deterministic generator per connection.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1 << 24) - 0.5f; }
};

/// One prepared request and what its answer must hold.
struct job {
  std::string target;
  std::string body;
  bool raw = false;
  std::string shape;
  int kind = 0;  // 0 gemm, 1 fft, 2 infer
  std::int64_t m = 0, n = 0, k = 0;
  std::vector<float> a, b;  // gemm inputs; fft: re, im; infer: x in a
};

job make_job(int kind, int size, bool raw, rng& g) {
  job j;
  j.kind = kind;
  j.raw = raw;
  auto fill = [&](std::vector<float>& v, std::size_t n) {
    v.resize(n);
    for (auto& x : v) x = g.uniform();
  };
  std::string& body = j.body;
  if (kind == 0) {
    j.target = "/v1/gemm";
    j.m = j.n = j.k = size;
    fill(j.a, static_cast<std::size_t>(size) * size);
    fill(j.b, static_cast<std::size_t>(size) * size);
    if (raw) {
      j.shape = std::to_string(size) + "," + std::to_string(size) + "," + std::to_string(size);
      body.assign(reinterpret_cast<const char*>(j.a.data()), j.a.size() * 4);
      body.append(reinterpret_cast<const char*>(j.b.data()), j.b.size() * 4);
    } else {
      body = "{\"m\":" + std::to_string(size) + ",\"n\":" + std::to_string(size) +
             ",\"k\":" + std::to_string(size) + ",\"a\":";
      serve::json::append_array<float>(body, j.a);
      body += ",\"b\":";
      serve::json::append_array<float>(body, j.b);
      body += "}";
    }
  } else if (kind == 1) {
    j.target = "/v1/fft";
    j.n = size;
    fill(j.a, static_cast<std::size_t>(size));
    fill(j.b, static_cast<std::size_t>(size));
    if (raw) {
      j.shape = std::to_string(size);
      std::vector<float> inter(2 * static_cast<std::size_t>(size));
      for (int i = 0; i < size; ++i) {
        inter[2 * i] = j.a[i];
        inter[2 * i + 1] = j.b[i];
      }
      body.assign(reinterpret_cast<const char*>(inter.data()), inter.size() * 4);
    } else {
      body = "{\"n\":" + std::to_string(size) + ",\"re\":";
      serve::json::append_array<float>(body, j.a);
      body += ",\"im\":";
      serve::json::append_array<float>(body, j.b);
      body += "}";
    }
  } else {
    j.target = "/v1/infer";
    fill(j.a, serve::model::input_size);
    if (raw) {
      body.assign(reinterpret_cast<const char*>(j.a.data()), j.a.size() * 4);
    } else {
      body = "{\"x\":";
      serve::json::append_array<float>(body, j.a);
      body += "}";
    }
  }
  return j;
}

/// The answer's numbers as floats (raw: the body; JSON: the named arrays).
bool numbers(const job& j, const std::string& body, std::vector<float>& out,
             std::vector<float>& out2) {
  if (j.raw) {
    if (body.size() % 4) return false;
    out.resize(body.size() / 4);
    std::memcpy(out.data(), body.data(), body.size());
    if (j.kind == 1) {  // interleaved
      std::vector<float> re(out.size() / 2), im(out.size() / 2);
      for (std::size_t i = 0; i < re.size(); ++i) {
        re[i] = out[2 * i];
        im[i] = out[2 * i + 1];
      }
      out = std::move(re);
      out2 = std::move(im);
    }
    return true;
  }
  std::string err;
  serve::json::reader r(body);
  auto v = r.parse(err);
  if (!v) return false;
  if (j.kind == 0)
    return serve::json::floats(*v, "c", static_cast<std::size_t>(j.m * j.n), out, err);
  if (j.kind == 1)
    return serve::json::floats(*v, "re", static_cast<std::size_t>(j.n), out, err) &&
           serve::json::floats(*v, "im", static_cast<std::size_t>(j.n), out2, err);
  return serve::json::floats(*v, "probs", serve::model::classes, out, err);
}

/// Checks an answer against a double-precision reference: every entry for
/// small outputs, 64 sampled entries (always the first and last) otherwise.
/// Errors are relative to the sum of absolute terms (the rounding scale).
bool correct(const job& j, const std::string& body, const serve::model::weights& w) {
  std::vector<float> got, got2;
  if (!numbers(j, body, got, got2)) return false;
  if (j.kind == 2) {
    if (got.size() != serve::model::classes) return false;
    const auto ref = serve::model::reference(w, j.a.data());
    for (int i = 0; i < serve::model::classes; ++i)
      if (std::fabs(got[i] - ref[i]) > 1e-4) return false;
    return true;
  }
  const std::size_t outputs =
      j.kind == 0 ? static_cast<std::size_t>(j.m * j.n) : static_cast<std::size_t>(j.n);
  if (got.size() != outputs || (j.kind == 1 && got2.size() != outputs)) return false;
  const std::size_t samples = std::min<std::size_t>(outputs, 64);
  rng pick{outputs};
  for (std::size_t s = 0; s < samples; ++s) {
    const std::size_t at = samples == outputs ? s
                           : s == 0           ? 0
                           : s == 1           ? outputs - 1
                                              : pick.next() % outputs;
    if (j.kind == 0) {
      // Row-major: C[i][jj] = sum_k A[i][k] B[k][jj].
      const std::size_t i = at / static_cast<std::size_t>(j.n),
                        jj = at % static_cast<std::size_t>(j.n);
      double ref = 0, scale = 0;
      for (std::int64_t k = 0; k < j.k; ++k) {
        const double p = static_cast<double>(j.a[i * j.k + k]) * j.b[k * j.n + jj];
        ref += p;
        scale += std::fabs(p);
      }
      if (std::fabs(got[at] - ref) > 1e-5 * std::max(scale, 1e-3)) return false;
    } else {
      // X[f] = sum_t x[t] e^{-2 pi i f t / n}.
      std::complex<double> ref = 0;
      double scale = 0;
      for (std::int64_t t = 0; t < j.n; ++t) {
        const double ang =
            -2 * std::numbers::pi * static_cast<double>((at * t) % j.n) / static_cast<double>(j.n);
        const std::complex<double> x(j.a[t], j.b[t]);
        ref += x * std::complex<double>(std::cos(ang), std::sin(ang));
        scale += std::abs(x);
      }
      const double tol =
          1e-5 * std::max(scale, 1e-3) * std::max(1.0, std::log2(static_cast<double>(j.n)));
      if (std::abs(std::complex<double>(got[at], got2[at]) - ref) > tol) return false;
    }
  }
  return true;
}

/// What all connections record.
struct tally {
  std::mutex mu;
  std::vector<double> latencies_us;  // successful requests
  std::map<int, std::uint64_t> by_status;
  /// Each failing status's first answer: when (seconds since t0) and its body
  /// (cut to 400 bytes), which names the failure (e.g. why a worker restarted).
  std::map<int, std::pair<double, std::string>> first_error;
  std::uint64_t ok = 0, wrong = 0, failed = 0, connect_errors = 0, faults = 0;
  std::vector<std::pair<double, double>> failed_spans;  // [start, end] seconds since t0
  std::uint64_t window_done = 0;
  std::vector<double> window_us;
};

struct run_state {
  cli_options o;
  tcp::endpoint ep;
  clock_type::time_point t0, deadline;
  std::atomic<long long> started{0};
  std::atomic<bool> stop{false};
  std::atomic<long long> faults_claimed{0};
  tally t;
  serve::model::weights w = serve::model::make_weights();
};

/// This process's CPU time so far (every thread, user and system), seconds.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double since(const run_state& st, clock_type::time_point t) {
  return std::chrono::duration<double>(t - st.t0).count();
}

asio::awaitable<void> connection(run_state& st, int id) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  beast::flat_buffer buf;
  // Beast reads max(512, free capacity) bytes at a time, and the parser
  // consumes what it read, so a buffer that starts empty stays small: a
  // 16 KiB answer took 33 reads, each arming and cancelling the stream's
  // timer under the reactor's lock (623 us of CPU per request at 8 threads).
  buf.reserve(std::size_t{1} << 16);
  rng g{0x1234567ull * static_cast<std::uint64_t>(id + 1)};
  const int kinds[] = {0, 1, 2};
  std::vector<job> pool;
  for (int i = 0; i < 4; ++i) {
    int kind = 0;
    if (st.o.endpoint == "fft")
      kind = 1;
    else if (st.o.endpoint == "infer")
      kind = 2;
    else if (st.o.endpoint == "mix")
      kind = kinds[(id + i) % 3];
    pool.push_back(make_job(kind, st.o.size, st.o.raw, g));
  }
  bool connected = false;
  for (std::uint64_t i = 0;; ++i) {
    if (st.stop.load() || clock_type::now() >= st.deadline) break;
    const long long n = st.started.fetch_add(1) + 1;
    if (st.o.requests > 0 && n > st.o.requests) break;
    if (!connected) {
      stream.expires_after(std::chrono::seconds(10));
      auto [ec] = co_await stream.async_connect(st.ep, asio::as_tuple(asio::use_awaitable));
      if (ec) {
        std::lock_guard lk(st.t.mu);
        ++st.t.connect_errors;
        if (st.t.connect_errors > 1000) st.stop = true;
        continue;
      }
      connected = true;
    }
    bool fault = st.o.fault_every > 0 && n % st.o.fault_every == 0;
    if (!fault && st.o.fault_every_ms > 0) {
      // The faults due by now; this request takes the next one if it is due.
      const long long due =
          std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - st.t0).count() /
          st.o.fault_every_ms;
      long long had = st.faults_claimed.load();
      while (had < due && !st.faults_claimed.compare_exchange_weak(had, had + 1)) {
      }
      fault = had < due;
    }
    const job& j = pool[i % pool.size()];
    http::request<http::string_body> req{
        http::verb::post, fault ? "/v1/fault?kind=" + st.o.fault_kind : j.target, 11};
    req.set(http::field::host, st.o.host);
    if (!fault) {
      req.set(http::field::content_type, j.raw ? "application/octet-stream" : "application/json");
      if (!j.shape.empty()) req.set("X-Shape", j.shape);
      req.body() = j.body;
    }
    req.keep_alive(true);
    req.prepare_payload();
    const auto t1 = clock_type::now();
    stream.expires_after(std::chrono::seconds(30));
    auto [wec, wn] = co_await http::async_write(stream, req, asio::as_tuple(asio::use_awaitable));
    http::response<http::string_body> res;
    boost::system::error_code rec;
    if (!wec) {
      auto [e, rn] =
          co_await http::async_read(stream, buf, res, asio::as_tuple(asio::use_awaitable));
      rec = e;
      (void)rn;
    }
    (void)wn;
    const auto t2 = clock_type::now();
    std::lock_guard lk(st.t.mu);
    if (wec || rec) {
      ++st.t.failed;
      ++st.t.by_status[0];
      st.t.failed_spans.emplace_back(since(st, t1), since(st, t2));
      connected = false;
      buf.clear();
      boost::system::error_code ignored;
      stream.socket().close(ignored);
      continue;
    }
    const int code = res.result_int();
    ++st.t.by_status[code];
    if (fault) {
      ++st.t.faults;
    } else if (code == 200) {
      const double us = std::chrono::duration<double, std::micro>(t2 - t1).count();
      st.t.latencies_us.push_back(us);
      st.t.window_us.push_back(us);
      ++st.t.ok;
      // Raw bodies are answered raw, JSON with JSON: the wrong kind is a wrong answer.
      const bool raw_answer =
          res[http::field::content_type].starts_with("application/octet-stream");
      if (st.o.check && (raw_answer != j.raw || !correct(j, res.body(), st.w))) ++st.t.wrong;
    } else {
      ++st.t.failed;
      st.t.failed_spans.emplace_back(since(st, t1), since(st, t2));
      st.t.first_error.try_emplace(code, since(st, t2), res.body().substr(0, 400));
    }
    if (!res.keep_alive()) {
      connected = false;
      boost::system::error_code ignored;
      stream.socket().close(ignored);
    }
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
}

/// Polls GET /health until it answers 200 (true), or `limit` passes, or the
/// device is unavailable or stopped (false); `last`: its last answer (or the
/// connection error).
bool wait_healthy(const tcp::endpoint& ep, const std::string& host, std::chrono::seconds limit,
                  std::string& last) {
  const auto end = clock_type::now() + limit;
  while (clock_type::now() < end) {
    asio::io_context io;
    beast::tcp_stream s(io);
    boost::system::error_code ec;
    s.expires_after(std::chrono::seconds(5));
    s.connect(ep, ec);
    if (!ec) {
      http::request<http::string_body> req{http::verb::get, "/health", 11};
      req.set(http::field::host, host);
      http::write(s, req, ec);
      beast::flat_buffer b;
      http::response<http::string_body> res;
      if (!ec) http::read(s, b, res, ec);
      if (!ec) {
        last = res.body();
        if (res.result_int() == 200) return true;
        // Unavailable (no GPU) and stopped never turn healthy: no point waiting.
        if (last.find("\"health\":\"unavailable\"") != std::string::npos ||
            last.find("\"health\":\"stopped\"") != std::string::npos)
          return false;
      }
    }
    if (ec) last = ec.message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

/// Seconds covered by failed requests (their spans merged).
double failed_seconds(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0, a = -1, b = -1;
  for (const auto& [s, e] : spans) {
    if (s > b) {
      if (b > a) total += b - a;
      a = s;
      b = e;
    } else {
      b = std::max(b, e);
    }
  }
  if (b > a) total += b - a;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  run_state st;
  auto& o = st.o;
  long long seconds = 5;
  std::string check_s;
  if (auto done = cli::options(prog, print_usage)
                      .text("--host", o.host)
                      .integer("--port", o.port, 1, 65535)
                      .integer("--connections", o.connections, 1, 4096)
                      .integer("--threads", o.threads, 1, 64)
                      .integer("--requests", o.requests, 0ll, 1ll << 40)
                      .integer("--seconds", seconds, 1ll, 3600ll)
                      .choice("--endpoint", o.endpoint,
                              {{"gemm", std::string("gemm")},
                               {"fft", std::string("fft")},
                               {"infer", std::string("infer")},
                               {"mix", std::string("mix")}})
                      .integer("--size", o.size, 1, 1 << 20)
                      .flag("--raw", o.raw)
                      .flag("--check", o.check)
                      .integer("--fault-every", o.fault_every, 0ll, 1ll << 40)
                      .choice("--fault-kind", o.fault_kind,
                              {{"illegal_address", std::string("illegal_address")},
                               {"abort", std::string("abort")},
                               {"kill", std::string("kill")},
                               {"hang", std::string("hang")}})
                      .integer("--fault-every-ms", o.fault_every_ms, 0ll, 3600000ll)
                      .integer("--wait-healthy", o.wait_healthy, 0ll, 3600ll)
                      .text("--json", o.json)
                      .flag("--quiet", o.quiet)
                      .parse(argc, argv))
    return *done;
  o.seconds = static_cast<double>(seconds);
  if ((o.endpoint == "gemm" || o.endpoint == "mix") && o.size > 1024)
    return prog.usage_error("--size: gemm takes n up to 1024");
  boost::system::error_code ec;
  const std::string host = o.host == "localhost" ? "127.0.0.1" : o.host;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec || !addr.is_loopback())
    return prog.usage_error("--host must be a loopback address (127.0.0.1, ::1 or localhost)");
  st.ep = tcp::endpoint(addr, static_cast<unsigned short>(o.port));

  if (o.wait_healthy > 0) {
    std::string last;
    const auto asked = clock_type::now();
    if (!wait_healthy(st.ep, o.host, std::chrono::seconds(o.wait_healthy), last)) {
      // Unavailable and stopped end the wait at once: say how long it was.
      const double waited = std::chrono::duration<double>(clock_type::now() - asked).count();
      std::fprintf(stderr,
                   "%s: the service is not healthy (gave up after %.1f s of the %lld s allowed); "
                   "/health: %s\n",
                   prog.name, waited, o.wait_healthy, last.c_str());
      return cli::exit_no_gpu;
    }
  }
  asio::io_context ioc(o.threads);
  const double cpu0 = cpu_seconds();
  st.t0 = clock_type::now();
  st.deadline = st.t0 + std::chrono::duration_cast<clock_type::duration>(
                            std::chrono::duration<double>(o.seconds));
  for (int c = 0; c < o.connections; ++c) asio::co_spawn(ioc, connection(st, c), asio::detached);
  // The progress line, once a second.
  std::atomic<bool> finished{false};
  std::thread progress([&] {
    auto last = clock_type::now();
    while (!finished.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto now = clock_type::now();
      if (now - last < std::chrono::seconds(1)) continue;
      std::vector<double> w;
      std::uint64_t failed = 0, wrong = 0;
      {
        std::lock_guard lk(st.t.mu);
        w.swap(st.t.window_us);
        failed = st.t.failed;
        wrong = st.t.wrong;
      }
      const double secs = std::chrono::duration<double>(now - last).count();
      last = now;
      if (!o.quiet)
        std::fprintf(
            stderr,
            "%s: t=%5.1fs  %9.0f req/s  p50 %8.1f us  p99 %8.1f us  errors %llu  wrong %llu\n",
            prog.name, since(st, now), static_cast<double>(w.size()) / secs, percentile(w, 0.5),
            percentile(w, 0.99), static_cast<unsigned long long>(failed),
            static_cast<unsigned long long>(wrong));
    }
  });
  std::vector<std::thread> pool;
  for (int i = 1; i < o.threads; ++i) pool.emplace_back([&] { ioc.run(); });
  ioc.run();
  for (auto& t : pool) t.join();
  finished = true;
  progress.join();

  const double elapsed = since(st, clock_type::now());
  const double cpu = cpu_seconds() - cpu0;
  std::string health_after;
  (void)wait_healthy(st.ep, o.host, std::chrono::seconds(1), health_after);
  auto& t = st.t;
  const double p50 = percentile(t.latencies_us, 0.5), p99 = percentile(t.latencies_us, 0.99);
  const double rps = static_cast<double>(t.ok) / elapsed;
  const double fsec = failed_seconds(t.failed_spans);
  // This program's CPU time (all threads, user and system) per answered
  // request: on one machine with the service, it shows whether the load
  // generator or the service is the limit.
  const std::uint64_t answered = t.ok + t.failed;
  const double cpu_us = answered ? cpu * 1e6 / static_cast<double>(answered) : 0.0;
  std::string codes;
  for (const auto& [c, n] : t.by_status)
    codes += (codes.empty() ? "" : ", ") + (c == 0 ? std::string("conn") : std::to_string(c)) +
             ": " + std::to_string(n);
  std::printf(
      "%s: %s%s, %d connections, %.1f s: %llu ok (%.0f req/s), p50 %.1f us, p99 %.1f us, "
      "%llu failed, %llu wrong%s, %llu faults injected, %.3f s with failures [%s], "
      "%.1f us of this program's CPU per request\n",
      prog.name, o.endpoint.c_str(), o.raw ? " raw" : " json", o.connections, elapsed,
      static_cast<unsigned long long>(t.ok), rps, p50, p99,
      static_cast<unsigned long long>(t.failed), static_cast<unsigned long long>(t.wrong),
      o.check ? "" : " (not checked)", static_cast<unsigned long long>(t.faults), fsec,
      codes.c_str(), cpu_us);
  for (const auto& [c, first] : t.first_error)
    std::printf("%s: first %d answer at %.3f s: %s\n", prog.name, c, first.first,
                first.second.c_str());
  std::printf("%s: the service's /health after the run: %s\n", prog.name, health_after.c_str());
  if (!o.json.empty()) {
    std::string j = "{\"endpoint\":" + serve::json::quote(o.endpoint) +
                    ",\"raw\":" + (o.raw ? "true" : "false") +
                    ",\"connections\":" + std::to_string(o.connections) +
                    ",\"size\":" + std::to_string(o.size) + ",\"seconds\":";
    serve::json::append_number(j, elapsed);
    j += ",\"ok\":" + std::to_string(t.ok) + ",\"failed\":" + std::to_string(t.failed) +
         ",\"wrong\":" + std::to_string(t.wrong) + ",\"checked\":" + (o.check ? "true" : "false") +
         ",\"faults\":" + std::to_string(t.faults) + ",\"req_per_s\":";
    serve::json::append_number(j, rps);
    j += ",\"p50_us\":";
    serve::json::append_number(j, p50);
    j += ",\"p99_us\":";
    serve::json::append_number(j, p99);
    j += ",\"failed_seconds\":";
    serve::json::append_number(j, fsec);
    j += ",\"client_cpu_us_per_req\":";
    serve::json::append_number(j, cpu_us);
    j += ",\"status\":{";
    bool first = true;
    for (const auto& [c, n] : t.by_status) {
      j += (first ? "" : ",") + serve::json::quote(c == 0 ? "connection" : std::to_string(c)) +
           ":" + std::to_string(n);
      first = false;
    }
    j += "},\"first_errors\":{";
    first = true;
    for (const auto& [c, fe] : t.first_error) {
      j += (first ? "" : ",") + serve::json::quote(std::to_string(c)) + ":{\"at_s\":";
      serve::json::append_number(j, fe.first);
      j += ",\"body\":" + serve::json::quote(fe.second) + "}";
      first = false;
    }
    j += "},\"health_after\":" + serve::json::quote(health_after) + "}\n";
    if (std::FILE* f = std::fopen(o.json.c_str(), "w")) {
      std::fputs(j.c_str(), f);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "%s: cannot write %s\n", prog.name, o.json.c_str());
      return cli::exit_error;
    }
  }
  if (t.wrong) return cli::exit_mismatch;
  const bool faults_expected = o.fault_every > 0 || o.fault_every_ms > 0;
  if (t.connect_errors > 0 && t.ok == 0) return cli::exit_error;
  if (t.failed > 0 && !faults_expected) return cli::exit_error;
  return cli::exit_ok;
}
