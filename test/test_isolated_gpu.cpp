// The isolated device on the GPU (issue 20): numbers against a double
// precision reference, every fault kind with 100 operations in flight, the
// restart budget, 2000 random operations with faults, a worker killed while
// idle, timeouts, and a clean exit in every worker state. Its own process
// (and main): the last check is that this process never initialised CUDA.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_fixture.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>

#include "../lib/worker/protocol.hpp"

#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <span>
#include <complex>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;
using namespace std::chrono_literals;
namespace wire = atomr::cuda::detail::wire;

namespace {

/// True when the CUDA driver library is mapped into this process.
bool cuda_loaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcuda.so") != std::string::npos) return true;
  return false;
}

/// The NVIDIA device files this process holds open: cuInit opens
/// /dev/nvidiactl and a context opens /dev/nvidia<N>, so none means CUDA was
/// never initialised here.
std::vector<std::string> nvidia_fds() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().rfind("/dev/nvidia", 0) == 0) out.push_back(target.string());
  }
  return out;
}

constexpr int n = 64;  // gemm size of the stress operations

struct iso : io_fixture {
  device dev;

  static device_options options() {
    device_options o;
    o.isolation.enabled = true;
    o.isolation.worker_args = {"--test-faults"};
    o.isolation.arena_bytes = std::size_t{32} << 20;
    o.isolation.hang_margin = 1000ms;
    o.isolation.max_op_time = 2000ms;
    o.isolation.heartbeat = 50ms;
    o.isolation.heartbeat_timeout = 1000ms;
    o.isolation.budget.max_restarts = 3;
    return o;
  }

  void open(device_options o = options()) {
    dev = device(ioc.get_executor(), 0, o);
    REQUIRE(dev.isolated());
    REQUIRE_MESSAGE(wait_health(health_state::healthy, 30s), to_string(dev.health()));
  }

  /// The io_context on the test thread until `done()` (2 ms slices, 30 s).
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
    return io_fixture::run_until(done, limit, 2ms);
  }
  /// Drops the device and runs what its last handlers hold, so that the next
  /// open() makes a new state (an isolated ordinal's live state would be
  /// handed out again, with its first opener's options).
  void drop() {
    dev = device{};
    ioc.restart();
    ioc.run_for(100ms);
  }
  bool wait_health(health_state h, std::chrono::milliseconds limit = 30s) {
    return run_until([&] { return dev.health() == h; }, limit);
  }
  /// Waits for the worker restart after `restarts_before` and a healthy
  /// device (a fault's answer comes before the service sees the worker go,
  /// so "healthy" alone may still be the old worker's).
  bool wait_restart(std::uint64_t restarts_before) {
    return run_until([&] {
      return dev.statistics().worker_restarts == restarts_before + 1 &&
             dev.health() == health_state::healthy;
    });
  }

  /// Runs the io_context on `threads` threads until `left` is 0 (or 120 s).
  bool run_threads(std::atomic<int>& left, int threads = 4) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        while (!stop.load()) {
          ioc.restart();
          ioc.run_for(5ms);
        }
      });
    const auto end = std::chrono::steady_clock::now() + 120s;
    while (left.load() > 0 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
    stop = true;
    for (auto& t : pool) t.join();
    return left.load() == 0;
  }
};

/// The first message checked_gemm saw for each error code (to report
/// alongside a count; guarded by the callers' mutex).
std::map<errc, std::string>& first_messages() {
  static std::map<errc, std::string> m;
  return m;
}

/// One checked request: upload A (random, seeded), C = A * B, download C and
/// compare with the double-precision reference. 1: correct, 0: an error
/// (the code is counted), -1: wrong numbers (never allowed).
asio::awaitable<int> checked_gemm(device dev, blas_actor blas, const std::vector<float>& b,
                                  std::uint64_t seed, std::map<errc, int>& errors, std::mutex& mu) {
  auto fail = [&](const gpu_error& e) {
    std::lock_guard lk(mu);
    ++errors[e.code()];
    first_messages().emplace(e.code(), e.message());
    return 0;
  };
  const auto a = random_floats(n * n, seed);
  auto ga = dev.allocate<float>(n * n);
  auto gb = dev.allocate<float>(n * n);
  auto gc = dev.allocate<float>(n * n);
  if (!ga) co_return fail(ga.error());
  if (!gb) co_return fail(gb.error());
  if (!gc) co_return fail(gc.error());
  if (auto r = co_await upload(a, ga.value()); !r) co_return fail(r.error());
  if (auto r = co_await upload(b, gb.value()); !r) co_return fail(r.error());
  gemm_params p;
  p.m = p.n = p.k = n;
  if (auto r = co_await blas.gemm(p, ga.value(), gb.value(), gc.value()); !r)
    co_return fail(r.error());
  std::vector<float> c(n * n, std::nanf(""));
  if (auto r = co_await download(gc.value(), std::span<float>(c)); !r) co_return fail(r.error());
  co_return gemm_rel_error(a, b, c, n) < 1e-5 ? 1 : -1;
}

}  // namespace

TEST_CASE_FIXTURE(iso,
                  "isolated: buffers allocated before the io_context first runs (the worker "
                  "not started yet) are known to the worker when the first requests name them") {
  // The allocations went to the socket, held until the worker's hello, while
  // the uploads naming them went into the request rings, which the worker's
  // ring threads read before that: stale_ref. Now they wait for the first
  // link and go into its control ring, which the worker reads first.
  dev = device(ioc.get_executor(), 0, options());
  REQUIRE(dev.isolated());
  REQUIRE(dev.health() == health_state::starting);  // a new state: nothing ran yet
  constexpr int count = 8;
  constexpr std::size_t len = 4096;
  std::vector<gpu_ref<float>> bufs;
  std::vector<std::vector<float>> host;
  for (int i = 0; i < count; ++i) {
    auto r = dev.allocate<float>(len);
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    bufs.push_back(std::move(r).value());
    host.push_back(random_floats(len, 500 + static_cast<std::uint64_t>(i)));
  }
  int left = count, failed = 0, wrong = 0;
  std::string first_error;
  for (int i = 0; i < count; ++i)
    asio::co_spawn(
        ioc,
        [&, i]() -> asio::awaitable<void> {
          const auto k = static_cast<std::size_t>(i);
          std::vector<float> back(len, std::nanf(""));
          result<void> down = outcome::success();
          if (auto up = co_await upload(host[k], bufs[k]); !up)
            down = up.error();
          else
            down = co_await download(bufs[k], std::span<float>(back));
          if (!down) {
            if (failed++ == 0) first_error = down.error().message();
          } else {
            wrong += back != host[k];
          }
          --left;
        },
        asio::detached);
  REQUIRE(run_until([&] { return left == 0; }, 60s));
  CHECK_MESSAGE(failed == 0, first_error);
  CHECK(wrong == 0);
  CHECK(wait_health(health_state::healthy, 30s));
}

