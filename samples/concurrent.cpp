// atomr-concurrent: many coroutines on several io threads share one
// blas_actor, one fft_actor and one rng_actor, and every result is checked.
//
// Each coroutine runs three steps, each from upload to download: a 64 x 64
// SGEMM checked entry by entry against a double-precision CPU product, a
// 1024-point C2C FFT round trip (forward, then inverse normalised by 1/n)
// checked against its input, and a draw of 4096 standard normal floats whose
// mean must lie within 5 standard errors of 0. The actors serialise only
// their enqueues; the GPU work and the waits of all coroutines overlap.

#include "cli.hpp"

#include <atomr/cuda.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
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
using c32 = std::complex<float>;

constexpr cli::program prog{"atomr-concurrent"};

constexpr std::size_t gemm_n = 64;
constexpr long long fft_n = 1024;
constexpr std::size_t rng_count = 4096;
constexpr double gemm_tol = 1e-5;  // error relative to sum_k |a_ik b_kj|
constexpr double fft_tol = 1e-5;   // relative L2 error of the round trip
constexpr double rng_sigmas = 5.0;
constexpr unsigned max_coroutines = 100000;
constexpr unsigned max_threads = 256;
constexpr unsigned max_problems_shown = 5;

struct cli_options {
  int device = 0;
  unsigned coroutines = 1000;
  unsigned threads = 4;
  std::optional<cuda::strategy> strategy;  // unset: the device default
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [--coroutines C] [--threads T] [--strategy S] [--device D]\n"
               "\n"
               "Starts C coroutines on an io_context run by T threads. They share one\n"
               "blas_actor, one fft_actor and one rng_actor; each does a %zu x %zu SGEMM,\n"
               "a %lld-point C2C FFT round trip and a draw of %zu normal floats, and\n"
               "checks every result (SGEMM against a CPU reference, the FFT round trip\n"
               "against its input, the draw's mean within %.0f standard errors of 0).\n"
               "Prints how many coroutines got correct results, the wall time and the\n"
               "checked operations per second.\n"
               "\n"
               "Options:\n"
               "  --coroutines C  coroutines, 1..%u (default 1000)\n"
               "  --threads T     io threads, 1..%u (default 4)\n"
               "  --strategy S    completion strategy: event_poll, host_fn or blocking_sync\n"
               "                  (default: the device default, event_poll)\n"
               "  --device D      device ordinal (default 0)\n"
               "  --help          print this help and exit\n"
               "Options also take the form --name=value.\n"
               "\n"
               "%s",
               prog.name, gemm_n, gemm_n, fft_n, rng_count, rng_sigmas, max_coroutines, max_threads,
               cli::exit_status_help("a result failed its check (even if others also failed "
                                     "with errors)")
                   .c_str());
}

std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  return cli::options(prog, print_usage)
      .integer("--coroutines", out.coroutines, 1u, max_coroutines)
      .integer("--threads", out.threads, 1u, max_threads)
      .strategy("--strategy", out.strategy)
      .integer("--device", out.device, 0, std::numeric_limits<int>::max(), "an ordinal >= 0")
      .parse(argc, argv);
}

struct actors {
  cuda::device dev;
  cuda::blas_actor blas;
  cuda::fft_actor fft;
  cuda::rng_actor rng;
};

// ---------------------------------------------------------------------------
// The GPU side of each step: upload, run, download. The actors are taken by
// value: they are cheap handles, and device::allocate is not const.

template <class T>
asio::awaitable<cuda::result<cuda::gpu_ref<T>>> to_device(cuda::device dev,
                                                          std::span<const T> host) {
  BOOST_OUTCOME_CO_TRY(auto ref, dev.allocate<T>(host.size()));
  co_return co_await cuda::upload(host, std::move(ref));
}

template <class T>
asio::awaitable<cuda::result<std::vector<T>>> to_host(cuda::gpu_ref<T> ref) {
  std::vector<T> host(ref.size());
  BOOST_OUTCOME_CO_TRY(co_await cuda::download(std::move(ref), std::span<T>(host)));
  co_return host;
}

asio::awaitable<cuda::result<std::vector<float>>> gemm_on_gpu(actors g, std::span<const float> a,
                                                              std::span<const float> b) {
  BOOST_OUTCOME_CO_TRY(auto da, co_await to_device(g.dev, a));
  BOOST_OUTCOME_CO_TRY(auto db, co_await to_device(g.dev, b));
  BOOST_OUTCOME_CO_TRY(auto dc, g.dev.allocate<float>(a.size()));
  constexpr auto n = static_cast<std::int64_t>(gemm_n);
  const cuda::gemm_params p{.m = n, .n = n, .k = n};
  BOOST_OUTCOME_CO_TRY(auto c, co_await g.blas.gemm(p, da, db, dc));
  co_return co_await to_host(std::move(c));
}

