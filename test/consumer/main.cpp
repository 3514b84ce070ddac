// A downstream program of atomr-accel-cuda: what a user writes against the
// installed headers and library. It exercises the parts of the public API
// that the headers implement inline (run_kernel, the transfers) and one
// library actor, and checks every number it gets back.
//
// Exit status: 0 when every check passed, 1 on an error or a wrong number,
// 77 (a skip, for meson test) with the reason when no GPU is usable.

#include <atomr/cuda.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <span>
#include <tuple>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace ac = atomr::cuda;

constexpr int exit_ok = 0;
constexpr int exit_failed = 1;
constexpr int exit_skip = 77;

int fail(const char* what, const ac::gpu_error& e) {
  std::fprintf(stderr, "consumer: %s failed: %s\n", what, e.message().c_str());
  return exit_failed;
}

// upload, then run_kernel zeroing the first half with cudaMemsetAsync, then
// download: the first half must read 0, the second the uploaded values.
asio::awaitable<int> check_transfers_and_run_kernel(ac::device dev) {
  constexpr std::size_t n = 4096;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i + 1);

  auto buf = dev.allocate<float>(n);
  if (!buf) co_return fail("allocate", buf.error());
  if (auto up = co_await ac::upload(std::span<const float>(host), buf.value()); !up)
    co_return fail("upload", up.error());

  auto half = buf.value().subspan(0, n / 2);
  if (!half) co_return fail("subspan", half.error());
  auto zeroed = co_await ac::run_kernel(
      "cuda", dev.main_stream(), half.value(), [&](ac::launch& l) -> ac::result<std::tuple<>> {
        BOOST_OUTCOME_TRY(float* p, l.write(half.value()));
        if (auto st = cudaMemsetAsync(p, 0, half.value().size_bytes(), l.native_stream());
            st != cudaSuccess)
          return ac::classify(st, "cudaMemsetAsync");
        return std::tuple<>{};
      });
  if (!zeroed) co_return fail("run_kernel (cudaMemsetAsync)", zeroed.error());

  std::vector<float> back(n, -1.0f);
  if (auto down = co_await ac::download(buf.value(), std::span<float>(back)); !down)
    co_return fail("download", down.error());
  for (std::size_t i = 0; i < n; ++i) {
    const float want = i < n / 2 ? 0.0f : host[i];
    if (back[i] != want) {
      std::fprintf(stderr, "consumer: element %zu is %g after the memset, expected %g\n", i,
                   static_cast<double>(back[i]), static_cast<double>(want));
      co_return exit_failed;
    }
  }
  std::printf("consumer: upload, run_kernel (cudaMemsetAsync), download: %zu values right\n", n);
  co_return exit_ok;
}

#if ATOMR_CUDA_HAS_CUBLAS
// C = A * B through blas_actor, small integers so that f32 is exact.
asio::awaitable<int> check_gemm(ac::device dev) {
  constexpr std::size_t m = 3, k = 4, n = 2;  // column-major, as in cuBLAS
  std::vector<float> a(m * k), b(k * n), c(m * n, -1.0f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5) - 2.0f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 3) + 1.0f;

  auto blas = ac::blas_actor::create(dev);
  if (!blas) co_return fail("blas_actor::create", blas.error());
  auto da = dev.allocate<float>(a.size());
  auto db = dev.allocate<float>(b.size());
  auto dc = dev.allocate<float>(c.size());
  if (!da || !db || !dc) co_return fail("allocate", (!da ? da : !db ? db : dc).error());
  if (auto up = co_await ac::upload(std::span<const float>(a), da.value()); !up)
    co_return fail("upload A", up.error());
  if (auto up = co_await ac::upload(std::span<const float>(b), db.value()); !up)
    co_return fail("upload B", up.error());

  const ac::gemm_params p{.m = m, .n = n, .k = k};
  auto product = co_await blas.value().gemm(p, da.value(), db.value(), dc.value());
  if (!product) co_return fail("gemm", product.error());
  if (auto down = co_await ac::download(product.value(), std::span<float>(c)); !down)
    co_return fail("download C", down.error());

  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < m; ++i) {
      float want = 0.0f;
      for (std::size_t l = 0; l < k; ++l) want += a[i + l * m] * b[l + j * k];
      if (c[i + j * m] != want) {
        std::fprintf(stderr, "consumer: C(%zu, %zu) is %g, expected %g\n", i, j,
                     static_cast<double>(c[i + j * m]), static_cast<double>(want));
        co_return exit_failed;
      }
    }
  std::printf("consumer: blas_actor gemm %zux%zux%zu: right\n", m, n, k);
  co_return exit_ok;
}
#endif

asio::awaitable<int> check_all(ac::device dev) {
  if (int rc = co_await check_transfers_and_run_kernel(dev); rc != exit_ok) co_return rc;
#if ATOMR_CUDA_HAS_CUBLAS
  if (int rc = co_await check_gemm(dev); rc != exit_ok) co_return rc;
#else
  std::printf("consumer: built without cuBLAS: no actor checked\n");
#endif
  co_return exit_ok;
}

}  // namespace

int main() {
  // The io_context is declared first so that it outlives the device: the
  // device and every gpu_ref must be gone before their io_context is.
  asio::io_context ioc;
  int rc = exit_failed;
  {
    auto dev = ac::device::open(ioc.get_executor());
    if (!dev) {
      if (dev.error().code() == ac::errc::device_unavailable) {
        std::printf("SKIP: no usable GPU: %s\n", dev.error().message().c_str());
        return exit_skip;
      }
      return fail("device::open", dev.error());
    }
    asio::co_spawn(ioc, check_all(dev.value()), [&](std::exception_ptr ep, int got) {
      if (!ep) {
        rc = got;
        return;
      }
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "consumer: exception: %s\n", ex.what());
      }
      rc = exit_failed;
    });
  }
  ioc.run();
  if (rc == exit_ok) std::printf("consumer: all checks passed\n");
  return rc;
}