TEST_CASE_FIXTURE(iso,
                  "isolated: upload, gemm (f32, f64) and download match a double-precision "
                  "reference; copy, fill_bytes, and transfers larger than the arena") {
  auto o = options();
  o.isolation.arena_bytes = std::size_t{8} << 20;  // 2 MiB pieces
  open(o);
  auto blas = blas_actor::create(dev).value();
  const int m = 256;
  const auto a = random_floats(m * m, 1), b = random_floats(m * m, 2);
  auto ga = dev.allocate<float>(m * m).value();
  auto gb = dev.allocate<float>(m * m).value();
  auto gc = dev.allocate<float>(m * m).value();
  REQUIRE(run(upload(a, ga)));
  REQUIRE(run(upload(b, gb)));
  gemm_params p;
  p.m = p.n = p.k = m;
  auto g = run(blas.gemm(p, ga, gb, gc));
  REQUIRE_MESSAGE(g, (g ? "" : g.error().message()));
  std::vector<float> c(m * m);
  REQUIRE(run(download(gc, std::span<float>(c))));
  CHECK(gemm_rel_error(a, b, c, m) < 1e-5);

  // f64: exact to rounding.
  const int k = 48;
  std::vector<double> da(k * k), db(k * k), dc(k * k);
  for (int i = 0; i < k * k; ++i) {
    da[i] = std::sin(0.1 * i);
    db[i] = std::cos(0.07 * i);
  }
  auto xa = dev.allocate<double>(k * k).value();
  auto xb = dev.allocate<double>(k * k).value();
  auto xc = dev.allocate<double>(k * k).value();
  REQUIRE(run(upload(da, xa)));
  REQUIRE(run(upload(db, xb)));
  p.m = p.n = p.k = k;
  REQUIRE(run(blas.gemm(p, xa, xb, xc)));
  REQUIRE(run(download(xc, std::span<double>(dc))));
  double worst = 0;
  for (int col = 0; col < k; ++col)
    for (int row = 0; row < k; ++row) {
      double ref = 0;
      for (int i = 0; i < k; ++i) ref += da[i * k + row] * db[col * k + i];
      worst = std::max(worst, std::abs(dc[col * k + row] - ref));
    }
  CHECK(worst < 1e-12);

  // copy, fill_bytes.
  auto cc = dev.allocate<float>(m * m).value();
  REQUIRE(run(copy(gc, cc)));
  std::vector<float> c2(m * m);
  REQUIRE(run(download(cc, std::span<float>(c2))));
  CHECK(std::memcmp(c.data(), c2.data(), c.size() * sizeof(float)) == 0);
  REQUIRE(run(fill_bytes(cc, 0xAB)));
  std::vector<std::uint8_t> bytes(m * m * 4);
  auto cb = dev.allocate<std::uint8_t>(bytes.size()).value();
  REQUIRE(run(fill_bytes(cb, 0xAB)));
  REQUIRE(run(download(cb, std::span<std::uint8_t>(bytes))));
  CHECK(std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t v) { return v == 0xAB; }));

  // 24 MiB through an 8 MiB arena: twelve pieces each way, bit-exact.
  const std::size_t big = std::size_t{6} << 20;
  std::vector<std::uint32_t> in(big), out(big, 0);
  random_bytes(in.data(), big * 4, 7);
  auto gbig = dev.allocate<std::uint32_t>(big).value();
  REQUIRE(run(upload(in, gbig)));
  REQUIRE(run(download(gbig, std::span<std::uint32_t>(out))));
  CHECK(in == out);

  // Blocks that are not adjacent in the arena: three 2 MiB uploads staged
  // (their blocks at 0, 2 and 4 MiB, held until each is awaited), the middle
  // one finished, so a 4 MiB transfer gets the blocks at 2 and 6 MiB and
  // copies two runs; the staged data of the others must stay intact.
  {
    const std::size_t piece_words = std::size_t{512} << 10;  // 2 MiB of uint32
    std::vector<std::vector<std::uint32_t>> part(3, std::vector<std::uint32_t>(piece_words));
    std::vector<gpu_ref<std::uint32_t>> gp;
    for (int i = 0; i < 3; ++i) {
      random_bytes(part[i].data(), piece_words * 4, 20 + i);
      gp.push_back(dev.allocate<std::uint32_t>(piece_words).value());
    }
    auto op0 = upload(part[0], gp[0]);
    auto op1 = upload(part[1], gp[1]);
    auto op2 = upload(part[2], gp[2]);
    // The staged copies are the arena's: the host data may change now.
    for (auto& p : part) std::reverse(p.begin(), p.end());
    REQUIRE(run(std::move(op1)));
    std::vector<std::uint32_t> four(2 * piece_words), back(2 * piece_words, 0);
    random_bytes(four.data(), four.size() * 4, 30);
    auto g4 = dev.allocate<std::uint32_t>(four.size()).value();
    REQUIRE(run(upload(four, g4)));
    REQUIRE(run(download(g4, std::span<std::uint32_t>(back))));
    CHECK(four == back);
    REQUIRE(run(std::move(op0)));
    REQUIRE(run(std::move(op2)));
    for (int i = 0; i < 3; ++i) {
      std::vector<std::uint32_t> got(piece_words, 0);
      REQUIRE(run(download(gp[i], std::span<std::uint32_t>(got))));
      std::reverse(part[i].begin(), part[i].end());  // as it was when staged
      CHECK_MESSAGE(got == part[i], "staged upload " << i);
    }
  }

  const auto s = dev.statistics();
  CHECK(s.worker_calls_pending == 0);
  CHECK(s.ops_failed == 0);
  CHECK(s.total_bytes > 0);
  CHECK(s.parked == 0);
  // The worker's own threads, counted from the service: its io thread and
  // ring threads as without CUDA, plus the device's threads and the
  // driver's once a context exists.
  MESSAGE("worker threads: " << s.worker_threads);
  CHECK(s.worker_threads > 1 + dev.options().isolation.rings);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: every actor's operations run in the worker and match a "
                  "double-precision reference") {
  open();
  auto up = [&](const auto& host, auto ref) { REQUIRE(run(upload(host, ref))); };
  auto down = [&](auto ref, auto& host) {
    REQUIRE(run(download(ref, std::span(host.data(), host.size()))));
  };
  auto blas = blas_actor::create(dev).value();

  SUBCASE("blas: gemm_fused (bias_relu), strided batches, gemv, level 1") {
    const int m = 40, nn = 24, k = 32;
    const auto a = random_floats(m * k, 11), b = random_floats(k * nn, 12);
    const auto bias = random_floats(m, 13);
    auto ga = dev.allocate<float>(a.size()).value();
    auto gb = dev.allocate<float>(b.size()).value();
    auto gbias = dev.allocate<float>(bias.size()).value();
    auto gc = dev.allocate<float>(m * nn).value();
    up(a, ga);
    up(b, gb);
    up(bias, gbias);
    gemm_params p;
    p.m = m;
    p.n = nn;
    p.k = k;
    auto f = run(blas.gemm_fused(p, gemm_epilogue::bias_relu, ga, gb, gbias, gc));
    REQUIRE_MESSAGE(f, (f ? "" : f.error().message()));
    std::vector<float> c(m * nn);
    down(gc, c);
    double worst = 0;
    for (int col = 0; col < nn; ++col)
      for (int row = 0; row < m; ++row) {
        double ref = bias[row];
        for (int i = 0; i < k; ++i) ref += double(a[i * m + row]) * b[col * k + i];
        worst = std::max(worst, std::abs(c[col * m + row] - std::max(ref, 0.0)));
      }
    CHECK(worst < 1e-4);

    // Three batches of 16 x 16.
    const int s = 16, count = 3;
    const auto ba = random_floats(s * s * count, 21), bb = random_floats(s * s * count, 22);
    auto xa = dev.allocate<float>(ba.size()).value();
    auto xb = dev.allocate<float>(bb.size()).value();
    auto xc = dev.allocate<float>(ba.size()).value();
    up(ba, xa);
    up(bb, xb);
    gemm_params q;
    q.m = q.n = q.k = s;
    batch_params bp;
    bp.count = count;
    REQUIRE(run(blas.gemm_strided_batched(q, bp, xa, xb, xc)));
    std::vector<float> bc(ba.size());
    down(xc, bc);
    worst = 0;
    for (int t = 0; t < count; ++t)
      for (int col = 0; col < s; ++col)
        for (int row = 0; row < s; ++row) {
          double ref = 0;
          for (int i = 0; i < s; ++i)
            ref += double(ba[t * s * s + i * s + row]) * bb[t * s * s + col * s + i];
          worst = std::max(worst, std::abs(bc[t * s * s + col * s + row] - ref));
        }
    CHECK(worst < 1e-4);

    // f64 gemv and level 1: exact to rounding.
    std::vector<double> A(m * nn), x(nn), y(m);
    for (int i = 0; i < m * nn; ++i) A[i] = std::sin(0.3 * i);
    for (int i = 0; i < nn; ++i) x[i] = std::cos(0.2 * i) - 0.25;
    auto gA = dev.allocate<double>(A.size()).value();
    auto gx = dev.allocate<double>(x.size()).value();
    auto gy = dev.allocate<double>(y.size()).value();
    up(A, gA);
    up(x, gx);
    gemv_params gp;
    gp.m = m;
    gp.n = nn;
    REQUIRE(run(blas.gemv(gp, gA, gx, gy)));
    down(gy, y);
    std::vector<double> yref(m, 0.0);
    for (int col = 0; col < nn; ++col)
      for (int row = 0; row < m; ++row) yref[row] += A[col * m + row] * x[col];
    worst = 0;
    for (int row = 0; row < m; ++row) worst = std::max(worst, std::abs(y[row] - yref[row]));
    CHECK(worst < 1e-12);

    auto gx2 = dev.allocate<double>(x.size()).value();
    up(x, gx2);
    REQUIRE(run(blas.axpy(nn, 2.5, gx, gx2)));  // gx2 = 2.5 x + x = 3.5 x
    REQUIRE(run(blas.scal(nn, -2.0, gx2)));     // -7 x
    std::vector<double> x2(nn);
    down(gx2, x2);
    worst = 0;
    for (int i = 0; i < nn; ++i) worst = std::max(worst, std::abs(x2[i] + 7.0 * x[i]));
    CHECK(worst < 1e-12);
    double dref = 0, nref = 0, aref = 0;
    std::int64_t best = 0;
    for (int i = 0; i < nn; ++i) {
      dref += x[i] * x2[i];
      nref += x[i] * x[i];
      aref += std::abs(x[i]);
      if (std::abs(x2[i]) > std::abs(x2[best])) best = i;
    }
    auto d = run(blas.dot(nn, gx, gx2));
    REQUIRE(d);
    CHECK(std::abs(d.value() - dref) < 1e-10);
    auto nr = run(blas.nrm2(nn, gx));
    REQUIRE(nr);
    CHECK(std::abs(nr.value() - std::sqrt(nref)) < 1e-12);
    auto as = run(blas.asum(nn, gx));
    REQUIRE(as);
    CHECK(std::abs(as.value() - aref) < 1e-12);
    auto im = run(blas.iamax(nn, gx2));
    REQUIRE(im);
    CHECK(im.value() == best);
  }

#if ATOMR_CUDA_HAS_CUFFT
  SUBCASE("fft: c2c against a double DFT; r2c then normalised c2r gives the input back") {
    auto fft = fft_actor::create(dev).value();
    using c32 = fft_actor::c32;
    const int pts = 64;
    std::vector<c32> in(pts);
    const auto re = random_floats(pts, 31), im = random_floats(pts, 32);
    for (int i = 0; i < pts; ++i) in[i] = {re[i], im[i]};
    auto gin = dev.allocate<c32>(pts).value();
    auto gout = dev.allocate<c32>(pts).value();
    up(in, gin);
    fft_shape sh;
    sh.dims = {pts, 1, 1};
    auto r = run(fft.c2c(sh, gin, gout));
    REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
    std::vector<c32> out(pts);
    down(gout, out);
    double worst = 0;
    for (int f = 0; f < pts; ++f) {
      std::complex<double> acc = 0;
      for (int t = 0; t < pts; ++t)
        acc += std::complex<double>(in[t]) * std::polar(1.0, -2.0 * M_PI * f * t / pts);
      worst = std::max(worst, std::abs(acc - std::complex<double>(out[f])));
    }
    CHECK(worst < 1e-4);

    const auto real = random_floats(pts, 33);
    auto greal = dev.allocate<float>(pts).value();
    auto ghalf = dev.allocate<c32>(pts / 2 + 1).value();
    auto gback = dev.allocate<float>(pts).value();
    up(real, greal);
    REQUIRE(run(fft.r2c(sh, greal, ghalf)));
    sh.direction = fft_direction::inverse;
    sh.normalize = true;
    REQUIRE(run(fft.c2r(sh, ghalf, gback)));
    std::vector<float> back(pts);
    down(gback, back);
    worst = 0;
    for (int i = 0; i < pts; ++i) worst = std::max(worst, double(std::abs(back[i] - real[i])));
    CHECK(worst < 1e-5);
  }
#endif

#if ATOMR_CUDA_HAS_CUDNN
  SUBCASE("cudnn: conv2d with bias, relu, max pooling, softmax, batchnorm") {
    auto dnn = cudnn_actor::create(dev).value();
    const tensor_shape xs{2, 3, 8, 8};
    conv2d_params cp;
    cp.out_channels = 4;
    cp.filter_h = cp.filter_w = 3;
    cp.pad_h = cp.pad_w = 1;
    const auto x = random_floats(2 * 3 * 8 * 8, 41), w = random_floats(4 * 3 * 3 * 3, 42);
    const auto bias = random_floats(4, 43);
    auto gx = dev.allocate<float>(x.size()).value();
    auto gw = dev.allocate<float>(w.size()).value();
    auto gbias = dev.allocate<float>(bias.size()).value();
    auto gy = dev.allocate<float>(2 * 4 * 8 * 8).value();
    up(x, gx);
    up(w, gw);
    up(bias, gbias);
    auto cr = run(dnn.conv2d_forward(xs, cp, gx, gw, gbias, gy));
    REQUIRE_MESSAGE(cr, (cr ? "" : cr.error().message()));
    std::vector<float> y(2 * 4 * 8 * 8);
    down(gy, y);
    auto X = [&](int n_, int c, int h, int w_) {
      if (h < 0 || h >= 8 || w_ < 0 || w_ >= 8) return 0.0;
      return double(x[((n_ * 3 + c) * 8 + h) * 8 + w_]);
    };
    double worst = 0;
    for (int n_ = 0; n_ < 2; ++n_)
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < 8; ++h)
          for (int w_ = 0; w_ < 8; ++w_) {
            double ref = bias[k];
            for (int c = 0; c < 3; ++c)
              for (int r = 0; r < 3; ++r)
                for (int s2 = 0; s2 < 3; ++s2)
                  ref += X(n_, c, h - 1 + r, w_ - 1 + s2) * w[((k * 3 + c) * 3 + r) * 3 + s2];
            worst = std::max(worst, std::abs(y[((n_ * 4 + k) * 8 + h) * 8 + w_] - ref));
          }
    CHECK(worst < 1e-4);

    const tensor_shape ys{2, 4, 8, 8};
    auto gr = dev.allocate<float>(y.size()).value();
    REQUIRE(run(dnn.activation_forward(ys, {}, gy, gr)));
    std::vector<float> relu(y.size());
    down(gr, relu);
    bool relu_ok = true;
    for (std::size_t i = 0; i < y.size(); ++i) relu_ok &= relu[i] == std::max(y[i], 0.0f);
    CHECK(relu_ok);

    auto gp = dev.allocate<float>(2 * 4 * 4 * 4).value();
    REQUIRE(run(dnn.pooling_forward(ys, {}, gr, gp)));  // max, 2 x 2, stride 2
    std::vector<float> pooled(2 * 4 * 4 * 4);
    down(gp, pooled);
    bool pool_ok = true;
    for (int nc = 0; nc < 8; ++nc)
      for (int h = 0; h < 4; ++h)
        for (int w_ = 0; w_ < 4; ++w_) {
          float mx = -1e30f;
          for (int r = 0; r < 2; ++r)
            for (int s2 = 0; s2 < 2; ++s2)
              mx = std::max(mx, relu[(nc * 8 + 2 * h + r) * 8 + 2 * w_ + s2]);
          pool_ok &= pooled[(nc * 4 + h) * 4 + w_] == mx;
        }
    CHECK(pool_ok);

    auto gs = dev.allocate<float>(y.size()).value();
    REQUIRE(run(dnn.softmax_forward(ys, softmax_algorithm::accurate, gy, gs)));
    std::vector<float> sm(y.size());
    down(gs, sm);
    worst = 0;
    for (int n_ = 0; n_ < 2; ++n_)
      for (int hw = 0; hw < 64; ++hw) {
        double mx = -1e30, sum = 0;
        for (int k = 0; k < 4; ++k) mx = std::max(mx, double(y[(n_ * 4 + k) * 64 + hw]));
        for (int k = 0; k < 4; ++k) sum += std::exp(y[(n_ * 4 + k) * 64 + hw] - mx);
        for (int k = 0; k < 4; ++k) {
          const double ref = std::exp(y[(n_ * 4 + k) * 64 + hw] - mx) / sum;
          worst = std::max(worst, std::abs(sm[(n_ * 4 + k) * 64 + hw] - ref));
        }
      }
    CHECK(worst < 1e-6);

    std::vector<float> scale = {1.5f, -0.5f, 2.0f, 1.0f}, shift = {0.1f, 0.2f, -0.3f, 0.0f},
                       mean = {0.5f, -0.25f, 0.0f, 1.0f}, var = {1.0f, 4.0f, 0.25f, 2.0f};
    auto g1 = dev.allocate<float>(4).value();
    auto g2 = dev.allocate<float>(4).value();
    auto g3 = dev.allocate<float>(4).value();
    auto g4 = dev.allocate<float>(4).value();
    up(scale, g1);
    up(shift, g2);
    up(mean, g3);
    up(var, g4);
    auto gbn = dev.allocate<float>(y.size()).value();
    const double eps = 1e-5;
    REQUIRE(run(dnn.batchnorm_inference(ys, eps, gy, g1, g2, g3, g4, gbn)));
    std::vector<float> bn(y.size());
    down(gbn, bn);
    worst = 0;
    for (int n_ = 0; n_ < 2; ++n_)
      for (int k = 0; k < 4; ++k)
        for (int hw = 0; hw < 64; ++hw) {
          const std::size_t i = (n_ * 4 + k) * 64 + hw;
          const double ref = scale[k] * (y[i] - mean[k]) / std::sqrt(var[k] + eps) + shift[k];
          worst = std::max(worst, std::abs(bn[i] - ref));
        }
    CHECK(worst < 1e-5);
  }
