// Shared pieces of the GPU tests: an opened device, random data, a cuBLAS
// sgemm launched through run_kernel, and a double-precision CPU reference.
#pragma once

#include <atomr/cuda.hpp>

#include "io_fixture.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cublas_v2.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace atomr::cuda::test {

/// Whether the tests run under ASan (compiled in) or compute-sanitizer
/// (scripts/device-check.sh sets ATOMR_TEST_UNDER_SANITIZER for its runs):
/// tests scale their load down there, not their time limits up.
inline bool under_sanitizer() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#else
  const char* v = std::getenv("ATOMR_TEST_UNDER_SANITIZER");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
#endif
}

/// Fills `bytes` with a fast, seedable pseudo-random sequence (xorshift64*).
inline void random_bytes(void* out, std::size_t bytes, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto* p = static_cast<unsigned char*>(out);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    std::uint64_t v = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 131 + seed);
}

/// Uniform floats in [-1, 1), never all zero.
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> bits(n);
  random_bytes(bits.data(), n * 4, seed);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(bits[i] >> 8) / 8388608.0f - 1.0f;
  return out;
}

/// A cuBLAS handle bound to one stream, with TF32 and other reduced-precision
/// shortcuts off so results can be held to 1e-5.
struct blas_handle {
  cublasHandle_t h = nullptr;
  explicit blas_handle(const stream& s) {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    cublasSetStream(h, s.native_handle());
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  }
  ~blas_handle() { cublasDestroy(h); }
  blas_handle(const blas_handle&) = delete;
  blas_handle& operator=(const blas_handle&) = delete;
};

/// C = A * B (column-major, n x n) through run_kernel; the keep-alive holds A and B.
inline asio::awaitable<result<gpu_ref<float>>> sgemm(const blas_handle& blas, const stream& s,
                                                     completion how, gpu_ref<float> a,
                                                     gpu_ref<float> b, gpu_ref<float> c, int n,
                                                     int repeat = 1) {
  return run_kernel(
      "cublas", s, how, c,
      [&blas, a, b, c, n, repeat](launch& l) -> result<std::tuple<gpu_ref<float>, gpu_ref<float>>> {
        BOOST_OUTCOME_TRY(const float* pa, l.read(a));
        BOOST_OUTCOME_TRY(const float* pb, l.read(b));
        BOOST_OUTCOME_TRY(float* pc, l.write(c));
        const float one = 1.0f, zero = 0.0f;
        for (int i = 0; i < repeat; ++i) {
          auto st = cublasSgemm(blas.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, pa, n, pb, n,
                                &zero, pc, n);
          if (st != CUBLAS_STATUS_SUCCESS) return classify(st, "cublasSgemm");
        }
        return std::tuple{a, b};
      });
}

/// One element of A*B in double precision (column-major).
inline double gemm_ref(const std::vector<float>& a, const std::vector<float>& b, int n, int row,
                       int col) {
  double acc = 0;
  for (int k = 0; k < n; ++k)
    acc += static_cast<double>(a[static_cast<std::size_t>(k) * n + row]) *
           static_cast<double>(b[static_cast<std::size_t>(col) * n + k]);
  return acc;
}

/// ||out - ref|| / ||ref|| over `samples` deterministic entries (all if samples == 0).
inline double gemm_rel_error(const std::vector<float>& a, const std::vector<float>& b,
                             const std::vector<float>& c, int n, int samples = 0) {
  double num = 0, den = 0;
  auto one = [&](int r, int k) {
    double ref = gemm_ref(a, b, n, r, k);
    double d = c[static_cast<std::size_t>(k) * n + r] - ref;
    num += d * d;
    den += ref * ref;
  };
  if (samples == 0) {
    for (int k = 0; k < n; ++k)
      for (int r = 0; r < n; ++r) one(r, k);
  } else {
    for (int i = 0; i < samples; ++i) one((i * 7919) % n, (i * 104729 + 13) % n);
  }
  return std::sqrt(num / den);
}

struct gpu_fixture : io_fixture {
  gpu_fixture() = default;
  explicit gpu_fixture(const device_options& o)
      : dev(device::open(ioc.get_executor(), 0, o).value()) {}
  device dev = device::open(ioc.get_executor(), 0).value();

  template <element T>
  gpu_ref<T> alloc(std::size_t n) {
    return dev.allocate<T>(n).value();
  }

  gpu_ref<float> upload_floats(const std::vector<float>& v, const stream& s) {
    auto r = alloc<float>(v.size());
    auto up = run(upload(std::span<const float>(v), r, {.on = s}));
    REQUIRE(up);
    return r;
  }

  std::vector<float> download_floats(const gpu_ref<float>& r) {
    std::vector<float> out(r.size());
    auto d = run(download(r, std::span<float>(out)));
    REQUIRE(d);
    return out;
  }

  /// A buffer of n floats, every byte 0xFF (NaN), synchronised.
  gpu_ref<float> nan_floats(std::size_t n) {
    auto r = alloc<float>(n);
    REQUIRE(run(fill_bytes(r, 0xFF)));
    return r;
  }

#if ATOMR_CUDA_HAS_CUBLAS
  /// An n x n x n gemm with packed leading dimensions.
  static gemm_params square(int n) {
    return {.m = n, .n = n, .k = n, .lda = n, .ldb = n, .ldc = n};
  }
#endif

  /// Runs the io_context until the device has released every parked keep-alive.
  void drain_parked() {
    for (int i = 0; i < 2000 && dev.statistics().parked > 0; ++i) {
      ioc.restart();
      ioc.run_for(std::chrono::milliseconds(5));
    }
  }
};

/// Failures seen on io threads (doctest's macros stay on the test's
/// thread): how many, and the first one's description.
class failures {
public:
  void add(std::string what) {
    std::lock_guard lk(mu_);
    if (count_++ == 0) first_ = std::move(what);
  }
  std::size_t count() const {
    std::lock_guard lk(mu_);
    return count_;
  }
  std::string first() const {
    std::lock_guard lk(mu_);
    return first_;
  }

private:
  mutable std::mutex mu_;
  std::size_t count_ = 0;
  std::string first_;
};

/// An exception's description for a failure message.
inline std::string describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return std::string("exception: ") + x.what();
  } catch (...) {
  }
  return "an exception of unknown type";
}

}  // namespace atomr::cuda::test
