// cuDNN 9 status classification.
#include "atomr/cuda/cudnn_error.hpp"

#include <string>

namespace atomr::cuda {

namespace {

constexpr std::string_view k_cudnn = "cudnn";

// cudnnGetErrorString gives only the enumerator name, so the prose comes from here,
// by family, so that values newer than this header still read sensibly.
std::string_view family_description(int status) noexcept {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "success";
    case CUDNN_STATUS_RUNTIME_IN_PROGRESS:
      return "kernels still running; no error found yet";
    case CUDNN_STATUS_RUNTIME_FP_OVERFLOW:
      return "numerical overflow detected in a kernel";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
      return "host memory allocation failed";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return "device memory allocation failed";
    default:
      break;
  }
  switch (status / 1000) {
    case 1:
      return "library not initialized, mismatched or not loadable";
    case 2:
      return "invalid parameter";
    case 3:
      return "not supported for these parameters or this device";
    case 4:
      return "internal library error";
    case 5:
      return "GPU execution failed";
    default:
      return "unrecognized status";
  }
}

}  // namespace

errc classify_code(cudnnStatus_t status) noexcept {
  const int v = static_cast<int>(status);
  switch (v) {
    case CUDNN_STATUS_SUCCESS:
    // Reported by cudnnQueryRuntimeError while kernels run: like cudaErrorNotReady.
    case CUDNN_STATUS_RUNTIME_IN_PROGRESS:
      return errc::ok;
    // Data-dependent failure of one call; the library and context are fine.
    case CUDNN_STATUS_RUNTIME_FP_OVERFLOW:
      return errc::library;
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return errc::out_of_memory;
    case CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM:
      return errc::invalid_argument;
    default:
      break;
  }
  switch (v / 1000) {
    case 2:
      return errc::invalid_argument;
    case 3:
      return errc::not_supported;
    default:
      return errc::library;  // 1xxx, 4xxx, 5xxx and anything unknown
  }
}

gpu_error classify(cudnnStatus_t status, std::string_view context) {
  const errc code = classify_code(status);
  const int n = static_cast<int>(status);
  const char* name = cudnnGetErrorString(status);
  // Same shape as error.cpp: "<lib>: <context> failed: <NAME> (<n>): <description>".
  std::string m(k_cudnn);
  m += ": ";
  if (!context.empty()) m.append(context).append(code != errc::ok ? " failed: " : " returned: ");
  m.append(name != nullptr ? name : "CUDNN_UNKNOWN_STATUS");
  m.append(" (").append(std::to_string(n)).append("): ").append(family_description(n));
  return gpu_error(code, k_cudnn, n, std::move(m));
}

}  // namespace atomr::cuda
