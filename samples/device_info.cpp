// atomr-device-info: prints what a GPU is and times a verified host <-> device round trip.
//
// Every step is an awaitable from atomr/cuda.hpp, run in one coroutine on a
// single-threaded asio::io_context: an upload from pageable memory, a
// device-to-device copy, and downloads into pinned and pageable memory. The
// data comes back bit-exact or the program says where it did not.

#include <atomr/cuda.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;

constexpr const char* prog = "atomr-device-info";

// Exit statuses (sysexits.h values where one fits).
constexpr int exit_ok = 0;
constexpr int exit_error = 1;     // a library or CUDA error
constexpr int exit_mismatch = 2;  // data came back different
constexpr int exit_usage = 64;    // EX_USAGE
constexpr int exit_no_gpu = 69;   // EX_UNAVAILABLE

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
               "Exit status:\n"
               "  0   success\n"
               "  1   a CUDA or library error (its message is printed)\n"
               "  2   the data read back differs from the data sent\n"
               "  64  bad command line (EX_USAGE)\n"
               "  69  no usable GPU at that ordinal (EX_UNAVAILABLE)\n",
               prog, max_mib, max_reps);
}

template <class Int>
std::optional<Int> parse_int(std::string_view s, Int lo, Int hi) {
  Int v{};
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc{} || p != end || v < lo || v > hi) return std::nullopt;
  return v;
}

std::optional<cuda::strategy> parse_strategy(std::string_view s) {
  for (auto k :
       {cuda::strategy::event_poll, cuda::strategy::host_fn, cuda::strategy::blocking_sync})
    if (s == cuda::to_string(k)) return k;
  return std::nullopt;
}

cuda::completion completion_for(cuda::strategy s) {
  switch (s) {
    case cuda::strategy::host_fn:
      return cuda::host_fn{};
    case cuda::strategy::blocking_sync:
      return cuda::blocking_sync{};
    case cuda::strategy::event_poll:
      break;
  }
  return cuda::event_poll{};
}

// Fills `out` from argv, or prints why not and returns the exit status.
std::optional<int> parse_args(int argc, char** argv, cli_options& out) {
  auto bad = [](std::string_view what) {
    std::fprintf(stderr, "%s: %.*s\nTry '%s --help'.\n", prog, static_cast<int>(what.size()),
                 what.data(), prog);
    return exit_usage;
  };
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      return exit_ok;
    }
    std::string_view name = arg, value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (name != "--device" && name != "--mib" && name != "--reps" && name != "--strategy")
      return bad("unknown option '" + std::string(arg) + "'");
    if (!has_value) {
      if (i + 1 >= argc) return bad("option '" + std::string(name) + "' needs a value");
      value = argv[++i];
    }
    const std::string shown = "'" + std::string(value) + "' for " + std::string(name);
    if (name == "--device") {
      auto v = parse_int<int>(value, 0, std::numeric_limits<int>::max());
      if (!v) return bad("bad value " + shown + ": expected an ordinal >= 0");
      out.device = *v;
    } else if (name == "--mib") {
      auto v = parse_int<std::size_t>(value, 1, max_mib);
      if (!v) return bad("bad value " + shown + ": expected 1.." + std::to_string(max_mib));
      out.mib = *v;
    } else if (name == "--reps") {
      auto v = parse_int<unsigned>(value, 1, max_reps);
      if (!v) return bad("bad value " + shown + ": expected 1.." + std::to_string(max_reps));
      out.reps = *v;
    } else {
      auto v = parse_strategy(value);
      if (!v) return bad("bad value " + shown + ": expected event_poll, host_fn or blocking_sync");
      out.strategy = *v;
    }
  }
  return std::nullopt;
}

void print_error(std::string_view what, const cuda::gpu_error& e) {
  const auto code = cuda::to_string(e.code());
  std::fprintf(stderr, "%s: %.*s failed [%.*s]: %s\n", prog, static_cast<int>(what.size()),
               what.data(), static_cast<int>(code.size()), code.data(), e.message().c_str());
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
               prog, rep + 1, static_cast<int>(where.size()), where.data(), *at,
               static_cast<double>(got[*at]), static_cast<unsigned>(gb),
               static_cast<double>(want[*at]), static_cast<unsigned>(wb));
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
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

using clock_type = std::chrono::steady_clock;

double elapsed_ms(clock_type::time_point since) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - since).count();
}

