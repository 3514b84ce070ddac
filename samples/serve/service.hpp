// atomr-serve's HTTP/1.1 service (Boost.Beast) over one io_context run by N
// threads: every request's GPU work goes through atomr::cuda's public API.
// Not part of the library; a reference for how a service uses it.
//
// Endpoints (docs/guide.md, "The reference service"):
//   POST /v1/gemm   C = A B (row-major f32): JSON {"m","n","k","a":[..],"b":[..]}
//                   -> {"m","n","c":[..]}; or application/octet-stream with
//                   X-Shape: m,n,k and A then B as little-endian f32 -> C
//   POST /v1/fft    forward complex FFT: JSON {"n","re":[..],"im":[..]} ->
//                   {"n","re","im"}; or octet-stream, X-Shape: n, interleaved c32
//   POST /v1/infer  the fixed model of model.hpp: JSON {"x":[784 numbers]} ->
//                   {"probs":[10],"class":k}; or octet-stream of 784 f32
//   GET  /health    device health, generation, restarts, budget left (JSON;
//                   200 while the device serves, 503 otherwise)
//   GET  /metrics   device and actor statistics, request counters and
//                   latency histograms (Prometheus text format)
//   POST /v1/fault?kind=illegal_address|abort|kill|hang   only with
//                   --test-faults on an isolated device: a fault in the worker
#pragma once

#include <atomr/cuda.hpp>

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace serve {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;

struct options {
  std::string address = "127.0.0.1";  ///< loopback by default
  unsigned short port = 8080;         ///< 0: any free port (see service::port())
  int device = 0;
  bool isolated = false;     ///< the GPU work runs in a supervised worker process
  bool test_faults = false;  ///< enables /v1/fault (tests and the demo only)
  std::size_t body_limit = std::size_t{64} << 20;  ///< larger bodies: 413
  /// Larger JSON bodies of /v1/ requests: 413 (JSON is for small inputs; the
  /// reader holds about 20 to 40 bytes per byte of JSON, against none for a
  /// raw application/octet-stream body, which only body_limit bounds).
  std::size_t json_limit = std::size_t{1} << 20;
  /// A request (headers and body) must arrive within this: else 408.
  std::chrono::milliseconds read_timeout{10000};
  /// A response must be taken by the client within this: else the connection closes.
  std::chrono::milliseconds write_timeout{10000};
  /// The GPU work of one request: longer is 504 (the work goes on, parked).
  std::chrono::milliseconds gpu_timeout{10000};
  /// How the GPU work's completion is detected (docs/guide.md, the
  /// completion strategies): event_poll queries from the io threads,
  /// host_fn and blocking_sync post the completion from the driver's or the
  /// device's thread.
  cuda::strategy strategy = cuda::strategy::event_poll;
  /// event_poll: how long a wait is re-checked on every turn of an io
  /// thread before it backs off to timer-driven checks.
  std::chrono::microseconds spin{1000};
  std::int64_t max_gemm_dim = 4096;              ///< m, n and k each
  std::int64_t max_fft = std::int64_t{1} << 22;  ///< points
};

/// Request counters of one run, for tests and the shutdown summary.
struct counters {
  std::uint64_t requests = 0;       ///< answered (any status)
  std::uint64_t ok = 0;             ///< 2xx
  std::uint64_t client_errors = 0;  ///< 4xx
  std::uint64_t server_errors = 0;  ///< 5xx
  std::uint64_t client_gone = 0;    ///< the client disconnected before its answer
  std::uint64_t connections = 0;    ///< accepted so far
  std::uint64_t open_connections = 0;
};

class service {
public:
  service(asio::io_context& ioc, options o);
  ~service();
  service(const service&) = delete;
  service& operator=(const service&) = delete;

  /// Opens the device and its actors and uploads the model's weights (an
  /// unavailable device is no error: the service answers 503 for GPU work
  /// and says why in /health), then binds and listens. The error message,
  /// if it cannot listen.
  std::optional<std::string> start();
  /// The port it listens on (after start()).
  unsigned short port() const;
  /// Stops accepting, closes every connection (their GPU waits are
  /// cancelled), and once none is left drops the GPU objects, so that the
  /// io_context runs out of work. Returns at once; any thread.
  void stop();
  /// True once stop() has finished its work.
  bool stopped() const;

  counters stats() const;
  cuda::device& device();
  /// The device's state as /health shows it (the status code: 200 or 503).
  std::string health_json(int& status) const;
  std::string metrics_text() const;

  struct impl;

private:
  std::shared_ptr<impl> p_;
};

}  // namespace serve
