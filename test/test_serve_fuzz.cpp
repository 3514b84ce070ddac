// atomr-serve's JSON reader (samples/serve/json.hpp) under randomised input,
// with fixed seeds (every run reads the same inputs): mutations of valid
// request bodies, random bytes and random token streams, and random values of
// a small model written out in varied forms and read back. The reader must
// answer each input with a value or with an error that says what and where;
// it must never throw or crash. It must also agree with an independent
// recogniser of its grammar (RFC 8259, nesting to 32 levels, finite numbers,
// no lone surrogates), and what it reads must be the model it was written
// from. Self-contained (json.hpp and doctest only), so that it also builds
// on its own, with the sanitizers.
#include "../samples/serve/json.hpp"
#include "utf8_check.hpp"

#include <doctest/doctest.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using serve_test::valid_utf8;

namespace json = serve::json;
using rng = std::mt19937_64;

constexpr std::size_t max_depth = 32;  // the reader's default

std::size_t below(rng& g, std::size_t n) {
  return n == 0 ? 0 : static_cast<std::size_t>(g() % n);
}
bool coin(rng& g, unsigned in = 2) {
  return g() % in == 0;
}

/// `s` printable in a failure message: bytes outside ASCII as \xNN, cut to 300.
std::string shown(std::string_view s) {
  std::string out = serve_test::printable(s.substr(0, 300));
  if (s.size() > 300) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
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
}

// ---------------------------------------------------------------- a recogniser

/// Whether `s` is a document the reader should accept, written from the
/// grammar, not from the reader: RFC 8259 JSON, containers nested at most
/// 32 deep below the top value, numbers that are finite doubles (one that
/// rounds to zero from non-zero digits is out of range, as the reader's
/// std::from_chars has it), \u escapes whose surrogates come in pairs. The
/// reader is lenient in one place the RFC is not: bytes >= 0x80 inside a
/// string are kept as they are, valid UTF-8 or not.
class recogniser {
public:
  explicit recogniser(std::string_view s) : s_(s) {}
  bool accepts() {
    if (!value(0)) return false;
    ws();
    return p_ == s_.size();
  }

private:
  bool more() const { return p_ < s_.size(); }
  char at() const { return s_[p_]; }
  void ws() {
    while (more() && (at() == ' ' || at() == '\t' || at() == '\n' || at() == '\r')) ++p_;
  }
  bool word(std::string_view w) {
    if (s_.substr(p_, w.size()) != w) return false;
    p_ += w.size();
    return true;
  }
  bool value(std::size_t depth) {
    if (depth > max_depth) return false;
    ws();
    if (!more()) return false;
    switch (at()) {
      case '{':
        return object(depth);
      case '[':
        return array(depth);
      case '"':
        return string();
      case 't':
        return word("true");
      case 'f':
        return word("false");
      case 'n':
        return word("null");
      default:
        return number();
    }
  }
  bool array(std::size_t depth) {
    ++p_;
    ws();
    if (more() && at() == ']') return ++p_, true;
    for (;;) {
      if (!value(depth + 1)) return false;
      ws();
      if (!more()) return false;
      if (at() == ']') return ++p_, true;
      if (at() != ',') return false;
      ++p_;
    }
  }
  bool object(std::size_t depth) {
    ++p_;
    ws();
    if (more() && at() == '}') return ++p_, true;
    for (;;) {
      ws();
      if (!more() || at() != '"' || !string()) return false;
      ws();
      if (!more() || at() != ':') return false;
      ++p_;
      if (!value(depth + 1)) return false;
      ws();
      if (!more()) return false;
      if (at() == '}') return ++p_, true;
      if (at() != ',') return false;
      ++p_;
    }
  }
  static int hexdigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool u4(unsigned& v) {
    if (p_ + 4 > s_.size()) return false;
    v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = hexdigit(s_[p_++]);
      if (d < 0) return false;
      v = v * 16 + static_cast<unsigned>(d);
    }
    return true;
  }
  bool string() {
    ++p_;
    while (more()) {
      const char c = s_[p_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') continue;
      if (!more()) return false;
      const char e = s_[p_++];
      if (std::string_view("\"\\/bfnrt").find(e) != std::string_view::npos) continue;
      if (e != 'u') return false;
      unsigned v = 0;
      if (!u4(v)) return false;
      if (v >= 0xdc00 && v < 0xe000) return false;
      if (v >= 0xd800 && v < 0xdc00) {
        unsigned low = 0;
        if (!word("\\u") || !u4(low) || low < 0xdc00 || low >= 0xe000) return false;
      }
    }
    return false;
  }
  bool number() {
    const std::size_t start = p_;
    auto digits = [&] {
      const std::size_t d = p_;
      while (more() && at() >= '0' && at() <= '9') ++p_;
      return p_ - d;
    };
    if (more() && at() == '-') ++p_;
    if (!more()) return false;
    if (at() == '0') {
      ++p_;
    } else if (at() >= '1' && at() <= '9') {
      digits();
    } else {
      return false;
    }
    if (more() && at() == '.') {
      ++p_;
      if (digits() == 0) return false;
    }
    const std::size_t mantissa_end = p_;
    if (more() && (at() == 'e' || at() == 'E')) {
      ++p_;
      if (more() && (at() == '+' || at() == '-')) ++p_;
      if (digits() == 0) return false;
    }
    // The range, by strtod (the C locale: a test never sets another).
    const std::string text(s_.substr(start, p_ - start));
    errno = 0;
    const double d = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(d)) return false;
    bool nonzero = false;
    for (std::size_t i = start; i < mantissa_end; ++i)
      nonzero = nonzero || (s_[i] >= '1' && s_[i] <= '9');
    return !(d == 0 && nonzero);
  }

  std::string_view s_;
  std::size_t p_ = 0;
};

