// gpu_error formatting and the classification of CUDA, cuBLAS, cuFFT and cuRAND statuses.
#include "atomr/cuda/error.hpp"

#include <ostream>
#include <string>

namespace atomr::cuda {

namespace {

constexpr std::string_view k_cuda = "cuda";
constexpr std::string_view k_cublas = "cublas";
constexpr std::string_view k_cudnn = "cudnn";
constexpr std::string_view k_cufft = "cufft";
constexpr std::string_view k_curand = "curand";
constexpr std::string_view k_nccl = "nccl";
constexpr std::string_view k_atomr = "atomr";

// gpu_error stores a string_view, so every tag must be one of the literals above.
std::string_view canonical_library(std::string_view lib) noexcept {
  for (std::string_view known : {k_cuda, k_cublas, k_cudnn, k_cufft, k_curand, k_nccl, k_atomr}) {
    if (lib == known) return known;
  }
  return k_atomr;
}

std::string_view or_unknown(const char* s) noexcept {
  return s != nullptr ? std::string_view(s) : std::string_view("unrecognized status");
}

// "<lib>: <context> failed: <NAME> (<n>): <description>"; cudnn_error.cpp writes the same.
std::string format_status_message(std::string_view lib, std::string_view context, bool failure,
                                  std::string_view name, int number, std::string_view description) {
  std::string m;
  m.reserve(lib.size() + context.size() + name.size() + description.size() + 32);
  m.append(lib).append(": ");
  if (!context.empty()) {
    // A non-failure status (cudaErrorNotReady) must not read as "failed".
    m.append(context).append(failure ? " failed: " : " returned: ");
  }
  m.append(name).append(" (").append(std::to_string(number)).append(")");
  if (!description.empty()) m.append(": ").append(description);
  return m;
}

}  // namespace

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::ok:
      return "ok";
    case errc::context_poisoned:
      return "context_poisoned";
    case errc::out_of_memory:
      return "out_of_memory";
    case errc::unrecoverable:
      return "unrecoverable";
    case errc::stale_ref:
      return "stale_ref";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::timeout:
      return "timeout";
    case errc::cancelled:
      return "cancelled";
    case errc::driver:
      return "driver";
    case errc::library:
      return "library";
    case errc::device_unavailable:
      return "device_unavailable";
    case errc::not_supported:
      return "not_supported";
  }
  return "unknown";
}

