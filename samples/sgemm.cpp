// atomr-sgemm: times cuBLAS single-precision GEMM through blas_actor and
// checks the product against a double-precision CPU reference.
//
// C = A * B with square n x n column-major matrices of uniform values in
// [-1, 1). One coroutine on a single-threaded io_context uploads A and B,
// runs one untimed warm-up gemm, then R timed ones, downloads C and checks a
// sample of its entries.

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

constexpr cli::program prog{"atomr-sgemm"};

constexpr std::int64_t max_n = 16384;  // 3 matrices of 1 GiB each, on host and device
constexpr unsigned max_reps = 100000;
constexpr std::size_t checked_entries = 256;

struct cli_options {
  int device = 0;
  std::int64_t n = 4096;
  unsigned reps = 20;
  bool tf32 = false;
  std::optional<cuda::strategy> strategy;  // unset: the device default
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [--n N] [--reps R] [--tf32] [--strategy S] [--device D]\n"
               "\n"
               "Times R single-precision matrix products C = A * B of random n x n\n"
               "matrices with cuBLAS (blas_actor::gemm), after one untimed warm-up, and\n"
               "checks %zu entries of C against a double-precision CPU reference: the\n"
               "error relative to sum_k |a_ik * b_kj| must stay below 1e-5 (1e-2 with\n"
               "--tf32).\n"
               "\n"
               "Options:\n"
               "  --n N         matrix order, 1..%lld (default 4096)\n"
               "  --reps R      timed products, 1..%u (default 20)\n"
               "  --tf32        use TF32 tensor-core math (default: pedantic f32 math)\n"
               "  --strategy S  completion strategy: event_poll, host_fn or blocking_sync\n"
               "                (default: the device default, event_poll)\n"
               "  --device D    device ordinal (default 0)\n"
               "  --help        print this help and exit\n"
               "Options also take the form --name=value.\n"
               "\n"
               "%s",
               prog.name, checked_entries, static_cast<long long>(max_n), max_reps,
               cli::exit_status_help("an entry of C is off by more than the tolerance").c_str());
}

std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  return cli::options(prog, print_usage)
      .integer("--n", out.n, std::int64_t{1}, max_n)
      .integer("--reps", out.reps, 1u, max_reps)
      .flag("--tf32", out.tf32)
      .strategy("--strategy", out.strategy)
      .integer("--device", out.device, 0, std::numeric_limits<int>::max(), "an ordinal >= 0")
      .parse(argc, argv);
}

// Checks `checked_entries` entries of c = a * b (n x n, column-major): the
// error of each relative to sum_k |a_ik b_kj|, the scale of the rounding
// error of any summation order. True if all are below `tol`.
bool check_product(std::span<const float> a, std::span<const float> b, std::span<const float> c,
                   std::size_t n, double tol, double& worst) {
  cli::splitmix pick(0x5eed);
  worst = 0.0;
  const std::size_t samples = std::min(checked_entries, n * n);
  for (std::size_t s = 0; s < samples; ++s) {
    // The corners C(0, 0) and C(n-1, n-1) first, then random entries.
    const std::size_t i = s == 0 ? 0 : s == 1 ? n - 1 : pick.next() % n;
    const std::size_t j = s == 0 ? 0 : s == 1 ? n - 1 : pick.next() % n;
    double ref = 0.0, scale = 0.0;
    for (std::size_t k = 0; k < n; ++k) {
      const double p = static_cast<double>(a[i + k * n]) * static_cast<double>(b[k + j * n]);
      ref += p;
      scale += std::fabs(p);
    }
    const double got = c[i + j * n];
    const double err = std::fabs(got - ref) / (scale > 0 ? scale : 1.0);
    if (!(err <= tol)) {  // also catches NaN
      std::fprintf(stderr,
                   "%s: MISMATCH: C(%zu, %zu) is %.9g, expected %.9g (relative error %.3g, "
                   "tolerance %.0e)\n",
                   prog.name, i, j, got, ref, err, tol);
      worst = err;
      return false;
    }
    worst = std::max(worst, err);
  }
  return true;
}

