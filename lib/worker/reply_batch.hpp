// Private: the completions the reply reader of an isolated device gathers
// during one sweep of its reply rings, posted to the device's executor a
// chunk at a time (docs/design.md, "The request rings"). Not installed.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>

#include <cstddef>
#include <utility>
#include <vector>

namespace atomr::cuda::detail {

/// Completions to run on an executor, gathered on one thread (the reply
/// reader) and posted together: one post, and so at most one io thread
/// woken, per `chunk` completions instead of one per reply. While a batch is
/// open on a thread, `reply_batch::open()` returns it; elsewhere (timers,
/// cancellations, the supervisor's strand) it returns null and the caller
/// posts alone.
class reply_batch {
public:
  using completion = boost::asio::any_completion_handler<void()>;
  /// Completions run by one posted handler: small enough that a sweep's
  /// replies still spread over several io threads.
  static constexpr std::size_t chunk = 8;

  reply_batch() { current() = this; }
  ~reply_batch() {
    flush();
    current() = nullptr;
  }
  reply_batch(const reply_batch&) = delete;
  reply_batch& operator=(const reply_batch&) = delete;

  /// The batch open on this thread, or null.
  static reply_batch* open() noexcept { return current(); }

  /// Adds a completion to run on `ex`; a full chunk is posted at once.
  void add(const boost::asio::any_io_executor& ex, completion c) {
    if (!items_.empty() && ex != ex_) flush();
    if (items_.empty()) ex_ = ex;
    items_.emplace_back(std::move(c));
    if (items_.size() >= chunk) flush();
  }

  /// Posts what was gathered (one handler running each in turn).
  void flush() {
    if (items_.empty()) return;
    std::vector<completion> run;
    run.reserve(chunk);
    std::swap(run, items_);
    boost::asio::post(ex_, [run = std::move(run)]() mutable {
      for (auto& c : run) std::move(c)();
    });
    items_.reserve(chunk);
  }

private:
  static reply_batch*& current() noexcept {
    thread_local reply_batch* b = nullptr;
    return b;
  }
  boost::asio::any_io_executor ex_;
  std::vector<completion> items_;
};

}  // namespace atomr::cuda::detail
