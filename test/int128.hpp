// 128-bit integers for the argument-check model tests (test_*_args_model.cpp):
// products of two int64 values, or of a count and a stride, cannot overflow
// there, so a model never needs the checks it judges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace atomr::cuda::test {

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

/// `v` in decimal (std::to_string has no 128-bit overload).
inline std::string dec(i128 v) {
  u128 u = v < 0 ? u128{0} - static_cast<u128>(v) : static_cast<u128>(v);
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  } while (u != 0);
  return v < 0 ? "-" + s : s;
}

/// `v`, saturated to the int64 range.
inline std::int64_t clamp64(i128 v) {
  return static_cast<std::int64_t>(std::clamp<i128>(v, std::numeric_limits<std::int64_t>::min(),
                                                    std::numeric_limits<std::int64_t>::max()));
}

}  // namespace atomr::cuda::test