// ---------------------------------------------------------------- checking

/// Values equal: numbers exactly (and the sign of a zero), strings byte for
/// byte, objects member by member. `where` says where they differ.
bool same(const json::value& a, const json::value& b, std::string& where,
          const std::string& path = "$") {
  if (a.v.index() != b.v.index()) {
    where = path + ": different kinds";
    return false;
  }
  if (a.is_number()) {
    if (a.number() != b.number() || std::signbit(a.number()) != std::signbit(b.number())) {
      char buf[96];
      std::snprintf(buf, sizeof buf, ": %.17g != %.17g", a.number(), b.number());
      where = path + buf;
      return false;
    }
    return true;
  }
  if (const auto* s = std::get_if<std::string>(&a.v)) {
    if (*s != std::get<std::string>(b.v)) {
      where = path + ": \"" + shown(*s) + "\" != \"" + shown(std::get<std::string>(b.v)) + "\"";
      return false;
    }
    return true;
  }
  if (const auto* t = std::get_if<bool>(&a.v)) {
    if (*t != std::get<bool>(b.v)) {
      where = path + ": different booleans";
      return false;
    }
    return true;
  }
  if (a.is_array()) {
    const auto &x = a.items(), &y = b.items();
    if (x.size() != y.size()) {
      where = path + ": " + std::to_string(x.size()) + " items != " + std::to_string(y.size());
      return false;
    }
    for (std::size_t i = 0; i < x.size(); ++i)
      if (!same(x[i], y[i], where, path + "[" + std::to_string(i) + "]")) return false;
    return true;
  }
  if (a.is_object()) {
    const auto &x = a.members(), &y = b.members();
    if (x.size() != y.size()) {
      where = path + ": " + std::to_string(x.size()) + " members != " + std::to_string(y.size());
      return false;
    }
    for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j) {
      if (i->first != j->first) {
        where = path + ": member \"" + shown(i->first) + "\" != \"" + shown(j->first) + "\"";
        return false;
      }
      if (!same(i->second, j->second, where, path + "." + shown(i->first))) return false;
    }
    return true;
  }
  return true;  // both null
}

/// `v` as plain JSON text: numbers in their shortest round-trip form,
/// strings escaping only what JSON requires (other bytes as they are).
void write_plain(const json::value& v, std::string& out) {
  if (v.is_number()) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v.number());
    out.append(buf, r.ptr);
  } else if (const auto* s = std::get_if<std::string>(&v.v)) {
    out += '"';
    for (const char c : *s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        out += buf;
      } else {
        out += c;
      }
    }
    out += '"';
  } else if (const auto* t = std::get_if<bool>(&v.v)) {
    out += *t ? "true" : "false";
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& item : v.items()) {
      if (!first) out += ',';
      first = false;
      write_plain(item, out);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, item] : v.members()) {
      if (!first) out += ',';
      first = false;
      write_plain(json::value{k}, out);
      out += ':';
      write_plain(item, out);
    }
    out += '}';
  } else {
    out += "null";
  }
}

/// What the reader did with every input of a run, and the first few inputs
/// that broke a property.
struct tally {
  std::size_t inputs = 0, values = 0, errors = 0;
  std::vector<std::string> broken;
  std::size_t broken_count = 0;
  void fail(std::string_view input, const std::string& why) {
    ++broken_count;
    if (broken.size() < 8) broken.push_back(why + "; input: " + shown(input));
  }
  /// Checks that no input broke a property and that at least `min_values`
  /// inputs were values (so that the run tried both sides of the grammar).
  void report(const char* what, std::size_t min_values) const {
    INFO(std::string(what) << ": " << inputs << " inputs, " << values << " values, " << errors
                           << " errors");
    std::string first;
    for (const auto& b : broken) first += "\n  " + b;
    CHECK_MESSAGE(broken_count == 0, broken_count << " inputs broke a property:" << first);
    CHECK(values >= min_values);
  }
};

