// rng_actor's argument checks, without a GPU: every check with good and bad
// inputs, and create() on a device that cannot exist.
#include <atomr/cuda.hpp>
#include <atomr/cuda/rng_actor.hpp>

#include "io_fixture.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

using namespace atomr::cuda;
using atomr::cuda::test::io_fixture;
using atomr::cuda::test::unusable_ordinal;

namespace {

constexpr rng_kind all_kinds[] = {rng_kind::philox4_32_10, rng_kind::xorwow,
                                  rng_kind::mrg32k3a,      rng_kind::mtgp32,
                                  rng_kind::sobol32,       rng_kind::scrambled_sobol32,
                                  rng_kind::sobol64,       rng_kind::scrambled_sobol64};
constexpr rng_kind pseudo_kinds[] = {rng_kind::philox4_32_10, rng_kind::xorwow, rng_kind::mrg32k3a,
                                     rng_kind::mtgp32};
constexpr rng_kind quasi_kinds[] = {rng_kind::sobol32, rng_kind::scrambled_sobol32,
                                    rng_kind::sobol64, rng_kind::scrambled_sobol64};

/// invalid_argument whose message names `what` (the operation and the argument).
void check_bad(const result<void>& r, const std::string& what) {
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  CAPTURE(r.error().message());
  CHECK(r.error().message().find(what) != std::string::npos);
}

}  // namespace

TEST_CASE("rng_kind names and classes") {
  CHECK(to_string(rng_kind::philox4_32_10) == "philox4_32_10");
  CHECK(to_string(rng_kind::scrambled_sobol64) == "scrambled_sobol64");
  for (auto k : pseudo_kinds) {
    CHECK_FALSE(detail::is_quasi(k));
    CHECK_FALSE(detail::is_64bit(k));
  }
  for (auto k : quasi_kinds) CHECK(detail::is_quasi(k));
  CHECK(detail::is_64bit(rng_kind::sobol64));
  CHECK(detail::is_64bit(rng_kind::scrambled_sobol64));
  CHECK_FALSE(detail::is_64bit(rng_kind::sobol32));
  CHECK(rng_options{}.kind == rng_kind::philox4_32_10);
}

TEST_CASE("rng options: kind, seed, dimensions, offset") {
  for (auto k : all_kinds) {
    CAPTURE(to_string(k));
    CHECK(detail::check_rng_options({.kind = k}));
  }
  check_bad(detail::check_rng_options({.kind = static_cast<rng_kind>(42)}),
            "rng_actor::create: kind (42)");

  // Seeds: any value for pseudo-random generators, none for quasi-random ones.
  for (auto k : pseudo_kinds) CHECK(detail::check_rng_options({.kind = k, .seed = ~0ull}));
  for (auto k : quasi_kinds) {
    CAPTURE(to_string(k));
    check_bad(detail::check_rng_options({.kind = k, .seed = 1}), "rng_actor::create: seed");
  }

  // Dimensions: 1..20000 for quasi-random, exactly 1 for pseudo-random.
  for (auto k : quasi_kinds) {
    CHECK(detail::check_rng_options({.kind = k, .dimensions = 1}));
    CHECK(detail::check_rng_options({.kind = k, .dimensions = 20000}));
    check_bad(detail::check_rng_options({.kind = k, .dimensions = 0}),
              "rng_actor::create: dimensions (0) must be 1 to 20000");
    check_bad(detail::check_rng_options({.kind = k, .dimensions = 20001}), "dimensions (20001)");
  }
  for (auto k : pseudo_kinds)
    check_bad(detail::check_rng_options({.kind = k, .dimensions = 2}), "dimensions (2) must be 1");

  // Offsets: any value, except on MTGP32.
  CHECK(detail::check_rng_options({.kind = rng_kind::philox4_32_10, .offset = 1ull << 40}));
  CHECK(detail::check_rng_options({.kind = rng_kind::sobol32, .offset = 7}));
  CHECK(detail::check_rng_options({.kind = rng_kind::mtgp32, .offset = 0}));
  check_bad(detail::check_rng_options({.kind = rng_kind::mtgp32, .offset = 5}),
            "rng_actor::create: offset (5) must be 0 for mtgp32");
}

TEST_CASE("set_seed and set_offset checks") {
  for (auto k : pseudo_kinds) CHECK(detail::check_rng_seed(k));
  for (auto k : quasi_kinds) check_bad(detail::check_rng_seed(k), "set_seed: seed");
  for (auto k : all_kinds) CHECK(detail::check_rng_offset(k, 0));
  CHECK(detail::check_rng_offset(rng_kind::xorwow, 123456789));
  check_bad(detail::check_rng_offset(rng_kind::mtgp32, 3), "set_offset: offset (3)");
}

