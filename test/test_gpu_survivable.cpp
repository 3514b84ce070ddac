// Failures CUDA lets a process survive stay local: the device keeps working.
#include "gpu_fixture.hpp"
#include "test_kernels.hpp"

using namespace atomr::cuda;
using namespace atomr::cuda::test;

TEST_CASE_FIXTURE(gpu_fixture, "an allocation larger than the device yields out_of_memory") {
  auto before = dev.statistics();
  const std::size_t too_much = before.total_bytes + (std::size_t{1} << 30);
  auto big = dev.allocate<std::uint8_t>(too_much);
  REQUIRE_FALSE(big);
  CHECK(big.error().code() == errc::out_of_memory);
  CHECK(dev.statistics().out_of_memory == before.out_of_memory + 1);
  CHECK(dev.health() == health_state::healthy);

  // The next allocation and computation succeed.
  constexpr int n = 128;
  auto s = dev.acquire_stream().value();
  blas_handle blas(s);
  auto av = random_floats(n * n, 21);
  auto bv = random_floats(n * n, 22);
  auto a = upload_floats(av, s);
  auto b = upload_floats(bv, s);
  auto c = alloc<float>(n * n);
  auto r = run(sgemm(blas, s, event_poll{}, a, b, c, n));
  REQUIRE(r);
  CHECK(gemm_rel_error(av, bv, download_floats(c), n) < 1e-5);
}

TEST_CASE_FIXTURE(gpu_fixture, "an invalid launch configuration is an error; the next op works") {
  test_kernels kernels;
  auto s = dev.acquire_stream().value();
  auto target = alloc<int>(1);
  auto r = run(run_kernel("cuda", s, event_poll{}, target, [&](launch& l) -> result<int> {
    BOOST_OUTCOME_TRY(int* p, l.write(target));
    // 4096 threads per block exceeds every device's limit (1024).
    auto st =
        kernels.write_to(l.native_stream(), reinterpret_cast<unsigned long long>(p), 1, dim3(4096));
    if (st != cudaSuccess) return classify(st, "cudaLaunchKernel(write_to)");
    return 0;
  }));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  // cudaLaunchKernel on a library kernel reports cudaErrorInvalidValue here
  // (seen on the H200); a <<<>>> launch reports cudaErrorInvalidConfiguration.
  CHECK((r.error().native_status() == cudaErrorInvalidValue ||
         r.error().native_status() == cudaErrorInvalidConfiguration));
  CHECK(dev.health() == health_state::healthy);
  CHECK(cudaGetLastError() == cudaSuccess);  // not left behind for the next launch

  auto ok = run(run_kernel("cuda", s, event_poll{}, target, [&](launch& l) -> result<int> {
    BOOST_OUTCOME_TRY(int* p, l.write(target));
    auto st = kernels.write_to(l.native_stream(), reinterpret_cast<unsigned long long>(p), 42);
    if (st != cudaSuccess) return classify(st, "cudaLaunchKernel(write_to)");
    return 0;
  }));
  REQUIRE(ok);
  std::vector<int> back(1);
  REQUIRE(run(download(target, std::span<int>(back))));
  CHECK(back[0] == 42);
}
