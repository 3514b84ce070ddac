// Completion tokens without a GPU. Every operation fails with an error value
// here (device_unavailable from an unavailable device, invalid_argument for
// an empty gpu_ref), which is enough to prove the plumbing of each kind of
// token: the handler runs exactly once, never inside the initiating call, on
// the right executor, with the operation's error code. Cancellation in
// flight is shown with async_from on awaitables that wait on timers (nothing
// here can wait on a GPU). The actors cannot be created without a GPU: their
// token overloads are checked at compile time here and run in
// test_gpu_tokens.cpp.
#include <atomr/cuda.hpp>

#include "io_fixture.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

using fref = gpu_ref<float>;
template <class T>
using awaitable_result = asio::awaitable<result<T>>;

// ---- Compile time: which arguments are tokens, and what each call returns ----

const auto result_callback = [](result<fref>) {};
const auto any_callback = [](auto) {};
const auto an_enqueue = [](launch&) -> result<int> { return 0; };

static_assert(result_token<decltype(result_callback), fref>);
static_assert(result_token<const decltype(result_callback)&, fref>);
static_assert(result_token<asio::use_future_t<>, fref>);
static_assert(result_token<const asio::deferred_t&, fref>);
static_assert(result_token<const asio::use_awaitable_t<>&, fref>);
static_assert(result_token<asio::detached_t, void>);
// Ordinary trailing arguments never pass for tokens.
static_assert(!result_token<int, fref>);
static_assert(!result_token<std::int64_t, float>);
static_assert(!result_token<double, fref>);
static_assert(!result_token<float, fref>);
static_assert(!result_token<unsigned char, fref>);
static_assert(!result_token<transfer_options, fref>);
static_assert(!result_token<completion, int>);
static_assert(!result_token<event_poll, int>);
static_assert(!result_token<fref, fref>);
static_assert(!result_token<decltype(an_enqueue), int>);

// Plain calls are still the awaitables; a token picks the token overload.
static_assert(
    std::same_as<decltype(upload(pinned_buffer<float>{}, fref{})), awaitable_result<fref>>);
static_assert(std::same_as<decltype(upload(std::span<const float>{}, fref{}, transfer_options{})),
                           awaitable_result<fref>>);
static_assert(
    std::same_as<decltype(fill_bytes(fref{}, 0xFF, transfer_options{})), awaitable_result<fref>>);
static_assert(std::same_as<decltype(run_kernel("t", stream{}, event_poll{}, 1, an_enqueue)),
                           awaitable_result<int>>);
static_assert(
    std::same_as<decltype(run_kernel("t", stream{}, 1, an_enqueue)), awaitable_result<int>>);
static_assert(std::same_as<decltype(upload(pinned_buffer<float>{}, fref{}, asio::use_future)),
                           std::future<result<fref>>>);
static_assert(
    std::same_as<decltype(upload(std::declval<std::vector<float>&>(), fref{}, asio::use_awaitable)),
                 awaitable_result<fref>>);
static_assert(std::same_as<decltype(download(fref{}, std::span<float>{}, asio::use_future)),
                           std::future<result<void>>>);
static_assert(std::same_as<decltype(download(fref{}, pinned_buffer<float>{}, transfer_options{},
                                             asio::use_awaitable)),
                           awaitable_result<pinned_buffer<float>>>);
static_assert(std::is_void_v<decltype(copy(fref{}, fref{}, result_callback))>);
static_assert(
    std::same_as<decltype(run_kernel("t", stream{}, event_poll{}, 1, an_enqueue, asio::use_future)),
                 std::future<result<int>>>);
static_assert(std::same_as<decltype(run_kernel("t", stream{}, 1, an_enqueue, asio::use_awaitable)),
                           awaitable_result<int>>);
