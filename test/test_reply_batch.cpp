// The reply reader's and the polling io thread's batches of completions
// (lib/worker/reply_batch.hpp): how many handlers are posted, what runs
// where, and that a throwing completion loses none of the others.
#include "io_fixture.hpp"

#include "../lib/worker/reply_batch.hpp"
#include <doctest/doctest.h>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace atomr::cuda::detail;
using namespace atomr::cuda::test;

TEST_CASE_FIXTURE(io_fixture,
                  "reply batch: the reader's posts a handler per chunk of 8, runs none") {
  std::vector<int> ran;
  CHECK(reply_batch::open() == nullptr);
  {
    reply_batch b;
    CHECK(reply_batch::open() == &b);
    for (int i = 0; i < 20; ++i) b.add(ioc.get_executor(), [&ran, i] { ran.push_back(i); });
    b.finish();
    CHECK(reply_batch::open() == nullptr);
  }
  CHECK(ran.empty());     // nothing ran on this (the reader's) thread
  CHECK(ioc.run() == 3);  // 8 + 8 + 4: three handlers
  REQUIRE(ran.size() == 20);
  for (int i = 0; i < 20; ++i) CHECK(ran[static_cast<std::size_t>(i)] == i);  // in order
}

TEST_CASE_FIXTURE(io_fixture,
                  "reply batch: on an io thread the first chunk runs there, the rest is posted; "
                  "a throwing completion leaves through finish() and the others still run") {
  std::vector<int> ran;
  std::size_t inline_count = 0;
  bool threw = false;
  asio::post(ioc, [&] {
    reply_batch b(ioc.get_executor());
    for (int i = 0; i < 20; ++i)
      b.add(ioc.get_executor(), [&ran, i] {
        ran.push_back(i);
        if (i == 2) throw std::runtime_error("completion 2");
      });
    try {
      b.finish();
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "completion 2";
    }
    inline_count = ran.size();
  });
  ioc.run();
  CHECK(threw);
  CHECK(inline_count == 3);   // 0, 1 and the throwing 2 ran here before finish() left
  REQUIRE(ran.size() == 20);  // 3..7 were posted when 2 threw, 8..19 at finish()
  std::vector<int> sorted = ran;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 20; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
}

TEST_CASE_FIXTURE(io_fixture,
                  "reply batch: a posted chunk whose completion throws posts the rest of "
                  "the chunk before the exception leaves io_context::run()") {
  std::vector<int> ran;
  {
    reply_batch b;  // the reader's: every chunk is posted
    for (int i = 0; i < 20; ++i)
      b.add(ioc.get_executor(), [&ran, i] {
        ran.push_back(i);
        if (i == 2 || i == 10) throw std::runtime_error("completion " + std::to_string(i));
      });
    b.finish();
  }
  int caught = 0;
  for (int round = 0; round < 10 && ran.size() < 20; ++round) {
    try {
      ioc.run();
    } catch (const std::runtime_error&) {
      ++caught;
    }
    ioc.restart();
  }
  CHECK(caught == 2);
  REQUIRE(ran.size() == 20);  // 3..7 and 11..15 were dropped with their chunks before
  std::vector<int> sorted = ran;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 20; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
}

TEST_CASE_FIXTURE(io_fixture,
                  "reply batch: nested batches restore the outer one; a dropped "
                  "batch posts what it holds") {
  int ran = 0;
  {
    reply_batch outer;
    {
      reply_batch inner(ioc.get_executor());
      CHECK(reply_batch::open() == &inner);
      inner.add(ioc.get_executor(), [&] { ++ran; });
      // No finish(): the destructor posts (it never runs a completion itself).
    }
    CHECK(ran == 0);
    CHECK(reply_batch::open() == &outer);
    outer.add(ioc.get_executor(), [&] { ++ran; });
  }
  CHECK(reply_batch::open() == nullptr);
  CHECK(ran == 0);
  CHECK(ioc.run() == 2);
  CHECK(ran == 2);
}