asio::awaitable<int> bench(cuda::device dev, cli_options args) {
  const auto n = static_cast<std::size_t>(args.n);
  const std::size_t elems = n * n;

  auto created = cuda::blas_actor::create(dev, {.tf32 = args.tf32});
  if (!created) {
    prog.error("blas_actor::create", created.error());
    co_return exit_error;
  }
  const cuda::blas_actor blas = std::move(created).value();

  std::vector<float> a(elems), b(elems), c(elems);
  cli::splitmix gen(42);
  for (auto& x : a) x = gen.symmetric();
  for (auto& x : b) x = gen.symmetric();

  cuda::gpu_ref<float> da, db, dc;
  for (auto* r : {&da, &db, &dc}) {
    auto got = dev.allocate<float>(elems);
    if (!got) {
      prog.error("allocate<float>", got.error());
      co_return exit_error;
    }
    *r = std::move(got).value();
  }
  for (auto [host, ref] : {std::pair{&a, da}, std::pair{&b, db}}) {
    auto up = co_await cuda::upload(std::span<const float>(*host), ref);
    if (!up) {
      prog.error("upload", up.error());
      co_return exit_error;
    }
  }
  // NaN in C, so that a product that was never written cannot pass.
  if (auto f = co_await cuda::fill_bytes(dc, 0xFF); !f) {
    prog.error("fill_bytes", f.error());
    co_return exit_error;
  }

  const cuda::gemm_params p{.m = args.n, .n = args.n, .k = args.n};
  const auto t_first = cli::clock_type::now();
  if (auto r = co_await blas.gemm(p, da, db, dc); !r) {
    prog.error("gemm (warm-up)", r.error());
    co_return exit_error;
  }
  const double first_us = cli::elapsed_us(t_first);

  std::vector<double> us;
  us.reserve(args.reps);
  for (unsigned rep = 0; rep < args.reps; ++rep) {
    const auto t0 = cli::clock_type::now();
    auto r = co_await blas.gemm(p, da, db, dc);
    us.push_back(cli::elapsed_us(t0));
    if (!r) {
      prog.error("gemm", r.error());
      co_return exit_error;
    }
  }

  if (auto d = co_await cuda::download(dc, std::span<float>(c)); !d) {
    prog.error("download", d.error());
    co_return exit_error;
  }
  const double tol = args.tf32 ? 1e-2 : 1e-5;
  double worst = 0.0;
  if (!check_product(a, b, c, n, tol, worst)) co_return exit_mismatch;

  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const double med = cli::median(us), p99 = cli::percentile(us, 99);
  std::printf("sgemm %zu x %zu x %zu, %s math, %u reps (first call %.1f us)\n", n, n, n,
              args.tf32 ? "TF32" : "pedantic f32", args.reps, first_us);
  cli::table t({{"op", 10}, {"median us", 12, 1}, {"p99 us", 12, 1}, {"GFLOP/s", 10, 1}});
  t.row("gemm", {med, p99, med > 0 ? flops / (med * 1e3) : 0.0});
  t.print();
  std::printf("  (GFLOP/s = 2 n^3 / median time; p99 is nearest-rank)\n");
  std::printf("  %zu entries checked, worst relative error %.2e (tolerance %.0e)\n",
              std::min(checked_entries, elems), worst, tol);
  co_return exit_ok;
}

int run(const cli_options& args) {
  asio::io_context ioc;
  const cuda::device_options opts = cli::device_options_for(args.strategy);
  auto opened = cli::open_device(
      prog, ioc.get_executor(), args.device, opts,
      cli::format(
          "timed %u sgemm calls of %lld x %lld matrices (%s math) on device %d with the "
          "%s strategy, checking %zu entries against a CPU reference",
          args.reps, static_cast<long long>(args.n), static_cast<long long>(args.n),
          args.tf32 ? "TF32" : "pedantic f32", args.device, cli::strategy_name(opts).c_str(),
          std::min<std::size_t>(checked_entries, static_cast<std::size_t>(args.n * args.n))));
  if (!opened) return opened.status;
  return cli::run(prog, ioc, bench(*opened.device, args));
}

}  // namespace

int main(int argc, char** argv) {
  cli_options args;
  if (auto done = parse_args(argc, argv, args)) return *done;
  return run(args);
}
