// atomr-fft: times cuFFT complex-to-complex round trips through fft_actor.
//
// A batch of 1-D signals of random complex values in [-1, 1)^2 goes through
// a forward transform, then a normalised inverse (scaled by 1/n on the GPU),
// which must give the signal back. One coroutine on a single-threaded
// io_context runs one untimed round trip (which creates the two plans), then
// R timed ones, and reports the actor's plan cache counts.

#include "cli.hpp"

#include <atomr/cuda.hpp>

#include <cmath>
#include <complex>
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

constexpr cli::program prog{"atomr-fft"};

constexpr long long max_points = 1LL << 28;  // n * batch: 2 GiB (f32) or 4 GiB (f64) a buffer
constexpr unsigned max_reps = 100000;

struct cli_options {
  int device = 0;
  long long n = 1 << 20;
  long long batch = 1;
  unsigned reps = 20;
  bool f64 = false;
  std::optional<cuda::strategy> strategy;  // unset: the device default
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [--n N] [--batch B] [--reps R] [--double] [--strategy S] [--device D]\n"
               "\n"
               "Times R round trips of a batch of B complex signals of length N through\n"
               "cuFFT (fft_actor::c2c): a forward transform, then an inverse normalised by\n"
               "1/N, after one untimed round trip that creates the plans. The result must\n"
               "equal the signal: relative L2 error below 1e-5 (1e-12 with --double).\n"
               "Prints the timing and the actor's plan cache hits and misses.\n"
               "\n"
               "Options:\n"
               "  --n N         transform length, 1..%lld (default 1048576); any length\n"
               "                works, products of small primes are fastest\n"
               "  --batch B     transforms per call, 1..%lld, N * B <= %lld (default 1)\n"
               "  --reps R      timed round trips, 1..%u (default 20)\n"
               "  --double      double precision (Z2Z) instead of single (C2C)\n"
               "  --strategy S  completion strategy: event_poll, host_fn or blocking_sync\n"
               "                (default: the device default, event_poll)\n"
               "  --device D    device ordinal (default 0)\n"
               "  --help        print this help and exit\n"
               "Options also take the form --name=value.\n"
               "\n"
               "%s",
               prog.name, max_points, max_points, max_points, max_reps,
               cli::exit_status_help("the round trip does not give the signal back").c_str());
}

std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  if (auto done = cli::options(prog, print_usage)
                      .integer("--n", out.n, 1LL, max_points)
                      .integer("--batch", out.batch, 1LL, max_points)
                      .integer("--reps", out.reps, 1u, max_reps)
                      .flag("--double", out.f64)
                      .strategy("--strategy", out.strategy)
                      .integer("--device", out.device, 0, std::numeric_limits<int>::max(),
                               "an ordinal >= 0")
                      .parse(argc, argv))
    return done;
  if (out.n > max_points / out.batch)
    return prog.usage_error(cli::format("--n %lld times --batch %lld exceeds %lld points", out.n,
                                        out.batch, max_points));
  return std::nullopt;
}

// Relative L2 error of `got` against `want`.
template <class R>
double relative_error(std::span<const std::complex<R>> want, std::span<const std::complex<R>> got) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff += std::norm(std::complex<double>(got[i]) - std::complex<double>(want[i]));
    norm += std::norm(std::complex<double>(want[i]));
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