#endif

#if ATOMR_CUDA_HAS_CURAND
  SUBCASE("rng: uniform and normal statistics; set_seed repeats the sequence; poisson's mean") {
    auto rng = rng_actor::create(dev, {.seed = 1234, .max_lanes = 1}).value();
    const std::size_t cnt = 1 << 16;
    auto g = dev.allocate<float>(cnt).value();
    REQUIRE(run(rng.uniform(g)));
    std::vector<float> u1(cnt), u2(cnt);
    down(g, u1);
    double sum = 0;
    bool in_range = true;
    for (float v : u1) {
      sum += v;
      in_range &= v > 0.0f && v <= 1.0f;
    }
    CHECK(in_range);
    CHECK(std::abs(sum / cnt - 0.5) < 0.01);
    REQUIRE(rng.set_seed(1234));  // the same seed: the same numbers again
    REQUIRE(run(rng.uniform(g)));
    down(g, u2);
    CHECK(u1 == u2);
    REQUIRE(rng.set_seed(99));
    REQUIRE(run(rng.uniform(g)));
    down(g, u2);
    CHECK(u1 != u2);

    REQUIRE(run(rng.normal(g, 3.0f, 2.0f)));
    down(g, u1);
    double m1 = 0, m2 = 0;
    for (float v : u1) m1 += v;
    m1 /= cnt;
    for (float v : u1) m2 += (v - m1) * (v - m1);
    CHECK(std::abs(m1 - 3.0) < 0.05);
    CHECK(std::abs(std::sqrt(m2 / cnt) - 2.0) < 0.05);

    auto gp = dev.allocate<std::uint32_t>(cnt).value();
    REQUIRE(run(rng.poisson(gp, 6.5)));
    std::vector<std::uint32_t> pv(cnt);
    down(gp, pv);
    double pm = 0;
    for (auto v : pv) pm += v;
    CHECK(std::abs(pm / cnt - 6.5) < 0.1);
  }
