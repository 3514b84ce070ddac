// atomr-concurrent: many coroutines on several io threads share one
// blas_actor, one fft_actor, one rng_actor and one cudnn_actor, and every
// result is checked.
//
// Each coroutine runs four steps, each from upload to download: a 64 x 64
// SGEMM checked entry by entry against a double-precision CPU product, a
// 1024-point C2C FFT round trip (forward, then inverse normalised by 1/n)
// checked against its input, a draw of 4096 standard normal floats whose
// mean must lie within 5 standard errors of 0, and a small f32 NCHW 2-D
// convolution with bias (1 x C x H x W input, C 2..4, H and W 8..12; K 2..4
// filters of 3 x 3; padding 1; stride and dilation 1 or 2; 36 shapes chosen
// by the coroutine's index) whose NaN-filled output is checked entry by entry
// against a double-precision CPU convolution. The actors serialise only
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
#include <initializer_list>
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
// Distinct convolution shapes (index % conv_shapes picks one): fewer than the
// 64 a cudnn_actor caches by default, so each runs cuDNN's heuristics once.
constexpr unsigned conv_shapes = 36;
constexpr double gemm_tol = 1e-5;  // error relative to sum_k |a_ik b_kj|
constexpr double fft_tol = 1e-5;   // relative L2 error of the round trip
constexpr double rng_sigmas = 5.0;
constexpr double conv_tol = 1e-5;  // error relative to sum |x w| + |bias|
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
               "blas_actor, one fft_actor, one rng_actor and one cudnn_actor; each does a\n"
               "%zu x %zu SGEMM, a %lld-point C2C FFT round trip, a draw of %zu normal\n"
               "floats and a small f32 NCHW convolution with bias (1 x C x H x W input,\n"
               "C 2..4, H and W 8..12, K 2..4 filters of 3 x 3, padding 1, stride and\n"
               "dilation 1 or 2: %u shapes, picked by the coroutine's index), and checks\n"
               "every result: SGEMM against a CPU reference, the FFT round trip against\n"
               "its input, the draw's mean within %.0f standard errors of 0, and every\n"
               "convolution output entry against a double-precision CPU convolution (error\n"
               "relative to sum |x w| + |bias| at most %.0e). Prints how many coroutines\n"
               "got correct results, the wall time, the checked operations per second and\n"
               "the cudnn_actor's algorithm cache counts.\n"
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
               prog.name, gemm_n, gemm_n, fft_n, rng_count, conv_shapes, rng_sigmas, conv_tol,
               max_coroutines, max_threads,
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
  cuda::cudnn_actor dnn;
};

// ---------------------------------------------------------------------------
// The convolution each coroutine runs.

struct conv_problem {
  cuda::tensor_shape xs;  // 1 x C x H x W, NCHW
  cuda::conv2d_params p;  // K filters of C x 3 x 3 (KCRS), padding 1
  cuda::tensor_shape ys;  // 1 x K x P x Q, NCHW
};

/// (in + 2*pad - ((filter-1)*dilation + 1)) / stride + 1, as cudnn_actor computes it.
std::int64_t conv_output_dim(std::int64_t in, std::int64_t pad, std::int64_t filter,
                             std::int64_t stride, std::int64_t dilation) {
  return (in + 2 * pad - ((filter - 1) * dilation + 1)) / stride + 1;
}

/// Shape s = index % conv_shapes; C, K, stride and dilation take each of
/// their 3 * 3 * 2 * 2 = 36 combinations once, H and W follow s. The smallest
/// output side is (8 + 2 - 5) / 2 + 1 = 3.
conv_problem conv_for(unsigned index) {
  const std::int64_t s = index % conv_shapes;
  const std::int64_t k = 2 + (s / 3) % 3, stride = 1 + (s / 9) % 2, dilation = 1 + (s / 18) % 2;
  conv_problem pr;
  pr.xs = {.n = 1, .c = 2 + s % 3, .h = 8 + s % 5, .w = 8 + (s / 2) % 5};
  pr.p = {.out_channels = k,
          .filter_h = 3,
          .filter_w = 3,
          .pad_h = 1,
          .pad_w = 1,
          .stride_h = stride,
          .stride_w = stride,
          .dilation_h = dilation,
          .dilation_w = dilation};
  pr.ys = {.n = 1,
           .c = k,
           .h = conv_output_dim(pr.xs.h, 1, 3, stride, dilation),
           .w = conv_output_dim(pr.xs.w, 1, 3, stride, dilation)};
  return pr;
}

