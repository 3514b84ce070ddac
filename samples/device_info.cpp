// atomr-device-info: prints what a GPU is and times a verified host <-> device round trip.
//
// Every step is an awaitable from atomr/cuda.hpp, run in one coroutine on a
// single-threaded asio::io_context: an upload from pageable memory, a
// device-to-device copy, and downloads into pinned and pageable memory. The
// data comes back bit-exact or the program says where it did not.

#include "cli.hpp"

#include <atomr/cuda.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;
using cli::exit_error;
using cli::exit_mismatch;
using cli::exit_ok;

constexpr cli::program prog{"atomr-device-info"};

constexpr std::size_t max_mib = std::size_t{1} << 20;  // 1 TiB: far beyond any GPU, no overflow
constexpr unsigned max_reps = 100000;

struct cli_options {
  int device = 0;
  std::size_t mib = 64;
  unsigned reps = 5;
  std::optional<cuda::strategy> strategy;  // unset: the device default
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "Usage: %s [--device N] [--mib M] [--reps R] [--strategy S]\n"
               "\n"
               "Prints the properties and memory of a CUDA device, then times R round trips\n"
               "of M MiB of floats: upload from pageable memory, device-to-device copy,\n"
               "download into pinned memory and into pageable memory. Every round trip is\n"
               "checked bit for bit against the data sent.\n"
               "\n"
               "Options:\n"
               "  --device N    device ordinal (default 0)\n"
               "  --mib M       transfer size in MiB, 1..%zu (default 64)\n"
               "  --reps R      round trips, 1..%u (default 5)\n"
               "  --strategy S  completion strategy: event_poll, host_fn or blocking_sync\n"
               "                (default: the device default, event_poll)\n"
               "  --help        print this help and exit\n"
               "Options also take the form --name=value.\n"
               "\n"
               "%s",
               prog.name, max_mib, max_reps,
               cli::exit_status_help("the data read back differs from the data sent").c_str());
}

// Fills `out` from argv, or yields the exit status to end with.
std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  return cli::options(prog, print_usage)
      .integer("--device", out.device, 0, std::numeric_limits<int>::max(), "an ordinal >= 0")
      .integer("--mib", out.mib, std::size_t{1}, max_mib)
      .integer("--reps", out.reps, 1u, max_reps)
      .strategy("--strategy", out.strategy)
      .parse(argc, argv);
}

double mib_of(std::size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// A deterministic, non-trivial pattern: hashed index and round, spread over
// many binades and both signs. Always finite, so never equal to the 0xFF..
// (NaN) fill the destinations get before each round.
float pattern(std::size_t i, unsigned rep) {
  std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull +
                    (static_cast<std::uint64_t>(rep) + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  const float unit = static_cast<float>(x >> 40) * 0x1p-24f;  // 24 bits: exact, in [0, 1)
  const int exponent = static_cast<int>((x >> 8) & 31u) - 16;
  return std::ldexp(2.0f * unit - 1.0f, exponent);
}

// Index of the first element whose bits differ, if any.
std::optional<std::size_t> first_difference(std::span<const float> want,
                                            std::span<const float> got) {
  if (std::memcmp(want.data(), got.data(), want.size_bytes()) == 0) return std::nullopt;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0) return i;
  return std::nullopt;
}

bool verify(std::string_view where, unsigned rep, std::span<const float> want,
            std::span<const float> got) {
  auto at = first_difference(want, got);
  if (!at) return true;
  std::uint32_t wb = 0, gb = 0;
  std::memcpy(&wb, &want[*at], sizeof wb);
  std::memcpy(&gb, &got[*at], sizeof gb);
  std::fprintf(stderr,
               "%s: MISMATCH in round %u, %.*s: element %zu is %a (0x%08x), expected %a "
               "(0x%08x)\n",
               prog.name, rep + 1, static_cast<int>(where.size()), where.data(), *at,
               static_cast<double>(got[*at]), static_cast<unsigned>(gb),
               static_cast<double>(want[*at]), static_cast<unsigned>(wb));
  return false;
}

void print_properties(const cuda::device& dev) {
  cudaDeviceProp prop{};
  if (auto st = cudaGetDeviceProperties(&prop, dev.ordinal()); st != cudaSuccess) {
    cudaGetLastError();
    std::printf("device %d: (cudaGetDeviceProperties failed: %s)\n", dev.ordinal(),
                cudaGetErrorString(st));
  } else {
    std::printf("device %d: %s\n", dev.ordinal(), prop.name);
    std::printf("  compute capability  %d.%d\n", prop.major, prop.minor);
    std::printf("  multiprocessors     %d\n", prop.multiProcessorCount);
    std::printf("  L2 cache            %.1f MiB\n",
                mib_of(static_cast<std::size_t>(prop.l2CacheSize)));
    std::printf("  memory bus          %d bits\n", prop.memoryBusWidth);
    std::printf("  copy engines        %d\n", prop.asyncEngineCount);
    std::printf("  PCI                 %04x:%02x:%02x\n", static_cast<unsigned>(prop.pciDomainID),
                static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
  }
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) cudaGetLastError();
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) cudaGetLastError();
  std::printf("  driver / runtime    %d.%d / %d.%d\n", driver / 1000, driver % 1000 / 10,
              runtime / 1000, runtime % 1000 / 10);

  const auto s = dev.statistics();
  std::printf("  memory              %.0f MiB total, %.0f MiB free\n", mib_of(s.total_bytes),
              mib_of(s.free_bytes));
  const auto how = dev.options().default_completion.kind;
  const auto hs = cuda::to_string(s.health);
  const auto ws = cuda::to_string(how);
  std::printf("  health              %.*s (generation %llu)\n", static_cast<int>(hs.size()),
              hs.data(), static_cast<unsigned long long>(s.generation));
  std::printf("  completion          %.*s\n", static_cast<int>(ws.size()), ws.data());
}