#endif

  const auto st = dev.statistics();
  CHECK(st.ops_failed == 0);
  CHECK(st.worker_calls_pending == 0);
  CHECK(st.parked == 0);
  CHECK(st.worker_restarts == 0);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: a composed unit is one request; its numbers match a double-precision "
                  "reference; a failing step in the worker is named and the target untouched") {
  open();
  auto blas = blas_actor::create(dev).value();
  const int m = 96;
  const auto a = random_floats(m * m, 51), b = random_floats(m * m, 52);
  const auto bias = random_floats(m, 53);
  auto ga = dev.allocate<float>(m * m).value();
  auto gb = dev.allocate<float>(m * m).value();
  auto gbias = dev.allocate<float>(m).value();
  auto gc = dev.allocate<float>(m * m).value();
  auto gd = dev.allocate<float>(m * m).value();
  std::vector<float> out(m * m, std::nanf(""));
  gemm_params p;
  p.m = p.n = p.k = m;
  const auto before = dev.statistics().ops_completed;
  auto u =
      run(compose(dev, upload(a, ga), upload(b, gb), upload(bias, gbias),
                  blas.gemm_fused(p, gemm_epilogue::bias, ga, gb, gbias, gc),
                  blas.scal(m * m, -0.5, gc), copy(gc, gd), download(gd, std::span<float>(out))));
  REQUIRE_MESSAGE(u, (u ? "" : u.error().message()));
  CHECK(dev.statistics().ops_completed == before + 1);  // seven steps, one request
  double worst = 0;
  for (int col = 0; col < m; ++col)
    for (int row = 0; row < m; ++row) {
      double ref = bias[row];
      for (int i = 0; i < m; ++i) ref += double(a[i * m + row]) * b[col * m + i];
      worst = std::max(worst, std::abs(out[col * m + row] + 0.5 * ref));
    }
  CHECK(worst < 1e-4);

  // A fault in the middle of a unit: the unit fails as a whole, its
  // download target is never written, and the worker is replaced.
  std::vector<float> untouched(m * m, 7.0f);
  auto f = run(compose(dev, upload(a, ga), blas.gemm(p, ga, gb, gc),
                       download(gc, std::span<float>(untouched))));
  REQUIRE(f);  // the well-formed unit first
  const auto good = untouched;
  std::fill(untouched.begin(), untouched.end(), 7.0f);
  const auto restarts = dev.statistics().worker_restarts;
  const auto faulted = run(compose(
      dev, upload(a, ga),
      [](device d) -> asio::awaitable<result<void>> {
        co_return co_await detail::inject_isolated_fault(
            d.impl(), static_cast<std::uint16_t>(wire::fault_kind::illegal_address));
      }(dev),
      download(gc, std::span<float>(untouched))));
  REQUIRE_FALSE(faulted);
  CHECK(faulted.error().code() == errc::context_poisoned);
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](float v) { return v == 7.0f; }));
  CHECK(wait_restart(restarts));
  CHECK(gemm_rel_error(a, b, good, m) < 1e-5);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: a recording lives in the worker; replays with new inputs match an "
                  "unrecorded run bit for bit; after a restart it is stale") {
  open();
  auto blas = blas_actor::create(dev).value();
  const int m = 128;
  auto ga = dev.allocate<float>(m * m).value();
  auto gb = dev.allocate<float>(m * m).value();
  auto gc = dev.allocate<float>(m * m).value();
  auto gd = dev.allocate<float>(m * m).value();
  const auto b = random_floats(m * m, 62);
  REQUIRE(run(upload(b, gb)));
  gemm_params p;
  p.m = p.n = p.k = m;
  auto rec = run(record(dev, blas.gemm(p, ga, gb, gc), blas.scal(m * m, 2.0, gc), copy(gc, gd)));
  REQUIRE_MESSAGE(rec, (rec ? "" : rec.error().message()));
  CHECK(rec.value().steps() == 3);
  CHECK(rec.value().nodes() >= 3);
  for (std::uint64_t seed : {71, 72}) {
    const auto a = random_floats(m * m, seed);
    REQUIRE(run(upload(a, ga)));
    REQUIRE(run(replay(rec.value())));
    std::vector<float> replayed(m * m), direct(m * m);
    REQUIRE(run(download(gd, std::span<float>(replayed))));
    // The same steps unrecorded, on the same buffers.
    REQUIRE(run(compose(dev, blas.gemm(p, ga, gb, gc), blas.scal(m * m, 2.0, gc), copy(gc, gd),
                        download(gd, std::span<float>(direct)))));
    CHECK(std::memcmp(replayed.data(), direct.data(), direct.size() * sizeof(float)) == 0);
    std::vector<float> half(m * m);
    for (int i = 0; i < m * m; ++i) half[i] = replayed[i] / 2.0f;
    CHECK(gemm_rel_error(a, b, half, m) < 1e-5);
  }
  CHECK(rec.value().replays() == 2);

  // Refused at record time: a transfer from host memory, cuRAND.
  std::vector<float> host(m * m);
  auto up = run(record(dev, upload(host, ga)));
  REQUIRE_FALSE(up);
  CHECK(up.error().code() == errc::not_supported);
#if ATOMR_CUDA_HAS_CURAND
  auto rng = rng_actor::create(dev).value();
  auto rr = run(record(dev, blas.scal(m * m, 2.0, gc), rng.uniform(ga)));
  REQUIRE_FALSE(rr);
  CHECK(rr.error().code() == errc::not_supported);
  CHECK(rr.error().message().find("record: step 2 of 2") != std::string::npos);
#endif

  // A fault: the worker is replaced, the recording is stale, nothing launched.
  const auto restarts = dev.statistics().worker_restarts;
  auto f = run(detail::inject_isolated_fault(
      dev.impl(), static_cast<std::uint16_t>(wire::fault_kind::illegal_address)));
  REQUIRE_FALSE(f);
  REQUIRE(wait_restart(restarts));
  auto stale = run(replay(rec.value()));
  REQUIRE_FALSE(stale);
  CHECK(stale.error().code() == errc::stale_ref);
  CHECK(rec.value().replays() == 2);
}

