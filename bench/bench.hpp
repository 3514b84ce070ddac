// Shared pieces of the atomr-bench-* programs: command line, statistics,
// CPU-time clocks, a tiny JSON writer and the no-GPU exit. Header-only; not
// part of the library's API. Every benchmark prints a human table on stdout
// and, with --json FILE, writes its full results there.
#pragma once

#include <atomr/cuda.hpp>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <cuda_runtime_api.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bench {

inline constexpr int exit_no_gpu = 69;  // EX_UNAVAILABLE, as the samples

/// Runs `aw` to completion on `ioc` from this thread and yields its value
/// (rethrows its exception); the io_context is stopped when it is done, so
/// work it left behind (a parked keep-alive, a monitor tick) stays queued.
template <class T>
T run_one(boost::asio::io_context& ioc, boost::asio::awaitable<T> aw) {
  std::optional<T> out;
  std::exception_ptr err;
  boost::asio::co_spawn(
      ioc, [&]() -> boost::asio::awaitable<void> { out.emplace(co_await std::move(aw)); },
      [&](std::exception_ptr e) {
        err = e;
        ioc.stop();
      });
  ioc.restart();
  ioc.run();
  if (err) std::rethrow_exception(err);
  return std::move(*out);
}

/// Order statistics of a sample, in the sample's unit.
struct stats {
  double median = 0, p99 = 0, mean = 0, min = 0, max = 0;
  std::size_t n = 0;
};

/// Nearest-rank percentiles (p99 of 1000 values is the 990th smallest).
inline stats summarize(std::vector<double> v) {
  stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto rank = [&](double p) {
    auto k = static_cast<std::size_t>(p * static_cast<double>(v.size()) + 0.999999);
    return v[std::clamp<std::size_t>(k, 1, v.size()) - 1];
  };
  s.median = rank(0.5);
  s.p99 = rank(0.99);
  s.min = v.front();
  s.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

/// Wall clock in microseconds since an arbitrary origin.
inline double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// CPU time (user + system) of the calling thread, in microseconds.
inline double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

/// CPU time (user + system) of the whole process, all threads, in microseconds
/// (includes the CUDA driver's own threads).
inline double process_cpu_us() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto us = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec);
  };
  return us(u.ru_utime) + us(u.ru_stime);
}

/// A JSON value built by hand (objects keep insertion order). Enough for
/// numbers, strings, booleans, arrays and objects.
class json {
public:
  json() : text_("null") {}
  json(double x) {  // NOLINT: implicit on purpose
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", x);
    text_ = b;
  }
  json(int x) : json(static_cast<double>(x)) {}
  json(long x) : json(static_cast<double>(x)) {}
  json(long long x) : json(static_cast<double>(x)) {}
  json(unsigned x) : json(static_cast<double>(x)) {}
  json(unsigned long x) : json(static_cast<double>(x)) {}
  json(unsigned long long x) : json(static_cast<double>(x)) {}
  json(bool b) : text_(b ? "true" : "false") {}
  json(const char* s) : json(std::string_view(s)) {}
  json(const std::string& s) : json(std::string_view(s)) {}
  json(std::string_view s) {
    text_ = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        text_ += '\\';
        text_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", c);
        text_ += b;
      } else {
        text_ += c;
      }
    }
    text_ += '"';
  }
  static json object(std::initializer_list<std::pair<std::string_view, json>> kv) {
    json j;
    j.text_ = "{";
    bool first = true;
    for (auto& [k, v] : kv) {
      if (!first) j.text_ += ", ";
      first = false;
      j.text_ += json(k).text_ + ": " + v.text_;
    }
    j.text_ += "}";
    return j;
  }
  static json array(const std::vector<json>& xs) {
    json j;
    j.text_ = "[";
    for (std::size_t i = 0; i < xs.size(); ++i) j.text_ += (i ? ",\n  " : "\n  ") + xs[i].text_;
    j.text_ += xs.empty() ? "]" : "\n]";
    return j;
  }
  static json of(const stats& s) {
    return object({{"median", s.median},
                   {"p99", s.p99},
                   {"mean", s.mean},
                   {"min", s.min},
                   {"max", s.max},
                   {"n", s.n}});
  }
  const std::string& str() const noexcept { return text_; }

private:
  std::string text_;
};

/// The device's name and the date, for the JSON header.
inline std::string device_name(int ordinal = 0) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, ordinal) != cudaSuccess) return "unknown";
  return p.name;
}

inline std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}

/// The items of a comma-separated option value, in order ("a,,b" has an
/// empty middle item; "" is one empty item).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t at = 0;;) {
    const auto comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

/// Writes `j` to `path` (when one was given); returns false on failure.
inline bool write_json(const std::string& path, const json& j) {
  if (path.empty()) return true;
  std::ofstream f(path);
  f << j.str() << "\n";
  return static_cast<bool>(f);
}

/// Makes stdout line-buffered; exits 69 with the CUDA message when there is no
/// usable GPU.
inline void require_gpu(const char* prog) {
  // Line by line even into a pipe: a bench stopped by a timeout keeps the
  // rows it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int n = 0;
  if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    std::fprintf(stderr, "%s: no usable GPU (%s); nothing to measure\n", prog,
                 e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    std::exit(exit_no_gpu);
  }
}

/// `--name value` / `--name=value` options and `--flag`s; anything unknown is
/// an error reported by the caller.
struct args {
  std::map<std::string, std::string> kv;
  std::vector<std::string> unknown;
  args(int argc, char** argv, std::initializer_list<std::string_view> flags) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        unknown.push_back(a);
        continue;
      }
      auto eq = a.find('=');
      std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) {
        kv[name] = a.substr(eq + 1);
      } else if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
        kv[name] = "1";
      } else if (i + 1 < argc) {
        kv[name] = argv[++i];
      } else {
        unknown.push_back(a);
      }
    }
  }
  std::string get(const std::string& k, std::string def = {}) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  }
  long num(const std::string& k, long def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : std::strtol(it->second.c_str(), nullptr, 10);
  }
  bool has(const std::string& k) const { return kv.count(k) != 0; }
};

}  // namespace bench
