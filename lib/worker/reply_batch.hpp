// Private: the completions the reply reader of an isolated device gathers
// during one sweep of its reply rings, posted to the device's executor a
// chunk at a time (docs/design.md, "The request rings"). Not installed.
#pragma once

#include "../run_each.hpp"

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>

#include <cstddef>
#include <utility>
#include <vector>

namespace atomr::cuda::detail {

/// Completions to run on an executor, gathered on one thread and posted
/// together: one post, and so at most one io thread woken, per `chunk`
/// completions instead of one per reply. Opened by the reply reader for a
/// sweep of the reply rings, and by an io thread polling them (there
/// finish() runs the first chunk on that thread and posts only the
/// others). While a batch is open on a thread,
/// `reply_batch::open()` returns it; elsewhere (timers, cancellations, the
/// supervisor's strand) it returns null and the caller posts alone.
class reply_batch {
public:
  using completion = boost::asio::any_completion_handler<void()>;
  /// Completions run by one handler: small enough that a sweep's replies
  /// still spread over several io threads.
  static constexpr std::size_t chunk = 8;

  /// The reply reader's: every chunk is posted.
  reply_batch() : run_here_(false) { outer_ = std::exchange(current(), this); }
  /// An io thread's, running handlers of `here`: finish() runs the first
  /// chunk for `here` on this thread.
  explicit reply_batch(boost::asio::any_io_executor here)
      : run_here_(true), here_ex_(std::move(here)) {
    outer_ = std::exchange(current(), this);
  }
  reply_batch(const reply_batch&) = delete;
  reply_batch& operator=(const reply_batch&) = delete;
  /// Posts whatever finish() did not run (never runs a completion itself).
  ~reply_batch() {
    close();
    post(ex_, items_);
    post(here_ex_, here_);
  }

  /// Closes the batch: posts what was gathered and, on an io thread, runs
  /// the first chunk here. A completion that throws leaves through this
  /// call, as a handler's exception leaves io_context::run(); the rest of
  /// its chunk is posted first.
  void finish() {
    close();
    if (run_here_ && here_.empty() && ex_ == here_ex_) std::swap(here_, items_);
    post(ex_, items_);
    std::vector<completion> here;
    std::swap(here, here_);
    run_each(here_ex_, std::move(here), invoke);
  }
  /// The batch open on this thread, or null.
  static reply_batch* open() noexcept { return current(); }

  /// Adds a completion to run on `ex`; a full chunk is posted at once (the
  /// first one kept for this thread with `run_here`).
  void add(const boost::asio::any_io_executor& ex, completion c) {
    if (!items_.empty() && ex != ex_) post(ex_, items_);
    if (items_.empty()) ex_ = ex;
    items_.emplace_back(std::move(c));
    if (items_.size() < chunk) return;
    if (run_here_ && here_.empty() && ex == here_ex_)
      std::swap(here_, items_);
    else
      post(ex_, items_);
  }

private:
  /// No longer the batch open on this thread.
  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    current() = outer_;
  }
  /// Posts `v`'s completions to `ex` (one handler running each in turn),
  /// leaving `v` empty.
  static void post(const boost::asio::any_io_executor& ex, std::vector<completion>& v) {
    if (v.empty()) return;
    std::vector<completion> run;
    std::swap(run, v);
    // A completion that throws there posts the rest of its chunk first.
    boost::asio::post(
        ex, [ex, run = std::move(run)]() mutable { run_each(ex, std::move(run), invoke); });
  }
  static void invoke(completion& c) { std::move(c)(); }

  static reply_batch*& current() noexcept {
    thread_local reply_batch* b = nullptr;
    return b;
  }
  const bool run_here_;
  boost::asio::any_io_executor here_ex_, ex_;
  reply_batch* outer_ = nullptr;
  bool closed_ = false;
  std::vector<completion> items_, here_;
};

}  // namespace atomr::cuda::detail
