// Shared command-line plumbing of the atomr-* samples: option parsing, exit
// statuses, opening the device (with the no-GPU message), running coroutines,
// timing statistics and a small table printer. Header-only; not part of the
// library's API.
#pragma once

#include <atomr/cuda.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace cli {

namespace asio = boost::asio;
namespace cuda = atomr::cuda;

// Exit statuses (sysexits.h values where one fits).
inline constexpr int exit_ok = 0;
inline constexpr int exit_error = 1;     // a library or CUDA error
inline constexpr int exit_mismatch = 2;  // a result failed its check
inline constexpr int exit_usage = 64;    // EX_USAGE
inline constexpr int exit_no_gpu = 69;   // EX_UNAVAILABLE

/// The help text's closing section, shared by every sample; `mismatch` says
/// what exit status 2 means for the program.
inline std::string exit_status_help(std::string_view mismatch) {
  return "Exit status:\n"
         "  0   success\n"
         "  1   a CUDA or library error (its message is printed)\n"
         "  2   " +
         std::string(mismatch) +
         "\n"
         "  64  bad command line (EX_USAGE)\n"
         "  69  no usable GPU at that ordinal (EX_UNAVAILABLE)\n";
}

/// printf into a std::string.
[[gnu::format(printf, 1, 2)]] inline std::string format(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::va_list again;
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, again);
  va_end(again);
  return s;
}

/// The program's name, and how it reports problems on stderr.
struct program {
  const char* name;

  /// "<name>: <what>" and the --help hint; yields exit_usage.
  int usage_error(std::string_view what) const {
    std::fprintf(stderr, "%s: %.*s\nTry '%s --help'.\n", name, static_cast<int>(what.size()),
                 what.data(), name);
    return exit_usage;
  }

  /// "<name>: <what> failed [<code>]: <message>".
  void error(std::string_view what, const cuda::gpu_error& e) const {
    const auto code = cuda::to_string(e.code());
    std::fprintf(stderr, "%s: %.*s failed [%.*s]: %s\n", name, static_cast<int>(what.size()),
                 what.data(), static_cast<int>(code.size()), code.data(), e.message().c_str());
  }

  /// A plain message on stderr: "<name>: <text>".
  void say(std::string_view text) const {
    std::fprintf(stderr, "%s: %.*s\n", name, static_cast<int>(text.size()), text.data());
  }
};

// ---------------------------------------------------------------------------
// Parsing values

/// The integer `s` spells, if it is one in [lo, hi] (no sign for unsigned, no spaces).
template <class Int>
std::optional<Int> parse_int(std::string_view s, Int lo, Int hi) {
  Int v{};
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc{} || p != end || v < lo || v > hi) return std::nullopt;
  return v;
}

inline constexpr std::string_view strategy_names = "event_poll, host_fn or blocking_sync";

/// A completion strategy by its name (event_poll, host_fn, blocking_sync).
inline std::optional<cuda::strategy> parse_strategy(std::string_view s) {
  for (auto k :
       {cuda::strategy::event_poll, cuda::strategy::host_fn, cuda::strategy::blocking_sync})
    if (s == cuda::to_string(k)) return k;
  return std::nullopt;
}