// A pageable upload cannot start from a temporary container: it would be gone
// before the operation reads it.
template <class Src>
concept uploads_from = requires(Src&& src) {
  upload(std::forward<Src>(src), fref{}, any_callback);
};
static_assert(!uploads_from<std::vector<float>>);
static_assert(uploads_from<std::vector<float>&>);
static_assert(uploads_from<const std::vector<float>&>);
static_assert(uploads_from<std::span<const float>>);
static_assert(!uploads_from<std::vector<double>&>);  // the element type must be the ref's
// A download cannot write into const elements.
template <class Dst>
concept downloads_into = requires(Dst&& dst) {
  download(fref{}, std::forward<Dst>(dst), any_callback);
};
static_assert(downloads_into<std::vector<float>&>);
static_assert(downloads_into<std::span<float>>);
static_assert(!downloads_into<const std::vector<float>&>);
static_assert(!downloads_into<std::span<const float>>);

template <class Token>
concept transfers_take = requires(Token t, std::vector<float>& v, pinned_buffer<float> pb,
                                  transfer_options o) {
  upload(pb, fref{}, t);
  upload(pb, fref{}, o, t);
  upload(std::span<const float>(v), fref{}, t);
  upload(v, fref{}, o, t);
  download(fref{}, pb, t);
  download(fref{}, pb, o, t);
  download(fref{}, std::span<float>(v), t);
  download(fref{}, v, o, t);
  copy(fref{}, fref{}, t);
  copy(fref{}, fref{}, o, t);
  fill_bytes(fref{}, 0, t);
  fill_bytes(fref{}, 0, o, t);
  run_kernel("t", stream{}, event_poll{}, 1, an_enqueue, t);
  run_kernel("t", stream{}, 1, an_enqueue, t);
};
static_assert(transfers_take<decltype(any_callback)>);
static_assert(transfers_take<asio::use_future_t<>>);
static_assert(transfers_take<asio::deferred_t>);
static_assert(transfers_take<asio::use_awaitable_t<>>);

#if ATOMR_CUDA_HAS_CUBLAS
template <class Token>
concept blas_takes = requires(const blas_actor& b, Token t, gemm_params p, batch_params bp,
                              gemv_params v, gpu_ref<float> f, gpu_ref<double> d, gpu_ref<half> h,
                              gpu_ref<bfloat16> bf) {
  b.gemm(p, f, f, f, t);
  b.gemm(p, d, d, d, t);
  b.gemm(p, h, h, h, t);
  b.gemm(p, bf, bf, bf, t);
  b.gemm_strided_batched(p, bp, f, f, f, t);
  b.gemm_strided_batched(p, bp, d, d, d, t);
  b.gemm_strided_batched(p, bp, h, h, h, t);
  b.gemm_strided_batched(p, bp, bf, bf, bf, t);
  b.gemv(v, f, f, f, t);
  b.gemv(v, d, d, d, t);
  b.axpy(4, 2.0, f, f, 1, 1, t);
  b.axpy(4, 2.0, d, d, t);
  b.scal(4, 2.0, f, 1, t);
  b.scal(4, 2.0, d, t);
  b.dot(4, f, f, 1, 1, t);
  b.dot(4, d, d, t);
  b.nrm2(4, f, 1, t);
  b.nrm2(4, d, t);
  b.asum(4, f, t);
  b.asum(4, d, 1, t);
  b.iamax(4, f, t);
  b.iamax(4, d, 1, t);
};
static_assert(blas_takes<decltype(any_callback)>);
static_assert(blas_takes<asio::use_future_t<>>);
static_assert(blas_takes<asio::deferred_t>);
static_assert(blas_takes<asio::use_awaitable_t<>>);
// Token overloads exist for exactly the element types the awaitables take.
template <class T>
concept blas_gemm_takes = requires(const blas_actor& b, gpu_ref<T> x) {
  b.gemm(gemm_params{}, x, x, x, any_callback);
};
template <class T>
concept blas_dot_takes = requires(const blas_actor& b, gpu_ref<T> x) {
  b.dot(4, x, x, any_callback);
};
static_assert(blas_gemm_takes<half>);
static_assert(!blas_gemm_takes<std::int8_t>);
static_assert(blas_dot_takes<double>);
static_assert(!blas_dot_takes<half>);
static_assert(std::same_as<decltype(std::declval<const blas_actor&>().dot(4, fref{}, fref{},
                                                                          asio::use_future)),
                           std::future<result<float>>>);