TEST_CASE_FIXTURE(iso, "isolated: bad input is refused in the service, before anything is sent") {
  open();
  auto blas = blas_actor::create(dev).value();
  auto x = dev.allocate<float>(64).value();
  const auto before = dev.statistics();
  std::vector<float> host(65);
  auto up = run(upload(host, x));
  REQUIRE_FALSE(up);
  CHECK(up.error().code() == errc::invalid_argument);
  gemm_params p;
  p.m = p.n = p.k = 16;  // 256 elements each: x has 64
  auto g = run(blas.gemm(p, x, x, x));
  REQUIRE_FALSE(g);
  CHECK(g.error().code() == errc::invalid_argument);
  auto sub = x.subspan(0, 32).value();
  auto ov = run(copy(sub, x.subspan(16, 32).value()));
  REQUIRE_FALSE(ov);
  CHECK(ov.error().code() == errc::invalid_argument);
  const auto after = dev.statistics();
  CHECK(after.ops_completed == before.ops_completed);  // nothing reached the worker
  CHECK(after.ops_failed == before.ops_failed);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: each fault kind with 100 operations in flight: every one completes, "
                  "the worker restarts, old refs are stale, new work is correct") {
  struct kind {
    std::string name;
    wire::fault_kind k;
  };
  for (auto fk :
       {kind{"illegal address", wire::fault_kind::illegal_address},
        kind{"abort", wire::fault_kind::abort_process},
        kind{"SIGKILL", wire::fault_kind::kill_self}, kind{"hung process", wire::fault_kind::hang},
        kind{"kernel that never ends", wire::fault_kind::hang_kernel}}) {
    CAPTURE(fk.name);
    open();
    std::optional<blas_actor> blas_holder(blas_actor::create(dev).value());
    auto& blas = *blas_holder;
    const auto b = random_floats(n * n, 99);
    auto old = dev.allocate<float>(16).value();
    const auto gen = dev.generation();
    const int pid = dev.statistics().worker_pid;
    std::map<errc, int> errors;
    first_messages().clear();  // this scenario's own first message per code
    std::mutex mu;
    std::atomic<int> left{101}, good{0}, wrong{0};
    std::optional<result<void>> fault_result;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) {
      asio::co_spawn(
          ioc,
          [&, i]() -> asio::awaitable<void> {
            if (i >= 50) {  // the second half starts around the fault
              asio::steady_timer t(ioc, std::chrono::milliseconds(i % 7));
              co_await t.async_wait(asio::use_awaitable);
            }
            const int r = co_await checked_gemm(dev, blas, b, 1000 + i, errors, mu);
            if (r == 1) ++good;
            if (r == -1) ++wrong;
            --left;
          },
          asio::detached);
      if (i == 50)
        asio::co_spawn(
            ioc,
            [&]() -> asio::awaitable<void> {
              fault_result = co_await detail::inject_isolated_fault(
                  dev.impl(), static_cast<std::uint16_t>(fk.k));
              --left;
            },
            asio::detached);
    }
    REQUIRE(run_threads(left));
    CHECK(wrong == 0);
    {
      std::lock_guard lk(mu);
      for (auto [code, count] : errors) {
        MESSAGE(fk.name << ": " << count << " x " << to_string(code)
                        << " (first: " << first_messages()[code] << ")");
        CHECK((code == errc::context_poisoned || code == errc::stale_ref ||
               code == errc::device_unavailable || code == errc::timeout));
      }
    }
    MESSAGE(fk.name << ": " << good.load() << " of 100 correct, the rest failed fast");
    if (fk.k == wire::fault_kind::illegal_address) {
      REQUIRE(fault_result);
      REQUIRE_FALSE(*fault_result);
      CHECK(fault_result->error().code() == errc::context_poisoned);
    }
    if (fk.k == wire::fault_kind::hang_kernel) {
      REQUIRE(fault_result);
      REQUIRE_FALSE(*fault_result);
      CHECK(fault_result->error().code() == errc::timeout);
    }
    REQUIRE(wait_restart(0));
    const auto recovery = std::chrono::steady_clock::now() - t0;
    const auto hist = detail::health_history(*dev.impl());
    auto at = [&](health_state h, std::size_t from) {
      return std::find(hist.begin() + static_cast<std::ptrdiff_t>(from), hist.end(), h) -
             hist.begin();
    };
    const auto ip = static_cast<std::size_t>(at(health_state::poisoned, 0));
    const auto ir = static_cast<std::size_t>(at(health_state::restarting, ip));
    const auto ih = static_cast<std::size_t>(at(health_state::healthy, ir));
    CHECK(ip < hist.size());
    CHECK(ir < hist.size());
    CHECK(ih < hist.size());
    CHECK(dev.generation() > gen);
    CHECK(old.check().error().code() == errc::stale_ref);
    CHECK(pid_gone(pid));
    CHECK(dev.statistics().worker_restarts == 1);
    std::map<errc, int> after;
    CHECK(run(checked_gemm(dev, blas, b, 5, after, mu)) == 1);
    MESSAGE(fk.name << ": fault to healthy and correct again in "
                    << std::chrono::duration<double>(recovery).count() << " s");
    const auto s = dev.statistics();
    CHECK(s.worker_calls_pending == 0);
    blas_holder.reset();
    drop();
  }
}