/// The completion value for a strategy, with its default settings.
inline cuda::completion completion_for(cuda::strategy s) {
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

/// Device options whose default completion is `s`, when given.
inline cuda::device_options device_options_for(std::optional<cuda::strategy> s) {
  cuda::device_options o;
  if (s) o.default_completion = completion_for(*s);
  return o;
}

/// The name of the strategy a device option set uses.
inline std::string strategy_name(const cuda::device_options& o) {
  return std::string(cuda::to_string(o.default_completion.kind));
}

// ---------------------------------------------------------------------------
// Parsing the command line

/// The options a program accepts, each bound to the variable it sets.
/// Accepted forms: `--name value`, `--name=value`, and `--flag` for flags;
/// `--help` (or `-h`) prints the usage on stdout.
class options {
public:
  using usage_fn = void (*)(std::FILE*);

  options(program prog, usage_fn usage) : prog_(prog), usage_(usage) {}

  /// An integer option in [lo, hi]; `expected` describes the range in the
  /// error message (default "lo..hi").
  template <class Int>
  options& integer(std::string name, Int& target, Int lo, Int hi, std::string expected = {}) {
    return add_integer<Int>(std::move(name), lo, hi, std::move(expected),
                            [&target](Int v) { target = v; });
  }

  /// As integer(), for an optional value (unset unless given).
  template <class Int>
  options& integer(std::string name, std::optional<Int>& target, Int lo, Int hi,
                   std::string expected = {}) {
    return add_integer<Int>(std::move(name), lo, hi, std::move(expected),
                            [&target](Int v) { target = v; });
  }

  /// A switch without a value: sets `target` to true.
  options& flag(std::string name, bool& target) {
    specs_.push_back({std::move(name), false, [&target](std::string_view) {
                        target = true;
                        return std::optional<std::string>{};
                      }});
    return *this;
  }

  /// A string option (any value).
  options& text(std::string name, std::string& target) {
    specs_.push_back({std::move(name), true, [&target](std::string_view v) {
                        target = std::string(v);
                        return std::optional<std::string>{};
                      }});
    return *this;
  }

  /// A completion strategy by name.
  options& strategy(std::string name, std::optional<cuda::strategy>& target) {
    specs_.push_back({std::move(name), true, [&target](std::string_view v) {
                        auto got = parse_strategy(v);
                        if (!got) return std::optional<std::string>(strategy_names);
                        target = *got;
                        return std::optional<std::string>{};
                      }});
    return *this;
  }

  /// One of a fixed set of names, each standing for a value.
  template <class T>
  options& choice(std::string name, T& target,
                  std::vector<std::pair<std::string_view, T>> choices) {
    std::string expected;
    for (std::size_t i = 0; i < choices.size(); ++i) {
      if (i) expected += i + 1 == choices.size() ? " or " : ", ";
      expected += choices[i].first;
    }
    specs_.push_back({std::move(name), true,
                      [&target, choices = std::move(choices),
                       expected](std::string_view v) -> std::optional<std::string> {
                        for (const auto& [n, value] : choices)
                          if (v == n) {
                            target = value;
                            return std::nullopt;
                          }
                        return expected;
                      }});
    return *this;
  }

  /// Sets the bound variables from argv. nullopt: go on; otherwise the exit
  /// status to end with (after --help, or after reporting a usage error).
  std::optional<int> parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        usage_(stdout);
        return exit_ok;
      }
      std::string_view name = arg, value;
      bool has_value = false;
      if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        has_value = true;
      }
      const spec* s = find(name);
      if (!s) return prog_.usage_error("unknown option '" + std::string(arg) + "'");
      if (!s->takes_value) {
        if (has_value) return prog_.usage_error("option '" + s->name + "' takes no value");
      } else if (!has_value) {
        if (i + 1 >= argc) return prog_.usage_error("option '" + s->name + "' needs a value");
        value = argv[++i];
      }
      if (auto expected = s->set(value))
        return prog_.usage_error("bad value '" + std::string(value) + "' for " + s->name +
                                 ": expected " + *expected);
    }
    return std::nullopt;
  }

private:
  struct spec {
    std::string name;
    bool takes_value;
    // Sets the target; on a bad value, yields what was expected instead.
    std::function<std::optional<std::string>(std::string_view)> set;
  };

  template <class Int>
  options& add_integer(std::string name, Int lo, Int hi, std::string expected,
                       std::function<void(Int)> store) {
    if (expected.empty()) expected = std::to_string(lo) + ".." + std::to_string(hi);
    specs_.push_back({std::move(name), true,
                      [lo, hi, expected = std::move(expected),
                       store = std::move(store)](std::string_view v) -> std::optional<std::string> {
                        auto got = parse_int<Int>(v, lo, hi);
                        if (!got) return expected;
                        store(*got);
                        return std::nullopt;
                      }});
    return *this;
  }

  const spec* find(std::string_view name) const {
    for (const auto& s : specs_)
      if (s.name == name) return &s;
    return nullptr;
  }

  program prog_;
  usage_fn usage_;
  std::vector<spec> specs_;
};

// ---------------------------------------------------------------------------
// Opening the device

/// A device, or the exit status to end with when there is none.
struct opened_device {
  std::optional<cuda::device> device;
  int status = exit_ok;  // exit_no_gpu or exit_error when `device` is empty
  explicit operator bool() const noexcept { return device.has_value(); }
};

