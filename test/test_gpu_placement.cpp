// Placement over the devices of this machine (issue 22), on one GPU: the
// set finds it, every pick lands on an accepting device, placed actors
// compute correct numbers, and the loads are the device's own.
#include <atomr/cuda.hpp>

#include "gpu_fixture.hpp"

#include <doctest/doctest.h>

#include <span>
#include <vector>

using namespace atomr::cuda;
using atomr::cuda::test::gpu_fixture;

TEST_CASE_FIXTURE(gpu_fixture,
                  "placement on this machine: every device found, picks land on "
                  "accepting devices, placed gemms are correct") {
  auto all = device_set::open(ioc.get_executor());
  REQUIRE_MESSAGE(all, (all ? "" : all.error().message()));
  REQUIRE(all.value().size() >= 1);
  for (std::size_t i = 0; i < all.value().size(); ++i) {
    CHECK(all.value()[i].ordinal() == static_cast<int>(i));
    CHECK_FALSE(all.value().peer(i, i));
  }
  // An ordinal no machine has sits in the set as unavailable and is skipped.
  device_set_options o;
  o.ordinals = {1000, 0};
  for (auto policy : {placement_policy::round_robin, placement_policy::least_loaded}) {
    o.policy = policy;
    auto set = device_set::open(ioc.get_executor(), o).value();
    for (int k = 0; k < 50; ++k) {
      auto p = set.pick();
      REQUIRE(p);
      CHECK(p.value().ordinal() == 0);
    }
    const auto loads = set.loads();
    CHECK_FALSE(loads[0].accepting);
    CHECK(loads[1].accepting);
    CHECK(loads[1].free_bytes > 0);
  }

  placed_actors<blas_actor, blas_options> blas(all.value(), {});
  const int n = 64;
  const auto a = test::random_floats(n * n, 81), b = test::random_floats(n * n, 82);
  for (int k = 0; k < 4; ++k) {
    auto actor = blas.pick();
    REQUIRE(actor);
    auto d = actor.value().get_device();
    CHECK(d.accepting());
    auto ga = d.allocate<float>(n * n).value();
    auto gb = d.allocate<float>(n * n).value();
    auto gc = d.allocate<float>(n * n).value();
    REQUIRE(run(upload(a, ga)));
    REQUIRE(run(upload(b, gb)));
    gemm_params p;
    p.m = p.n = p.k = n;
    REQUIRE(run(actor.value().gemm(p, ga, gb, gc)));
    std::vector<float> c(n * n);
    REQUIRE(run(download(gc, std::span<float>(c))));
    CHECK(test::gemm_rel_error(a, b, c, n) < 1e-5);
  }
}