TEST_CASE_FIXTURE(iso,
                  "isolated: a fault request right after the worker starts is answered "
                  "context_poisoned under a 250 ms heartbeat timeout: the fault kernels are "
                  "compiled off the threads that answer") {
  // Compiled (NVRTC) by the first fault request on the thread that ran it,
  // the kernels held that thread for the compile's time; the worker now
  // compiles them on a thread of its own when its device opens (session 40).
  auto o = options();
  o.isolation.heartbeat = 20ms;
  o.isolation.heartbeat_timeout = 250ms;
  open(o);
  std::optional<result<void>> got;
  const auto t0 = std::chrono::steady_clock::now();
  run([&]() -> asio::awaitable<void> {
    got = co_await detail::inject_isolated_fault(
        dev.impl(), static_cast<std::uint16_t>(wire::fault_kind::illegal_address));
  }());
  MESSAGE(
      "fault answered after "
      << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
      << " ms");
  REQUIRE(got);
  REQUIRE_FALSE(*got);
  CHECK_MESSAGE(got->error().code() == errc::context_poisoned, got->error().message());
  REQUIRE(wait_restart(0));
  drop();
}

TEST_CASE_FIXTURE(iso, "isolated: the restart budget spent leads to stopped; no worker is left") {
  auto o = options();
  o.isolation.budget.max_restarts = 1;
  open(o);
  const int pid1 = dev.statistics().worker_pid;
  CHECK(run(detail::inject_isolated_fault(
      dev.impl(), static_cast<std::uint16_t>(wire::fault_kind::kill_self))));
  REQUIRE(wait_restart(0));
  CHECK(dev.statistics().restarts_left == 0);
  const int pid2 = dev.statistics().worker_pid;
  CHECK(pid2 != pid1);
  CHECK(run(detail::inject_isolated_fault(
      dev.impl(), static_cast<std::uint16_t>(wire::fault_kind::kill_self))));
  REQUIRE(wait_health(health_state::stopped));
  auto st = dev.status();
  REQUIRE_FALSE(st);
  CHECK(st.error().code() == errc::device_unavailable);
  CHECK(st.error().message().find("budget") != std::string::npos);
  auto a = dev.allocate<float>(4);
  REQUIRE_FALSE(a);
  CHECK(pid_gone(pid1));
  CHECK(run_until([&] { return pid_gone(pid2); }, 5s));
}