/// Opens `ordinal`. Without a usable GPU prints why, then "would have
/// <would_have>", and yields exit_no_gpu; any other failure is printed and
/// yields exit_error.
inline opened_device open_device(const program& prog, const asio::any_io_executor& ex, int ordinal,
                                 const cuda::device_options& opts, std::string_view would_have) {
  auto opened = cuda::device::open(ex, ordinal, opts);
  if (opened) return {std::move(opened).value(), exit_ok};
  const auto& e = opened.error();
  if (e.code() == cuda::errc::device_unavailable) {
    std::fprintf(stderr, "%s: no usable GPU: %s\n", prog.name, e.message().c_str());
    std::fprintf(stderr, "%s: would have %.*s\n", prog.name, static_cast<int>(would_have.size()),
                 would_have.data());
    return {std::nullopt, exit_no_gpu};
  }
  prog.error("device::open", e);
  return {std::nullopt, exit_error};
}

// ---------------------------------------------------------------------------
// Running coroutines

/// Runs `ioc` on `threads` threads (the calling one included) until it has no
/// work left. False (after printing it) if a handler threw.
inline bool run_threads(const program& prog, asio::io_context& ioc, unsigned threads = 1) {
  std::atomic<bool> ok{true};
  auto body = [&] {
    try {
      ioc.run();
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "%s: exception: %s\n", prog.name, ex.what());
      ok = false;
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads > 1 ? threads - 1 : 0);
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
  return ok;
}

/// Prints an exception that ended a coroutine.
inline void report_exception(const program& prog, std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s: exception: %s\n", prog.name, ex.what());
  } catch (...) {
    std::fprintf(stderr, "%s: unknown exception\n", prog.name);
  }
}

/// Runs `task` on `ioc` to completion and yields its exit status, or
/// exit_error if it (or anything else on `ioc`) threw.
inline int run(const program& prog, asio::io_context& ioc, asio::awaitable<int> task,
               unsigned threads = 1) {
  std::atomic<int> status{exit_error};
  asio::co_spawn(ioc, std::move(task), [&](std::exception_ptr ep, int rc) {
    if (!ep) {
      status = rc;
      return;
    }
    report_exception(prog, ep);
    status = exit_error;
  });
  if (!run_threads(prog, ioc, threads)) return exit_error;
  return status;
}

// ---------------------------------------------------------------------------
// Timing

using clock_type = std::chrono::steady_clock;

inline double elapsed_ms(clock_type::time_point since) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - since).count();
}

inline double elapsed_us(clock_type::time_point since) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - since).count();
}

/// The median (mean of the two middle values for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/// The nearest-rank p-th percentile, 0 < p <= 100; 0 when empty.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

/// Bytes over microseconds as GB/s (1e9 bytes per second); 0 for no time.
inline double gb_per_s(double bytes, double us) {
  return us > 0 ? bytes / (us * 1e3) : 0.0;
}

// ---------------------------------------------------------------------------
// Tables

/// A table printed with a two-space indent: a left-aligned text column, then
/// right-aligned numeric columns, one space apart.
class table {
public:
  struct column {
    std::string header;
    int width;
    int precision = 0;  // digits after the point (numeric columns)
  };

  /// The first column holds the row labels; the others numbers.
  explicit table(std::vector<column> columns) : columns_(std::move(columns)) {}

  void row(std::string label, std::initializer_list<double> values) {
    rows_.push_back({std::move(label), std::vector<double>(values)});
  }

  void print(std::FILE* to = stdout) const {
    std::fprintf(to, " ");
    for (std::size_t c = 0; c < columns_.size(); ++c)
      std::fprintf(to, c == 0 ? " %-*s" : " %*s", columns_[c].width, columns_[c].header.c_str());
    std::fprintf(to, "\n");
    for (const auto& r : rows_) {
      std::fprintf(to, "  %-*s", columns_.empty() ? 0 : columns_[0].width, r.label.c_str());
      for (std::size_t c = 1; c < columns_.size() && c <= r.values.size(); ++c)
        std::fprintf(to, " %*.*f", columns_[c].width, columns_[c].precision, r.values[c - 1]);
      std::fprintf(to, "\n");
    }
  }

private:
  struct line {
    std::string label;
    std::vector<double> values;
  };
  std::vector<column> columns_;
  std::vector<line> rows_;
};

// ---------------------------------------------------------------------------
// Test data

/// A fast deterministic generator (splitmix64) for test inputs.
class splitmix {
public:
  explicit splitmix(std::uint64_t seed) noexcept : state_(seed) {}

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  /// Uniform in [-1, 1), exactly representable as a float (24 random bits).
  float symmetric() noexcept { return static_cast<float>(next() >> 40) * 0x1p-23f - 1.0f; }

private:
  std::uint64_t state_;
};

}  // namespace cli