static_assert(
    std::same_as<decltype(std::declval<const blas_actor&>().iamax(4, fref{}, asio::use_awaitable)),
                 awaitable_result<std::int64_t>>);
// An increment is never taken for a token.
static_assert(
    std::same_as<decltype(std::declval<const blas_actor&>().axpy(4, 2.0, fref{}, fref{}, 2)),
                 awaitable_result<fref>>);
static_assert(std::same_as<decltype(std::declval<const blas_actor&>().nrm2(4, fref{}, 2)),
                           awaitable_result<float>>);
#endif

#if ATOMR_CUDA_HAS_CUFFT
template <class Token>
concept fft_takes = requires(const fft_actor& a, Token t, fft_shape s, gpu_ref<float> f,
                             gpu_ref<double> d, gpu_ref<fft_actor::c32> c,
                             gpu_ref<fft_actor::c64> z) {
  a.c2c(s, c, c, t);
  a.c2c(s, z, z, t);
  a.r2c(s, f, c, t);
  a.r2c(s, d, z, t);
  a.c2r(s, c, f, t);
  a.c2r(s, z, d, t);
};
static_assert(fft_takes<decltype(any_callback)>);
static_assert(fft_takes<asio::use_future_t<>>);
static_assert(fft_takes<asio::deferred_t>);
static_assert(fft_takes<asio::use_awaitable_t<>>);
template <class In, class Out>
concept fft_r2c_takes = requires(const fft_actor& a, gpu_ref<In> in, gpu_ref<Out> out) {
  a.r2c(fft_shape{}, in, out, any_callback);
};
static_assert(fft_r2c_takes<float, fft_actor::c32>);
static_assert(!fft_r2c_takes<double, fft_actor::c32>);  // mixed precisions: no awaitable either
#endif

#if ATOMR_CUDA_HAS_CURAND
template <class Token>
concept rng_takes = requires(const rng_actor& r, Token t, gpu_ref<float> f, gpu_ref<double> d,
                             gpu_ref<std::uint32_t> u, gpu_ref<std::uint64_t> l) {
  r.uniform(f, t);
  r.uniform(d, t);
  r.normal(f, 0.0, 1.0, t);  // double literals for a float mean and stddev
  r.normal(d, t);
  r.log_normal(f, t);
  r.log_normal(d, 0.5, 2.0, t);
  r.poisson(u, 3.5, t);
  r.raw(u, t);
  r.raw(l, t);
};
static_assert(rng_takes<decltype(any_callback)>);
static_assert(rng_takes<asio::use_future_t<>>);
static_assert(rng_takes<asio::deferred_t>);
static_assert(rng_takes<asio::use_awaitable_t<>>);
// A mean is never taken for a token.
static_assert(std::same_as<decltype(std::declval<const rng_actor&>().normal(fref{}, 0.5f)),
                           awaitable_result<fref>>);
#endif

