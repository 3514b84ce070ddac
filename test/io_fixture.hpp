// Test fixture: an io_context and a way to run one coroutine on it to completion.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <cuda_runtime_api.h>
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>

namespace atomr::cuda::test {

namespace asio = boost::asio;

/// An ordinal no device has: past the GPUs where there are some, else 0
/// (opening it leaves the device unavailable, with no CUDA error left set).
inline int unusable_ordinal() {
  int n = 0;
  const auto st = cudaGetDeviceCount(&n);
  cudaGetLastError();
  return st == cudaSuccess && n > 0 ? 1000 : 0;
}

struct io_fixture {
  asio::io_context ioc;
  /// No test waits longer than this: a hang becomes a failure.
  std::chrono::seconds limit{120};

  /// Runs `aw` on the io_context until it (and everything it left behind) is
  /// done, and returns its value; rethrows its exception.
  template <class T>
  T run(asio::awaitable<T> aw) {
    std::optional<T> out;
    std::exception_ptr err;
    // co_spawn's handler needs a default-constructible value; result<T> is not.
    auto store = [](asio::awaitable<T> a, std::optional<T>& o) -> asio::awaitable<void> {
      o.emplace(co_await std::move(a));
    };
    // Stop as soon as the coroutine is done: work it abandoned (a parked
    // keep-alive, a monitor tick) stays queued for the next run.
    asio::co_spawn(ioc, store(std::move(aw), out), [&](std::exception_ptr e) {
      err = e;
      ioc.stop();
    });
    ioc.restart();
    ioc.run_for(limit);
    if (err) std::rethrow_exception(err);
    if (!out) throw std::logic_error("coroutine did not complete within the test's limit");
    return std::move(*out);
  }

  /// Runs the io_context on the test thread, in `step` slices, until
  /// `done()` (true) or `limit` has passed (false).
  bool run_until(const std::function<bool()>& done,
                 std::chrono::milliseconds limit = std::chrono::seconds(10),
                 std::chrono::milliseconds step = std::chrono::milliseconds(5)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) return false;
      ioc.restart();
      ioc.run_for(step);
    }
    return true;
  }

  void run(asio::awaitable<void> aw) {
    std::exception_ptr err;
    bool done = false;
    asio::co_spawn(ioc, std::move(aw), [&](std::exception_ptr e) {
      err = e;
      done = true;
      ioc.stop();
    });
    ioc.restart();
    ioc.run_for(limit);
    if (err) std::rethrow_exception(err);
    if (!done) throw std::logic_error("coroutine did not complete within the test's limit");
  }
};

/// True once process `pid` is gone and reaped (a zombie still answers kill(pid, 0)).
inline bool pid_gone(int pid) {
  return pid > 0 && ::kill(pid, 0) == -1 && errno == ESRCH;
}

}  // namespace atomr::cuda::test
