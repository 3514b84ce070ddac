// atomr-conv2d: times cuDNN 2-D forward convolutions through cudnn_actor and
// checks the output against a double-precision CPU convolution.
//
// y = conv2d(x, filter) (+ bias) with random inputs in [-1, 1) (never 0), in
// NCHW or NHWC, f32 or f16. One coroutine on a single-threaded io_context
// uploads the operands, NaN-fills y, runs one untimed warm-up (which runs
// cuDNN's heuristics and allocates the workspace), then R timed
// convolutions, downloads y, checks that every entry is finite and compares a
// sample of entries spread over y with a naive CPU cross-correlation.

#include "cli.hpp"

#include <atomr/cuda.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;
using cli::exit_error;
using cli::exit_mismatch;
using cli::exit_ok;

constexpr cli::program prog{"atomr-conv2d"};

constexpr std::int64_t max_extent = std::int64_t{1} << 20;  // every dimension; cuDNN needs ints
constexpr std::int64_t max_elems = std::int64_t{1} << 28;   // x, filter, y: 1 GiB of f32 each
constexpr unsigned max_reps = 100000;
constexpr std::size_t checked_entries = 256;

struct cli_options {
  int device = 0;
  std::int64_t n = 8, c = 64, h = 56, w = 56;  // a ResNet-50 stage-2 3x3 layer, batch 8
  std::int64_t k = 64, r = 3, s = 3;
  std::int64_t pad = 1, stride = 1, dilation = 1, groups = 1;
  cuda::tensor_layout layout = cuda::tensor_layout::nchw;
  bool f16 = false;
  bool bias = false;
  unsigned reps = 20;
  std::optional<cuda::strategy> strategy;  // unset: the device default
};

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "Usage: %s [--n N] [--c C] [--h H] [--w W] [--k K] [--r R] [--s S] [--pad P]\n"
      "          [--stride U] [--dilation D] [--groups G] [--layout L] [--half]\n"
      "          [--bias] [--reps R] [--strategy S] [--device D]\n"
      "\n"
      "Times R forward 2-D convolutions (cross-correlations) of a random N x C x H x W\n"
      "input with K random filters of C/G x R x S (cudnn_actor::conv2d_forward,\n"
      "cuDNN's heuristic algorithm choice and the actor's workspace), after one\n"
      "untimed warm-up. Checks that every output entry is finite and compares %zu\n"
      "entries spread over the output (all when fewer) with a double-precision CPU\n"
      "convolution: the error relative to sum |x * w| (+ |bias|) must stay below\n"
      "1e-5 (1e-2 with --half).\n"
      "\n"
      "Options:\n"
      "  --n N         batch size (default 8)\n"
      "  --c C         input channels (default 64)\n"
      "  --h H         input height (default 56)\n"
      "  --w W         input width (default 56)\n"
      "  --k K         output channels (filters) (default 64)\n"
      "  --r R         filter height (default 3)\n"
      "  --s S         filter width (default 3)\n"
      "  --pad P       zero padding on each side, 0..%lld (default 1)\n"
      "  --stride U    stride (default 1)\n"
      "  --dilation D  filter dilation (default 1)\n"
      "  --groups G    channel groups; G divides C and K (default 1)\n"
      "  --layout L    nchw or nhwc; filters are KCRS or KRSC alike (default nchw)\n"
      "  --half        f16 data (tensor cores allowed, f32 accumulation); default f32\n"
      "                with FMA math only (no TF32)\n"
      "  --bias        add a random bias per output channel\n"
      "  --reps R      timed convolutions, 1..%u (default 20)\n"
      "  --strategy S  completion strategy: event_poll, host_fn or blocking_sync\n"
      "                (default: the device default, event_poll)\n"
      "  --device D    device ordinal (default 0)\n"
      "  --help        print this help and exit\n"
      "Dimensions, stride, dilation and groups are 1..%lld; the input, the filters\n"
      "and the output may hold at most %lld elements each, and the dilated filter\n"
      "must fit the padded input. Options also take the form --name=value.\n"
      "\n"
      "%s",
      prog.name, checked_entries, static_cast<long long>(max_extent), max_reps,
      static_cast<long long>(max_extent), static_cast<long long>(max_elems),
      cli::exit_status_help("an output entry is off by more than the tolerance, or not finite")
          .c_str());
}

