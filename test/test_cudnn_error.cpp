// cuDNN 9 status classification.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "atomr/cuda/cudnn_error.hpp"

using namespace atomr::cuda;

namespace {
// Built by appending: GCC 12 at -O3 warns falsely (-Wrestrict) on "(" + to_string(x) + ")".
std::string in_parens(int v, const char* close) {
  std::string out = "(";
  out += std::to_string(v);
  out += close;
  return out;
}
}  // namespace

namespace {

struct cudnn_row {
  int status;
  const char* name;
  errc expected;
};

#define ROW(s, c) \
  { s, #s, errc::c }

// Every enumerator of cudnnStatus_t in cudnn_graph.h (cuDNN 9). The deprecated aliases
// (ALLOC_FAILED, ARCH_MISMATCH, MAPPING_ERROR, RUNTIME_PREREQUISITE_MISSING,
// VERSION_MISMATCH) share a value with a row below; INVALID_VALUE has its own (2001) and
// is spelled as a number since naming it warns.
const std::vector<cudnn_row> rows = {
    ROW(CUDNN_STATUS_SUCCESS, ok),
    ROW(CUDNN_STATUS_NOT_INITIALIZED, library),
    ROW(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, library),
    ROW(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, library),
    ROW(CUDNN_STATUS_DEPRECATED, library),
    ROW(CUDNN_STATUS_LICENSE_ERROR, library),
    ROW(CUDNN_STATUS_RUNTIME_IN_PROGRESS, ok),
    ROW(CUDNN_STATUS_RUNTIME_FP_OVERFLOW, library),
    ROW(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, library),
    ROW(CUDNN_STATUS_BAD_PARAM, invalid_argument),
    {2001, "CUDNN_STATUS_INVALID_VALUE", errc::invalid_argument},
    ROW(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH, invalid_argument),
    ROW(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, invalid_argument),
    ROW(CUDNN_STATUS_NOT_SUPPORTED, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_PADDING, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM, not_supported),
    ROW(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, not_supported),
#if CUDNN_VERSION >= 91900  // absent from 9.14 (the GPU machine), present in 9.19
    ROW(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, not_supported),
#endif
    ROW(CUDNN_STATUS_INTERNAL_ERROR, library),
    ROW(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, library),
    ROW(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE, library),
    ROW(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, out_of_memory),
    ROW(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, out_of_memory),
    ROW(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, invalid_argument),
    ROW(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED, library),
    ROW(CUDNN_STATUS_EXECUTION_FAILED, library),
    ROW(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, library),
    ROW(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS, library),
    ROW(CUDNN_STATUS_EXECUTION_FAILED_CUDART, library),
    ROW(CUDNN_STATUS_EXECUTION_FAILED_CURAND, library),
};

bool contains(const std::string& hay, std::string_view needle) {
  return hay.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("cuDNN: every cudnnStatus_t enumerator") {
  std::set<int> seen;
  for (const auto& r : rows) {
    INFO(r.name);
    CHECK(seen.insert(r.status).second);
    const auto s = static_cast<cudnnStatus_t>(r.status);
    CHECK(classify_code(s) == r.expected);
    const gpu_error e = classify(s, "cudnnConvolutionForward");
    CHECK(e.code() == r.expected);
    CHECK(e.library() == "cudnn");
    CHECK(e.native_status() == r.status);
    CHECK(contains(e.message(), r.name));
    CHECK(contains(e.message(), in_parens(r.status, "): ")));
    CHECK(e.message().starts_with(r.expected == errc::ok
                                      ? "cudnn: cudnnConvolutionForward returned: "
                                      : "cudnn: cudnnConvolutionForward failed: "));
    const gpu_error bare = classify(s);
    CHECK(bare.message().starts_with(std::string("cudnn: ") + r.name + " ("));
  }
}

TEST_CASE("cuDNN: the table covers every status the library names") {
  std::set<int> listed, named;
  for (const auto& r : rows) listed.insert(r.status);
  for (int v = 0; v <= 10000; ++v) {
    const char* name = cudnnGetErrorString(static_cast<cudnnStatus_t>(v));
    if (std::strcmp(name, "CUDNN_UNKNOWN_STATUS") == 0) continue;
    named.insert(v);
    INFO(v << " " << name);
    CHECK(listed.count(v) == 1);
  }
  // The loop saw the library's names (not only its placeholder).
  CHECK(named.count(static_cast<int>(CUDNN_STATUS_BAD_PARAM)) == 1);
}

TEST_CASE("cuDNN: deprecated aliases classify like their targets") {
  CHECK(classify_code(static_cast<cudnnStatus_t>(4003)) == errc::out_of_memory);  // ALLOC_FAILED
  CHECK(classify_code(static_cast<cudnnStatus_t>(3007)) == errc::not_supported);  // ARCH_MISMATCH
  CHECK(classify_code(static_cast<cudnnStatus_t>(4006)) == errc::library);        // MAPPING_ERROR
  CHECK(classify_code(static_cast<cudnnStatus_t>(1002)) == errc::library);  // VERSION_MISMATCH
}

TEST_CASE("cuDNN: unknown values fall back by family") {
  const struct {
    int status;
    errc expected;
  } cases[] = {
      {999, errc::library},           {1999, errc::library},
      {2999, errc::invalid_argument}, {2500, errc::invalid_argument},
      {3999, errc::not_supported},    {4999, errc::library},
      {5999, errc::library},          {6000, errc::library},
      {12345, errc::library},         {-1, errc::library},
  };
  for (const auto& c : cases) {
    INFO(c.status);
    const auto s = static_cast<cudnnStatus_t>(c.status);
    CHECK(classify_code(s) == c.expected);
    const gpu_error e = classify(s, "cudnnFoo");
    CHECK(e.code() == c.expected);
    CHECK(e.native_status() == c.status);
    CHECK(contains(e.message(), in_parens(c.status, ")")));
    CHECK(contains(e.message(), "cudnnFoo failed"));
  }
}

TEST_CASE("cuDNN: exact message format") {
  CHECK(classify(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnSetTensor4dDescriptor").message() ==
        "cudnn: cudnnSetTensor4dDescriptor failed: CUDNN_STATUS_BAD_PARAM_NULL_POINTER (2002): "
        "invalid parameter");
  CHECK(classify(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED).message() ==
        "cudnn: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED (4004): device memory "
        "allocation failed");
  CHECK(classify(static_cast<cudnnStatus_t>(12345)).message() ==
        "cudnn: CUDNN_UNKNOWN_STATUS (12345): unrecognized status");
  // Tagging leaves a cudnn error alone.
  const gpu_error e = classify(CUDNN_STATUS_EXECUTION_FAILED, "cudnnBackendExecute");
  CHECK(e.tagged("cublas").library() == "cudnn");
}
