// The element types a gpu_ref may hold, and their runtime tag.
#pragma once

#include <complex>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace atomr::cuda {

using half = __half;             ///< IEEE half precision (CUDA's __half), element type f16
using bfloat16 = __nv_bfloat16;  ///< bfloat16 (CUDA's __nv_bfloat16), element type bf16

/// Runtime tag of an element type, for checks in library actors.
enum class dtype : std::uint8_t {
  f32,
  f64,
  f16,
  bf16,
  c32,  ///< std::complex<float>, layout of cuComplex / cufftComplex
  c64,  ///< std::complex<double>, layout of cuDoubleComplex
  i8,
  i32,
  i64,
  u8,
  u32,
  u64,
};

/// The enumerator's name ("f32", ...); "unknown" for any other value.
std::string_view to_string(dtype t) noexcept;

namespace detail {
template <class T>
struct dtype_of_impl;
template <>
struct dtype_of_impl<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of_impl<double> : std::integral_constant<dtype, dtype::f64> {};
template <>
struct dtype_of_impl<half> : std::integral_constant<dtype, dtype::f16> {};
template <>
struct dtype_of_impl<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <>
struct dtype_of_impl<std::complex<float>> : std::integral_constant<dtype, dtype::c32> {};
template <>
struct dtype_of_impl<std::complex<double>> : std::integral_constant<dtype, dtype::c64> {};
template <>
struct dtype_of_impl<std::int8_t> : std::integral_constant<dtype, dtype::i8> {};
template <>
struct dtype_of_impl<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <>
struct dtype_of_impl<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <>
struct dtype_of_impl<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
template <>
struct dtype_of_impl<std::uint32_t> : std::integral_constant<dtype, dtype::u32> {};
template <>
struct dtype_of_impl<std::uint64_t> : std::integral_constant<dtype, dtype::u64> {};

template <class T, class = void>
struct is_element : std::false_type {};
template <class T>
struct is_element<T, std::void_t<decltype(dtype_of_impl<T>::value)>> : std::true_type {};
}  // namespace detail

/// The types device buffers may hold: those with a dtype above (float, double,
/// half, bfloat16, std::complex<float>, std::complex<double>, int8/32/64 and
/// uint8/32/64).
template <class T>
concept element = detail::is_element<T>::value;

/// The runtime tag of T.
template <element T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<T>::value;

/// Size in bytes of one element of type t.
std::size_t size_of(dtype t) noexcept;

}  // namespace atomr::cuda