/// The product of `factors` if it is at most max_elems (all factors are > 0).
std::optional<std::int64_t> bounded_product(std::initializer_list<std::int64_t> factors) {
  std::int64_t p = 1;
  for (auto f : factors) {
    if (p > max_elems / f) return std::nullopt;
    p *= f;
  }
  return p;
}

/// (in + 2*pad - ((filter-1)*dilation + 1)) / stride + 1; <= 0 when the
/// dilated filter does not fit the padded input. No overflow for extents <= max_extent.
std::int64_t output_dim(std::int64_t in, std::int64_t pad, std::int64_t filter, std::int64_t stride,
                        std::int64_t dilation) {
  const std::int64_t room = in + 2 * pad - ((filter - 1) * dilation + 1);
  return room < 0 ? 0 : room / stride + 1;
}

std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  const std::int64_t one = 1;
  if (auto done =
          cli::options(prog, print_usage)
              .integer("--n", out.n, one, max_extent)
              .integer("--c", out.c, one, max_extent)
              .integer("--h", out.h, one, max_extent)
              .integer("--w", out.w, one, max_extent)
              .integer("--k", out.k, one, max_extent)
              .integer("--r", out.r, one, max_extent)
              .integer("--s", out.s, one, max_extent)
              .integer("--pad", out.pad, std::int64_t{0}, max_extent)
              .integer("--stride", out.stride, one, max_extent)
              .integer("--dilation", out.dilation, one, max_extent)
              .integer("--groups", out.groups, one, max_extent)
              .choice("--layout", out.layout,
                      {{"nchw", cuda::tensor_layout::nchw}, {"nhwc", cuda::tensor_layout::nhwc}})
              .flag("--half", out.f16)
              .flag("--bias", out.bias)
              .integer("--reps", out.reps, 1u, max_reps)
              .strategy("--strategy", out.strategy)
              .integer("--device", out.device, 0, std::numeric_limits<int>::max(),
                       "an ordinal >= 0")
              .parse(argc, argv))
    return done;

  const auto ll = [](std::int64_t v) { return static_cast<long long>(v); };
  if (out.c % out.groups != 0)
    return prog.usage_error(
        cli::format("--groups %lld does not divide --c %lld", ll(out.groups), ll(out.c)));
  if (out.k % out.groups != 0)
    return prog.usage_error(
        cli::format("--groups %lld does not divide --k %lld", ll(out.groups), ll(out.k)));
  for (const auto& [fname, filter, in, iname] :
       {std::tuple{"--r", out.r, out.h, "--h"}, std::tuple{"--s", out.s, out.w, "--w"}}) {
    if (output_dim(in, out.pad, filter, out.stride, out.dilation) <= 0)
      return prog.usage_error(
          cli::format("%s %lld with --dilation %lld spans %lld, more than the padded input "
                      "(%s %lld + 2 * --pad %lld = %lld): the output would be empty",
                      fname, ll(filter), ll(out.dilation), ll((filter - 1) * out.dilation + 1),
                      iname, ll(in), ll(out.pad), ll(in + 2 * out.pad)));
  }
  const std::int64_t p = output_dim(out.h, out.pad, out.r, out.stride, out.dilation);
  const std::int64_t q = output_dim(out.w, out.pad, out.s, out.stride, out.dilation);
  if (!bounded_product({out.n, out.c, out.h, out.w}))
    return prog.usage_error(
        cli::format("the input (--n x --c x --h x --w) exceeds %lld elements", ll(max_elems)));
  if (!bounded_product({out.k, out.c / out.groups, out.r, out.s}))
    return prog.usage_error(cli::format(
        "the filters (--k x --c/--groups x --r x --s) exceed %lld elements", ll(max_elems)));
  if (!bounded_product({out.n, out.k, p, q}))
    return prog.usage_error(cli::format(
        "the output (--n x --k x %lld x %lld) exceeds %lld elements", ll(p), ll(q), ll(max_elems)));
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Host data and the CPU reference

template <class T>
T from_float(float v) {
  if constexpr (std::is_same_v<T, cuda::half>)
    return __float2half(v);
  else
    return v;
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, cuda::half>)
    return static_cast<double>(__half2float(v));
  else
    return static_cast<double>(v);
}

/// Uniform in [-1, 1), never 0 (also after rounding to f16: every non-zero
/// value drawn is a multiple of 2^-23, above f16's smallest subnormal).
template <class T>
void fill_random(std::vector<T>& v, cli::splitmix& gen) {
  for (auto& e : v) {
    float f = 0.0f;
    while (f == 0.0f) f = gen.symmetric();
    e = from_float<T>(f);
  }
}

