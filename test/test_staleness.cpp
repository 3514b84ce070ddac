// Generation, staleness, poisoning and stop logic, driven on the device state
// directly (no GPU needed): a device state that was never initialised is
// marked healthy by hand, then poisoned or stopped, and everything that
// depends on it is observed. No CUDA call is made on these paths.
#include <atomr/cuda.hpp>

#include "../lib/device_impl.hpp"
#include "io_fixture.hpp"

#include <boost/asio/use_awaitable.hpp>
#include <doctest/doctest.h>

#include <string>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
namespace asio = boost::asio;

namespace {
struct fake_device : io_fixture {
  std::shared_ptr<detail::device_impl> impl =
      std::make_shared<detail::device_impl>(ioc.get_executor(), 4242, device_options{});
  device dev{impl};

  fake_device() { impl->health.store(health_state::healthy); }

  gpu_ref<float> ref(std::size_t n) {
    ++impl->live_buffers;
    auto st = std::make_shared<detail::buffer_state>(impl, nullptr, n, dtype::f32,
                                                     impl->generation.load());
    return gpu_ref<float>(std::move(st), 0, n);
  }
  stream fake_stream() {
    auto st = std::make_shared<detail::stream_state>(impl, nullptr, 99);
    st->owner = impl.get();
    return stream(std::move(st));
  }
};
}  // namespace

TEST_CASE_FIXTURE(fake_device, "refs are valid while the generation holds") {
  auto r = ref(16);
  CHECK(r.check());
  CHECK_FALSE(r.stale());
  CHECK(r.generation() == 1);
  CHECK(r.size() == 16);
  CHECK(r.size_bytes() == 64);

  auto sub = r.subspan(4, 8);
  REQUIRE(sub);
  CHECK(sub.value().offset() == 4);
  CHECK(sub.value().size() == 8);
  CHECK(r.subspan(10, 7).error().code() == errc::invalid_argument);
  CHECK(r.subspan(17, 0).error().code() == errc::invalid_argument);
  CHECK(r.subspan(16, 0));

  CHECK(gpu_ref<float>{}.check().error().code() == errc::invalid_argument);
  impl->poison(make_error(errc::context_poisoned, "test teardown"));
}

TEST_CASE_FIXTURE(fake_device, "a sticky fault poisons the device and stales every ref") {
  auto a = ref(8);
  auto b = ref(8);
  std::optional<health_state> woke;
  dev.async_wait_health_change([&](health_state h) { woke = h; });

  impl->note_error(classify(cudaErrorIllegalAddress, "kernel<<<>>>"));
  CHECK(dev.health() == health_state::poisoned);
  CHECK(dev.generation() == 2);
  CHECK(dev.statistics().faults == 1);

  for (auto* r : {&a, &b}) {
    auto c = r->check();
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == errc::stale_ref);
    CHECK(c.error().message().find("generation 1") != std::string::npos);
    CHECK(c.error().message().find("generation 2") != std::string::npos);
    CHECK(c.error().message().find("cudaErrorIllegalAddress") != std::string::npos);
  }
  CHECK(a.unsafe_data().error().code() == errc::stale_ref);

  // Later calls fail at once with the original fault's message.
  auto st = dev.status();
  REQUIRE_FALSE(st);
  CHECK(st.error().code() == errc::context_poisoned);
  CHECK(st.error().message().find("kernel<<<>>>") != std::string::npos);
  CHECK(dev.allocate<float>(4).error().code() == errc::context_poisoned);
  CHECK(dev.acquire_stream().error().code() == errc::context_poisoned);

  // A second fault does not replace the first.
  impl->poison(make_error(errc::context_poisoned, "second fault"));
  CHECK(dev.fault()->message().find("kernel<<<>>>") != std::string::npos);
  CHECK(dev.generation() == 2);
  CHECK(dev.statistics().faults == 1);

  ioc.run();
  REQUIRE(woke);
  CHECK(*woke == health_state::poisoned);
}

