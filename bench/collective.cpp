// atomr-bench-collective (issue 22): collective_actor's all_reduce against a
// raw NCCL loop in the same run (same devices, same buffers, one wait per
// operation on both sides), sizes 8 KiB to 1 GiB; and placement throughput
// of sgemm 256 from 1 to N devices. Bus bandwidth is NCCL's convention:
// algbw x 2(n-1)/n (0 with one rank, where algbw is the figure to compare).
//
//   atomr-bench-collective [--min-bytes 8192] [--max-bytes 1073741824]
//                          [--reps 20] [--seconds 1] [--json FILE]
#include "bench.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cublas_v2.h>
#include <nccl.h>

#include <atomic>
#include <optional>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace atomr::cuda;

namespace {

bool nccl_ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, ncclGetErrorString(r));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  bench::args a(argc, argv, {});
  if (!a.unknown.empty()) {
    std::fprintf(stderr, "atomr-bench-collective: unknown argument %s\n", a.unknown[0].c_str());
    return 2;
  }
  bench::require_gpu("atomr-bench-collective");
  const std::size_t min_bytes = static_cast<std::size_t>(a.num("min-bytes", 8192));
  const std::size_t max_bytes = static_cast<std::size_t>(a.num("max-bytes", 1L << 30));
  const int reps = static_cast<int>(a.num("reps", 20));
  const double seconds = static_cast<double>(a.num("seconds", 1));

  asio::io_context io;
  auto set = device_set::open(io.get_executor()).value();
  const std::size_t n = set.size();
  auto actor = collective_actor::create(set);
  if (!actor) {
    std::fprintf(stderr, "collective_actor: %s\n", actor.error().message().c_str());
    return 1;
  }
  const auto nccl = actor.value();
  std::printf("devices: %zu x %s, NCCL %llu\n", n, bench::device_name().c_str(),
              static_cast<unsigned long long>(nccl.statistics().nccl_version));

  // The raw side: its own communicator and streams, the same buffers.
  std::vector<int> ordinals;
  for (std::size_t r = 0; r < n; ++r) ordinals.push_back(set[r].ordinal());
  std::vector<ncclComm_t> comms(n);
  if (!nccl_ok(ncclCommInitAll(comms.data(), static_cast<int>(n), ordinals.data()),
               "ncclCommInitAll"))
    return 1;
  std::vector<cudaStream_t> streams(n);
  for (std::size_t r = 0; r < n; ++r) {
    cudaSetDevice(ordinals[r]);
    cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
  }

  std::vector<bench::json> rows;
  std::printf("%12s %10s %10s %10s %10s %10s %10s %7s\n", "bytes", "lib_us", "raw_us", "lib_algbw",
              "raw_algbw", "lib_busbw", "raw_busbw", "ratio");
  const double bus = n > 1 ? 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) : 0.0;
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<gpu_ref<float>> send, recv;
    for (std::size_t r = 0; r < n; ++r) {
      send.push_back(set[r].allocate<float>(count).value());
      recv.push_back(set[r].allocate<float>(count).value());
      if (!bench::run_one(io, fill_bytes(send[r], 0))) return 1;
    }
    const int iters = bytes >= (std::size_t{256} << 20) ? std::max(5, reps / 4) : reps;
    std::vector<double> lib, raw;
    for (int i = 0; i < iters + 3; ++i) {
      const double t0 = bench::now_us();
      auto r = bench::run_one(io, nccl.all_reduce(send, recv));
      const double t1 = bench::now_us();
      if (!r) {
        std::fprintf(stderr, "all_reduce: %s\n", r.error().message().c_str());
        return 1;
      }
      if (i >= 3) lib.push_back(t1 - t0);
    }
    std::vector<float*> sp, rp;
    for (std::size_t r = 0; r < n; ++r) {
      sp.push_back(send[r].unsafe_data().value());
      rp.push_back(recv[r].unsafe_data().value());
    }
    for (int i = 0; i < iters + 3; ++i) {
      const double t0 = bench::now_us();
      ncclGroupStart();
      for (std::size_t r = 0; r < n; ++r)
        ncclAllReduce(sp[r], rp[r], count, ncclFloat32, ncclSum, comms[r], streams[r]);
      if (!nccl_ok(ncclGroupEnd(), "ncclGroupEnd")) return 1;
      for (std::size_t r = 0; r < n; ++r) cudaStreamSynchronize(streams[r]);
      const double t1 = bench::now_us();
      if (i >= 3) raw.push_back(t1 - t0);
    }
    const auto ls = bench::summarize(lib), rs = bench::summarize(raw);
    const double lib_alg = static_cast<double>(bytes) / ls.median / 1e3;  // GB/s
    const double raw_alg = static_cast<double>(bytes) / rs.median / 1e3;
    std::printf("%12zu %10.1f %10.1f %10.2f %10.2f %10.2f %10.2f %7.3f\n", bytes, ls.median,
                rs.median, lib_alg, raw_alg, lib_alg * bus, raw_alg * bus,
                raw_alg > 0 ? lib_alg / raw_alg : 0);
    rows.push_back(bench::json::object({{"kind", "all_reduce"},
                                        {"ranks", n},
                                        {"bytes", bytes},
                                        {"lib_us", bench::json::of(ls)},
                                        {"raw_us", bench::json::of(rs)},
                                        {"lib_algbw_gbs", lib_alg},
                                        {"raw_algbw_gbs", raw_alg},
                                        {"lib_busbw_gbs", lib_alg * bus},
                                        {"raw_busbw_gbs", raw_alg * bus},
                                        {"ratio", raw_alg > 0 ? lib_alg / raw_alg : 0.0}}));
  }
  for (std::size_t r = 0; r < n; ++r) ncclCommDestroy(comms[r]);

  // Placement: sgemm 256 from coroutines placed over the first k devices.
  std::printf("\nplacement, sgemm 256, %g s per point\n%8s %12s %10s\n", seconds, "devices",
              "ops_per_s", "scaling");
  double one = 0;
  for (std::size_t k = 1; k <= n; ++k) {
    device_set_options o;
    for (std::size_t r = 0; r < k; ++r) o.ordinals.push_back(ordinals[r]);
    auto sub = device_set::open(io.get_executor(), o).value();
    placed_actors<blas_actor, blas_options> blas(sub, {});
    const int per_device = 16, m = 256;
    std::atomic<std::uint64_t> ops{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    // The coroutines run on the io_context the devices were opened with (their
    // completions are delivered there), on several threads, as a service runs.
    io.restart();
    auto guard = asio::make_work_guard(io);
    for (std::size_t c = 0; c < k * per_device; ++c) {
      auto actor = blas.at(c % k).value();
      auto d = actor.get_device();
      auto ga = d.allocate<float>(m * m).value(), gb = d.allocate<float>(m * m).value(),
           gc = d.allocate<float>(m * m).value();
      asio::co_spawn(
          io,
          [&, actor, ga, gb, gc]() -> asio::awaitable<void> {
            gemm_params p;
            p.m = p.n = p.k = m;
            while (!stop.load(std::memory_order_relaxed)) {
              auto r = co_await actor.gemm(p, ga, gb, gc);
              if (!r) break;
              ops.fetch_add(1, std::memory_order_relaxed);
            }
          },
          asio::detached);
    }
    const unsigned nthreads = static_cast<unsigned>(std::min<std::size_t>(4 * k, 16));
    for (unsigned t = 0; t < nthreads; ++t) threads.emplace_back([&] { io.run(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // warm-up
    const auto before = ops.load();
    const double t0 = bench::now_us();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    const double per_s = static_cast<double>(ops.load() - before) / ((bench::now_us() - t0) / 1e6);
    stop = true;
    guard.reset();
    for (auto& t : threads) t.join();
    if (k == 1) one = per_s;
    const double scaling = one > 0 ? per_s / (one * static_cast<double>(k)) : 0;
    std::printf("%8zu %12.0f %10.3f\n", k, per_s, scaling);
    rows.push_back(bench::json::object({{"kind", "placement_sgemm256"},
                                        {"devices", k},
                                        {"ops_per_s", per_s},
                                        {"scaling_vs_k_x_one", scaling}}));
  }
  const auto doc = bench::json::object({{"bench", "collective"},
                                        {"device", bench::device_name()},
                                        {"devices", n},
                                        {"date", bench::utc_now()},
                                        {"rows", bench::json::array(rows)}});
  return bench::write_json(a.get("json"), doc) ? 0 : 1;
}