/// Index of (n, c, h, w) in a dense tensor of shape `s` (NCHW or NHWC).
std::size_t at(const cuda::tensor_shape& s, std::int64_t n, std::int64_t c, std::int64_t h,
               std::int64_t w) {
  if (s.layout == cuda::tensor_layout::nchw)
    return static_cast<std::size_t>(((n * s.c + c) * s.h + h) * s.w + w);
  return static_cast<std::size_t>(((n * s.h + h) * s.w + w) * s.c + c);
}

/// The problem: shapes of x, the filters (as a tensor K x C/G x R x S in x's
/// layout) and y.
struct problem {
  cuda::tensor_shape xs, fs, ys;
  cuda::conv2d_params p;
};

problem make_problem(const cli_options& a) {
  problem pr;
  pr.xs = {a.n, a.c, a.h, a.w, a.layout};
  pr.p = {.out_channels = a.k,
          .filter_h = a.r,
          .filter_w = a.s,
          .pad_h = a.pad,
          .pad_w = a.pad,
          .stride_h = a.stride,
          .stride_w = a.stride,
          .dilation_h = a.dilation,
          .dilation_w = a.dilation,
          .groups = a.groups};
  pr.fs = {a.k, a.c / a.groups, a.r, a.s, a.layout};
  pr.ys = {a.n, a.k, output_dim(a.h, a.pad, a.r, a.stride, a.dilation),
           output_dim(a.w, a.pad, a.s, a.stride, a.dilation), a.layout};
  return pr;
}

/// The entry of y at flat index `i` as (n, k, p, q).
struct coords {
  std::int64_t n, k, p, q;
};
coords coords_of(const cuda::tensor_shape& s, std::size_t i) {
  auto rest = static_cast<std::int64_t>(i);
  coords c{};
  if (s.layout == cuda::tensor_layout::nchw) {
    c.q = rest % s.w;
    rest /= s.w;
    c.p = rest % s.h;
    rest /= s.h;
    c.k = rest % s.c;
    rest /= s.c;
  } else {
    c.k = rest % s.c;
    rest /= s.c;
    c.q = rest % s.w;
    rest /= s.w;
    c.p = rest % s.h;
    rest /= s.h;
  }
  c.n = rest;
  return c;
}

// Checks y: every entry finite, then `checked_entries` entries (all when y
// is smaller; else y's first and last entries and one random entry in each of
// the equal stripes between) against the naive cross-correlation in double.
// The error of each is relative to sum |x * w| (+ |bias|), the scale of the
// rounding error of any summation order. True if all are below `tol`.
template <class T>
bool check_output(const problem& pr, std::span<const T> x, std::span<const T> f,
                  std::span<const T> bias, std::span<const T> y, double tol, double& worst) {
  worst = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (std::isfinite(to_double(y[i]))) continue;
    const auto c = coords_of(pr.ys, i);
    std::fprintf(stderr,
                 "%s: MISMATCH: y(n=%lld, k=%lld, p=%lld, q=%lld) is %g (flat index %zu): "
                 "not finite\n",
                 prog.name, static_cast<long long>(c.n), static_cast<long long>(c.k),
                 static_cast<long long>(c.p), static_cast<long long>(c.q), to_double(y[i]), i);
    worst = std::numeric_limits<double>::infinity();
    return false;
  }

  const auto& p = pr.p;
  const std::int64_t cg = pr.xs.c / p.groups, kg = p.out_channels / p.groups;
  cli::splitmix pick(0x5eed);
  const std::size_t total = y.size();
  const std::size_t samples = std::min(checked_entries, total);
  for (std::size_t s = 0; s < samples; ++s) {
    const std::size_t lo = s * total / samples, hi = (s + 1) * total / samples;
    const std::size_t i = s == 0 ? 0 : s + 1 == samples ? total - 1 : lo + pick.next() % (hi - lo);
    const auto e = coords_of(pr.ys, i);
    double ref = 0.0, scale = 0.0;
    if (!bias.empty()) {
      ref = to_double(bias[static_cast<std::size_t>(e.k)]);
      scale = std::fabs(ref);
    }
    const std::int64_t g = e.k / kg;
    for (std::int64_t c = 0; c < cg; ++c)
      for (std::int64_t r = 0; r < p.filter_h; ++r) {
        const std::int64_t ih = e.p * p.stride_h - p.pad_h + r * p.dilation_h;
        if (ih < 0 || ih >= pr.xs.h) continue;
        for (std::int64_t t = 0; t < p.filter_w; ++t) {
          const std::int64_t iw = e.q * p.stride_w - p.pad_w + t * p.dilation_w;
          if (iw < 0 || iw >= pr.xs.w) continue;
          const double prod = to_double(x[at(pr.xs, e.n, g * cg + c, ih, iw)]) *
                              to_double(f[at(pr.fs, e.k, c, r, t)]);
          ref += prod;
          scale += std::fabs(prod);
        }
      }
    const double got = to_double(y[i]);
    const double err = std::fabs(got - ref) / (scale > 0 ? scale : 1.0);
    if (!(err <= tol)) {  // also catches NaN
      std::fprintf(stderr,
                   "%s: MISMATCH: y(n=%lld, k=%lld, p=%lld, q=%lld) is %.9g, expected %.9g "
                   "(relative error %.3g, tolerance %.0e)\n",
                   prog.name, static_cast<long long>(e.n), static_cast<long long>(e.k),
                   static_cast<long long>(e.p), static_cast<long long>(e.q), got, ref, err, tol);
      worst = err;
      return false;
    }
    worst = std::max(worst, err);
  }
  return true;
}

