// atomr-rng: times cuRAND normal draws through rng_actor and checks their
// sample mean and variance.
//
// One coroutine on a single-threaded io_context makes one untimed draw (the
// generator sets itself up on first use), then R timed draws of N standard
// normal floats into one device buffer, downloads the last and compares its
// mean and variance with 0 and 1.

#include "cli.hpp"

#include <atomr/cuda.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;
using cli::exit_error;
using cli::exit_mismatch;
using cli::exit_ok;

constexpr cli::program prog{"atomr-rng"};

constexpr std::size_t max_count = std::size_t{1} << 28;  // 1 GiB of floats
constexpr unsigned max_reps = 100000;
constexpr double max_sigmas = 5.0;

struct cli_options {
  int device = 0;
  std::size_t count = std::size_t{1} << 24;
  cuda::rng_kind kind = cuda::rng_kind::philox4_32_10;
  std::optional<std::uint64_t> seed;
  unsigned reps = 20;
  std::optional<cuda::strategy> strategy;  // unset: the device default
};

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "Usage: %s [--count N] [--generator G] [--seed S] [--reps R] [--strategy S]\n"
      "          [--device D]\n"
      "\n"
      "Times R draws of N standard normal floats with cuRAND (rng_actor::normal),\n"
      "after one untimed draw, then checks the last draw: its sample mean and\n"
      "variance must lie within %.0f standard errors of 0 and 1.\n"
      "\n"
      "Options:\n"
      "  --count N      numbers per draw, 2..%zu, even (default 16777216)\n"
      "  --generator G  philox, xorwow, mrg32k3a, mtgp32, sobol32 or\n"
      "                 scrambled_sobol32 (default philox)\n"
      "  --seed S       seed of a pseudo-random generator (default: cuRAND's, 0);\n"
      "                 the Sobol generators take none\n"
      "  --reps R       timed draws, 1..%u (default 20)\n"
      "  --strategy S   completion strategy: event_poll, host_fn or blocking_sync\n"
      "                 (default: the device default, event_poll)\n"
      "  --device D     device ordinal (default 0)\n"
      "  --help         print this help and exit\n"
      "Options also take the form --name=value.\n"
      "\n"
      "%s",
      prog.name, max_sigmas, max_count, max_reps,
      cli::exit_status_help("the mean or variance is off by more than 5 standard errors").c_str());
}

bool is_quasi(cuda::rng_kind k) {
  return k == cuda::rng_kind::sobol32 || k == cuda::rng_kind::scrambled_sobol32;
}

std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  using K = cuda::rng_kind;
  if (auto done = cli::options(prog, print_usage)
                      .integer("--count", out.count, std::size_t{2}, max_count)
                      .choice<K>("--generator", out.kind,
                                 {{"philox", K::philox4_32_10},
                                  {"xorwow", K::xorwow},
                                  {"mrg32k3a", K::mrg32k3a},
                                  {"mtgp32", K::mtgp32},
                                  {"sobol32", K::sobol32},
                                  {"scrambled_sobol32", K::scrambled_sobol32}})
                      .integer("--seed", out.seed, std::uint64_t{0},
                               std::numeric_limits<std::uint64_t>::max())
                      .integer("--reps", out.reps, 1u, max_reps)
                      .strategy("--strategy", out.strategy)
                      .integer("--device", out.device, 0, std::numeric_limits<int>::max(),
                               "an ordinal >= 0")
                      .parse(argc, argv))
    return done;
  // Box-Muller makes normals in pairs: cuRAND wants an even count.
  if (out.count % 2 != 0)
    return prog.usage_error(
        cli::format("--count %zu is odd: normal draws come in pairs", out.count));
  if (out.seed && is_quasi(out.kind))
    return prog.usage_error(std::string(cuda::to_string(out.kind)) +
                            " is quasi-random and takes no --seed");
  return std::nullopt;
}

