// Text helpers for atomr-serve's tests: strict UTF-8 (RFC 3629), written
// independently of samples/serve/json.hpp (whose output it judges), and
// bytes made printable for failure messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace serve_test {

/// True if `s` is strict UTF-8: no overlong forms, surrogates or code
/// points past U+10FFFF.
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::uint32_t cp = 0;
    std::size_t n = 0;
    if (b < 0x80) {
      ++i;
      continue;
    }
    if ((b & 0xe0) == 0xc0) {
      n = 2;
      cp = b & 0x1f;
    } else if ((b & 0xf0) == 0xe0) {
      n = 3;
      cp = b & 0x0f;
    } else if ((b & 0xf8) == 0xf0) {
      n = 4;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    static constexpr std::uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return false;
    i += n;
  }
  return true;
}

/// `s` with bytes outside printable ASCII as \xNN (for failure messages).
inline std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

}  // namespace serve_test