// ---------------------------------------------------------------------------
// The benchmark

std::string dims(const cuda::tensor_shape& s) {
  return cli::format("%lld x %lld x %lld x %lld", static_cast<long long>(s.n),
                     static_cast<long long>(s.c), static_cast<long long>(s.h),
                     static_cast<long long>(s.w));
}

template <class T>
asio::awaitable<int> bench(cuda::device dev, cli_options args) {
  constexpr bool is_f16 = std::is_same_v<T, cuda::half>;
  const problem pr = make_problem(args);
  const auto x_elems = static_cast<std::size_t>(pr.xs.elements());
  const auto f_elems = static_cast<std::size_t>(pr.fs.elements());
  const auto b_elems = args.bias ? static_cast<std::size_t>(args.k) : 0;
  const auto y_elems = static_cast<std::size_t>(pr.ys.elements());

  auto created = cuda::cudnn_actor::create(dev);
  if (!created) {
    prog.error("cudnn_actor::create", created.error());
    co_return exit_error;
  }
  const cuda::cudnn_actor dnn = std::move(created).value();

  std::vector<T> x(x_elems), f(f_elems), b(b_elems), y(y_elems);
  cli::splitmix gen(42);
  fill_random(x, gen);
  fill_random(f, gen);
  fill_random(b, gen);

  cuda::gpu_ref<T> dx, df, db, dy;
  for (auto [ref, count] : {std::pair{&dx, x_elems}, std::pair{&df, f_elems},
                            std::pair{&db, b_elems}, std::pair{&dy, y_elems}}) {
    if (count == 0) continue;  // no bias: an empty gpu_ref
    auto got = dev.allocate<T>(count);
    if (!got) {
      prog.error(is_f16 ? "allocate<half>" : "allocate<float>", got.error());
      co_return exit_error;
    }
    *ref = std::move(got).value();
  }
  for (auto [host, ref] : {std::pair{&x, dx}, std::pair{&f, df}, std::pair{&b, db}}) {
    if (host->empty()) continue;
    auto up = co_await cuda::upload(std::span<const T>(*host), ref);
    if (!up) {
      prog.error("upload", up.error());
      co_return exit_error;
    }
  }
  // NaN in y, so that an entry that was never written cannot pass.
  if (auto fb = co_await cuda::fill_bytes(dy, 0xFF); !fb) {
    prog.error("fill_bytes", fb.error());
    co_return exit_error;
  }

  const auto t_first = cli::clock_type::now();
  if (auto r = co_await dnn.conv2d_forward(pr.xs, pr.p, dx, df, db, dy); !r) {
    prog.error("conv2d_forward (warm-up)", r.error());
    co_return exit_error;
  }
  const double first_us = cli::elapsed_us(t_first);

  std::vector<double> us;
  us.reserve(args.reps);
  for (unsigned rep = 0; rep < args.reps; ++rep) {
    const auto t0 = cli::clock_type::now();
    auto r = co_await dnn.conv2d_forward(pr.xs, pr.p, dx, df, db, dy);
    us.push_back(cli::elapsed_us(t0));
    if (!r) {
      prog.error("conv2d_forward", r.error());
      co_return exit_error;
    }
  }

  if (auto d = co_await cuda::download(dy, std::span<T>(y)); !d) {
    prog.error("download", d.error());
    co_return exit_error;
  }
  const double tol = is_f16 ? 1e-2 : 1e-5;
  double worst = 0.0;
  if (!check_output<T>(pr, x, f, b, y, tol, worst)) co_return exit_mismatch;

  const double flops = 2.0 * static_cast<double>(pr.ys.elements()) *
                       static_cast<double>(pr.fs.c * pr.fs.h * pr.fs.w);
  const double med = cli::median(us), p99 = cli::percentile(us, 99);
  const bool nchw = args.layout == cuda::tensor_layout::nchw;
  std::printf("conv2d forward, %s %s%s, %u reps (first call %.1f us)\n", is_f16 ? "f16" : "f32",
              nchw ? "NCHW" : "NHWC", args.bias ? ", with bias" : "", args.reps, first_us);
  std::printf("  x %s, filters %s (%s), y %s\n", dims(pr.xs).c_str(), dims(pr.fs).c_str(),
              nchw ? "KCRS" : "KRSC", dims(pr.ys).c_str());
  std::printf("  pad %lld, stride %lld, dilation %lld, groups %lld; %s\n",
              static_cast<long long>(args.pad), static_cast<long long>(args.stride),
              static_cast<long long>(args.dilation), static_cast<long long>(args.groups),
              is_f16 ? "tensor-op math allowed" : "FMA math (no TF32)");
  cli::table t({{"op", 12}, {"median us", 12, 1}, {"p99 us", 12, 1}, {"GFLOP/s", 10, 1}});
  t.row(args.bias ? "conv2d+bias" : "conv2d", {med, p99, med > 0 ? flops / (med * 1e3) : 0.0});
  t.print();
  std::printf(
      "  (GFLOP/s = 2 N K P Q (C/G) R S / median time, bias not counted; p99 is nearest-rank)\n");
  const auto st = dnn.statistics();
  std::printf(
      "  plan: cuDNN's heuristic choice (cudnn_actor does not report which), %s API; cache %llu "
      "hits, %llu misses; workspace %zu bytes; CUDA graph: %llu recorded, %llu launches\n",
      st.graph_plans > 0 ? "graph" : "legacy", static_cast<unsigned long long>(st.algo_hits),
      static_cast<unsigned long long>(st.algo_misses), st.workspace_bytes,
      static_cast<unsigned long long>(st.cuda_graph_records),
      static_cast<unsigned long long>(st.cuda_graph_launches));
  std::printf("  %zu entries finite, %zu checked, worst relative error %.2e (tolerance %.0e)\n",
              y_elems, std::min(checked_entries, y_elems), worst, tol);
  co_return exit_ok;
}

