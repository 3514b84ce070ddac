// A small JSON reader and writer for atomr-serve and atomr-load: enough for
// their request and response bodies (objects, arrays, numbers, strings,
// booleans, null). Not part of the library. Numbers are doubles; strings
// keep \uXXXX escapes as UTF-8 (a surrogate pair as the character it
// stands for; a lone surrogate is an error).
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace serve::json {

struct value;
using object = std::map<std::string, value, std::less<>>;
using array = std::vector<value>;

struct value {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<array>,
               std::shared_ptr<object>>
      v = nullptr;

  bool is_number() const { return std::holds_alternative<double>(v); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<array>>(v); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<object>>(v); }
  double number() const { return std::get<double>(v); }
  const array& items() const { return *std::get<std::shared_ptr<array>>(v); }
  const object& members() const { return *std::get<std::shared_ptr<object>>(v); }
  /// The member `key` of an object, or nullptr.
  const value* find(std::string_view key) const {
    if (!is_object()) return nullptr;
    const auto& m = members();
    auto it = m.find(key);
    return it == m.end() ? nullptr : &it->second;
  }
};

/// Parses `text` (the whole of it: trailing non-space is an error). On
/// failure, `error` says what and where.
class reader {
public:
  explicit reader(std::string_view text, std::size_t max_depth = 32)
      : s_(text), max_depth_(max_depth) {}

  std::optional<value> parse(std::string& error) {
    value out;
    bool ok = parse_value(out, 0);
    if (ok) {
      skip();
      if (pos_ != s_.size()) ok = fail("trailing characters");
    }
    if (!ok) {
      error = err_ + " at byte " + std::to_string(pos_);
      return std::nullopt;
    }
    return out;
  }

private:
  bool fail(const char* what) {
    if (err_.empty()) err_ = what;
    return false;
  }
  void skip() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return fail("unknown literal");
    pos_ += word.size();
    return true;
  }
  bool parse_value(value& out, std::size_t depth) {
    if (depth > max_depth_) return fail("nesting too deep");
    skip();
    if (pos_ >= s_.size()) return fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return parse_object(out, depth);
    if (c == '[') return parse_array(out, depth);
    if (c == '"') {
      std::string str;
      if (!parse_string(str)) return false;
      out.v = std::move(str);
      return true;
    }
    if (c == 't') return literal("true") && (out.v = true, true);
    if (c == 'f') return literal("false") && (out.v = false, true);
    if (c == 'n') return literal("null") && (out.v = nullptr, true);
    return parse_number(out);
  }
  bool parse_number(value& out) {
    // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0')
      ++pos_;
    else if (!digits())
      return fail("not a value");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) return fail("bad number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return fail("bad number");
    }
    double d = 0;
    const auto r = std::from_chars(s_.data() + start, s_.data() + pos_, d);
    if (r.ec == std::errc::result_out_of_range || !std::isfinite(d))
      return fail("number out of range");
    if (r.ec != std::errc()) return fail("bad number");
    out.v = d;
    return true;
  }
  bool parse_string(std::string& out) {
    ++pos_;  // the opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(cp)) return fail("bad \\u escape");
          // UTF-16 surrogates: a high one and its low one are one character;
          // either alone has no UTF-8 form.
          if (cp >= 0xd800 && cp < 0xdc00) {
            unsigned low = 0;
            if (s_.substr(pos_, 2) != "\\u" || (pos_ += 2, !hex4(low)) || low < 0xdc00 ||
                low >= 0xe000)
              return fail("lone surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return fail("lone surrogate in a \\u escape");
          }
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          } else if (cp < 0x10000) {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          } else {
            out += static_cast<char>(0xf0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
          }
          break;
        }
        default:
          return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }
  /// Four hex digits at pos_ (and past them): false if not.
  bool hex4(unsigned& cp) {
    if (pos_ + 4 > s_.size() ||
        std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, cp, 16).ptr != s_.data() + pos_ + 4)
      return false;
    pos_ += 4;
    return true;
  }
  bool parse_array(value& out, std::size_t depth) {
    ++pos_;
    auto a = std::make_shared<array>();
    skip();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      out.v = std::move(a);
      return true;
    }
    for (;;) {
      value item;
      if (!parse_value(item, depth + 1)) return false;
      a->push_back(std::move(item));
      skip();
      if (pos_ >= s_.size()) return fail("unterminated array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] != ']') return fail("expected , or ]");
      ++pos_;
      out.v = std::move(a);
      return true;
    }
  }
  bool parse_object(value& out, std::size_t depth) {
    ++pos_;
    auto o = std::make_shared<object>();
    skip();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      out.v = std::move(o);
      return true;
    }
    for (;;) {
      skip();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a member name");
      std::string key;
      if (!parse_string(key)) return false;
      skip();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected :");
      ++pos_;
      value item;
      if (!parse_value(item, depth + 1)) return false;
      (*o)[std::move(key)] = std::move(item);
      skip();
      if (pos_ >= s_.size()) return fail("unterminated object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] != '}') return fail("expected , or }");
      ++pos_;
      out.v = std::move(o);
      return true;
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::size_t max_depth_;
  std::string err_;
};