std::string describe(const conv_problem& pr) {
  return cli::format("x 1x%lldx%lldx%lld, %lld filters 3x3, stride %lld, dilation %lld",
                     static_cast<long long>(pr.xs.c), static_cast<long long>(pr.xs.h),
                     static_cast<long long>(pr.xs.w), static_cast<long long>(pr.p.out_channels),
                     static_cast<long long>(pr.p.stride_h),
                     static_cast<long long>(pr.p.dilation_h));
}

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

asio::awaitable<cuda::result<std::vector<float>>> conv_on_gpu(actors g, conv_problem pr,
                                                              std::span<const float> x,
                                                              std::span<const float> f,
                                                              std::span<const float> bias) {
  BOOST_OUTCOME_CO_TRY(auto dx, co_await to_device(g.dev, x));
  BOOST_OUTCOME_CO_TRY(auto df, co_await to_device(g.dev, f));
  BOOST_OUTCOME_CO_TRY(auto db, co_await to_device(g.dev, bias));
  BOOST_OUTCOME_CO_TRY(auto dy, g.dev.allocate<float>(static_cast<std::size_t>(pr.ys.elements())));
  // NaN in y (all bits set), so that an entry that was never written cannot pass.
  BOOST_OUTCOME_CO_TRY(dy, co_await cuda::fill_bytes(std::move(dy), 0xFF));
  BOOST_OUTCOME_CO_TRY(auto y, co_await g.dnn.conv2d_forward(pr.xs, pr.p, dx, df, db, dy));
  co_return co_await to_host(std::move(y));
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

// Every entry of y against the naive cross-correlation in double; the error
// of each is relative to sum |x w| + |bias|, the scale of the rounding error
// of any summation order (so also catches NaN: y was NaN-filled).
std::string check_conv(const conv_problem& pr, std::span<const float> x, std::span<const float> f,
                       std::span<const float> bias, std::span<const float> y) {
  const auto& p = pr.p;
  const std::int64_t cs = pr.xs.c, hs = pr.xs.h, ws = pr.xs.w;
  const auto idx = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  if (y.size() != idx(pr.ys.elements()))
    return cli::format("conv2d (%s): y has %zu entries, expected %lld", describe(pr).c_str(),
                       y.size(), static_cast<long long>(pr.ys.elements()));
  for (std::int64_t k = 0; k < p.out_channels; ++k)
    for (std::int64_t oh = 0; oh < pr.ys.h; ++oh)
      for (std::int64_t ow = 0; ow < pr.ys.w; ++ow) {
        double ref = bias[idx(k)], scale = std::fabs(ref);
        for (std::int64_t c = 0; c < cs; ++c)
          for (std::int64_t r = 0; r < p.filter_h; ++r) {
            const std::int64_t ih = oh * p.stride_h - p.pad_h + r * p.dilation_h;
            if (ih < 0 || ih >= hs) continue;
            for (std::int64_t t = 0; t < p.filter_w; ++t) {
              const std::int64_t iw = ow * p.stride_w - p.pad_w + t * p.dilation_w;
              if (iw < 0 || iw >= ws) continue;
              const double prod =
                  static_cast<double>(x[idx((c * hs + ih) * ws + iw)]) *
                  static_cast<double>(f[idx(((k * cs + c) * p.filter_h + r) * p.filter_w + t)]);
              ref += prod;
              scale += std::fabs(prod);
            }
          }
        const float got = y[idx((k * pr.ys.h + oh) * pr.ys.w + ow)];
        const double err = std::fabs(got - ref) / (scale > 0 ? scale : 1.0);
        if (!(err <= conv_tol))
          return cli::format(
              "conv2d (%s): y(k=%lld, p=%lld, q=%lld) is %.9g, expected %.9g (relative error "
              "%.3g)",
              describe(pr).c_str(), static_cast<long long>(k), static_cast<long long>(oh),
              static_cast<long long>(ow), static_cast<double>(got), ref, err);
      }
  return {};
}

// ---------------------------------------------------------------------------
// One coroutine's work.

constexpr int steps = 4;

struct report {
  int status = exit_ok;   // exit_ok, exit_mismatch (a check failed) or exit_error
  std::string problem;    // what went wrong, when not exit_ok
  double us[steps] = {};  // time of each step (sgemm, fft, rng, conv2d), upload to download
};

constexpr const char* step_names[steps] = {"sgemm 64", "fft 1024 round trip", "normal 4096",
                                           "conv2d 3x3 f32 + bias"};

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

  if (!co_await step(
          r, 2, [&] { return normal_on_gpu(g); },
          [](const std::vector<float>& v) { return check_normal(v); }))
    co_return r;

  // Uniform in [-1, 1), never 0, so that every filter tap and bias matters.
  const conv_problem pr = conv_for(index);
  const auto nonzero = [&gen] {
    float v = 0.0f;
    while (v == 0.0f) v = gen.symmetric();
    return v;
  };
  std::vector<float> cx(static_cast<std::size_t>(pr.xs.elements()));
  std::vector<float> cf(
      static_cast<std::size_t>(pr.p.out_channels * pr.xs.c * pr.p.filter_h * pr.p.filter_w));
  std::vector<float> cb(static_cast<std::size_t>(pr.p.out_channels));
  for (auto* v : {&cx, &cf, &cb})
    for (auto& e : *v) e = nonzero();
  co_await step(
      r, 3, [&] { return conv_on_gpu(g, pr, cx, cf, cb); },
      [&](const std::vector<float>& y) { return check_conv(pr, cx, cf, cb, y); });
  co_return r;
}