#if ATOMR_CUDA_HAS_CUDNN
template <class Token>
concept cudnn_takes = requires(const cudnn_actor& a, Token t, tensor_shape s, gpu_ref<float> f,
                               gpu_ref<half> h) {
  a.conv2d_forward(s, conv2d_params{}, f, f, f, f, t);
  a.conv2d_forward(s, conv2d_params{}, h, h, h, h, t);
  a.activation_forward(s, activation_params{}, f, f, t);
  a.activation_forward(s, activation_params{}, h, h, t);
  a.softmax_forward(s, softmax_algorithm::accurate, f, f, t);
  a.softmax_forward(s, softmax_algorithm::log, h, h, t);
  a.pooling_forward(s, pooling_params{}, f, f, t);
  a.pooling_forward(s, pooling_params{}, h, h, t);
  a.batchnorm_inference(s, 1e-5, f, f, f, f, f, f, t);
  a.batchnorm_inference(s, 1e-5, h, f, f, f, f, h, t);
};
static_assert(cudnn_takes<decltype(any_callback)>);
static_assert(cudnn_takes<asio::use_future_t<>>);
static_assert(cudnn_takes<asio::deferred_t>);
static_assert(cudnn_takes<asio::use_awaitable_t<>>);
#endif

// ---- Run time ----

// Ordinal 0 where there is no GPU (the real case), else one that cannot exist.
errc code_of(const auto& r) {
  return r ? errc::ok : r.error().code();
}

/// Handlers that record each call: how often, with which code, and whether
/// it ran where it had to (`where()` true).
struct recorder {
  std::map<std::string, std::vector<errc>> codes;
  int calls = 0;
  int misplaced = 0;

  template <class Where>
  auto handler(std::string name, Where where) {
    return [this, name = std::move(name), where](auto r) {
      ++calls;
      if (!where()) ++misplaced;
      codes[name].push_back(code_of(r));
    };
  }
  bool once_with(const std::string& name, errc code) const {
    auto it = codes.find(name);
    return it != codes.end() && it->second == std::vector<errc>{code};
  }
};

// Coroutines for async_from. They take what they use as parameters: a
// coroutine lambda's captures would not outlive the initiating call.

asio::awaitable<result<int>> note_thread(std::thread::id* where, int value) {
  *where = std::this_thread::get_id();
  co_return value;
}

template <class Executor>
asio::awaitable<result<int>> note_running_in(Executor ex, bool* yes) {
  *yes = ex.running_in_this_thread();
  co_return 1;
}

asio::awaitable<result<int>> mark_ran(bool* ran) {
  *ran = true;
  co_return 1;
}

/// Waits `d` on a timer; a cancelled wait yields errc::cancelled (as the
/// library's waits do) and sets *cancelled.
asio::awaitable<result<int>> sleep_then(std::chrono::steady_clock::duration d, bool* cancelled) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  if (ec == asio::error::operation_aborted) {
    *cancelled = true;
    co_return make_error(errc::cancelled, "sleep cancelled");
  }
  co_return 1;
}

/// Waits `d` on a timer, letting a cancelled wait throw operation_aborted.
asio::awaitable<result<int>> sleep_or_throw(std::chrono::steady_clock::duration d) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  co_await t.async_wait(asio::use_awaitable);
  co_return 1;
}

asio::awaitable<result<int>> rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
  co_return 1;
}

struct token_fixture : io_fixture {
  device dev{ioc.get_executor(), unusable_ordinal()};
  const transfer_options on_dev{.on = dev.main_stream()};
  std::vector<float> host = std::vector<float>(8, 1.0f);
  std::vector<float> out = std::vector<float>(8, 0.0f);
  bool enqueued = false;
  std::function<result<int>(launch&)> enqueue = [this](launch&) -> result<int> {
    enqueued = true;
    return 0;
  };
  bool on_io() { return ioc.get_executor().running_in_this_thread(); }
};

using steady = std::chrono::steady_clock;

}  // namespace