TEST_CASE_FIXTURE(fake_device, "run_kernel and waits on a poisoned device fail without enqueue") {
  impl->poison(classify(cudaErrorLaunchFailure, "user kernel"));
  bool enqueued = false;
  auto r = run(run_kernel("cufft", fake_stream(), host_fn{}, 1, [&](launch&) -> result<int> {
    enqueued = true;
    return 1;
  }));
  CHECK_FALSE(enqueued);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::context_poisoned);
  CHECK(r.error().library() == "cufft");  // tagged with the library that was called
  CHECK(r.error().message().find("user kernel") != std::string::npos);

  for (completion how :
       {completion(event_poll{}), completion(host_fn{}), completion(blocking_sync{})}) {
    auto w = run([&]() -> asio::awaitable<result<void>> {
      co_return co_await how.async_wait(fake_stream(), asio::use_awaitable);
    }());
    CHECK(w.error().code() == errc::context_poisoned);
  }
  CHECK(dev.statistics().ops_in_flight == 0);
}

TEST_CASE_FIXTURE(fake_device, "a stale ref is refused by run_kernel before enqueue") {
  auto out = ref(4);
  impl->generation++;  // as if the device had been rebuilt since the ref was made
  bool enqueued = false;
  auto r = run(run_kernel("cublas", fake_stream(), event_poll{}, out, [&](launch&) -> result<int> {
    enqueued = true;
    return 0;
  }));
  CHECK_FALSE(enqueued);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::stale_ref);
  CHECK(r.error().library() == "cublas");
  CHECK(dev.statistics().ops_failed == 1);
  impl->poison(make_error(errc::context_poisoned, "test teardown"));
}

TEST_CASE_FIXTURE(fake_device, "stop stales refs and refuses work with device_unavailable") {
  auto a = ref(2);
  std::optional<health_state> woke;
  dev.async_wait_health_change([&](health_state h) { woke = h; });
  dev.stop();
  CHECK(dev.health() == health_state::stopped);
  CHECK(dev.generation() == 2);
  CHECK(a.check().error().code() == errc::stale_ref);
  CHECK(dev.status().error().code() == errc::device_unavailable);
  CHECK(dev.status().error().message().find("stopped") != std::string::npos);
  ioc.run();
  REQUIRE(woke);
  CHECK(*woke == health_state::stopped);
  CHECK_FALSE(dev.fault());
}

TEST_CASE_FIXTURE(fake_device, "live buffer count follows ref lifetimes") {
  {
    auto a = ref(2);
    auto copy = a;
    CHECK(dev.statistics().live_buffers == 1);
  }
  CHECK(dev.statistics().live_buffers == 0);
  impl->poison(make_error(errc::context_poisoned, "test teardown"));
}

TEST_CASE_FIXTURE(fake_device,
                  "a library error met in a poisoned context is reported as context_poisoned") {
  // Another operation's fault poisoned the device a moment before this
  // operation's cuBLAS call failed (the isolated worker saw it with 100
  // requests in flight across an illegal-address fault).
  impl->note_error(classify(cudaErrorIllegalAddress, "kernel<<<>>>"));
  REQUIRE(dev.health() == health_state::poisoned);
  const auto failed_before = dev.statistics().ops_failed;
  launch l(fake_stream(), "cublas");
  const auto e = l.fail(gpu_error(errc::library, "cublas", 13,
                                  "cublas: cublasSgemm failed: CUBLAS_STATUS_EXECUTION_FAILED"));
  CHECK(e.code() == errc::context_poisoned);
  CHECK(e.library() == "cublas");
  CHECK(e.native_status() == 13);
  CHECK(e.message().find("CUBLAS_STATUS_EXECUTION_FAILED") != std::string::npos);
  CHECK(e.message().find("cudaErrorIllegalAddress") != std::string::npos);
  // The device keeps its first fault; the failure is not counted as an operation
  // that began (this launch never did).
  CHECK(dev.statistics().faults == 1);
  CHECK(dev.statistics().ops_failed == failed_before);
  // Errors that are not the context's stay as they are.
  launch other(fake_stream(), "cublas");
  CHECK(other.fail(make_error(errc::invalid_argument, "m < 0")).code() == errc::invalid_argument);
}