/// The length of the UTF-8 sequence at s[i] (a byte >= 0x80): 2 to 4, or 0
/// if it is not one (RFC 3629: no overlong forms, surrogates or code points
/// past U+10FFFF).
inline std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto at = [&](std::size_t k) {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u;
  };
  const unsigned b = at(0), b1 = at(1);
  std::size_t n = 0;
  unsigned lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (b >= 0xc2 && b <= 0xdf) {
    n = 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    n = 3;
    if (b == 0xe0) lo = 0xa0;
    if (b == 0xed) hi = 0x9f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    n = 4;
    if (b == 0xf0) lo = 0x90;
    if (b == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (b1 < lo || b1 > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (at(k) < 0x80 || at(k) > 0xbf) return 0;
  return n;
}

/// `s` as a JSON string literal. A byte that is not part of valid UTF-8
/// (a request's target may hold any) becomes U+FFFD, so that the literal
/// is valid UTF-8, as JSON text must be.
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      if (const std::size_t n = utf8_sequence(s, i)) {
        out.append(s.substr(i, n));
        i += n - 1;
      } else {
        out += "\\ufffd";
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

/// A float as JSON: shortest round-trip form; non-finite values as null.
inline void append_number(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  out.append(buf, r.ptr);
}
inline void append_number(std::string& out, float f) {
  if (!std::isfinite(f)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  out.append(buf, r.ptr);
}

template <class T>
void append_array(std::string& out, std::span<const T> v) {
  out += '[';
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    append_number(out, v[i]);
  }
  out += ']';
}

/// The numbers of an array member `key` as floats into `out`: false (and
/// `error`) when it is missing, not an array of numbers, or not `count` long.
inline bool floats(const value& obj, std::string_view key, std::size_t count,
                   std::vector<float>& out, std::string& error) {
  const value* a = obj.find(key);
  if (!a || !a->is_array()) {
    error = "\"" + std::string(key) + "\" must be an array of numbers";
    return false;
  }
  const auto& items = a->items();
  if (items.size() != count) {
    error = "\"" + std::string(key) + "\" has " + std::to_string(items.size()) +
            " numbers, the shape needs " + std::to_string(count);
    return false;
  }
  out.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (!items[i].is_number()) {
      error = "\"" + std::string(key) + "\"[" + std::to_string(i) + "] is not a number";
      return false;
    }
    const double d = items[i].number();
    if (std::fabs(d) > 3.4e38) {
      error = "\"" + std::string(key) + "\"[" + std::to_string(i) + "] does not fit a float";
      return false;
    }
    out[i] = static_cast<float>(d);
  }
  return true;
}

/// A positive integer member `key` of at most `max`: false (and `error`) otherwise.
inline bool positive(const value& obj, std::string_view key, std::int64_t max, std::int64_t& out,
                     std::string& error) {
  const value* v = obj.find(key);
  if (!v || !v->is_number()) {
    error = "\"" + std::string(key) + "\" must be a positive integer";
    return false;
  }
  const double d = v->number();
  if (d != std::floor(d) || d < 1 || d > static_cast<double>(max)) {
    error = "\"" + std::string(key) + "\" must be an integer in 1.." + std::to_string(max);
    return false;
  }
  out = static_cast<std::int64_t>(d);
  return true;
}

}  // namespace serve::json