template <class R>
asio::awaitable<int> bench(cuda::device dev, cli_options args) {
  using C = std::complex<R>;
  const auto points = static_cast<std::size_t>(args.n * args.batch);

  auto created = cuda::fft_actor::create(dev);
  if (!created) {
    prog.error("fft_actor::create", created.error());
    co_return exit_error;
  }
  const cuda::fft_actor fft = std::move(created).value();

  std::vector<C> signal(points), back(points);
  cli::splitmix gen(7);
  for (auto& z : signal) z = C(gen.symmetric(), gen.symmetric());

  cuda::gpu_ref<C> dx, dy, dz;
  for (auto* r : {&dx, &dy, &dz}) {
    auto got = dev.allocate<C>(points);
    if (!got) {
      prog.error("allocate", got.error());
      co_return exit_error;
    }
    *r = std::move(got).value();
  }
  if (auto up = co_await cuda::upload(std::span<const C>(signal), dx); !up) {
    prog.error("upload", up.error());
    co_return exit_error;
  }
  // NaN in the result, so that an inverse that never wrote it cannot pass.
  if (auto f = co_await cuda::fill_bytes(dz, 0xFF); !f) {
    prog.error("fill_bytes", f.error());
    co_return exit_error;
  }

  cuda::fft_shape forward{.rank = 1, .dims = {args.n, 1, 1}, .batch = args.batch};
  cuda::fft_shape inverse = forward;
  inverse.direction = cuda::fft_direction::inverse;
  inverse.normalize = true;

  std::vector<double> fwd_us, inv_us;
  fwd_us.reserve(args.reps);
  inv_us.reserve(args.reps);
  double first_us = 0.0;
  for (unsigned rep = 0; rep <= args.reps; ++rep) {  // rep 0: the untimed warm-up
    auto t0 = cli::clock_type::now();
    auto y = co_await fft.c2c(forward, dx, dy);
    const double f_us = cli::elapsed_us(t0);
    if (!y) {
      prog.error("c2c (forward)", y.error());
      co_return exit_error;
    }
    t0 = cli::clock_type::now();
    auto z = co_await fft.c2c(inverse, dy, dz);
    const double i_us = cli::elapsed_us(t0);
    if (!z) {
      prog.error("c2c (inverse, normalised)", z.error());
      co_return exit_error;
    }
    if (rep == 0) {
      first_us = f_us + i_us;
      continue;
    }
    fwd_us.push_back(f_us);
    inv_us.push_back(i_us);
  }

  if (auto d = co_await cuda::download(dz, std::span<C>(back)); !d) {
    prog.error("download", d.error());
    co_return exit_error;
  }
  const double tol = sizeof(R) == 8 ? 1e-12 : 1e-5;
  const double err = relative_error<R>(signal, back);
  if (!(err <= tol)) {  // also catches NaN
    std::fprintf(stderr,
                 "%s: MISMATCH: inverse(forward(x)) differs from x: relative L2 error %.3g, "
                 "tolerance %.0e\n",
                 prog.name, err, tol);
    co_return exit_mismatch;
  }

  // The customary FFT operation count, 5 n log2(n) per transform.
  const double n = static_cast<double>(args.n);
  const double flops = 5.0 * n * std::log2(std::max(n, 2.0)) * static_cast<double>(args.batch);
  const double bytes = 2.0 * static_cast<double>(points * sizeof(C));  // read and write once
  std::printf("%s FFT, n = %lld, batch %lld, %u round trips (first round trip %.1f us)\n",
              sizeof(R) == 8 ? "Z2Z" : "C2C", args.n, args.batch, args.reps, first_us);
  cli::table t({{"transform", 20},
                {"median us", 12, 1},
                {"p99 us", 12, 1},
                {"GFLOP/s", 10, 1},
                {"GB/s", 9, 1}});
  for (const auto& [name, us] : {std::pair{"forward", &fwd_us}, std::pair{"inverse/n", &inv_us}}) {
    const double med = cli::median(*us);
    t.row(name, {med, cli::percentile(*us, 99), med > 0 ? flops / (med * 1e3) : 0.0,
                 cli::gb_per_s(bytes, med)});
  }
  t.print();
  std::printf(
      "  (GFLOP/s counts 5 n log2 n per transform; GB/s one read and one write;\n"
      "   inverse/n includes the 1/n scaling by cuBLAS)\n");
  const auto s = fft.statistics();
  std::printf("  plan cache: %llu hits, %llu misses, %llu evictions, %zu of %zu plans cached\n",
              static_cast<unsigned long long>(s.plan_hits),
              static_cast<unsigned long long>(s.plan_misses),
              static_cast<unsigned long long>(s.plan_evictions), s.plans_cached, s.plan_cache_size);
  std::printf("  round trip relative L2 error %.2e (tolerance %.0e)\n", err, tol);
  co_return exit_ok;
}

int run(const cli_options& args) {
  asio::io_context ioc;
  const cuda::device_options opts = cli::device_options_for(args.strategy);
  auto opened = cli::open_device(
      prog, ioc.get_executor(), args.device, opts,
      cli::format("timed %u %s FFT round trips (n = %lld, batch %lld, inverse normalised) on "
                  "device %d with the %s strategy, checking the signal comes back",
                  args.reps, args.f64 ? "Z2Z" : "C2C", args.n, args.batch, args.device,
                  cli::strategy_name(opts).c_str()));
  if (!opened) return opened.status;
  return cli::run(
      prog, ioc,
      args.f64 ? bench<double>(*opened.device, args) : bench<float>(*opened.device, args));
}

}  // namespace

int main(int argc, char** argv) {
  cli_options args;
  if (auto done = parse_args(argc, argv, args)) return *done;
  return run(args);
}
