// doctest entry point for the GPU tests: exits 77 (meson: SKIP) with the
// reason when no CUDA device is usable, so CI shows why they did not run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int n = 0;
  if (auto st = cudaGetDeviceCount(&n); st != cudaSuccess || n == 0) {
    std::printf("SKIP: GPU tests need a CUDA device: %s\n",
                st != cudaSuccess ? cudaGetErrorString(st) : "no devices");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