void print_statistics(const cuda::device& dev) {
  const auto s = dev.statistics();
  std::printf("\nstatistics:\n");
  std::printf("  ops completed       %llu\n", static_cast<unsigned long long>(s.ops_completed));
  std::printf("  ops failed          %llu\n", static_cast<unsigned long long>(s.ops_failed));
  std::printf("  ops in flight       %llu\n", static_cast<unsigned long long>(s.ops_in_flight));
  std::printf("  live buffers        %llu\n", static_cast<unsigned long long>(s.live_buffers));
  std::printf("  parked              %llu\n", static_cast<unsigned long long>(s.parked));
  std::printf("  events created      %llu\n", static_cast<unsigned long long>(s.events_created));
  std::printf("  pinned cached       %.1f MiB\n", mib_of(s.pinned_cached_bytes));
  std::printf("  faults / OOM        %llu / %llu\n", static_cast<unsigned long long>(s.faults),
              static_cast<unsigned long long>(s.out_of_memory));
}

struct step_times {
  const char* name;
  std::vector<double> ms;
};

using cli::clock_type;
using cli::elapsed_ms;

// The timed round trips. Yields the exit status.
asio::awaitable<int> round_trips(cuda::device dev, cli_options args) {
  const std::size_t count = args.mib * (std::size_t{1} << 20) / sizeof(float);
  const std::size_t bytes = count * sizeof(float);

  auto src = dev.allocate<float>(count);
  if (!src) {
    prog.error("allocate<float> (source buffer)", src.error());
    co_return exit_error;
  }
  auto dst = dev.allocate<float>(count);
  if (!dst) {
    prog.error("allocate<float> (copy buffer)", dst.error());
    co_return exit_error;
  }
  auto pinned = dev.allocate_pinned<float>(count);
  if (!pinned) {
    prog.error("allocate_pinned<float>", pinned.error());
    co_return exit_error;
  }
  std::vector<float> sent(count), pageable(count);

  std::vector<step_times> steps{{"upload   pageable -> device", {}},
                                {"copy     device   -> device", {}},
                                {"download device   -> pinned", {}},
                                {"download device   -> pageable", {}}};
  for (auto& s : steps) s.ms.reserve(args.reps);

  std::printf("\nround trips: %u x %zu MiB (%zu floats)\n", args.reps, args.mib, count);
  for (unsigned rep = 0; rep < args.reps; ++rep) {
    for (std::size_t i = 0; i < count; ++i) sent[i] = pattern(i, rep);
    // Poison the host destinations so a stale round cannot pass for this one.
    std::memset(static_cast<void*>(pinned.value().data()), 0xFF, bytes);
    std::memset(static_cast<void*>(pageable.data()), 0xFF, bytes);

    auto t0 = clock_type::now();
    auto up = co_await cuda::upload(std::span<const float>(sent), src.value());
    steps[0].ms.push_back(elapsed_ms(t0));
    if (!up) {
      prog.error("upload", up.error());
      co_return exit_error;
    }

    t0 = clock_type::now();
    auto copied = co_await cuda::copy(up.value(), dst.value());
    steps[1].ms.push_back(elapsed_ms(t0));
    if (!copied) {
      prog.error("copy", copied.error());
      co_return exit_error;
    }

    t0 = clock_type::now();
    auto down = co_await cuda::download(copied.value(), pinned.value());
    steps[2].ms.push_back(elapsed_ms(t0));
    if (!down) {
      prog.error("download (pinned)", down.error());
      co_return exit_error;
    }

    t0 = clock_type::now();
    auto down_pageable = co_await cuda::download(copied.value(), std::span<float>(pageable));
    steps[3].ms.push_back(elapsed_ms(t0));
    if (!down_pageable) {
      prog.error("download (pageable)", down_pageable.error());
      co_return exit_error;
    }

    if (!verify("pinned download", rep, sent, down.value().span()) ||
        !verify("pageable download", rep, sent, pageable))
      co_return exit_mismatch;
    std::printf("  round %u: ok (%.2f ms)\n", rep + 1,
                steps[0].ms.back() + steps[1].ms.back() + steps[2].ms.back() + steps[3].ms.back());
  }

  cli::table t({{"step", 31}, {"MiB", 9, 1}, {"median ms", 11, 3}, {"GB/s", 9, 2}});
  for (const auto& s : steps) {
    const double ms = cli::median(s.ms);
    t.row(s.name, {mib_of(bytes), ms, cli::gb_per_s(static_cast<double>(bytes), ms * 1e3)});
  }
  std::printf("\n");
  t.print();
  std::printf(
      "  (bytes moved once per step; pageable steps include the host copy through a\n"
      "   pinned staging buffer; GB/s = 1e9 bytes per second)\n");
  std::printf("  all %u rounds bit-exact\n", args.reps);
  co_return exit_ok;
}

int run(const cli_options& args) {
  asio::io_context ioc;

  const cuda::device_options opts = cli::device_options_for(args.strategy);
  // Declared after the io_context so the device (whose timers live on it) goes first.
  auto opened = cli::open_device(
      prog, ioc.get_executor(), args.device, opts,
      cli::format("printed device %d's properties and timed %u round trips of %zu MiB (upload, "
                  "device copy, pinned and pageable download) with the %s strategy",
                  args.device, args.reps, args.mib, cli::strategy_name(opts).c_str()));
  if (!opened) return opened.status;
  const cuda::device& dev = *opened.device;

  print_properties(dev);
  const int status = cli::run(prog, ioc, round_trips(dev, args));
  print_statistics(dev);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  cli_options args;
  if (auto done = parse_args(argc, argv, args)) return *done;
  return run(args);
}