std::string_view to_string(decision d) noexcept {
  switch (d) {
    case decision::resume:
      return "resume";
    case decision::restart:
      return "restart";
    case decision::stop:
      return "stop";
    case decision::escalate:
      return "escalate";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, const gpu_error& e) {
  return os << '[' << e.library() << ':' << e.native_status() << "] " << to_string(e.code()) << ": "
            << e.message();
}

gpu_error gpu_error::tagged(std::string_view library) const {
  const std::string_view lib = canonical_library(library);
  // Only untagged (atomr) or driver-level (cuda) errors take a new tag, and never a less
  // specific one: a cuda error stays "cuda" rather than become "atomr".
  const bool retag = (library_ == k_atomr && lib != k_atomr) ||
                     (library_ == k_cuda && lib != k_cuda && lib != k_atomr);
  if (!retag) return *this;

  std::string prefix(lib);
  prefix += ": ";
  std::string msg = message_.starts_with(prefix) ? message_ : prefix + message_;
  return gpu_error(code_, lib, native_, std::move(msg));
}

gpu_error make_error(errc code, std::string message) {
  return gpu_error(code, k_atomr, 0, std::move(message));
}

decision supervise(errc code) noexcept {
  switch (code) {
    case errc::context_poisoned:
      return decision::restart;
    case errc::unrecoverable:
      return decision::escalate;
    case errc::device_unavailable:
      return decision::stop;
    case errc::ok:
    case errc::stale_ref:
    case errc::out_of_memory:
    case errc::invalid_argument:
    case errc::timeout:
    case errc::cancelled:
    case errc::driver:
    case errc::library:
    case errc::not_supported:
      return decision::resume;
  }
  return decision::escalate;  // a value outside the enum: let the caller decide
}

// ---------------------------------------------------------------------------------------------
// CUDA runtime

errc classify_code(cudaError_t status) noexcept {
  switch (status) {
    // Not failures: completion and "still running".
    case cudaSuccess:
    case cudaErrorNotReady:
      return errc::ok;

    // Sticky: every later call in this process fails the same way.
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorExternalDevice:
    case cudaErrorMpsClientTerminated:
    // What every call returns after a fault on the current driver.
    case cudaErrorDevicesUnavailable:
    // The context our streams, events and allocations belong to is gone: same recovery.
    case cudaErrorContextIsDestroyed:
      return errc::context_poisoned;

    case cudaErrorMemoryAllocation:
      return errc::out_of_memory;

    case cudaErrorInitializationError:
    case cudaErrorCudartUnloading:
    case cudaErrorStubLibrary:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorSoftwareValidityNotEstablished:
    case cudaErrorStartupFailure:
    case cudaErrorDeviceUninitialized:
    case cudaErrorDeviceAlreadyInUse:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorMpsConnectionFailed:
      return errc::device_unavailable;

    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidSymbol:
    case cudaErrorInvalidHostPointer:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidTexture:
    case cudaErrorInvalidTextureBinding:
    case cudaErrorInvalidChannelDescriptor:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorInvalidFilterSetting:
    case cudaErrorInvalidNormSetting:
    case cudaErrorInvalidSurface:
    case cudaErrorMissingConfiguration:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorInvalidKernelImage:
    case cudaErrorArrayIsMapped:
    case cudaErrorAlreadyMapped:
    case cudaErrorAlreadyAcquired:
    case cudaErrorNotMapped:
    case cudaErrorNotMappedAsArray:
    case cudaErrorNotMappedAsPointer:
    case cudaErrorInvalidPtx:
    case cudaErrorInvalidGraphicsContext:
    case cudaErrorInvalidSource:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorIllegalState:
    case cudaErrorLossyQuery:
    case cudaErrorSymbolNotFound:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorPeerAccessAlreadyEnabled:
    case cudaErrorPeerAccessNotEnabled:
    case cudaErrorSetOnActiveProcess:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
    case cudaErrorCooperativeLaunchTooLarge:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorGraphExecUpdateFailure:
    case cudaErrorInvalidClusterSize:
    case cudaErrorFunctionNotLoaded:
    case cudaErrorInvalidResourceType:
    case cudaErrorInvalidResourceConfiguration:
      return errc::invalid_argument;

    case cudaErrorNotYetImplemented:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorLaunchFileScopedTex:
    case cudaErrorLaunchFileScopedSurf:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedLimit:
    case cudaErrorPeerAccessUnsupported:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilationDisabled:
    case cudaErrorUnsupportedExecAffinity:
    case cudaErrorUnsupportedDevSideSync:
    case cudaErrorLaunchIncompatibleTexturing:
    case cudaErrorNotPermitted:
    case cudaErrorNotSupported:
    case cudaErrorCdpNotSupported:
    case cudaErrorCdpVersionMismatch:
      return errc::not_supported;

    case cudaErrorTimeout:
      return errc::timeout;

    default:
      return errc::driver;
  }
}

bool is_sticky(cudaError_t status) noexcept {
  return classify_code(status) == errc::context_poisoned;
}

gpu_error classify(cudaError_t status, std::string_view context) {
  const errc code = classify_code(status);
  const int n = static_cast<int>(status);
  return gpu_error(
      code, k_cuda, n,
      format_status_message(k_cuda, context, code != errc::ok, or_unknown(cudaGetErrorName(status)),
                            n, or_unknown(cudaGetErrorString(status))));
}

// ---------------------------------------------------------------------------------------------
// cuBLAS

errc classify_code(cublasStatus_t status) noexcept {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return errc::ok;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return errc::out_of_memory;
    case CUBLAS_STATUS_INVALID_VALUE:
      return errc::invalid_argument;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return errc::not_supported;
    // EXECUTION_FAILED can hide a sticky fault; the caller probes the context for that.
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_MAPPING_ERROR:
    case CUBLAS_STATUS_EXECUTION_FAILED:
    case CUBLAS_STATUS_INTERNAL_ERROR:
    case CUBLAS_STATUS_LICENSE_ERROR:
    default:
      return errc::library;
  }
}