TEST_CASE_FIXTURE(token_fixture,
                  "every transfer and run_kernel completes once through a callback, on the "
                  "device's executor, with its error") {
  recorder rec;
  auto here = [this] { return on_io(); };
  upload(pinned_buffer<float>{}, fref{}, on_dev, rec.handler("upload pinned", here));
  upload(std::span<const float>(host), fref{}, on_dev, rec.handler("upload span", here));
  upload(host, fref{}, on_dev, rec.handler("upload vector", here));
  download(fref{}, pinned_buffer<float>{}, on_dev, rec.handler("download pinned", here));
  download(fref{}, std::span<float>(out), on_dev, rec.handler("download span", here));
  download(fref{}, out, on_dev, rec.handler("download vector", here));
  copy(fref{}, fref{}, on_dev, rec.handler("copy", here));
  fill_bytes(fref{}, 0xFF, on_dev, rec.handler("fill_bytes", here));
  run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue, rec.handler("run_kernel", here));
  run_kernel("test", dev.main_stream(), 42, enqueue, rec.handler("run_kernel default", here));
  CHECK(rec.calls == 0);  // never from within the initiating call
  ioc.run();              // returns: nothing is left behind
  CHECK(rec.calls == 10);
  CHECK(rec.misplaced == 0);
  for (const char* name : {"upload pinned", "upload span", "upload vector", "download pinned",
                           "download span", "download vector", "copy", "fill_bytes"}) {
    CAPTURE(name);
    CHECK(rec.once_with(name, errc::invalid_argument));
  }
  CHECK(rec.once_with("run_kernel", errc::device_unavailable));
  CHECK(rec.once_with("run_kernel default", errc::device_unavailable));
  CHECK_FALSE(enqueued);
  CHECK(out == std::vector<float>(8, 0.0f));  // a failed download leaves dst alone
  CHECK(dev.statistics().ops_in_flight == 0);
}

TEST_CASE_FIXTURE(token_fixture,
                  "a handler bound to a strand runs the operation and its completion there") {
  auto strand = asio::make_strand(ioc);
  auto in_strand = [strand] { return strand.running_in_this_thread(); };
  recorder rec;
  auto on = [&](std::string name) {
    return asio::bind_executor(strand, rec.handler(name, in_strand));
  };
  // Without options an empty ref has no device: the executor is the handler's.
  upload(pinned_buffer<float>{}, fref{}, on("upload pinned"));
  upload(std::span<const float>(host), fref{}, on("upload span"));
  download(fref{}, pinned_buffer<float>{}, on("download pinned"));
  download(fref{}, out, on("download vector"));
  copy(fref{}, fref{}, on("copy"));
  fill_bytes(fref{}, 0, on("fill_bytes"));
  run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue, on("run_kernel"));
  bool op_in_strand = false;
  async_from(ioc.get_executor(), note_running_in(strand, &op_in_strand), on("async_from"));
  CHECK(rec.calls == 0);
  ioc.run();
  CHECK(rec.calls == 8);
  CHECK(rec.misplaced == 0);
  for (const char* name : {"upload pinned", "upload span", "download pinned", "download vector",
                           "copy", "fill_bytes"}) {
    CAPTURE(name);
    CHECK(rec.once_with(name, errc::invalid_argument));
  }
  CHECK(rec.once_with("run_kernel", errc::device_unavailable));
  CHECK(rec.once_with("async_from", errc::ok));
  CHECK(op_in_strand);  // the operation itself ran on the handler's strand, not on `ex`
}

