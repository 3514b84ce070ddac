// gpu_error, result<T> and the classification of CUDA, cuBLAS, cuFFT and cuRAND statuses.
#include <doctest/doctest.h>

#include <cstring>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "atomr/cuda/error.hpp"

using namespace atomr::cuda;

namespace {

template <class Status>
struct row {
  Status status;
  const char* name;
  errc expected;
};

#define ROW(s, c) \
  { s, #s, errc::c }

bool contains(const std::string& hay, std::string_view needle) {
  return hay.find(needle) != std::string::npos;
}

const errc all_errc[] = {
    errc::ok,
    errc::context_poisoned,
    errc::out_of_memory,
    errc::unrecoverable,
    errc::stale_ref,
    errc::invalid_argument,
    errc::timeout,
    errc::cancelled,
    errc::driver,
    errc::library,
    errc::device_unavailable,
    errc::not_supported,
};

// Checks what every classify() must give: code, tag, native number, and a message that names
// the status, its number and the failing call.
template <class Status>
void check_rows(const std::vector<row<Status>>& rows, std::string_view lib) {
  std::set<int> seen;
  for (const auto& r : rows) {
    INFO(r.name);
    const int n = static_cast<int>(r.status);
    CHECK_MESSAGE(seen.insert(n).second, "duplicate row");
    CHECK(classify_code(r.status) == r.expected);

    const gpu_error e = classify(r.status, "someCall");
    CHECK(e.code() == r.expected);
    CHECK(e == r.expected);
    CHECK(e.library() == lib);
    CHECK(e.native_status() == n);
    const std::string& m = e.message();
    CHECK(m.starts_with(std::string(lib) + ": someCall "));
    CHECK(contains(m, r.name));
    CHECK(contains(m, "(" + std::to_string(n) + ")"));
    CHECK(contains(m, r.expected == errc::ok ? "someCall returned: " : "someCall failed: "));

    const gpu_error bare = classify(r.status);
    CHECK(bare.code() == r.expected);
    CHECK(bare.message() == std::string(lib) + ": " + m.substr(m.find(r.name)));
  }
}

const std::vector<row<cudaError_t>> cuda_rows = {
    ROW(cudaSuccess, ok),
    ROW(cudaErrorInvalidValue, invalid_argument),
    ROW(cudaErrorMemoryAllocation, out_of_memory),
    ROW(cudaErrorInitializationError, device_unavailable),
    ROW(cudaErrorCudartUnloading, device_unavailable),
    ROW(cudaErrorProfilerDisabled, driver),
    ROW(cudaErrorProfilerNotInitialized, driver),
    ROW(cudaErrorProfilerAlreadyStarted, driver),
    ROW(cudaErrorProfilerAlreadyStopped, driver),
    ROW(cudaErrorInvalidConfiguration, invalid_argument),
    ROW(cudaErrorInvalidPitchValue, invalid_argument),
    ROW(cudaErrorInvalidSymbol, invalid_argument),
    ROW(cudaErrorInvalidHostPointer, invalid_argument),
    ROW(cudaErrorInvalidDevicePointer, invalid_argument),
    ROW(cudaErrorInvalidTexture, invalid_argument),
    ROW(cudaErrorInvalidTextureBinding, invalid_argument),
    ROW(cudaErrorInvalidChannelDescriptor, invalid_argument),
    ROW(cudaErrorInvalidMemcpyDirection, invalid_argument),
    ROW(cudaErrorAddressOfConstant, driver),
    ROW(cudaErrorTextureFetchFailed, driver),
    ROW(cudaErrorTextureNotBound, driver),
    ROW(cudaErrorSynchronizationError, driver),
    ROW(cudaErrorInvalidFilterSetting, invalid_argument),
    ROW(cudaErrorInvalidNormSetting, invalid_argument),
    ROW(cudaErrorMixedDeviceExecution, driver),
    ROW(cudaErrorNotYetImplemented, not_supported),
    ROW(cudaErrorMemoryValueTooLarge, driver),
    ROW(cudaErrorStubLibrary, device_unavailable),
    ROW(cudaErrorInsufficientDriver, device_unavailable),
    ROW(cudaErrorCallRequiresNewerDriver, not_supported),
    ROW(cudaErrorInvalidSurface, invalid_argument),
    ROW(cudaErrorDuplicateVariableName, driver),
    ROW(cudaErrorDuplicateTextureName, driver),
    ROW(cudaErrorDuplicateSurfaceName, driver),
    ROW(cudaErrorDevicesUnavailable, context_poisoned),
    ROW(cudaErrorIncompatibleDriverContext, driver),
    ROW(cudaErrorMissingConfiguration, invalid_argument),
    ROW(cudaErrorPriorLaunchFailure, driver),
    ROW(cudaErrorLaunchMaxDepthExceeded, driver),
    ROW(cudaErrorLaunchFileScopedTex, not_supported),
    ROW(cudaErrorLaunchFileScopedSurf, not_supported),
    ROW(cudaErrorSyncDepthExceeded, driver),
    ROW(cudaErrorLaunchPendingCountExceeded, driver),
    ROW(cudaErrorInvalidDeviceFunction, invalid_argument),
    ROW(cudaErrorNoDevice, device_unavailable),
    ROW(cudaErrorInvalidDevice, device_unavailable),
    ROW(cudaErrorDeviceNotLicensed, device_unavailable),
    ROW(cudaErrorSoftwareValidityNotEstablished, device_unavailable),
    ROW(cudaErrorStartupFailure, device_unavailable),
    ROW(cudaErrorInvalidKernelImage, invalid_argument),
    ROW(cudaErrorDeviceUninitialized, device_unavailable),
    ROW(cudaErrorMapBufferObjectFailed, driver),
    ROW(cudaErrorUnmapBufferObjectFailed, driver),
    ROW(cudaErrorArrayIsMapped, invalid_argument),
    ROW(cudaErrorAlreadyMapped, invalid_argument),
    ROW(cudaErrorNoKernelImageForDevice, not_supported),
    ROW(cudaErrorAlreadyAcquired, invalid_argument),
    ROW(cudaErrorNotMapped, invalid_argument),
    ROW(cudaErrorNotMappedAsArray, invalid_argument),
    ROW(cudaErrorNotMappedAsPointer, invalid_argument),
    ROW(cudaErrorECCUncorrectable, context_poisoned),
    ROW(cudaErrorUnsupportedLimit, not_supported),
    ROW(cudaErrorDeviceAlreadyInUse, device_unavailable),
    ROW(cudaErrorPeerAccessUnsupported, not_supported),
    ROW(cudaErrorInvalidPtx, invalid_argument),
    ROW(cudaErrorInvalidGraphicsContext, invalid_argument),
    ROW(cudaErrorNvlinkUncorrectable, context_poisoned),
    ROW(cudaErrorJitCompilerNotFound, not_supported),
    ROW(cudaErrorUnsupportedPtxVersion, not_supported),
    ROW(cudaErrorJitCompilationDisabled, not_supported),
    ROW(cudaErrorUnsupportedExecAffinity, not_supported),
    ROW(cudaErrorUnsupportedDevSideSync, not_supported),
    ROW(cudaErrorContained, context_poisoned),
    ROW(cudaErrorInvalidSource, invalid_argument),
    ROW(cudaErrorFileNotFound, driver),
    ROW(cudaErrorSharedObjectSymbolNotFound, driver),
    ROW(cudaErrorSharedObjectInitFailed, driver),
    ROW(cudaErrorOperatingSystem, driver),
    ROW(cudaErrorInvalidResourceHandle, invalid_argument),
    ROW(cudaErrorIllegalState, invalid_argument),
    ROW(cudaErrorLossyQuery, invalid_argument),
    ROW(cudaErrorSymbolNotFound, invalid_argument),
    ROW(cudaErrorNotReady, ok),
    ROW(cudaErrorIllegalAddress, context_poisoned),
    ROW(cudaErrorLaunchOutOfResources, invalid_argument),
    ROW(cudaErrorLaunchTimeout, context_poisoned),
    ROW(cudaErrorLaunchIncompatibleTexturing, not_supported),
    ROW(cudaErrorPeerAccessAlreadyEnabled, invalid_argument),
    ROW(cudaErrorPeerAccessNotEnabled, invalid_argument),
    ROW(cudaErrorSetOnActiveProcess, invalid_argument),
    ROW(cudaErrorContextIsDestroyed, context_poisoned),
    ROW(cudaErrorAssert, context_poisoned),
    ROW(cudaErrorTooManyPeers, driver),
    ROW(cudaErrorHostMemoryAlreadyRegistered, invalid_argument),
    ROW(cudaErrorHostMemoryNotRegistered, invalid_argument),
    ROW(cudaErrorHardwareStackError, context_poisoned),
    ROW(cudaErrorIllegalInstruction, context_poisoned),
    ROW(cudaErrorMisalignedAddress, context_poisoned),
    ROW(cudaErrorInvalidAddressSpace, context_poisoned),
    ROW(cudaErrorInvalidPc, context_poisoned),
    ROW(cudaErrorLaunchFailure, context_poisoned),
    ROW(cudaErrorCooperativeLaunchTooLarge, invalid_argument),
    ROW(cudaErrorTensorMemoryLeak, context_poisoned),
    ROW(cudaErrorNotPermitted, not_supported),
    ROW(cudaErrorNotSupported, not_supported),
    ROW(cudaErrorSystemNotReady, device_unavailable),
    ROW(cudaErrorSystemDriverMismatch, device_unavailable),
    ROW(cudaErrorCompatNotSupportedOnDevice, device_unavailable),
    ROW(cudaErrorMpsConnectionFailed, device_unavailable),
    ROW(cudaErrorMpsRpcFailure, driver),
    ROW(cudaErrorMpsServerNotReady, driver),
    ROW(cudaErrorMpsMaxClientsReached, driver),
    ROW(cudaErrorMpsMaxConnectionsReached, driver),
    ROW(cudaErrorMpsClientTerminated, context_poisoned),
    ROW(cudaErrorCdpNotSupported, not_supported),
    ROW(cudaErrorCdpVersionMismatch, not_supported),
    ROW(cudaErrorStreamCaptureUnsupported, invalid_argument),
    ROW(cudaErrorStreamCaptureInvalidated, invalid_argument),
    ROW(cudaErrorStreamCaptureMerge, invalid_argument),
    ROW(cudaErrorStreamCaptureUnmatched, invalid_argument),
    ROW(cudaErrorStreamCaptureUnjoined, invalid_argument),
    ROW(cudaErrorStreamCaptureIsolation, invalid_argument),
    ROW(cudaErrorStreamCaptureImplicit, invalid_argument),
    ROW(cudaErrorCapturedEvent, invalid_argument),
    ROW(cudaErrorStreamCaptureWrongThread, invalid_argument),
    ROW(cudaErrorTimeout, timeout),
    ROW(cudaErrorGraphExecUpdateFailure, invalid_argument),
    ROW(cudaErrorExternalDevice, context_poisoned),
    ROW(cudaErrorInvalidClusterSize, invalid_argument),
    ROW(cudaErrorFunctionNotLoaded, invalid_argument),
    ROW(cudaErrorInvalidResourceType, invalid_argument),
    ROW(cudaErrorInvalidResourceConfiguration, invalid_argument),
    ROW(cudaErrorUnknown, driver),
    ROW(cudaErrorApiFailureBase, driver),
};

const std::vector<row<cublasStatus_t>> cublas_rows = {
    ROW(CUBLAS_STATUS_SUCCESS, ok),
    ROW(CUBLAS_STATUS_NOT_INITIALIZED, library),
    ROW(CUBLAS_STATUS_ALLOC_FAILED, out_of_memory),
    ROW(CUBLAS_STATUS_INVALID_VALUE, invalid_argument),
    ROW(CUBLAS_STATUS_ARCH_MISMATCH, not_supported),
    ROW(CUBLAS_STATUS_MAPPING_ERROR, library),
    ROW(CUBLAS_STATUS_EXECUTION_FAILED, library),
    ROW(CUBLAS_STATUS_INTERNAL_ERROR, library),
    ROW(CUBLAS_STATUS_NOT_SUPPORTED, not_supported),
    ROW(CUBLAS_STATUS_LICENSE_ERROR, library),
};

const std::vector<row<cufftResult>> cufft_rows = {
    ROW(CUFFT_SUCCESS, ok),
    ROW(CUFFT_INVALID_PLAN, invalid_argument),
    ROW(CUFFT_ALLOC_FAILED, out_of_memory),
    ROW(CUFFT_INVALID_TYPE, invalid_argument),
    ROW(CUFFT_INVALID_VALUE, invalid_argument),
    ROW(CUFFT_INTERNAL_ERROR, library),
    ROW(CUFFT_EXEC_FAILED, library),
    ROW(CUFFT_SETUP_FAILED, library),
    ROW(CUFFT_INVALID_SIZE, invalid_argument),
    ROW(CUFFT_UNALIGNED_DATA, invalid_argument),
    ROW(CUFFT_INVALID_DEVICE, device_unavailable),
    ROW(CUFFT_NO_WORKSPACE, invalid_argument),
    ROW(CUFFT_NOT_IMPLEMENTED, not_supported),
    ROW(CUFFT_NOT_SUPPORTED, not_supported),
    ROW(CUFFT_MISSING_DEPENDENCY, library),
    ROW(CUFFT_NVRTC_FAILURE, library),
    ROW(CUFFT_NVJITLINK_FAILURE, library),
    ROW(CUFFT_NVSHMEM_FAILURE, library),
};

const std::vector<row<curandStatus_t>> curand_rows = {
    ROW(CURAND_STATUS_SUCCESS, ok),
    ROW(CURAND_STATUS_VERSION_MISMATCH, library),
    ROW(CURAND_STATUS_NOT_INITIALIZED, library),
    ROW(CURAND_STATUS_ALLOCATION_FAILED, out_of_memory),
    ROW(CURAND_STATUS_TYPE_ERROR, invalid_argument),
    ROW(CURAND_STATUS_OUT_OF_RANGE, invalid_argument),
    ROW(CURAND_STATUS_LENGTH_NOT_MULTIPLE, invalid_argument),
    ROW(CURAND_STATUS_DOUBLE_PRECISION_REQUIRED, not_supported),
    ROW(CURAND_STATUS_LAUNCH_FAILURE, library),
    ROW(CURAND_STATUS_PREEXISTING_FAILURE, context_poisoned),
    ROW(CURAND_STATUS_INITIALIZATION_FAILED, device_unavailable),
    ROW(CURAND_STATUS_ARCH_MISMATCH, not_supported),
    ROW(CURAND_STATUS_INTERNAL_ERROR, library),
};

result<int> parse_positive(int v) {
  if (v <= 0) return make_error(errc::invalid_argument, "not positive: " + std::to_string(v));
  return v;
}

// BOOST_OUTCOME_TRY must hand the error on untouched.
result<int> doubled(int v) {
  BOOST_OUTCOME_TRY(auto x, parse_positive(v));
  return 2 * x;
}

result<void> from_cuda(cudaError_t s) {
  if (classify_code(s) != errc::ok) return classify(s, "cudaMemcpyAsync");
  return outcome::success();
}

result<std::string> chained(cudaError_t s) {
  BOOST_OUTCOME_TRY(from_cuda(s));
  return std::string("done");
}

}  // namespace

TEST_CASE("to_string(errc) names every code distinctly") {
  const char* expected[] = {"ok",
                            "context_poisoned",
                            "out_of_memory",
                            "unrecoverable",
                            "stale_ref",
                            "invalid_argument",
                            "timeout",
                            "cancelled",
                            "driver",
                            "library",
                            "device_unavailable",
                            "not_supported"};
  static_assert(std::size(all_errc) == std::size(expected));
  for (std::size_t i = 0; i < std::size(all_errc); ++i) {
    CHECK(to_string(all_errc[i]) == expected[i]);
  }
  CHECK(to_string(static_cast<errc>(200)) == "unknown");
}

TEST_CASE("to_string(decision)") {
  CHECK(to_string(decision::resume) == "resume");
  CHECK(to_string(decision::restart) == "restart");
  CHECK(to_string(decision::stop) == "stop");
  CHECK(to_string(decision::escalate) == "escalate");
  CHECK(to_string(static_cast<decision>(99)) == "unknown");
}

TEST_CASE("supervise() for every code") {
  CHECK(supervise(errc::ok) == decision::resume);
  CHECK(supervise(errc::context_poisoned) == decision::restart);
  CHECK(supervise(errc::out_of_memory) == decision::resume);
  CHECK(supervise(errc::unrecoverable) == decision::escalate);
  CHECK(supervise(errc::stale_ref) == decision::resume);
  CHECK(supervise(errc::invalid_argument) == decision::resume);
  CHECK(supervise(errc::timeout) == decision::resume);
  CHECK(supervise(errc::cancelled) == decision::resume);
  CHECK(supervise(errc::driver) == decision::resume);
  CHECK(supervise(errc::library) == decision::resume);
  CHECK(supervise(errc::device_unavailable) == decision::stop);
  CHECK(supervise(errc::not_supported) == decision::resume);
  CHECK(supervise(static_cast<errc>(200)) == decision::escalate);
}

TEST_CASE("CUDA: every cudaError_t enumerator") {
  check_rows(cuda_rows, "cuda");
  for (const auto& r : cuda_rows) {
    INFO(r.name);
    CHECK(is_sticky(r.status) == (r.expected == errc::context_poisoned));
    const std::string m = classify(r.status, "someCall").message();
    CHECK(contains(m, cudaGetErrorName(r.status)));
    CHECK(contains(m, cudaGetErrorString(r.status)));
  }
}

TEST_CASE("CUDA: the table covers every code the runtime knows") {
  std::set<int> listed, named;
  for (const auto& r : cuda_rows) listed.insert(static_cast<int>(r.status));
  for (int v = 0; v <= 10000; ++v) {
    const char* name = cudaGetErrorName(static_cast<cudaError_t>(v));
    if (std::strcmp(name, "unrecognized error code") == 0) continue;
    named.insert(v);
    INFO(v << " " << name);
    CHECK(listed.count(v) == 1);
  }
  // The loop saw the library's names (not only its placeholder).
  CHECK(named.count(static_cast<int>(cudaErrorIllegalAddress)) == 1);
}

TEST_CASE("CUDA: the sticky set is exactly the documented faults") {
  const std::set<int> sticky = {
      cudaErrorIllegalAddress,      cudaErrorLaunchFailure,
      cudaErrorMisalignedAddress,   cudaErrorIllegalInstruction,
      cudaErrorInvalidAddressSpace, cudaErrorInvalidPc,
      cudaErrorHardwareStackError,  cudaErrorAssert,
      cudaErrorLaunchTimeout,       cudaErrorECCUncorrectable,
      cudaErrorDevicesUnavailable,  cudaErrorContextIsDestroyed,
      cudaErrorExternalDevice,      cudaErrorTensorMemoryLeak,
      cudaErrorNvlinkUncorrectable, cudaErrorContained,
      cudaErrorMpsClientTerminated,
  };
  for (int v = -5; v <= 12000; ++v) {
    const auto s = static_cast<cudaError_t>(v);
    INFO(v);
    CHECK(is_sticky(s) == (sticky.count(v) == 1));
    CHECK(is_sticky(s) == (classify_code(s) == errc::context_poisoned));
  }
  CHECK_FALSE(is_sticky(cudaErrorUnknown));
  CHECK(classify_code(cudaErrorUnknown) == errc::driver);
}

TEST_CASE("CUDA: exact message format") {
  CHECK(classify(cudaErrorMemoryAllocation, "cudaMalloc").message() ==
        "cuda: cudaMalloc failed: cudaErrorMemoryAllocation (2): out of memory");
  CHECK(classify(cudaErrorInvalidValue).message() ==
        "cuda: cudaErrorInvalidValue (1): invalid argument");
  // Not failures: code ok, and the message does not say "failed".
  const gpu_error nr = classify(cudaErrorNotReady, "cudaStreamQuery");
  CHECK(nr.code() == errc::ok);
  CHECK(nr.native_status() == 600);
  CHECK(nr.message() ==
        "cuda: cudaStreamQuery returned: cudaErrorNotReady (600): device not ready");
  CHECK(classify(cudaSuccess).code() == errc::ok);
}

TEST_CASE("unknown status values still give a message with the number") {
  SUBCASE("cuda") {
    for (int v : {12345, -1, 727, 10001}) {
      INFO(v);
      const auto s = static_cast<cudaError_t>(v);
      const gpu_error e = classify(s, "cudaFoo");
      CHECK(e.code() == errc::driver);
      CHECK_FALSE(is_sticky(s));
      CHECK(e.native_status() == v);
      CHECK(e.library() == "cuda");
      CHECK(contains(e.message(), "(" + std::to_string(v) + ")"));
      CHECK(contains(e.message(), "cudaFoo failed"));
    }
  }
  SUBCASE("cublas") {
    const gpu_error e = classify(static_cast<cublasStatus_t>(12345), "cublasSgemm");
    CHECK(e.code() == errc::library);
    CHECK(e.library() == "cublas");
    CHECK(e.native_status() == 12345);
    CHECK(contains(e.message(), "12345"));
    CHECK(contains(e.message(), "cublasSgemm failed"));
  }
  SUBCASE("cufft") {
    const gpu_error e = classify(static_cast<cufftResult>(12345), "cufftExecC2C");
    CHECK(e.code() == errc::library);
    CHECK(e.library() == "cufft");
    CHECK(contains(e.message(), "CUFFT_UNKNOWN_STATUS (12345)"));
  }
  SUBCASE("curand") {
    const gpu_error e = classify(static_cast<curandStatus_t>(12345), "curandGenerate");
    CHECK(e.code() == errc::library);
    CHECK(e.library() == "curand");
    CHECK(contains(e.message(), "CURAND_UNKNOWN_STATUS (12345)"));
  }
}

#if ATOMR_CUDA_HAS_CUBLAS  // names come from the library
TEST_CASE("cuBLAS: every cublasStatus_t enumerator") {
  check_rows(cublas_rows, "cublas");
  for (const auto& r : cublas_rows) {
    INFO(r.name);
    CHECK(contains(classify(r.status).message(), cublasGetStatusString(r.status)));
  }
  CHECK(classify(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate").message() ==
        "cublas: cublasCreate failed: CUBLAS_STATUS_ALLOC_FAILED (3): the resource allocation "
        "failed");
}

TEST_CASE("cuBLAS: the table covers every status the library names") {
  std::set<int> listed, named;
  for (const auto& r : cublas_rows) listed.insert(static_cast<int>(r.status));
  for (int v = 0; v <= 1000; ++v) {
    const char* name = cublasGetStatusName(static_cast<cublasStatus_t>(v));
    if (std::strcmp(name, "unrecognized status") == 0) continue;
    named.insert(v);
    INFO(v << " " << name);
    CHECK(listed.count(v) == 1);
  }
  // The loop saw the library's names (not only its placeholder).
  CHECK(named.count(static_cast<int>(CUBLAS_STATUS_ALLOC_FAILED)) == 1);
}
#endif

TEST_CASE("cuFFT: every cufftResult enumerator") {
  check_rows(cufft_rows, "cufft");
  CHECK(classify(CUFFT_INVALID_SIZE, "cufftPlan1d").message() ==
        "cufft: cufftPlan1d failed: CUFFT_INVALID_SIZE (8): invalid transform size");
  // Values older cuFFT releases returned, gone from the CUDA 13 header.
  CHECK(classify_code(static_cast<cufftResult>(0xA)) == errc::invalid_argument);
  CHECK(contains(classify(static_cast<cufftResult>(0xA)).message(),
                 "CUFFT_INCOMPLETE_PARAMETER_LIST (10)"));
  CHECK(classify_code(static_cast<cufftResult>(0xC)) == errc::library);
  CHECK(contains(classify(static_cast<cufftResult>(0xC)).message(), "CUFFT_PARSE_ERROR (12)"));
  CHECK(classify_code(static_cast<cufftResult>(0xF)) == errc::library);
  CHECK(contains(classify(static_cast<cufftResult>(0xF)).message(), "CUFFT_LICENSE_ERROR (15)"));
}

TEST_CASE("cuRAND: every curandStatus_t enumerator") {
  check_rows(curand_rows, "curand");
  CHECK(classify(CURAND_STATUS_PREEXISTING_FAILURE, "curandGenerateUniform").message() ==
        "curand: curandGenerateUniform failed: CURAND_STATUS_PREEXISTING_FAILURE (202): "
        "preexisting failure on library entry");
}

TEST_CASE("gpu_error basics and operator<<") {
  const gpu_error d;
  CHECK(d.code() == errc::ok);
  CHECK(d.library() == "atomr");
  CHECK(d.native_status() == 0);
  CHECK(d.message().empty());

  std::ostringstream os;
  os << classify(cudaErrorMemoryAllocation, "cudaMalloc");
  CHECK(os.str() ==
        "[cuda:2] out_of_memory: cuda: cudaMalloc failed: cudaErrorMemoryAllocation (2): out of "
        "memory");

  std::ostringstream os2;
  os2 << make_error(errc::stale_ref, "gpu_ref from generation 3");
  CHECK(os2.str() == "[atomr:0] stale_ref: gpu_ref from generation 3");
}

TEST_CASE("make_error") {
  const gpu_error e = make_error(errc::invalid_argument, "n must be > 0");
  CHECK(e.code() == errc::invalid_argument);
  CHECK(e.library() == "atomr");
  CHECK(e.native_status() == 0);
  CHECK(e.message() == "n must be > 0");
}

TEST_CASE("tagged()") {
  SUBCASE("an atomr error takes the library's tag and prefix") {
    const gpu_error t =
        make_error(errc::invalid_argument, "bad leading dimension").tagged("cublas");
    CHECK(t.library() == "cublas");
    CHECK(t.code() == errc::invalid_argument);
    CHECK(t.native_status() == 0);
    CHECK(t.message() == "cublas: bad leading dimension");
  }
  SUBCASE("a driver error inside a library call keeps its native status") {
    const gpu_error c = classify(cudaErrorMemoryAllocation, "cudaMalloc");
    const gpu_error t = c.tagged("cudnn");
    CHECK(t.library() == "cudnn");
    CHECK(t.code() == errc::out_of_memory);
    CHECK(t.native_status() == cudaErrorMemoryAllocation);
    CHECK(t.message() == "cudnn: " + c.message());
  }
  SUBCASE("no double prefix") {
    const gpu_error t = make_error(errc::library, "cufft: plan cache full").tagged("cufft");
    CHECK(t.library() == "cufft");
    CHECK(t.message() == "cufft: plan cache full");
  }
  SUBCASE("a library error keeps its own tag") {
    const gpu_error b = classify(CUBLAS_STATUS_EXECUTION_FAILED, "cublasGemmEx");
    const gpu_error t = b.tagged("cudnn");
    CHECK(t.library() == "cublas");
    CHECK(t.message() == b.message());
    CHECK(t.native_status() == b.native_status());
  }
  SUBCASE("same tag is a plain copy") {
    const gpu_error c = classify(cudaErrorInvalidValue, "cudaMemset");
    const gpu_error t = c.tagged("cuda");
    CHECK(t.library() == "cuda");
    CHECK(t.message() == c.message());
    const gpu_error a = make_error(errc::timeout, "waited 5 s").tagged("atomr");
    CHECK(a.library() == "atomr");
    CHECK(a.message() == "waited 5 s");
  }
  SUBCASE("unknown names map to atomr, and never demote a cuda error") {
    const gpu_error a = make_error(errc::timeout, "waited").tagged("cusparse");
    CHECK(a.library() == "atomr");
    CHECK(a.message() == "waited");
    const gpu_error c = classify(cudaErrorInvalidValue).tagged("cusparse");
    CHECK(c.library() == "cuda");
  }
  SUBCASE("nccl is a known tag (collective_actor's errors)") {
    const gpu_error a = make_error(errc::library, "group failed").tagged("nccl");
    CHECK(a.library() == "nccl");
    CHECK(a.message() == "nccl: group failed");
  }
  SUBCASE("an atomr error can be tagged cuda") {
    const gpu_error t = make_error(errc::driver, "event pool empty").tagged("cuda");
    CHECK(t.library() == "cuda");
    CHECK(t.message() == "cuda: event pool empty");
  }
  SUBCASE("the tag outlives the string it was asked with") {
    std::string name = "curand";
    const gpu_error t = make_error(errc::library, "x").tagged(name);
    name.assign("zzzzzz");
    name.shrink_to_fit();
    CHECK(t.library() == "curand");
    CHECK(t.library().data() != name.data());
  }
}

TEST_CASE("result<T>: value() on an error throws gpu_exception") {
  result<int> r = make_error(errc::out_of_memory, "pool exhausted");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == errc::out_of_memory);
  bool thrown = false;
  try {
    (void)r.value();
  } catch (const gpu_exception& ex) {
    thrown = true;
    CHECK(std::string(ex.what()) == "pool exhausted");
    CHECK(ex.error().code() == errc::out_of_memory);
    CHECK(ex.error().library() == "atomr");
    CHECK(ex.error().message() == "pool exhausted");
  }
  CHECK(thrown);
  CHECK_THROWS_AS((void)r.value(), std::runtime_error);

  result<int> ok = 7;
  CHECK(ok.value() == 7);
  CHECK_THROWS_AS((void)ok.error(), outcome::bad_result_access);
}

TEST_CASE("BOOST_OUTCOME_TRY propagates the error unchanged") {
  CHECK(doubled(21).value() == 42);
  const result<int> bad = doubled(-3);
  REQUIRE(bad.has_error());
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(bad.error().message() == "not positive: -3");

  CHECK(chained(cudaSuccess).value() == "done");
  const result<std::string> lost = chained(cudaErrorIllegalAddress);
  REQUIRE(lost.has_error());
  CHECK(lost.error() == errc::context_poisoned);
  CHECK(lost.error().library() == "cuda");
  CHECK(lost.error().native_status() == cudaErrorIllegalAddress);
  CHECK(contains(lost.error().message(), "cudaMemcpyAsync failed: cudaErrorIllegalAddress (700)"));
  CHECK(supervise(lost.error().code()) == decision::restart);
  CHECK_THROWS_WITH_AS((void)lost.value(), lost.error().message().c_str(), gpu_exception);
}