gpu_error classify(cublasStatus_t status, std::string_view context) {
  const errc code = classify_code(status);
  const int n = static_cast<int>(status);
#if ATOMR_CUDA_HAS_CUBLAS
  const std::string_view name = or_unknown(cublasGetStatusName(status));
  const std::string_view text = or_unknown(cublasGetStatusString(status));
#else  // built without cuBLAS: only the header's enum is known
  const std::string_view name = "CUBLAS_STATUS";
  const std::string_view text = "cuBLAS status (library not linked)";
#endif
  return gpu_error(code, k_cublas, n,
                   format_status_message(k_cublas, context, code != errc::ok, name, n, text));
}

// ---------------------------------------------------------------------------------------------
// cuFFT (no string functions in the library)

namespace {

struct status_text {
  const char* name;
  const char* description;
};

status_text cufft_text(int status) noexcept {
  switch (status) {
    case CUFFT_SUCCESS:
      return {"CUFFT_SUCCESS", "the operation completed successfully"};
    case CUFFT_INVALID_PLAN:
      return {"CUFFT_INVALID_PLAN", "invalid plan handle"};
    case CUFFT_ALLOC_FAILED:
      return {"CUFFT_ALLOC_FAILED", "memory allocation failed"};
    case CUFFT_INVALID_TYPE:
      return {"CUFFT_INVALID_TYPE", "invalid transform type"};
    case CUFFT_INVALID_VALUE:
      return {"CUFFT_INVALID_VALUE", "invalid argument or pointer"};
    case CUFFT_INTERNAL_ERROR:
      return {"CUFFT_INTERNAL_ERROR", "internal driver error"};
    case CUFFT_EXEC_FAILED:
      return {"CUFFT_EXEC_FAILED", "failed to execute the FFT on the GPU"};
    case CUFFT_SETUP_FAILED:
      return {"CUFFT_SETUP_FAILED", "the cuFFT library failed to initialize"};
    case CUFFT_INVALID_SIZE:
      return {"CUFFT_INVALID_SIZE", "invalid transform size"};
    case CUFFT_UNALIGNED_DATA:
      return {"CUFFT_UNALIGNED_DATA", "data is not properly aligned"};
    case CUFFT_INVALID_DEVICE:
      return {"CUFFT_INVALID_DEVICE", "execution on a different GPU than the plan was made for"};
    case CUFFT_NO_WORKSPACE:
      return {"CUFFT_NO_WORKSPACE", "no workspace has been provided"};
    case CUFFT_NOT_IMPLEMENTED:
      return {"CUFFT_NOT_IMPLEMENTED", "functionality not implemented in this version"};
    case CUFFT_NOT_SUPPORTED:
      return {"CUFFT_NOT_SUPPORTED", "operation not supported for these parameters"};
    case CUFFT_MISSING_DEPENDENCY:
      return {"CUFFT_MISSING_DEPENDENCY", "a required library dependency is missing"};
    case CUFFT_NVRTC_FAILURE:
      return {"CUFFT_NVRTC_FAILURE", "NVRTC runtime compilation failed"};
    case CUFFT_NVJITLINK_FAILURE:
      return {"CUFFT_NVJITLINK_FAILURE", "nvJitLink just-in-time linking failed"};
    case CUFFT_NVSHMEM_FAILURE:
      return {"CUFFT_NVSHMEM_FAILURE", "an NVSHMEM call failed"};
    // Values removed from the CUDA 13 header but returned by older libraries.
    case 0xA:
      return {"CUFFT_INCOMPLETE_PARAMETER_LIST", "missing parameters in call"};
    case 0xC:
      return {"CUFFT_PARSE_ERROR", "plan parse error"};
    case 0xF:
      return {"CUFFT_LICENSE_ERROR", "license error"};
    default:
      return {"CUFFT_UNKNOWN_STATUS", "unrecognized status"};
  }
}

status_text curand_text(int status) noexcept {
  switch (status) {
    case CURAND_STATUS_SUCCESS:
      return {"CURAND_STATUS_SUCCESS", "no errors"};
    case CURAND_STATUS_VERSION_MISMATCH:
      return {"CURAND_STATUS_VERSION_MISMATCH",
              "header file and linked library version do not match"};
    case CURAND_STATUS_NOT_INITIALIZED:
      return {"CURAND_STATUS_NOT_INITIALIZED", "generator not initialized"};
    case CURAND_STATUS_ALLOCATION_FAILED:
      return {"CURAND_STATUS_ALLOCATION_FAILED", "memory allocation failed"};
    case CURAND_STATUS_TYPE_ERROR:
      return {"CURAND_STATUS_TYPE_ERROR", "generator is wrong type"};
    case CURAND_STATUS_OUT_OF_RANGE:
      return {"CURAND_STATUS_OUT_OF_RANGE", "argument out of range"};
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE:
      return {"CURAND_STATUS_LENGTH_NOT_MULTIPLE",
              "length requested is not a multiple of the dimension"};
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED:
      return {"CURAND_STATUS_DOUBLE_PRECISION_REQUIRED",
              "GPU does not have the double precision the generator requires"};
    case CURAND_STATUS_LAUNCH_FAILURE:
      return {"CURAND_STATUS_LAUNCH_FAILURE", "kernel launch failure"};
    case CURAND_STATUS_PREEXISTING_FAILURE:
      return {"CURAND_STATUS_PREEXISTING_FAILURE", "preexisting failure on library entry"};
    case CURAND_STATUS_INITIALIZATION_FAILED:
      return {"CURAND_STATUS_INITIALIZATION_FAILED", "initialization of CUDA failed"};
    case CURAND_STATUS_ARCH_MISMATCH:
      return {"CURAND_STATUS_ARCH_MISMATCH", "GPU does not support the requested feature"};
    case CURAND_STATUS_INTERNAL_ERROR:
      return {"CURAND_STATUS_INTERNAL_ERROR", "internal library error"};
    default:
      return {"CURAND_UNKNOWN_STATUS", "unrecognized status"};
  }
}

}  // namespace

