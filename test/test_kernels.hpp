// Test-only kernels, compiled at run time with NVRTC for the device at hand
// and loaded through the runtime's library API (no driver-API link needed):
// a write to an arbitrary address (fault injection), a timed spin, and a spin
// that the host ends.
#pragma once

#include <atomr/cuda.hpp>

#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include <string>
#include <vector>

namespace atomr::cuda::test {

class test_kernels {
public:
  /// Compiles and loads the kernels for the current device; throws on failure.
  test_kernels() {
    static const char* src = R"(
extern "C" __global__ void atomr_write_to(unsigned long long addr, int value) {
  *reinterpret_cast<volatile int*>(addr) = value;
}
__device__ unsigned long long atomr_now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
extern "C" __global__ void atomr_spin(unsigned long long ns, int* done) {
  unsigned long long start = atomr_now_ns();
  while (atomr_now_ns() - start < ns) {}
  if (done && threadIdx.x == 0 && blockIdx.x == 0) *done = 1;
}
extern "C" __global__ void atomr_spin_until(const volatile int* release, unsigned long long max_ns) {
  unsigned long long start = atomr_now_ns();
  while (*release == 0 && atomr_now_ns() - start < max_ns) {}
}
)";
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    nvrtcProgram prog;
    check(nvrtcCreateProgram(&prog, src, "atomr_test_kernels.cu", 0, nullptr, nullptr));
    std::string arch = "--gpu-architecture=sm_" + std::to_string(major * 10 + minor);
    const char* opts[] = {arch.c_str()};
    auto st = nvrtcCompileProgram(prog, 1, opts);
    if (st != NVRTC_SUCCESS) {
      std::size_t n = 0;
      nvrtcGetProgramLogSize(prog, &n);
      std::string log(n, '\0');
      nvrtcGetProgramLog(prog, log.data());
      throw std::runtime_error("nvrtc: " + log);
    }
    std::size_t size = 0;
    check(nvrtcGetCUBINSize(prog, &size));
    std::vector<char> cubin(size);
    check(nvrtcGetCUBIN(prog, cubin.data()));
    nvrtcDestroyProgram(&prog);
    check(cudaLibraryLoadData(&lib_, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    check(cudaLibraryGetKernel(&write_to_, lib_, "atomr_write_to"));
    check(cudaLibraryGetKernel(&spin_, lib_, "atomr_spin"));
    check(cudaLibraryGetKernel(&spin_until_, lib_, "atomr_spin_until"));
  }
  ~test_kernels() =
      default;  // the library is left loaded: unloading on a poisoned context is pointless

  /// Enqueues a one-thread write of `value` to `addr` (0x10 faults).
  cudaError_t write_to(cudaStream_t s, unsigned long long addr, int value, dim3 block = 1) const {
    void* args[] = {&addr, &value};
    return cudaLaunchKernel(reinterpret_cast<const void*>(write_to_), dim3(1), block, args, 0, s);
  }

  /// Enqueues a kernel that spins for `ms` milliseconds of wall time
  /// (%globaltimer, so independent of clock rates).
  cudaError_t spin(cudaStream_t s, double ms, int* done = nullptr) const {
    auto ns = static_cast<unsigned long long>(ms * 1e6);
    void* args[] = {&ns, &done};
    return cudaLaunchKernel(reinterpret_cast<const void*>(spin_), dim3(1), dim3(32), args, 0, s);
  }

  /// Enqueues a one-thread kernel that spins until the host sets `*release`
  /// to non-zero (pinned host memory, which kernels reach by the same
  /// pointer), or at most `max_ms` milliseconds.
  cudaError_t spin_until(cudaStream_t s, const int* release, double max_ms) const {
    auto ns = static_cast<unsigned long long>(max_ms * 1e6);
    void* args[] = {&release, &ns};
    return cudaLaunchKernel(reinterpret_cast<const void*>(spin_until_), dim3(1), dim3(1), args, 0,
                            s);
  }

private:
  static void check(nvrtcResult r) {
    if (r != NVRTC_SUCCESS) throw std::runtime_error(nvrtcGetErrorString(r));
  }
  static void check(cudaError_t r) {
    if (r != cudaSuccess) throw std::runtime_error(cudaGetErrorString(r));
  }

  cudaLibrary_t lib_ = nullptr;
  cudaKernel_t write_to_ = nullptr;
  cudaKernel_t spin_ = nullptr;
  cudaKernel_t spin_until_ = nullptr;
};

}  // namespace atomr::cuda::test
