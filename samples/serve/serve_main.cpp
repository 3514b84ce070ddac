// atomr-serve: an HTTP/1.1 service whose requests run on the GPU through
// atomr::cuda (service.hpp lists the endpoints). Runs until SIGINT or
// SIGTERM, then closes its connections, waits for them, and prints a summary.
#include "../cli.hpp"
#include "service.hpp"

#include <boost/asio/signal_set.hpp>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr cli::program prog{"atomr-serve"};

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "Usage: %s [--address A] [--port P] [--threads N] [--device D] [--isolated]\n"
      "          [--test-faults] [--body-limit BYTES] [--json-limit BYTES]\n"
      "          [--read-timeout-ms MS] [--gpu-timeout-ms MS] [--strategy S]\n"
      "          [--spin-us US]\n"
      "\n"
      "An HTTP/1.1 service (Boost.Beast) on one io_context run by N threads; every\n"
      "request's GPU work goes through atomr::cuda:\n"
      "  POST /v1/gemm   C = A B, f32 row-major: JSON {\"m\",\"n\",\"k\",\"a\",\"b\"}, or\n"
      "                  application/octet-stream with X-Shape: m,n,k and A then B\n"
      "  POST /v1/fft    forward complex FFT: JSON {\"n\",\"re\",\"im\"}, or octet-stream\n"
      "                  with X-Shape: n and interleaved complex f32\n"
      "  POST /v1/infer  a small fixed model (conv, relu, pool, dense, softmax) on a\n"
      "                  28 x 28 image: JSON {\"x\": [784 numbers]}, or 784 raw f32\n"
      "                  (answered with the 10 probabilities as raw f32, X-Class)\n"
      "  GET  /health    device health, generation, restarts (503 unless serving)\n"
      "  GET  /metrics   statistics and latency histograms, Prometheus text format\n"
      "  POST /v1/fault?kind=illegal_address|abort|kill|hang   with --test-faults\n"
      "                  and --isolated only: a fault in the GPU worker process\n"
      "Bad requests get a 4xx with a JSON {\"error\", \"code\"}; GPU errors a 5xx.\n"
      "Prints 'listening on http://ADDRESS:PORT' once it accepts connections.\n"
      "\n"
      "Options:\n"
      "  --address A          address to listen on (default 127.0.0.1)\n"
      "  --port P             port, 0 for any free one (default 8080)\n"
      "  --threads N          io threads, 1..256 (default 4)\n"
      "  --device D           device ordinal (default 0)\n"
      "  --isolated           run the GPU work in a supervised worker process\n"
      "  --test-faults        enable /v1/fault (tests and demos only)\n"
      "  --body-limit BYTES   largest request body (default 67108864): else 413\n"
      "  --json-limit BYTES   largest JSON body of a /v1/ request (default 1048576):\n"
      "                       else 413; raw bodies have only --body-limit\n"
      "  --read-timeout-ms MS a request must arrive within this (default 10000): else 408\n"
      "  --gpu-timeout-ms MS  longest GPU wait of one request (default 10000): else 504\n"
      "  --strategy S         how GPU completion is detected: event_poll (default),\n"
      "                       host_fn or blocking_sync\n"
      "  --spin-us US         event_poll: re-check every turn of an io thread for this\n"
      "                       long before backing off (default 1000)\n"
      "  --help               print this help and exit\n"
      "\n"
      "Exit status: 0 after a signal, 1 when it cannot listen, 64 bad command line.\n"
      "Without a usable GPU it still serves: /health says why and GPU requests get 503.\n",
      prog.name);
}

}  // namespace

int main(int argc, char** argv) {
  serve::options o;
  int threads = 4;
  long long body_limit = static_cast<long long>(o.body_limit);
  long long json_limit = static_cast<long long>(o.json_limit);
  long long read_ms = o.read_timeout.count(), gpu_ms = o.gpu_timeout.count();
  long long spin_us = o.spin.count();
  int port = o.port;
  if (auto done = cli::options(prog, print_usage)
                      .text("--address", o.address)
                      .integer("--port", port, 0, 65535)
                      .integer("--threads", threads, 1, 256)
                      .integer("--device", o.device, 0, 1 << 20, "an ordinal >= 0")
                      .flag("--isolated", o.isolated)
                      .flag("--test-faults", o.test_faults)
                      .integer("--body-limit", body_limit, 1ll, 1ll << 34)
                      .integer("--json-limit", json_limit, 1ll, 1ll << 34)
                      .integer("--read-timeout-ms", read_ms, 1ll, 3600000ll)
                      .integer("--gpu-timeout-ms", gpu_ms, 1ll, 3600000ll)
                      .choice("--strategy", o.strategy,
                              {{"event_poll", atomr::cuda::strategy::event_poll},
                               {"host_fn", atomr::cuda::strategy::host_fn},
                               {"blocking_sync", atomr::cuda::strategy::blocking_sync}})
                      .integer("--spin-us", spin_us, 0ll, 1000000ll)
                      .parse(argc, argv))
    return *done;
  o.port = static_cast<unsigned short>(port);
  o.body_limit = static_cast<std::size_t>(body_limit);
  o.json_limit = static_cast<std::size_t>(json_limit);
  o.read_timeout = std::chrono::milliseconds(read_ms);
  o.gpu_timeout = std::chrono::milliseconds(gpu_ms);
  o.spin = std::chrono::microseconds(spin_us);

  boost::asio::io_context ioc(threads);
  serve::service svc(ioc, o);
  if (auto err = svc.start()) {
    std::fprintf(stderr, "%s: %s\n", prog.name, err->c_str());
    return cli::exit_error;
  }
  boost::asio::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) svc.stop();
  });
  std::string how = ", " + std::string(atomr::cuda::to_string(o.strategy));
  if (o.strategy == atomr::cuda::strategy::event_poll)
    how += " (spin " + std::to_string(o.spin.count()) + " us)";
  std::printf("%s: listening on http://%s:%u (%d io threads, device %d%s%s%s)\n", prog.name,
              o.address.c_str(), svc.port(), threads, o.device, how.c_str(),
              o.isolated ? ", isolated" : "", o.test_faults ? ", test faults on" : "");
  std::fflush(stdout);
  // The io threads run until stop() has closed every connection and dropped
  // the GPU objects; a watcher then ends run().
  std::thread watcher([&] {
    while (!svc.stopped()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ioc.stop();
  });
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&] { ioc.run(); });
  ioc.run();
  for (auto& t : pool) t.join();
  watcher.join();
  const auto c = svc.stats();
  std::printf(
      "%s: stopped after %llu requests (%llu ok, %llu 4xx, %llu 5xx, %llu clients gone) "
      "on %llu connections\n",
      prog.name, static_cast<unsigned long long>(c.requests), static_cast<unsigned long long>(c.ok),
      static_cast<unsigned long long>(c.client_errors),
      static_cast<unsigned long long>(c.server_errors),
      static_cast<unsigned long long>(c.client_gone),
      static_cast<unsigned long long>(c.connections));
  return cli::exit_ok;
}