TEST_CASE_FIXTURE(iso, "isolated: a worker killed while idle is restarted; work goes on") {
  open();
  auto blas = blas_actor::create(dev).value();
  const int pid = dev.statistics().worker_pid;
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(run_until([&] { return dev.health() != health_state::healthy; }, 10s));
  REQUIRE(wait_health(health_state::healthy));
  CHECK(pid_gone(pid));
  std::map<errc, int> errors;
  std::mutex mu;
  CHECK(run(checked_gemm(dev, blas, random_floats(n * n, 3), 4, errors, mu)) == 1);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: a timed-out download leaves its target untouched and parks its "
                  "arena block until the answer") {
  open();
  const std::size_t big = std::size_t{4} << 20;
  auto g = dev.allocate<std::uint32_t>(big).value();
  REQUIRE(run(fill_bytes(g, 0x11)));
  std::vector<std::uint32_t> out(big, 7);
  auto r = run(download(g, std::span<std::uint32_t>(out), {.how = event_poll{1us}}));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::timeout);
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint32_t v) { return v == 7; }));
  REQUIRE(run_until([&] {
    const auto s = dev.statistics();
    return s.parked == 0 && s.worker_calls_pending == 0;
  }));
  REQUIRE(run(download(g, std::span<std::uint32_t>(out))));
  CHECK(std::all_of(out.begin(), out.end(), [](std::uint32_t v) { return v == 0x11111111u; }));
}