errc classify_code(cufftResult status) noexcept {
  switch (static_cast<int>(status)) {
    case CUFFT_SUCCESS:
      return errc::ok;
    case CUFFT_ALLOC_FAILED:
      return errc::out_of_memory;
    case CUFFT_INVALID_PLAN:
    case CUFFT_INVALID_TYPE:
    case CUFFT_INVALID_VALUE:
    case CUFFT_INVALID_SIZE:
    case CUFFT_UNALIGNED_DATA:
    case CUFFT_NO_WORKSPACE:
    case 0xA:  // CUFFT_INCOMPLETE_PARAMETER_LIST, gone from the CUDA 13 header
      return errc::invalid_argument;
    case CUFFT_NOT_IMPLEMENTED:
    case CUFFT_NOT_SUPPORTED:
      return errc::not_supported;
    case CUFFT_INVALID_DEVICE:
      return errc::device_unavailable;
    default:
      return errc::library;
  }
}

gpu_error classify(cufftResult status, std::string_view context) {
  const errc code = classify_code(status);
  const int n = static_cast<int>(status);
  const status_text t = cufft_text(n);
  return gpu_error(
      code, k_cufft, n,
      format_status_message(k_cufft, context, code != errc::ok, t.name, n, t.description));
}

errc classify_code(curandStatus_t status) noexcept {
  switch (status) {
    case CURAND_STATUS_SUCCESS:
      return errc::ok;
    case CURAND_STATUS_ALLOCATION_FAILED:
      return errc::out_of_memory;
    case CURAND_STATUS_TYPE_ERROR:
    case CURAND_STATUS_OUT_OF_RANGE:
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE:
      return errc::invalid_argument;
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED:
    case CURAND_STATUS_ARCH_MISMATCH:
      return errc::not_supported;
    // A CUDA error was already pending on entry: in practice a sticky fault from earlier work.
    case CURAND_STATUS_PREEXISTING_FAILURE:
      return errc::context_poisoned;
    case CURAND_STATUS_INITIALIZATION_FAILED:
      return errc::device_unavailable;
    case CURAND_STATUS_VERSION_MISMATCH:
    case CURAND_STATUS_NOT_INITIALIZED:
    case CURAND_STATUS_LAUNCH_FAILURE:
    case CURAND_STATUS_INTERNAL_ERROR:
    default:
      return errc::library;
  }
}

gpu_error classify(curandStatus_t status, std::string_view context) {
  const errc code = classify_code(status);
  const int n = static_cast<int>(status);
  const status_text t = curand_text(n);
  return gpu_error(
      code, k_curand, n,
      format_status_message(k_curand, context, code != errc::ok, t.name, n, t.description));
}

}  // namespace atomr::cuda