int run(const cli_options& args) {
  asio::io_context ioc;
  const cuda::device_options opts = cli::device_options_for(args.strategy);
  const problem pr = make_problem(args);
  auto opened = cli::open_device(
      prog, ioc.get_executor(), args.device, opts,
      cli::format("timed %u %s conv2d forward calls (%s, x %s, filters %s, y %s, pad %lld, "
                  "stride %lld, dilation %lld, groups %lld%s) on device %d with the %s strategy, "
                  "checking %zu entries against a CPU reference",
                  args.reps, args.f16 ? "f16" : "f32",
                  args.layout == cuda::tensor_layout::nchw ? "NCHW" : "NHWC", dims(pr.xs).c_str(),
                  dims(pr.fs).c_str(), dims(pr.ys).c_str(), static_cast<long long>(args.pad),
                  static_cast<long long>(args.stride), static_cast<long long>(args.dilation),
                  static_cast<long long>(args.groups), args.bias ? ", bias" : "", args.device,
                  cli::strategy_name(opts).c_str(),
                  std::min(checked_entries, static_cast<std::size_t>(pr.ys.elements()))));
  if (!opened) return opened.status;
  return cli::run(
      prog, ioc,
      args.f16 ? bench<cuda::half>(*opened.device, args) : bench<float>(*opened.device, args));
}

}  // namespace

int main(int argc, char** argv) {
  cli_options args;
  if (auto done = parse_args(argc, argv, args)) return *done;
  return run(args);
}