TEST_CASE("output counts: non-empty, even for pseudo-random normals, whole quasi points") {
  // Pseudo-random: any non-zero count, but normal/log-normal need pairs.
  for (auto k : pseudo_kinds) {
    CAPTURE(to_string(k));
    CHECK(detail::check_rng_count("uniform", k, 1, 1, false));
    CHECK(detail::check_rng_count("uniform", k, 1, 1001, false));
    CHECK(detail::check_rng_count("normal", k, 1, 1000, true));
    check_bad(detail::check_rng_count("normal", k, 1, 1001, true),
              "normal: out size (1001) must be even");
    check_bad(detail::check_rng_count("log_normal", k, 1, 1, true), "log_normal: out size (1)");
    check_bad(detail::check_rng_count("uniform", k, 1, 0, false), "uniform: out is empty");
  }
  // Quasi-random: a multiple of the dimensions, odd counts fine for normals.
  for (auto k : quasi_kinds) {
    CAPTURE(to_string(k));
    CHECK(detail::check_rng_count("normal", k, 1, 7, true));
    CHECK(detail::check_rng_count("normal", k, 3, 9, true));
    CHECK(detail::check_rng_count("poisson", k, 5, 10, false));
    check_bad(detail::check_rng_count("uniform", k, 3, 10, false),
              "uniform: out size (10) must be a multiple of the 3 dimensions");
    check_bad(detail::check_rng_count("raw", k, 2, 0, false), "raw: out is empty");
  }
}

TEST_CASE("normal and log-normal parameters") {
  CHECK(detail::check_rng_normal("normal", 0.0, 1.0));
  CHECK(detail::check_rng_normal("normal", -1e6, 1e-30));
  CHECK(detail::check_rng_normal("log_normal", 2.5, 0.25));
  check_bad(detail::check_rng_normal("normal", 0.0, 0.0),
            "normal: stddev (0) must be finite and > 0");
  check_bad(detail::check_rng_normal("log_normal", 0.0, -2.0), "log_normal: stddev (-2)");
  check_bad(detail::check_rng_normal("normal", 0.0, std::numeric_limits<double>::quiet_NaN()),
            "normal: stddev (nan)");
  check_bad(detail::check_rng_normal("normal", 0.0, std::numeric_limits<double>::infinity()),
            "normal: stddev (inf)");
  check_bad(detail::check_rng_normal("normal", std::numeric_limits<double>::infinity(), 1.0),
            "normal: mean (inf) must be finite");
  check_bad(detail::check_rng_normal("log_normal", std::nan(""), 1.0), "log_normal: mean (nan)");
}

TEST_CASE("Poisson lambda") {
  CHECK(detail::check_rng_lambda("poisson", 1e-6));
  CHECK(detail::check_rng_lambda("poisson", 4.5));
  CHECK(detail::check_rng_lambda("poisson", 400000.0));
  check_bad(detail::check_rng_lambda("poisson", 0.0), "poisson: lambda (0) must be > 0");
  check_bad(detail::check_rng_lambda("poisson", -3.0), "poisson: lambda (-3)");
  check_bad(detail::check_rng_lambda("poisson", 400001.0), "lambda (400001)");
  check_bad(detail::check_rng_lambda("poisson", std::nan("")), "lambda (nan)");
  check_bad(detail::check_rng_lambda("poisson", std::numeric_limits<double>::infinity()),
            "lambda (inf)");
}

TEST_CASE("raw value width matches the generator") {
  for (auto k : all_kinds) {
    CAPTURE(to_string(k));
    if (detail::is_64bit(k)) {
      CHECK(detail::check_rng_raw_bits("raw", k, 64));
      check_bad(detail::check_rng_raw_bits("raw", k, 32), "raw: out is gpu_ref<uint32>");
    } else {
      CHECK(detail::check_rng_raw_bits("raw", k, 32));
      check_bad(detail::check_rng_raw_bits("raw", k, 64),
                "raw: out is gpu_ref<uint64>, but " + std::string(to_string(k)));
    }
  }
  check_bad(detail::check_rng_raw_bits("raw", rng_kind::xorwow, 16), "raw: out");
}

TEST_CASE_FIXTURE(io_fixture, "rng_actor::create on an unusable device yields device_unavailable") {
  device d(ioc.get_executor(), unusable_ordinal());
  for (auto k : all_kinds) {
    CAPTURE(to_string(k));
    auto a = rng_actor::create(d, {.kind = k});
    REQUIRE_FALSE(a);
    CHECK(a.error().code() == errc::device_unavailable);
    CHECK(a.error().library() == "curand");
  }
  // Device state is checked first: bad options on a dead device still say device_unavailable.
  auto bad = rng_actor::create(d, {.kind = rng_kind::sobol32, .seed = 1});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::device_unavailable);
  CHECK(d.statistics().ops_in_flight == 0);
}

TEST_CASE("rng_actor::create on an empty device handle is invalid_argument") {
  auto a = rng_actor::create(device(std::shared_ptr<detail::device_impl>{}));
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::invalid_argument);
  CHECK(a.error().message().find("rng_actor::create: dev is an empty device handle") !=
        std::string::npos);
}
