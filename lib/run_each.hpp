// Private: running a batch of completions so that one that throws loses
// none of the others. Not installed.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>

#include <cstddef>
#include <utility>
#include <vector>

namespace atomr::cuda::detail {

/// Runs `run(item)` for each item in order. When one throws, the items after
/// it are posted to `ex` (to run there the same way) and the exception goes
/// on, as a handler's exception leaves io_context::run() in Asio: the caller
/// of run() sees it and may run again, and no completion queued behind the
/// throwing one is dropped (a dropped one leaves its coroutine suspended for
/// ever). Items are moved out one by one: vector::erase() would move-assign,
/// which Boost 1.81's any_completion_handler gets wrong.
template <class T, class Run>
void run_each(const boost::asio::any_io_executor& ex, std::vector<T> items, Run run) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    try {
      run(items[i]);
    } catch (...) {
      std::vector<T> rest;
      rest.reserve(items.size() - i - 1);
      for (std::size_t j = i + 1; j < items.size(); ++j) rest.emplace_back(std::move(items[j]));
      if (!rest.empty())
        boost::asio::post(ex, [ex, rest = std::move(rest), run]() mutable {
          run_each(ex, std::move(rest), run);
        });
      throw;
    }
  }
}

}  // namespace atomr::cuda::detail