asio::awaitable<cuda::result<std::vector<c32>>> fft_round_trip_on_gpu(actors g,
                                                                      std::span<const c32> x) {
  BOOST_OUTCOME_CO_TRY(auto dx, co_await to_device(g.dev, x));
  BOOST_OUTCOME_CO_TRY(auto dy, g.dev.allocate<c32>(x.size()));
  BOOST_OUTCOME_CO_TRY(auto dz, g.dev.allocate<c32>(x.size()));
  cuda::fft_shape shape{.rank = 1, .dims = {fft_n, 1, 1}, .batch = 1};
  BOOST_OUTCOME_CO_TRY(auto y, co_await g.fft.c2c(shape, dx, dy));
  shape.direction = cuda::fft_direction::inverse;
  shape.normalize = true;
  BOOST_OUTCOME_CO_TRY(auto z, co_await g.fft.c2c(shape, y, dz));
  co_return co_await to_host(std::move(z));
}

asio::awaitable<cuda::result<std::vector<float>>> normal_on_gpu(actors g) {
  BOOST_OUTCOME_CO_TRY(auto buf, g.dev.allocate<float>(rng_count));
  BOOST_OUTCOME_CO_TRY(auto drawn, co_await g.rng.normal(std::move(buf)));
  co_return co_await to_host(std::move(drawn));
}

// ---------------------------------------------------------------------------
// The CPU checks: an empty string when the result is right, else what is wrong.

std::string check_gemm(std::span<const float> a, std::span<const float> b,
                       std::span<const float> c) {
  const std::size_t n = gemm_n;
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t i = 0; i < n; ++i) {
      double ref = 0.0, scale = 0.0;
      for (std::size_t k = 0; k < n; ++k) {
        const double p = static_cast<double>(a[i + k * n]) * static_cast<double>(b[k + j * n]);
        ref += p;
        scale += std::fabs(p);
      }
      const double err = std::fabs(c[i + j * n] - ref) / (scale > 0 ? scale : 1.0);
      if (!(err <= gemm_tol))
        return cli::format("sgemm: C(%zu, %zu) is %.9g, expected %.9g (relative error %.3g)", i, j,
                           static_cast<double>(c[i + j * n]), ref, err);
    }
  return {};
}

std::string check_round_trip(std::span<const c32> x, std::span<const c32> back) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    diff += std::norm(std::complex<double>(back[i]) - std::complex<double>(x[i]));
    norm += std::norm(std::complex<double>(x[i]));
  }
  const double err = std::sqrt(diff / norm);
  if (!(err <= fft_tol))
    return cli::format("fft: round trip relative L2 error %.3g (tolerance %.0e)", err, fft_tol);
  return {};
}

std::string check_normal(std::span<const float> v) {
  double sum = 0.0;
  for (float x : v) {
    if (!std::isfinite(x)) return "rng: a drawn value is not finite";
    sum += x;
  }
  const double n = static_cast<double>(v.size());
  const double z = (sum / n) * std::sqrt(n);  // the mean in standard errors, 1/sqrt(n)
  if (!(std::fabs(z) <= rng_sigmas))
    return cli::format("rng: sample mean %.5f is %.2f standard errors from 0", sum / n, z);
  return {};
}

// ---------------------------------------------------------------------------
// One coroutine's work.

struct report {
  int status = exit_ok;  // exit_ok, exit_mismatch (a check failed) or exit_error
  std::string problem;   // what went wrong, when not exit_ok
  double us[3] = {};     // time of each step (sgemm, fft, rng), upload to download
};

constexpr const char* step_names[3] = {"sgemm 64", "fft 1024 round trip", "normal 4096"};

// Runs one step: the GPU part, then the check. False if the coroutine should stop.
template <class Gpu, class Check>
asio::awaitable<bool> step(report& r, int index, Gpu gpu, Check check) {
  const auto t0 = cli::clock_type::now();
  auto got = co_await gpu();
  r.us[index] = cli::elapsed_us(t0);
  if (!got) {
    const auto& e = got.error();
    const auto code = cuda::to_string(e.code());
    r.status = exit_error;
    r.problem = cli::format("%s failed [%.*s]: %s", step_names[index],
                            static_cast<int>(code.size()), code.data(), e.message().c_str());
    co_return false;
  }
  if (auto wrong = check(got.value()); !wrong.empty()) {
    r.status = exit_mismatch;
    r.problem = "MISMATCH: " + wrong;
    co_return false;
  }
  co_return true;
}