// What all coroutines reported; filled from several io threads.
struct tally {
  std::mutex m;
  unsigned correct = 0, wrong = 0, failed = 0;
  unsigned shown = 0;
  std::vector<double> us[steps];

  void add(unsigned index, const report& r) {
    std::lock_guard lock(m);
    if (r.status == exit_ok) {
      ++correct;
      for (int s = 0; s < steps; ++s) us[s].push_back(r.us[s]);
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
      cli::format("run %u coroutines on %u io threads sharing one blas, one fft, one rng and "
                  "one cudnn actor on device %d with the %s strategy, each checking a %zu x %zu "
                  "SGEMM, a %lld-point FFT round trip, a draw of %zu normal floats and a small "
                  "f32 conv2d with bias (%u shapes)",
                  args.coroutines, args.threads, args.device, cli::strategy_name(opts).c_str(),
                  gemm_n, gemm_n, fft_n, rng_count, conv_shapes));
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
  auto dnn = cuda::cudnn_actor::create(dev);
  if (!dnn) {
    prog.error("cudnn_actor::create", dnn.error());
    return exit_error;
  }
  const actors shared{dev, blas.value(), fft.value(), rng.value(), dnn.value()};

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
  const double ops = static_cast<double>(steps) * args.coroutines;
  std::printf("%u coroutines on %u io threads: %u correct, %u wrong, %u failed\n", args.coroutines,
              args.threads, t.correct, t.wrong, t.failed);
  std::printf(
      "wall time %.1f ms; %.0f checked operations (sgemm, FFT round trip, normal draw, "
      "conv2d): %.0f ops/s\n",
      wall_ms, ops, wall_ms > 0 ? ops / (wall_ms * 1e-3) : 0.0);
  if (t.correct > 0) {
    cli::table tab({{"step (correct coroutines)", 26}, {"median us", 12, 1}, {"p99 us", 12, 1}});
    for (int s = 0; s < steps; ++s)
      tab.row(step_names[s], {cli::median(t.us[s]), cli::percentile(t.us[s], 99)});
    tab.print();
    std::printf(
        "  (each step timed from its first upload to its download, while all\n"
        "   coroutines compete for the actors and the GPU)\n");
  }
  const auto st = dnn.value().statistics();
  std::printf(
      "cudnn_actor: algorithm cache %llu hits, %llu misses (%zu shapes cached); workspace %zu "
      "bytes\n",
      static_cast<unsigned long long>(st.algo_hits),
      static_cast<unsigned long long>(st.algo_misses), st.algos_cached, st.workspace_bytes);
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