TEST_CASE_FIXTURE(iso,
                  "isolated: 2000 random operations with a fault every ~200: the service keeps "
                  "working and every successful result is correct") {
  auto o = options();
  o.isolation.budget.max_restarts = 20;
  open(o);
  auto blas = blas_actor::create(dev).value();
  const auto b = random_floats(n * n, 42);
  std::map<errc, int> errors;
  std::mutex mu;
  std::atomic<int> done{0}, good{0}, wrong{0}, faults{0};
  std::atomic<int> left{8};
  for (int w = 0; w < 8; ++w)
    asio::co_spawn(
        ioc,
        [&, w]() -> asio::awaitable<void> {
          std::mt19937 rng(static_cast<unsigned>(w));
          for (int i = 0; i < 250; ++i) {
            const int k = done.fetch_add(1) + 1;
            if (k % 200 == 100) {
              ++faults;
              auto injected = co_await detail::inject_isolated_fault(
                  dev.impl(),
                  static_cast<std::uint16_t>(rng() % 2 ? wire::fault_kind::illegal_address
                                                       : wire::fault_kind::kill_self));
              (void)injected;  // an illegal address answers context_poisoned
            }
            int r = 0;
            switch (rng() % 3) {
              case 0:
                r = co_await checked_gemm(dev, blas, b, rng(), errors, mu);
                break;
              case 1: {  // a round trip through the arena
                std::vector<std::uint32_t> in(1000 + rng() % 5000), back(in.size());
                random_bytes(in.data(), in.size() * 4, rng());
                auto g = dev.allocate<std::uint32_t>(in.size());
                if (!g) {
                  std::lock_guard lk(mu);
                  ++errors[g.error().code()];
                  break;
                }
                auto u = co_await upload(in, g.value());
                auto d = u ? co_await download(g.value(), std::span<std::uint32_t>(back))
                           : result<void>(u.error());
                if (!d) {
                  std::lock_guard lk(mu);
                  ++errors[d.error().code()];
                } else {
                  r = in == back ? 1 : -1;
                }
                break;
              }
              default: {  // fill then copy
                auto x = dev.allocate<std::uint8_t>(4096);
                auto y = dev.allocate<std::uint8_t>(4096);
                if (!x || !y) break;
                std::vector<std::uint8_t> back(4096);
                const auto v = static_cast<unsigned char>(rng());
                auto f = co_await fill_bytes(x.value(), v);
                auto c = f ? co_await copy(x.value(), y.value())
                           : result<gpu_ref<std::uint8_t>>(f.error());
                auto d = c ? co_await download(y.value(), std::span<std::uint8_t>(back))
                           : result<void>(c.error());
                if (!d) {
                  std::lock_guard lk(mu);
                  ++errors[d.error().code()];
                } else {
                  r = std::all_of(back.begin(), back.end(), [&](auto e) { return e == v; }) ? 1
                                                                                            : -1;
                }
                break;
              }
            }
            if (r == 1) ++good;
            if (r == -1) ++wrong;
            // Failed fast during a restart: wait for the new worker (up to 10 s).
            for (int wait = 0; r == 0 && wait < 2000 && !dev.accepting(); ++wait) {
              asio::steady_timer t(ioc, 5ms);
              co_await t.async_wait(asio::use_awaitable);
            }
          }
          --left;
        },
        asio::detached);
  REQUIRE(run_threads(left));
  MESSAGE(good.load() << " of 2000 correct, " << faults.load() << " faults injected, "
                      << dev.statistics().worker_restarts << " restarts");
  for (auto [code, count] : errors) MESSAGE(count << " x " << to_string(code));
  CHECK(wrong == 0);
  CHECK(good > 1500);
  CHECK(faults >= 9);
  REQUIRE(wait_health(health_state::healthy));
  std::map<errc, int> after;
  CHECK(run(checked_gemm(dev, blas, b, 11, after, mu)) == 1);
  REQUIRE(run_until([&] {
    const auto s = dev.statistics();
    return s.worker_calls_pending == 0 && s.parked == 0;
  }));
  CHECK(dev.statistics().live_buffers == 0);
}

TEST_CASE_FIXTURE(iso,
                  "isolated: the service exits cleanly with a live, a dead and a restarting "
                  "worker; no process is left") {
  std::vector<int> pids;
  {  // live
    open();
    pids.push_back(dev.statistics().worker_pid);
    drop();
  }
  {  // dead: the budget spent
    auto o = options();
    o.isolation.budget.max_restarts = 0;
    open(o);
    REQUIRE(dev.statistics().restarts_left == 0);  // a new state, with these options
    pids.push_back(dev.statistics().worker_pid);
    ::kill(pids.back(), SIGKILL);
    REQUIRE(wait_health(health_state::stopped));
    drop();
  }
  {  // restarting: killed, then dropped before the new worker's hello
    open();
    pids.push_back(dev.statistics().worker_pid);
    ::kill(pids.back(), SIGKILL);
    REQUIRE(run_until([&] {
      const auto s = dev.statistics();
      return s.worker_pid != 0 && s.worker_pid != pids.back();
    }));
    pids.push_back(dev.statistics().worker_pid);
    drop();
  }
  for (int p : pids) {
    CAPTURE(p);
    CHECK(pid_gone(p));
  }
}

int main(int argc, char** argv) {
  // No CUDA call here: this process must never initialise CUDA. A GPU is
  // present when the driver says so in /proc.
  if (!std::filesystem::exists("/proc/driver/nvidia/version")) {
    std::printf("SKIP: the isolated GPU tests need an NVIDIA driver (/proc/driver/nvidia)\n");
    return 77;
  }
  const bool loaded_at_start = cuda_loaded();
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  std::printf("libcuda.so mapped into this process: at start %s, at the end %s\n",
              loaded_at_start ? "yes" : "no", cuda_loaded() ? "yes" : "no");
  if (const auto fds = nvidia_fds(); !fds.empty()) {
    std::printf("FAIL: the service process opened %s: it initialised CUDA\n", fds.front().c_str());
    return 1;
  }
  std::printf("the service process never opened an NVIDIA device file (CUDA not initialised)\n");
  return rc;
}