// The timed round trips. Yields the exit status.
asio::awaitable<int> round_trips(cuda::device dev, cli_options cli) {
  const std::size_t count = cli.mib * (std::size_t{1} << 20) / sizeof(float);
  const std::size_t bytes = count * sizeof(float);

  auto src = dev.allocate<float>(count);
  if (!src) {
    print_error("allocate<float> (source buffer)", src.error());
    co_return exit_error;
  }
  auto dst = dev.allocate<float>(count);
  if (!dst) {
    print_error("allocate<float> (copy buffer)", dst.error());
    co_return exit_error;
  }
  auto pinned = dev.allocate_pinned<float>(count);
  if (!pinned) {
    print_error("allocate_pinned<float>", pinned.error());
    co_return exit_error;
  }
  std::vector<float> sent(count), pageable(count);

  std::vector<step_times> steps{{"upload   pageable -> device", {}},
                                {"copy     device   -> device", {}},
                                {"download device   -> pinned", {}},
                                {"download device   -> pageable", {}}};
  for (auto& s : steps) s.ms.reserve(cli.reps);

  std::printf("\nround trips: %u x %zu MiB (%zu floats)\n", cli.reps, cli.mib, count);
  for (unsigned rep = 0; rep < cli.reps; ++rep) {
    for (std::size_t i = 0; i < count; ++i) sent[i] = pattern(i, rep);
    // Poison the host destinations so a stale round cannot pass for this one.
    std::memset(static_cast<void*>(pinned.value().data()), 0xFF, bytes);
    std::memset(static_cast<void*>(pageable.data()), 0xFF, bytes);

    auto t0 = clock_type::now();
    auto up = co_await cuda::upload(std::span<const float>(sent), src.value());
    steps[0].ms.push_back(elapsed_ms(t0));
    if (!up) {
      print_error("upload", up.error());
      co_return exit_error;
    }

    t0 = clock_type::now();
    auto copied = co_await cuda::copy(up.value(), dst.value());
    steps[1].ms.push_back(elapsed_ms(t0));
    if (!copied) {
      print_error("copy", copied.error());
      co_return exit_error;
    }

    t0 = clock_type::now();
    auto down = co_await cuda::download(copied.value(), pinned.value());
    steps[2].ms.push_back(elapsed_ms(t0));
    if (!down) {
      print_error("download (pinned)", down.error());
      co_return exit_error;
    }

    t0 = clock_type::now();
    auto down_pageable = co_await cuda::download(copied.value(), std::span<float>(pageable));
    steps[3].ms.push_back(elapsed_ms(t0));
    if (!down_pageable) {
      print_error("download (pageable)", down_pageable.error());
      co_return exit_error;
    }

    if (!verify("pinned download", rep, sent, down.value().span()) ||
        !verify("pageable download", rep, sent, pageable))
      co_return exit_mismatch;
    std::printf("  round %u: ok (%.2f ms)\n", rep + 1,
                steps[0].ms.back() + steps[1].ms.back() + steps[2].ms.back() + steps[3].ms.back());
  }

  std::printf("\n  %-31s %9s %11s %9s\n", "step", "MiB", "median ms", "GB/s");
  for (const auto& s : steps) {
    const double ms = median(s.ms);
    const double gbps = ms > 0 ? static_cast<double>(bytes) / (ms * 1e6) : 0.0;
    std::printf("  %-31s %9.1f %11.3f %9.2f\n", s.name, mib_of(bytes), ms, gbps);
  }
  std::printf(
      "  (bytes moved once per step; pageable steps include the host copy through a\n"
      "   pinned staging buffer; GB/s = 1e9 bytes per second)\n");
  std::printf("  all %u rounds bit-exact\n", cli.reps);
  co_return exit_ok;
}

int run(const cli_options& cli) {
  asio::io_context ioc;

  cuda::device_options opts;
  if (cli.strategy) opts.default_completion = completion_for(*cli.strategy);

  // Declared after the io_context so the device (whose timers live on it) goes first.
  auto opened = cuda::device::open(ioc.get_executor(), cli.device, opts);
  if (!opened) {
    const auto& e = opened.error();
    if (e.code() == cuda::errc::device_unavailable) {
      const auto ws = cuda::to_string(opts.default_completion.kind);
      std::fprintf(stderr, "%s: no usable GPU: %s\n", prog, e.message().c_str());
      std::fprintf(stderr,
                   "%s: would have printed device %d's properties and timed %u round trips of "
                   "%zu MiB (upload, device copy, pinned and pageable download) with the %.*s "
                   "strategy\n",
                   prog, cli.device, cli.reps, cli.mib, static_cast<int>(ws.size()), ws.data());
      return exit_no_gpu;
    }
    print_error("device::open", e);
    return exit_error;
  }
  const cuda::device& dev = opened.value();

  print_properties(dev);

  int status = exit_error;
  asio::co_spawn(ioc, round_trips(dev, cli), [&](std::exception_ptr ep, int rc) {
    if (!ep) {
      status = rc;
      return;
    }
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s: exception: %s\n", prog, ex.what());
    } catch (...) {
      std::fprintf(stderr, "%s: unknown exception\n", prog);
    }
    status = exit_error;
  });
  try {
    ioc.run();
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s: exception: %s\n", prog, ex.what());
    status = exit_error;
  }

  print_statistics(dev);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  cli_options cli;
  if (auto done = parse_args(argc, argv, cli)) return *done;
  return run(cli);
}