TEST_CASE("use_future: the operation runs on the device's io thread, get() on the caller's") {
  asio::io_context ioc;
  auto work = asio::make_work_guard(ioc);
  std::thread io([&] { ioc.run(); });
  {
    device dev(ioc.get_executor(), unusable_ordinal());
    const transfer_options on_dev{.on = dev.main_stream()};
    std::vector<float> host(8, 1.0f), out(8, 0.0f);
    bool enqueued = false;
    auto enqueue = [&](launch&) -> result<int> {
      enqueued = true;
      return 0;
    };
    auto fill = fill_bytes(fref{}, 0, on_dev, asio::use_future);
    auto up = upload(host, fref{}, on_dev, asio::use_future);
    auto down = download(fref{}, std::span<float>(out), on_dev, asio::use_future);
    auto rk = run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue, asio::use_future);
    std::thread::id ran_on{};
    auto own = async_from(ioc.get_executor(), note_thread(&ran_on, 7), asio::use_future);
    // An empty ref without options has no device, and use_future's handler has
    // only a system-context executor: a strand of the system executor runs it.
    auto nowhere = copy(fref{}, fref{}, asio::use_future);
    for (auto* f : {&fill, &up, &nowhere}) REQUIRE(f->wait_for(60s) == std::future_status::ready);
    CHECK(code_of(fill.get()) == errc::invalid_argument);
    CHECK(code_of(up.get()) == errc::invalid_argument);
    CHECK(code_of(nowhere.get()) == errc::invalid_argument);
    REQUIRE(down.wait_for(60s) == std::future_status::ready);
    CHECK(code_of(down.get()) == errc::invalid_argument);
    REQUIRE(rk.wait_for(60s) == std::future_status::ready);
    CHECK(code_of(rk.get()) == errc::device_unavailable);
    REQUIRE(own.wait_for(60s) == std::future_status::ready);
    auto r = own.get();
    REQUIRE(r);
    CHECK(r.value() == 7);
    CHECK(ran_on == io.get_id());  // not a system thread: use_future's executor is not used
    CHECK_FALSE(enqueued);
  }
  work.reset();
  io.join();
}

TEST_CASE_FIXTURE(token_fixture,
                  "deferred starts nothing until it is invoked, then completes once") {
  recorder rec;
  auto here = [this] { return on_io(); };
  auto cp = copy(fref{}, fref{}, on_dev, asio::deferred);
  auto up = upload(std::span<const float>(host), fref{}, on_dev, asio::deferred);
  auto rk = run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue, asio::deferred);
  bool ran = false;
  auto own = async_from(ioc.get_executor(), mark_ran(&ran), asio::deferred);
  ioc.run();
  CHECK(rec.calls == 0);
  CHECK_FALSE(ran);
  std::move(cp)(rec.handler("copy", here));
  std::move(up)(rec.handler("upload", here));
  std::move(rk)(rec.handler("run_kernel", here));
  std::move(own)(rec.handler("async_from", here));
  CHECK(rec.calls == 0);
  ioc.restart();
  ioc.run();
  CHECK(rec.calls == 4);
  CHECK(rec.misplaced == 0);
  CHECK(rec.once_with("copy", errc::invalid_argument));
  CHECK(rec.once_with("upload", errc::invalid_argument));
  CHECK(rec.once_with("run_kernel", errc::device_unavailable));
  CHECK(rec.once_with("async_from", errc::ok));
  CHECK(ran);
}

TEST_CASE_FIXTURE(token_fixture,
                  "use_awaitable in a coroutine on a strand: the operation and the resumption "
                  "stay on the strand") {
  auto strand = asio::make_strand(ioc);
  std::vector<errc> codes;
  int resumed_in_strand = 0;
  bool op_in_strand = false;
  auto body = [&]() -> asio::awaitable<void> {
    codes.push_back(code_of(
        co_await upload(std::span<const float>(host), fref{}, on_dev, asio::use_awaitable)));
    resumed_in_strand += strand.running_in_this_thread();
    codes.push_back(code_of(co_await download(fref{}, out, on_dev, asio::use_awaitable)));
    resumed_in_strand += strand.running_in_this_thread();
    codes.push_back(code_of(co_await run_kernel("test", dev.main_stream(), event_poll{}, 42,
                                                enqueue, asio::use_awaitable)));
    resumed_in_strand += strand.running_in_this_thread();
    codes.push_back(code_of(co_await async_from(
        ioc.get_executor(), note_running_in(strand, &op_in_strand), asio::use_awaitable)));
    resumed_in_strand += strand.running_in_this_thread();
  };
  std::exception_ptr failed;
  asio::co_spawn(strand, body(), [&](std::exception_ptr e) { failed = e; });
  ioc.run();
  REQUIRE_FALSE(failed);
  CHECK(codes == std::vector<errc>{errc::invalid_argument, errc::invalid_argument,
                                   errc::device_unavailable, errc::ok});
  CHECK(resumed_in_strand == 4);
  CHECK(op_in_strand);  // run on the awaiting coroutine's executor, as a plain co_await is
}

