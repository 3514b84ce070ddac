#include <atomr/cuda/element.hpp>

namespace atomr::cuda {

std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return "f32";
    case dtype::f64:
      return "f64";
    case dtype::f16:
      return "f16";
    case dtype::bf16:
      return "bf16";
    case dtype::c32:
      return "c32";
    case dtype::c64:
      return "c64";
    case dtype::i8:
      return "i8";
    case dtype::i32:
      return "i32";
    case dtype::i64:
      return "i64";
    case dtype::u8:
      return "u8";
    case dtype::u32:
      return "u32";
    case dtype::u64:
      return "u64";
  }
  return "unknown";
}

std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return sizeof(float);
    case dtype::f64:
      return sizeof(double);
    case dtype::f16:
      return sizeof(half);
    case dtype::bf16:
      return sizeof(bfloat16);
    case dtype::c32:
      return sizeof(std::complex<float>);
    case dtype::c64:
      return sizeof(std::complex<double>);
    case dtype::i8:
      return 1;
    case dtype::i32:
      return 4;
    case dtype::i64:
      return 8;
    case dtype::u8:
      return 1;
    case dtype::u32:
      return 4;
    case dtype::u64:
      return 8;
  }
  return 1;
}

}  // namespace atomr::cuda
