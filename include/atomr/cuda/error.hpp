// gpu_error, result<T> and the classification of every CUDA library status.
#pragma once

// result.hpp first: in Boost 1.81 policy/base.hpp needs the traits it declares.
#include <boost/outcome/result.hpp>
#include <boost/outcome/bad_access.hpp>
#include <boost/outcome/policy/base.hpp>
#include <boost/outcome/try.hpp>

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <string_view>

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cufft.h>
#include <curand.h>

namespace atomr::cuda {

namespace outcome = BOOST_OUTCOME_V2_NAMESPACE;

/// What went wrong, independent of which library said it. The supervision
/// decision and every caller's branching is made on this code alone.
enum class errc : std::uint8_t {
  ok = 0,              ///< not an error (never stored in a gpu_error)
  context_poisoned,    ///< a sticky fault: the CUDA context of this process is lost
  out_of_memory,       ///< an allocation failed (device or host), whichever library said so
  unrecoverable,       ///< the process or hardware is in a state nothing here can repair
  stale_ref,           ///< a gpu_ref from an earlier device generation, or a stopped device
  invalid_argument,    ///< rejected before (or by) the library: shape, size, pointer, config
  timeout,             ///< the wait ended at its deadline; the GPU work goes on
  cancelled,           ///< the wait was cancelled; the GPU work goes on
  driver,              ///< another CUDA runtime or driver failure the process survives
  library,             ///< a library-internal failure the process survives
  device_unavailable,  ///< no usable GPU, driver too old, device stopped or absent
  not_supported,       ///< the request is valid but this device or library cannot do it
};

/// Short stable name of a code ("context_poisoned", ...).
std::string_view to_string(errc code) noexcept;

/// One failure as a value: the code, the library that reported it, the
/// library's own status number and a readable message. Cheap to move.
class gpu_error {
public:
  gpu_error() = default;
  /// An error with these parts. `library` must outlive every copy (the
  /// library passes string literals); make_error() and classify() are the
  /// usual ways to make one.
  gpu_error(errc code, std::string_view library, int native_status, std::string message)
      : code_(code), library_(library), native_(native_status), message_(std::move(message)) {}

  /// What went wrong (errc): what callers and supervise() decide on.
  errc code() const noexcept { return code_; }
  /// "cuda", "cublas", "cudnn", "cufft", "curand", "nccl" or "atomr" (checks
  /// done by this library).
  std::string_view library() const noexcept { return library_; }
  /// The library's status number (cudaError_t, cublasStatus_t, ...); 0 for our own checks.
  int native_status() const noexcept { return native_; }
  /// Readable text, e.g. "cublas: cublasSgemm failed: CUBLAS_STATUS_... (n): ...".
  const std::string& message() const noexcept { return message_; }

  /// A copy whose library tag is `library` and whose message says so, unless
  /// it already carries a tag (driver errors inside a library call).
  gpu_error tagged(std::string_view library) const;

  friend bool operator==(const gpu_error& a, errc b) noexcept { return a.code_ == b; }

private:
  errc code_ = errc::ok;
  std::string_view library_ = "atomr";  // always a string literal
  int native_ = 0;
  std::string message_;
};

/// Writes "[library:native_status] code: message".
std::ostream& operator<<(std::ostream& os, const gpu_error& e);

/// Thrown by result<T>::value() when it holds an error; what() is the error's message.
class gpu_exception : public std::runtime_error {
public:
  /// Carries `e`; what() is its message.
  explicit gpu_exception(gpu_error e) : std::runtime_error(e.message()), error_(std::move(e)) {}
  /// The error that was accessed as a value.
  const gpu_error& error() const noexcept { return error_; }

private:
  gpu_error error_;
};

namespace detail {
// Outcome policy: wide access to a missing value throws gpu_exception with
// the stored error, so `.value()` reads like the message a user would log.
struct throw_gpu_error : outcome::policy::base {
  template <class Impl>
  static constexpr void wide_value_check(Impl&& self) {
    if (!base::_has_value(self)) {
      if (base::_has_error(self)) throw gpu_exception(base::_error(self));
      throw outcome::bad_result_access("result has no value");
    }
  }
  template <class Impl>
  static constexpr void wide_error_check(Impl&& self) {
    if (!base::_has_error(self)) throw outcome::bad_result_access("result has no error");
  }
  template <class Impl>
  static constexpr void wide_exception_check(Impl&& self) {
    if (!base::_has_exception(self)) throw outcome::bad_result_access("result has no exception");
  }
};
}  // namespace detail

/// The return type of every fallible operation.
template <class T>
using result = outcome::basic_result<T, gpu_error, detail::throw_gpu_error>;

/// A failure detected by this library before any GPU call.
gpu_error make_error(errc code, std::string message);

/// Classification: one function per library status type. `context` names the
/// call that failed (e.g. "cudaMemcpyAsync") and goes into the message. The
/// error carries the library's tag and the status number; sticky CUDA errors
/// are context_poisoned, allocation failures out_of_memory (docs/design.md,
/// "Errors").
/// @{
gpu_error classify(cudaError_t status, std::string_view context = {});
gpu_error classify(cublasStatus_t status, std::string_view context = {});
gpu_error classify(cufftResult status, std::string_view context = {});
gpu_error classify(curandStatus_t status, std::string_view context = {});
/// @}

/// The code alone, for tests and for deciding without building a message.
/// @{
errc classify_code(cudaError_t status) noexcept;
errc classify_code(cublasStatus_t status) noexcept;
errc classify_code(cufftResult status) noexcept;
errc classify_code(curandStatus_t status) noexcept;
/// @}

/// True for CUDA errors after which the context is unusable for the process.
bool is_sticky(cudaError_t status) noexcept;

/// What a supervisor does after a failure with this code.
enum class decision : std::uint8_t {
  resume,    ///< the failure was local to one request; keep going
  restart,   ///< the device (context) is lost; rebuild it (a fresh process, once isolated)
  stop,      ///< the device cannot serve; stop using it
  escalate,  ///< beyond this supervisor: hand to the caller's policy
};
/// The enumerator's name ("resume", ...); "unknown" for any other value.
std::string_view to_string(decision d) noexcept;

/// The default supervision decision for a code.
decision supervise(errc code) noexcept;

}  // namespace atomr::cuda