asio::awaitable<int> bench(cuda::device dev, cli_options args) {
  auto created = cuda::rng_actor::create(dev, {.kind = args.kind, .seed = args.seed});
  if (!created) {
    prog.error("rng_actor::create", created.error());
    co_return exit_error;
  }
  const cuda::rng_actor rng = std::move(created).value();

  auto buf = dev.allocate<float>(args.count);
  if (!buf) {
    prog.error("allocate<float>", buf.error());
    co_return exit_error;
  }

  const auto t_first = cli::clock_type::now();
  if (auto r = co_await rng.normal(buf.value()); !r) {
    prog.error("normal (first draw)", r.error());
    co_return exit_error;
  }
  const double first_us = cli::elapsed_us(t_first);

  std::vector<double> us;
  us.reserve(args.reps);
  for (unsigned rep = 0; rep < args.reps; ++rep) {
    const auto t0 = cli::clock_type::now();
    auto r = co_await rng.normal(buf.value());
    us.push_back(cli::elapsed_us(t0));
    if (!r) {
      prog.error("normal", r.error());
      co_return exit_error;
    }
  }

  std::vector<float> host(args.count);
  if (auto d = co_await cuda::download(buf.value(), std::span<float>(host)); !d) {
    prog.error("download", d.error());
    co_return exit_error;
  }
  // Two passes in double: the mean, then the sum of squared deviations.
  double sum = 0.0;
  for (float x : host) sum += x;
  const double n = static_cast<double>(args.count);
  const double mean = sum / n;
  double sq = 0.0;
  for (float x : host) sq += (x - mean) * (x - mean);
  const double var = sq / (n - 1);
  // Standard errors for N(0, 1): of the mean 1/sqrt(n), of the variance sqrt(2/(n-1)).
  const double se_mean = 1.0 / std::sqrt(n), se_var = std::sqrt(2.0 / (n - 1));
  const double z_mean = mean / se_mean, z_var = (var - 1.0) / se_var;

  const auto kind = cuda::to_string(args.kind);
  const double bytes = n * sizeof(float);
  const double med = cli::median(us);
  std::printf("normal f32, %zu numbers a draw, %.*s, %u draws (first draw %.1f us)\n", args.count,
              static_cast<int>(kind.size()), kind.data(), args.reps, first_us);
  cli::table t(
      {{"op", 10}, {"median us", 12, 1}, {"p99 us", 12, 1}, {"GB/s", 9, 1}, {"Gnum/s", 9, 2}});
  t.row("normal",
        {med, cli::percentile(us, 99), cli::gb_per_s(bytes, med), med > 0 ? n / (med * 1e3) : 0.0});
  t.print();
  std::printf("  %-10s %12s %12s %12s\n", "statistic", "sample", "expected", "std errors");
  std::printf("  %-10s %12.6f %12.6f %12.2f\n", "mean", mean, 0.0, z_mean);
  std::printf("  %-10s %12.6f %12.6f %12.2f\n", "variance", var, 1.0, z_var);
  if (!(std::fabs(z_mean) <= max_sigmas && std::fabs(z_var) <= max_sigmas)) {  // NaN fails too
    std::fprintf(stderr,
                 "%s: MISMATCH: the sample is off by more than %.0f standard errors (mean %.2f, "
                 "variance %.2f)\n",
                 prog.name, max_sigmas, z_mean, z_var);
    co_return exit_mismatch;
  }
  co_return exit_ok;
}

int run(const cli_options& args) {
  asio::io_context ioc;
  const cuda::device_options opts = cli::device_options_for(args.strategy);
  const auto kind = cuda::to_string(args.kind);
  auto opened = cli::open_device(
      prog, ioc.get_executor(), args.device, opts,
      cli::format(
          "timed %u draws of %zu normal floats from %.*s%s on device %d with the %s "
          "strategy, checking their mean and variance",
          args.reps, args.count, static_cast<int>(kind.size()), kind.data(),
          args.seed
              ? cli::format(" (seed %llu)", static_cast<unsigned long long>(*args.seed)).c_str()
              : "",
          args.device, cli::strategy_name(opts).c_str()));
  if (!opened) return opened.status;
  return cli::run(prog, ioc, bench(*opened.device, args));
}

}  // namespace

int main(int argc, char** argv) {
  cli_options args;
  if (auto done = parse_args(argc, argv, args)) return *done;
  return run(args);
}