/// Reads `text` and checks what holds for every input: a value or an error
/// of the form "<what> at byte N" with N within the input; no exception; the
/// same answer as the recogniser; a value that reads back the same from its
/// plain form. Returns the value, if any.
std::optional<json::value> check(std::string_view text, tally& t) {
  ++t.inputs;
  std::string err;
  std::optional<json::value> v;
  try {
    json::reader r(text);
    v = r.parse(err);
  } catch (const std::exception& e) {
    t.fail(text, std::string("threw: ") + e.what());
    return std::nullopt;
  }
  const bool expected = recogniser(text).accepts();
  if (v) {
    ++t.values;
    if (!expected) t.fail(text, "accepted what the grammar rejects");
    std::string plain;
    write_plain(*v, plain);
    std::string err2, where;
    json::reader again(plain);
    const auto w = again.parse(err2);
    if (!w)
      t.fail(text, "its plain form does not read back: " + err2 + "; plain: " + shown(plain));
    else if (!same(*v, *w, where))
      t.fail(text, "its plain form reads back different: " + where);
    return v;
  }
  ++t.errors;
  if (expected) t.fail(text, "rejected what the grammar accepts: " + err);
  const auto at = err.rfind(" at byte ");
  if (at == std::string::npos || at == 0) {
    t.fail(text, "an error without its place: \"" + err + "\"");
  } else {
    const std::string n = err.substr(at + 9);
    std::size_t pos = 0;
    const auto r = std::from_chars(n.data(), n.data() + n.size(), pos);
    if (r.ec != std::errc() || r.ptr != n.data() + n.size() || pos > text.size())
      t.fail(text, "an error whose place is not in the input: \"" + err + "\"");
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- inputs

/// Odd tokens and fragments that mutations splice in.
const std::vector<std::string>& oddities() {
  static const std::vector<std::string> list = [] {
    std::vector<std::string> l = {"1e309",
                                  "-1e309",
                                  "-0",
                                  "-0.0",
                                  "0e0",
                                  "1e-400",
                                  "-1e-400",
                                  "4.9e-324",
                                  "2.5e-324",
                                  "2.4e-324",
                                  "1.7976931348623157e308",
                                  "1.7976931348623159e308",
                                  "0x10",
                                  "01",
                                  "-01",
                                  "00",
                                  "NaN",
                                  "nan",
                                  "Infinity",
                                  "-Infinity",
                                  "inf",
                                  "1.",
                                  ".5",
                                  "-",
                                  "+1",
                                  "1e",
                                  "1e+",
                                  "1E-",
                                  "1.5e3.2",
                                  "--1",
                                  "1_000",
                                  "0.0000001",
                                  "1e-0007",
                                  "1E+2",
                                  "\"\\ud800\"",
                                  "\"\\udc00\"",
                                  "\"\\ud800\\u0041\"",
                                  "\"\\ud800\\ud800\"",
                                  "\"\\udbff\\udfff\"",
                                  "\"\\ud83d\\ude00\"",
                                  "\"\\ud83d\"",
                                  "\"\\u00zz\"",
                                  "\"\\u12\"",
                                  "\"\\u-123\"",
                                  "\"\\u+123\"",
                                  "\"\\u 123\"",
                                  "\"\\U0041\"",
                                  "\"\\x41\"",
                                  "\"\\0\"",
                                  "\"\\u0000\"",
                                  std::string("\"a\0b\"", 5),
                                  std::string("\0", 1),
                                  "\"\x01\"",
                                  "\"\x7f\"",
                                  "\"\xc3\x28\"",
                                  "\"\xed\xa0\x80\"",
                                  "\"\xf4\x90\x80\x80\"",
                                  "\"\xc0\xaf\"",
                                  "\"\xff\xfe\"",
                                  "\"\xe2\x82\"",
                                  "true",
                                  "tru",
                                  "nul",
                                  "null1",
                                  "falsey",
                                  "[1,]",
                                  "{,}",
                                  "[,1]",
                                  "{\"a\"}",
                                  "{\"a\":}",
                                  "{\"a\" 1}",
                                  "{1:2}",
                                  "[]",
                                  "{}",
                                  "[[[]]]",
                                  "\"\"",
                                  "\"",
                                  "\\",
                                  "\xef\xbb\xbf",
                                  "/* c */",
                                  "//",
                                  "'a'",
                                  "\"\\/\"",
                                  " ",
                                  "\t",
                                  "\r\n",
                                  "\v",
                                  "\f"};
    l.push_back(std::string(400, '1'));               // long, in range
    l.push_back(std::string(5000, '9'));              // past 1e308
    l.push_back("0." + std::string(400, '0') + "1");  // underflow, by digits
    l.push_back("1" + std::string(308, '0'));         // 1e308, written out
    l.push_back("-" + std::string(309, '9'));         // past -1e308
    l.push_back(std::string(40, '[') + std::string(40, ']'));
    return l;
  }();
  return list;
}

/// A valid request body of one of the endpoints, small and random.
std::string request_body(rng& g) {
  auto numbers = [&](std::size_t n) {
    std::string s = "[";
    for (std::size_t i = 0; i < n; ++i) {
      if (i) s += ',';
      json::append_number(s, static_cast<float>(std::uniform_real_distribution<double>(-8, 8)(g)));
    }
    return s + "]";
  };
  switch (below(g, 3)) {
    case 0: {
      const std::size_t m = 1 + below(g, 4), n = 1 + below(g, 4), k = 1 + below(g, 4);
      return "{\"m\":" + std::to_string(m) + ",\"n\":" + std::to_string(n) +
             ",\"k\":" + std::to_string(k) + ",\"a\":" + numbers(m * k) +
             ",\"b\":" + numbers(k * n) + "}";
    }
    case 1: {
      const std::size_t n = 1 + below(g, 8);
      return "{\"n\":" + std::to_string(n) + ",\"re\":" + numbers(n) + ",\"im\":" + numbers(n) +
             "}";
    }
    default:
      return "{\"x\":" + numbers(1 + below(g, 24)) + "}";
  }
}

/// One random change to `s`.
void mutate(std::string& s, rng& g) {
  static constexpr std::string_view significant = "{}[],:\"\\-+.eE0123456789tfnulu \t\n";
  const std::size_t at = below(g, s.size() + 1);
  switch (below(g, 12)) {
    case 0:  // flip a bit
      if (!s.empty()) s[below(g, s.size())] ^= static_cast<char>(1u << below(g, 8));
      break;
    case 1:  // any byte
      if (!s.empty()) s[below(g, s.size())] = static_cast<char>(g() & 0xff);
      break;
    case 2:  // a byte that means something to JSON
      if (!s.empty()) s[below(g, s.size())] = significant[below(g, significant.size())];
      break;
    case 3: {  // insert random bytes
      std::string ins;
      for (std::size_t n = 1 + below(g, 8); n > 0; --n) ins += static_cast<char>(g() & 0xff);
      s.insert(at, ins);
      break;
    }
    case 4:  // insert an odd token
      s.insert(at, oddities()[below(g, oddities().size())]);
      break;
    case 5: {  // replace the number or literal at `at` by an odd token
      const auto b = s.find_first_of("-0123456789tfn", at);
      if (b == std::string::npos) break;
      const auto e = s.find_first_of(",]}", b);
      s.replace(b, (e == std::string::npos ? s.size() : e) - b,
                oddities()[below(g, oddities().size())]);
      break;
    }
    case 6:  // delete a range
      s.erase(at, 1 + below(g, 16));
      break;
    case 7: {  // repeat a range
      const std::size_t n = std::min<std::size_t>(s.size() - at, 1 + below(g, 32));
      s.insert(at, s.substr(at, n));
      break;
    }
    case 8:  // truncate
      s.resize(at);
      break;
    case 9: {  // a duplicate key, before the first closing brace
      static const char* keys[] = {"m", "n", "k", "a", "b", "re", "im", "x"};
      const auto close = s.find('}');
      if (close == std::string::npos) break;
      std::string member = std::string(",\"") + keys[below(g, 8)] + "\":";
      member += coin(g) ? std::to_string(static_cast<long long>(g() % 10000) - 100)
                        : oddities()[below(g, oddities().size())];
      s.insert(close, member);
      break;
    }
    case 10: {  // nest the whole in k arrays or objects, around the depth limit
      const std::size_t k = coin(g, 3) ? below(g, 40) : max_depth - 2 + below(g, 5);
      const bool obj = coin(g);
      std::string pre, post;
      for (std::size_t i = 0; i < k; ++i) {
        pre += obj ? "{\"k\":" : "[";
        post += obj ? "}" : "]";
      }
      s = pre + s + post;
      break;
    }
    default: {  // a \u escape, valid or not, inside the first string
      const auto q = s.find('"');
      if (q == std::string::npos) break;
      static const char* escapes[] = {"\\u0041", "\\u00e9", "\\uFFFF",        "\\ud83d\\ude00",
                                      "\\ud800", "\\udc00", "\\uDBFF\\uDFFF", "\\ud800\\u0041",
                                      "\\u0000", "\\u001f", "\\u12",          "\\uzzzz"};
      s.insert(q + 1, escapes[below(g, 12)]);
      break;
    }
  }
}

// ---------------------------------------------------------------- the model

/// A value of the model and its text, written with random whitespace and
/// in random equivalent forms (numbers: shortest, %.17g, exponents in
/// either case and with a sign; strings: raw UTF-8, \u escapes in either
/// case, surrogate pairs, the short escapes, \/).
struct writer {
  rng& g;
  std::size_t max_items = 6;

  void space(std::string& out) {
    static constexpr char ws[] = {' ', '\t', '\n', '\r'};
    if (coin(g, 3))
      for (std::size_t n = 1 + below(g, 3); n > 0; --n) out += ws[below(g, 4)];
  }

  /// A random double and one text that reads as exactly it.
  double number(std::string& out) {
    char buf[512];
    switch (below(g, 8)) {
      case 0: {  // small integers, written plainly
        const auto i = static_cast<long long>(g() % 2001) - 1000;
        out += std::to_string(i);
        return static_cast<double>(i);
      }
      case 1:  // zero, negative or not, in some forms
        switch (below(g, 5)) {
          case 0:
            out += "-0";
            return -0.0;
          case 1:
            out += "-0.0e+0";
            return -0.0;
          case 2:
            out += "0E-7";
            return 0.0;
          case 3:
            out += "0.000";
            return 0.0;
          default:
            out += "0";
            return 0.0;
        }
      case 2:
      case 3: {  // any finite double (subnormals and extremes included), shortest form
        double d = 0;
        do {
          const std::uint64_t bits = g();
          std::memcpy(&d, &bits, sizeof d);
        } while (!std::isfinite(d));
        if (coin(g)) {
          out.append(buf, std::to_chars(buf, buf + sizeof buf, d).ptr);
        } else {  // %.17g, its exponent's 'e' in either case
          std::snprintf(buf, sizeof buf, coin(g) ? "%.17g" : "%.17G", d);
          out += buf;
        }
        return d;
      }
      case 4: {  // a mantissa and an exponent: the reference is strtod
        const auto mant = g() % 100000000;
        const int exp10 = static_cast<int>(below(g, 600)) - 300;
        std::snprintf(buf, sizeof buf, "%s%llu%s%s%d", coin(g) ? "-" : "",
                      static_cast<unsigned long long>(mant), coin(g) ? "e" : "E",
                      exp10 >= 0 && coin(g) ? "+" : "", exp10);
        const double d = std::strtod(buf, nullptr);
        if (!std::isfinite(d) || (d == 0 && mant != 0)) {  // out of range: a plain 1 instead
          out += "1";
          return 1.0;
        }
        out += buf;
        return d;
      }
      case 5: {  // a long digit string, with a fraction (the reference is strtod)
        std::string t = coin(g) ? "-" : "";
        t += static_cast<char>('1' + below(g, 9));
        for (std::size_t n = below(g, 300); n > 0; --n) t += static_cast<char>('0' + below(g, 10));
        t += '.';
        for (std::size_t n = 1 + below(g, 300); n > 0; --n)
          t += static_cast<char>('0' + below(g, 10));
        const double d = std::strtod(t.c_str(), nullptr);
        out += t;
        return d;
      }
      case 6: {  // subnormals: tiny exponents
        const std::uint64_t bits = g() & ((std::uint64_t{1} << 52) - 1);
        double d = 0;
        std::memcpy(&d, &bits, sizeof d);
        if (coin(g)) d = -d;
        out.append(buf, std::to_chars(buf, buf + sizeof buf, d).ptr);
        return d;
      }
      default: {  // a float as the service writes them: its shortest form, read as a double
        const auto f = static_cast<float>(std::uniform_real_distribution<double>(-1e6, 1e6)(g));
        std::string t;
        json::append_number(t, f);
        out += t;
        return std::strtod(t.c_str(), nullptr);
      }
    }
  }

  /// A random code point (no surrogates).
  std::uint32_t code_point() {
    switch (below(g, 6)) {
      case 0:
        return static_cast<std::uint32_t>(below(g, 0x20));  // control characters, NUL too
      case 1:
        return static_cast<std::uint32_t>(0x80 + below(g, 0x780));  // two bytes
      case 2: {
        std::uint32_t cp = 0;
        do cp = static_cast<std::uint32_t>(0x800 + below(g, 0x10000 - 0x800));
        while (cp >= 0xd800 && cp < 0xe000);
        return cp;
      }
      case 3:
        return static_cast<std::uint32_t>(0x10000 + below(g, 0x100000));  // astral
      default:
        return static_cast<std::uint32_t>(0x20 + below(g, 0x60));  // ASCII
    }
  }

  void escape16(std::string& out, unsigned unit) {
    char buf[8];
    std::snprintf(buf, sizeof buf, coin(g) ? "\\u%04x" : "\\u%04X", unit);
    out += buf;
  }

  /// A random string: its UTF-8 bytes, and its text into `out`.
  std::string string(std::string& out) {
    std::string bytes;
    out += '"';
    for (std::size_t n = below(g, 12); n > 0; --n) {
      const std::uint32_t cp = code_point();
      append_utf8(bytes, cp);
      const bool must = cp < 0x20 || cp == '"' || cp == '\\';
      if (cp == '"' || cp == '\\' || (cp == '/' && coin(g))) {
        out += '\\';
        out += static_cast<char>(cp);
      } else if (must && cp != 0 && coin(g) && std::strchr("\b\f\n\r\t", static_cast<int>(cp))) {
        static constexpr std::string_view from = "\b\f\n\r\t", to = "bfnrt";
        out += '\\';
        out += to[from.find(static_cast<char>(cp))];
      } else if (must || coin(g, 3)) {
        if (cp < 0x10000) {
          escape16(out, cp);
        } else {
          const std::uint32_t v = cp - 0x10000;
          escape16(out, 0xd800 + (v >> 10));
          escape16(out, 0xdc00 + (v & 0x3ff));
        }
      } else {
        append_utf8(out, cp);
      }
    }
    out += '"';
    return bytes;
  }

  /// A random value of at most `depth` more levels of containers.
  json::value make(std::string& out, std::size_t depth) {
    space(out);
    json::value v;
    const std::size_t kinds = depth == 0 ? 5 : 7;
    switch (below(g, kinds)) {
      case 0:
        out += "null";
        break;
      case 1: {
        const bool b = coin(g);
        out += b ? "true" : "false";
        v.v = b;
        break;
      }
      case 2:
      case 3:
        v.v = number(out);
        break;
      case 4:
        v.v = string(out);
        break;
      case 5: {
        auto a = std::make_shared<json::array>();
        out += '[';
        for (std::size_t n = below(g, max_items + 1), i = 0; i < n; ++i) {
          if (i) out += ',';
          a->push_back(make(out, depth - 1));
        }
        space(out);
        out += ']';
        v.v = std::move(a);
        break;
      }
      default: {
        // Members, sometimes with a key again: the last one read is kept.
        auto o = std::make_shared<json::object>();
        out += '{';
        std::vector<std::string> keys;
        for (std::size_t n = below(g, max_items + 1), i = 0; i < n; ++i) {
          if (i) out += ',';
          space(out);
          std::string key;
          if (!keys.empty() && coin(g, 4)) {
            key = keys[below(g, keys.size())];
            out += "\"";
            for (const char c : key) {  // the same key, written plainly
              if (c == '"' || c == '\\') out += '\\';
              if (static_cast<unsigned char>(c) < 0x20) {
                escape16(out, static_cast<unsigned char>(c));
                continue;
              }
              out += c;
            }
            out += "\"";
          } else {
            key = string(out);
            keys.push_back(key);
          }
          space(out);
          out += ':';
          (*o)[key] = make(out, depth - 1);
        }
        space(out);
        out += '}';
        v.v = std::move(o);
        break;
      }
    }
    space(out);
    return v;
  }
};

}  // namespace

TEST_CASE("atomr-serve's JSON reader, odd inputs one by one: numbers, escapes, nesting") {
  auto read = [](std::string_view s) {
    std::string err;
    json::reader r(s);
    auto v = r.parse(err);
    return std::pair{v, err};
  };
  auto number = [&](std::string_view s) {
    auto [v, err] = read(s);
    REQUIRE_MESSAGE(v, s << ": " << err);
    REQUIRE(v->is_number());
    return v->number();
  };
  auto error = [&](std::string_view s) {
    auto [v, err] = read(s);
    CHECK_MESSAGE(!v, std::string(s));
    return err;
  };
  auto str = [&](std::string_view s) {
    auto [v, err] = read(s);
    REQUIRE_MESSAGE(v, shown(s) << ": " << err);
    return std::get<std::string>(v->v);
  };

  // Numbers: -0 keeps its sign; subnormals are read; a number beyond the
  // doubles is an error that says so (1e-400 too: from_chars calls an
  // underflow out of range), never infinity or a silent zero from 1e309.
  CHECK(std::signbit(number("-0")));
  CHECK(number("-0") == 0.0);
  CHECK(number("4.9e-324") == std::numeric_limits<double>::denorm_min());
  CHECK(number("1.7976931348623157e308") == std::numeric_limits<double>::max());
  CHECK(number(std::string(300, '1')) == std::strtod(std::string(300, '1').c_str(), nullptr));
  CHECK(number("1" + std::string(308, '0')) == 1e308);
  for (const char* big : {"1e309", "-1e309", "1.7976931348623159e308", "1e99999999999999999999"})
    CHECK(error(big).starts_with("number out of range at byte "));
  CHECK(error(std::string(400, '9')).starts_with("number out of range"));
  CHECK(error("1e-400").starts_with("number out of range"));
  for (const char* bad : {"0x10", "01", "-01", "NaN", "Infinity", "-Infinity", "+1", ".5", "1.",
                          "1e", "1e+", "-", "--1", "1.5e3.2", "0.e1"}) {
    CAPTURE(bad);
    CHECK_FALSE(error(bad).empty());
  }
  CHECK(error("01") == "trailing characters at byte 1");
  CHECK(error("NaN") == "not a value at byte 0");

  // Escapes: \uXXXX in either case, a surrogate pair as one character (four
  // bytes of UTF-8), a lone surrogate an error; NUL by escape, not raw.
  CHECK(str(R"("\u00e9\u00E9")") == "\xc3\xa9\xc3\xa9");
  CHECK(str(R"("\uffff")") == "\xef\xbf\xbf");
  CHECK(str(R"("\ud83d\ude00")") == "\xf0\x9f\x98\x80");  // U+1F600
  CHECK(str(R"("\uD800\uDC00")") == "\xf0\x90\x80\x80");  // U+10000
  CHECK(str(R"("\udbff\udfff")") == "\xf4\x8f\xbf\xbf");  // U+10FFFF
  CHECK(str(R"("a\u0000b")") == std::string("a\0b", 3));
  CHECK(str(R"("\/\b\f\n\r\t\"\\")") == "/\b\f\n\r\t\"\\");
  for (const char* lone : {R"("\ud800")", R"("\udc00")", R"("\ud800\u0041")", R"("\ud800x")",
                           R"("\ud800\ud800")", R"("\udfff\ud800")", R"("\ud83d\")"}) {
    CAPTURE(lone);
    CHECK(error(lone).starts_with("lone surrogate in a \\u escape at byte "));
  }
  for (const char* bad : {R"("\u12")", R"("\u-123")", R"("\u+123")", R"("\u 123")", R"("\uzzzz")",
                          R"("\U0041")", R"("\x41")", R"("\0")", R"("\ud800\u12")"}) {
    CAPTURE(bad);
    CHECK_FALSE(error(bad).empty());
  }
  CHECK(error(std::string("\"a\0b\"", 5)) == "control character in a string at byte 3");
  CHECK(error(std::string("\0", 1)) == "not a value at byte 0");
  CHECK(error("\"\x1f\"").starts_with("control character"));
  // Bytes >= 0x80 in a string are kept as they are, valid UTF-8 or not
  // (JSON text should be UTF-8; the reader does not insist).
  CHECK(str("\"\xc3\xa9\"") == "\xc3\xa9");
  CHECK(str("\"\xff\xc0\xaf\xed\xa0\x80\"") == "\xff\xc0\xaf\xed\xa0\x80");

  // Nesting: a value 32 containers deep is read, 33 is "nesting too deep";
  // a string of 100000 brackets is not read past the limit.
  for (const bool obj : {false, true})
    for (std::size_t k : {std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{34}}) {
      std::string s;
      for (std::size_t i = 0; i < k; ++i) s += obj ? "{\"k\":" : "[";
      s += "1";
      for (std::size_t i = 0; i < k; ++i) s += obj ? "}" : "]";
      CAPTURE(obj);
      CAPTURE(k);
      auto [v, err] = read(s);
      CHECK(v.has_value() == (k <= max_depth));
      if (!v) CHECK(err.starts_with("nesting too deep at byte "));
      std::string empty(k + 1, '[');  // an empty container one level further is fine
      empty += std::string(k + 1, ']');
      CHECK(read(empty).first.has_value() == (k <= max_depth));
    }
  CHECK(error(std::string(100000, '[')).starts_with("nesting too deep at byte 33"));
}

TEST_CASE(
    "atomr-serve's JSON reader fuzzed: mutations of request bodies, truncations, random "
    "bytes and token streams") {
  rng g(0x5e7e'f022'0001);

  // Every prefix of valid bodies: each is an error (a top-level object ends
  // with its '}'), and the whole is a value.
  {
    tally t;
    std::vector<std::string> seeds;
    for (int i = 0; i < 40; ++i) seeds.push_back(request_body(g));
    seeds.push_back(R"({"s":"x\ny\u00e9\ud83d\ude00\/","t":true,"f":false,"n":null,"e":[],)"
                    R"("o":{},"d":[-0,1e-7,1.5E+3,-2.5e-3,4.9e-324]})");
    for (const auto& s : seeds) {
      for (std::size_t len = 0; len < s.size(); ++len)
        if (check(std::string_view(s).substr(0, len), t)) t.fail(s.substr(0, len), "a prefix read");
      if (!check(s, t)) t.fail(s, "a valid body not read");
    }
    t.report("truncations", seeds.size());
  }

  // Mutations: 1 to 4 random changes to a valid body.
  {
    tally t;
    for (int i = 0; i < 150000; ++i) {
      std::string s = request_body(g);
      for (std::size_t n = 1 + below(g, 4); n > 0; --n) mutate(s, g);
      check(s, t);
    }
    t.report("mutations", 5000);
  }

  // Random bytes: any byte, or the bytes that mean something to JSON.
  {
    tally t;
    static constexpr std::string_view jsonish = "{}[],:\"\\-+.eE0123456789 \ttrufalsn";
    for (int i = 0; i < 60000; ++i) {
      std::string s(below(g, 48), '\0');
      const bool any = coin(g);
      for (auto& c : s) c = any ? static_cast<char>(g() & 0xff) : jsonish[below(g, jsonish.size())];
      check(s, t);
    }
    t.report("random bytes", 100);
  }

  // Token streams: JSON's tokens in random order, often valid documents.
  {
    tally t;
    static const char* tokens[] = {
        "{",    "}",  "[",           "]",      ",",           ":",    "\"k\"",
        "\"\"", "1",  "-0",          "2.5e-3", "true",        "null", "false",
        " ",    "\n", "\"\\u00e9\"", "1e400",  "\"\\ud800\"", "01",   "\"\\ud83d\\ude00\""};
    constexpr std::size_t count = sizeof tokens / sizeof tokens[0];
    for (int i = 0; i < 60000; ++i) {
      std::string s;
      for (std::size_t n = below(g, 24); n > 0; --n) s += tokens[below(g, count)];
      check(s, t);
    }
    t.report("token streams", 500);
  }
}

TEST_CASE(
    "atomr-serve's JSON reader reads back random values of a model, written in varied "
    "forms") {
  rng g(0x5e7e'f022'0002);
  tally t;
  writer w{g};
  for (int i = 0; i < 40000; ++i) {
    std::string text;
    // Mostly shallow and wide; every 50th as deep as the reader allows.
    const bool deep = i % 50 == 0;
    w.max_items = deep ? 2 : 6;
    json::value model;
    if (deep) {
      // 32 containers around a random value: the deepest the reader reads.
      json::value inner = w.make(text, 0);
      for (std::size_t d = 0; d < max_depth; ++d) {
        auto a = std::make_shared<json::array>();
        a->push_back(std::move(inner));
        inner.v = std::move(a);
      }
      text = std::string(max_depth, '[') + text + std::string(max_depth, ']');
      model = std::move(inner);
    } else {
      model = w.make(text, below(g, 5));
    }
    const auto v = check(text, t);
    std::string where;
    if (!v)
      t.fail(text, "a model's text not read");
    else if (!same(model, *v, where))
      t.fail(text, "read back different from the model: " + where);
  }
  t.report("model round trips", t.inputs);
}

TEST_CASE(
    "atomr-serve's JSON writer: quote() makes valid UTF-8 JSON of any bytes, and the reader "
    "reads it back") {
  rng g(0x5e7e'f022'0003);
  std::size_t broken = 0, replaced = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s(below(g, 24), '\0');
    const int kind = static_cast<int>(below(g, 3));
    for (auto& c : s) {
      if (kind == 0) {
        c = static_cast<char>(g() & 0xff);  // any bytes
      } else if (kind == 1) {
        c = static_cast<char>(below(g, 0x80));  // ASCII, controls too
      }
    }
    if (kind == 2) {  // valid UTF-8 of random code points
      s.clear();
      writer w{g};
      for (std::size_t n = below(g, 8); n > 0; --n) append_utf8(s, w.code_point());
    }
    const std::string q = json::quote(s);
    std::string err;
    json::reader r(q);
    const auto v = r.parse(err);
    const bool utf8 = valid_utf8(s);
    bool ok = valid_utf8(q) && v && std::holds_alternative<std::string>(v->v);
    if (ok && utf8) ok = std::get<std::string>(v->v) == s;  // exactly the bytes
    if (ok && !utf8) {
      ++replaced;  // each byte outside UTF-8 is U+FFFD; what is UTF-8 stays
      const auto& back = std::get<std::string>(v->v);
      ok = valid_utf8(back) && back.find("\xef\xbf\xbd") != std::string::npos;
    }
    if (!ok && ++broken <= 8) MESSAGE("quote(\"" << shown(s) << "\") = " << shown(q) << " " << err);
  }
  CHECK(broken == 0);
  CHECK(replaced > 1000);
  // Exact forms: a target's stray bytes and a truncated sequence.
  CHECK(json::quote("/\xff/\xc3") == "\"/\\ufffd/\\ufffd\"");
  CHECK(json::quote("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate's bytes
  CHECK(json::quote("\xf0\x9f\x98\x80\xc3\xa9") == "\"\xf0\x9f\x98\x80\xc3\xa9\"");
}