asio::awaitable<report> work(actors g, unsigned index) {
  report r;
  cli::splitmix gen(0x1000 + index);  // distinct inputs for every coroutine

  std::vector<float> a(gemm_n * gemm_n), b(gemm_n * gemm_n);
  for (auto& x : a) x = gen.symmetric();
  for (auto& x : b) x = gen.symmetric();
  if (!co_await step(
          r, 0, [&] { return gemm_on_gpu(g, a, b); },
          [&](const std::vector<float>& c) { return check_gemm(a, b, c); }))
    co_return r;

  std::vector<c32> x(fft_n);
  for (auto& z : x) z = c32(gen.symmetric(), gen.symmetric());
  if (!co_await step(
          r, 1, [&] { return fft_round_trip_on_gpu(g, x); },
          [&](const std::vector<c32>& back) { return check_round_trip(x, back); }))
    co_return r;

  co_await step(
      r, 2, [&] { return normal_on_gpu(g); },
      [](const std::vector<float>& v) { return check_normal(v); });
  co_return r;
}

// What all coroutines reported; filled from several io threads.
struct tally {
  std::mutex m;
  unsigned correct = 0, wrong = 0, failed = 0;
  unsigned shown = 0;
  std::vector<double> us[3];

  void add(unsigned index, const report& r) {
    std::lock_guard lock(m);
    if (r.status == exit_ok) {
      ++correct;
      for (int s = 0; s < 3; ++s) us[s].push_back(r.us[s]);
      return;
    }
    ++(r.status == exit_mismatch ? wrong : failed);
    show(index, r.problem);
  }

  void add_exception(unsigned index, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = std::string("exception: ") + ex.what();
    } catch (...) {
    }
    std::lock_guard lock(m);
    ++failed;
    show(index, what);
  }

private:
  void show(unsigned index, const std::string& what) {
    if (shown++ < max_problems_shown)
      std::fprintf(stderr, "%s: coroutine %u: %s\n", prog.name, index, what.c_str());
  }
};

int run(const cli_options& args) {
  asio::io_context ioc(static_cast<int>(args.threads));
  const cuda::device_options opts = cli::device_options_for(args.strategy);
  auto opened = cli::open_device(
      prog, ioc.get_executor(), args.device, opts,
      cli::format("run %u coroutines on %u io threads sharing one blas, one fft and one rng "
                  "actor on device %d with the %s strategy, each checking a %zu x %zu SGEMM, a "
                  "%lld-point FFT round trip and a draw of %zu normal floats",
                  args.coroutines, args.threads, args.device, cli::strategy_name(opts).c_str(),
                  gemm_n, gemm_n, fft_n, rng_count));
  if (!opened) return opened.status;
  const cuda::device dev = *opened.device;

  auto blas = cuda::blas_actor::create(dev);
  if (!blas) {
    prog.error("blas_actor::create", blas.error());
    return exit_error;
  }
  auto fft = cuda::fft_actor::create(dev);
  if (!fft) {
    prog.error("fft_actor::create", fft.error());
    return exit_error;
  }
  auto rng = cuda::rng_actor::create(dev);
  if (!rng) {
    prog.error("rng_actor::create", rng.error());
    return exit_error;
  }
  const actors shared{dev, blas.value(), fft.value(), rng.value()};

  tally t;
  const auto start = cli::clock_type::now();
  for (unsigned i = 0; i < args.coroutines; ++i)
    asio::co_spawn(ioc, work(shared, i), [&t, i](std::exception_ptr ep, report r) {
      if (ep)
        t.add_exception(i, ep);
      else
        t.add(i, r);
    });
  const bool clean = cli::run_threads(prog, ioc, args.threads);
  const double wall_ms = cli::elapsed_ms(start);

  if (t.shown > max_problems_shown)
    std::fprintf(stderr, "%s: (%u more problems not shown)\n", prog.name,
                 t.shown - max_problems_shown);
  const double ops = 3.0 * args.coroutines;
  std::printf("%u coroutines on %u io threads: %u correct, %u wrong, %u failed\n", args.coroutines,
              args.threads, t.correct, t.wrong, t.failed);
  std::printf(
      "wall time %.1f ms; %.0f checked operations (sgemm, FFT round trip, normal draw): "
      "%.0f ops/s\n",
      wall_ms, ops, wall_ms > 0 ? ops / (wall_ms * 1e-3) : 0.0);
  if (t.correct > 0) {
    cli::table tab({{"step (correct coroutines)", 26}, {"median us", 12, 1}, {"p99 us", 12, 1}});
    for (int s = 0; s < 3; ++s)
      tab.row(step_names[s], {cli::median(t.us[s]), cli::percentile(t.us[s], 99)});
    tab.print();
    std::printf(
        "  (each step timed from its first upload to its download, while all\n"
        "   coroutines compete for the actors and the GPU)\n");
  }
  if (t.wrong > 0) return exit_mismatch;
  if (t.failed > 0 || !clean) return exit_error;
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  cli_options args;
  if (auto done = parse_args(argc, argv, args)) return *done;
  return run(args);
}