TEST_CASE_FIXTURE(token_fixture,
                  "awaitable operators: || with a timer, either side winning, and &&") {
  using namespace asio::experimental::awaitable_operators;
  // The operation wins (it fails at once); the timer's wait is cancelled.
  auto first = run([&]() -> asio::awaitable<std::variant<result<fref>, std::monostate>> {
    asio::steady_timer t(co_await asio::this_coro::executor, 60s);
    co_return co_await (fill_bytes(fref{}, 0, on_dev, asio::use_awaitable) ||
                        t.async_wait(asio::use_awaitable));
  }());
  REQUIRE(first.index() == 0);
  CHECK(code_of(std::get<0>(first)) == errc::invalid_argument);

  auto kernel = run([&]() -> asio::awaitable<std::variant<result<int>, std::monostate>> {
    asio::steady_timer t(co_await asio::this_coro::executor, 60s);
    co_return co_await (
        run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue, asio::use_awaitable) ||
        t.async_wait(asio::use_awaitable));
  }());
  REQUIRE(kernel.index() == 0);
  CHECK(code_of(std::get<0>(kernel)) == errc::device_unavailable);

  // The timer wins: the operation's wait is cancelled (the operators emit
  // every cancellation type; it reaches the wait inside the operation).
  bool cancelled = false;
  const auto t0 = steady::now();
  auto second = run([&]() -> asio::awaitable<std::variant<result<int>, std::monostate>> {
    asio::steady_timer t(co_await asio::this_coro::executor, 1ms);
    co_return co_await (
        async_from(ioc.get_executor(), sleep_then(60s, &cancelled), asio::use_awaitable) ||
        t.async_wait(asio::use_awaitable));
  }());
  CHECK(second.index() == 1);
  CHECK(cancelled);
  CHECK(steady::now() - t0 < 30s);

  // &&: both complete (with their errors, which are values, not exceptions).
  auto both = run([&]() -> asio::awaitable<std::tuple<result<fref>, result<int>>> {
    co_return co_await (
        fill_bytes(fref{}, 0, on_dev, asio::use_awaitable) &&
        run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue, asio::use_awaitable));
  }());
  CHECK(code_of(std::get<0>(both)) == errc::invalid_argument);
  CHECK(code_of(std::get<1>(both)) == errc::device_unavailable);
}

TEST_CASE_FIXTURE(
    token_fixture,
    "per-operation cancellation of every type reaches the wait and yields cancelled") {
  for (auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                    asio::cancellation_type::total}) {
    CAPTURE(static_cast<int>(type));
    for (bool throws : {false, true}) {
      CAPTURE(throws);
      asio::cancellation_signal sig;
      bool saw = false;
      recorder rec;
      auto op = throws ? sleep_or_throw(60s) : sleep_then(60s, &saw);
      async_from(
          ioc.get_executor(), std::move(op),
          asio::bind_cancellation_slot(sig.slot(), rec.handler("op", [this] { return on_io(); })));
      asio::steady_timer t(ioc, 1ms);
      t.async_wait([&](boost::system::error_code) { sig.emit(type); });
      const auto t0 = steady::now();
      ioc.restart();
      ioc.run();
      CHECK(steady::now() - t0 < 30s);  // the 60 s wait did not run out
      CHECK(rec.misplaced == 0);
      CHECK(rec.once_with("op", errc::cancelled));
      CHECK(saw == !throws);
      sig.emit(type);  // after completion: nothing happens
      ioc.restart();
      ioc.run();
      CHECK(rec.calls == 1);
    }
  }
}

TEST_CASE_FIXTURE(token_fixture,
                  "a cancellation that arrives before the operation starts: cancelled, never "
                  "started, once") {
  for (auto type : {asio::cancellation_type::terminal, asio::cancellation_type::partial,
                    asio::cancellation_type::total}) {
    CAPTURE(static_cast<int>(type));
    asio::cancellation_signal sig;
    recorder rec;
    auto here = [this] { return on_io(); };
    // Queued ahead of the operations' start on the same io_context. (A plain
    // co_spawn cancelled this way throws out of run() with Boost 1.81 and 1.83.)
    asio::post(ioc, [&] { sig.emit(type); });
    bool ran = false;
    async_from(ioc.get_executor(), mark_ran(&ran),
               asio::bind_cancellation_slot(sig.slot(), rec.handler("async_from", here)));
    ioc.restart();
    CHECK_NOTHROW(ioc.run());
    CHECK(rec.once_with("async_from", errc::cancelled));
    CHECK_FALSE(ran);

    asio::post(ioc, [&] { sig.emit(type); });
    run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue,
               asio::bind_cancellation_slot(sig.slot(), rec.handler("run_kernel", here)));
    asio::cancellation_signal sig2;
    asio::post(ioc, [&] { sig2.emit(type); });
    upload(host, fref{}, on_dev,
           asio::bind_cancellation_slot(sig2.slot(), rec.handler("upload", here)));
    ioc.restart();
    CHECK_NOTHROW(ioc.run());
    CHECK(rec.once_with("run_kernel", errc::cancelled));
    CHECK(rec.once_with("upload", errc::cancelled));
    CHECK(rec.calls == 3);
    CHECK(rec.misplaced == 0);
    CHECK_FALSE(enqueued);
  }
}

TEST_CASE_FIXTURE(token_fixture,
                  "a cancellation slot on an operation that completes first changes nothing") {
  asio::cancellation_signal sig;
  recorder rec;
  auto here = [this] { return on_io(); };
  run_kernel("test", dev.main_stream(), event_poll{}, 42, enqueue,
             asio::bind_cancellation_slot(sig.slot(), rec.handler("run_kernel", here)));
  ioc.run();
  sig.emit(asio::cancellation_type::terminal);
  ioc.restart();
  ioc.run();
  CHECK(rec.once_with("run_kernel", errc::device_unavailable));
  CHECK(rec.misplaced == 0);
}

TEST_CASE_FIXTURE(token_fixture, "an exception escaping the operation becomes a gpu_error") {
  struct expect {
    std::exception_ptr thrown;
    errc code;
    const char* in_message;
  };
  const expect cases[] = {
      {std::make_exception_ptr(std::bad_alloc()), errc::out_of_memory, "host allocation failed"},
      {std::make_exception_ptr(std::runtime_error("boom")), errc::unrecoverable, "boom"},
      {std::make_exception_ptr(gpu_exception(make_error(errc::stale_ref, "stale in the test"))),
       errc::stale_ref, "stale in the test"},
      {std::make_exception_ptr(boost::system::system_error(asio::error::operation_aborted)),
       errc::cancelled, "cancelled"},
      {std::make_exception_ptr(boost::system::system_error(asio::error::timed_out)),
       errc::unrecoverable, "operation threw"},
      {std::make_exception_ptr(42), errc::unrecoverable, "unknown type"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.in_message);
    int calls = 0;
    std::optional<result<int>> got;
    async_from(ioc.get_executor(), rethrow(c.thrown), [&](result<int> r) {
      ++calls;
      got.emplace(std::move(r));
    });
    ioc.restart();
    CHECK_NOTHROW(ioc.run());
    REQUIRE(calls == 1);
    REQUIRE_FALSE(*got);
    CHECK(got->error().code() == c.code);
    CHECK(got->error().message().find(c.in_message) != std::string::npos);
  }
}
