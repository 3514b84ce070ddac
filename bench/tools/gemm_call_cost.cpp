// A diagnostic: the host time of one small SGEMM enqueue through each way
// cuBLAS offers, without the library. Shows what bounds the small-operation
// throughput at one thread (the raw ceiling there is one thread calling
// cublasSgemm back to back). Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -o /tmp/gemm_call_cost bench/tools/gemm_call_cost.cpp
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcublasLt -lcublas -lcudart
//   [LIVE_GRAPHS=K] /tmp/gemm_call_cost [n ...]       (default: 64 256)
// For each n: median and p90 host microseconds per call over 20 rounds of
// 256 calls (one stream; synchronized between rounds, not timed), for
//   sgemm    cublasSgemm, pedantic math (what the library and the raw ceiling call)
//   lt       cublasLtMatmul, 32F_PEDANTIC compute, descriptors and the
//            heuristic's first algorithm made once
//   graph    cudaGraphLaunch of one captured cublasSgemm (cuBLAS's own
//            workspace: what it records depends on the cuBLAS version)
//   graph-ws the same, captured with cublasSetWorkspace(32 MiB of ours)
// and the GPU time per call of each (events around a round / 256). For each
// recording it prints the node types the graph holds. With LIVE_GRAPHS=K,
// sgemm and the graph are measured again (as sgemm+K, graph+K) while K more
// instantiated copies of that graph exist, launched once each; an
// instantiation that fails is counted, not fatal.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "gemm_call_cost: %s failed\n", what);
    std::exit(1);
  }
}

struct stats {
  double median = 0, p90 = 0;
};
stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 9 / 10]};
}

template <class F>
void measure(const char* name, int n, cudaStream_t s, F call) {
  constexpr int rounds = 20, per_round = 256;
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess, "events");
  for (int i = 0; i < 64; ++i) call();  // warm-up
  check(cudaStreamSynchronize(s) == cudaSuccess, "warm-up");
  std::vector<double> host, gpu;
  for (int r = 0; r < rounds; ++r) {
    cudaEventRecord(e0, s);
    for (int i = 0; i < per_round; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      host.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    cudaEventRecord(e1, s);
    check(cudaStreamSynchronize(s) == cudaSuccess, "round");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    gpu.push_back(1e3 * ms / per_round);
  }
  const auto h = summarize(host), g = summarize(gpu);
  std::printf("n=%-5d %-6s host us/call median %7.2f p90 %7.2f   GPU us/call %7.2f\n", n, name,
              h.median, h.p90, g.median);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

const char* node_type(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel:
      return "kernel";
    case cudaGraphNodeTypeMemcpy:
      return "memcpy";
    case cudaGraphNodeTypeMemset:
      return "memset";
    case cudaGraphNodeTypeHost:
      return "host";
    case cudaGraphNodeTypeGraph:
      return "child-graph";
    case cudaGraphNodeTypeEmpty:
      return "empty";
    case cudaGraphNodeTypeWaitEvent:
      return "wait-event";
    case cudaGraphNodeTypeEventRecord:
      return "event-record";
    case cudaGraphNodeTypeMemAlloc:
      return "mem-alloc";
    case cudaGraphNodeTypeMemFree:
      return "mem-free";
    default:
      return "other";
  }
}

void print_nodes(const char* name, int n, cudaGraph_t g) {
  std::size_t count = 0;
  cudaGraphGetNodes(g, nullptr, &count);
  std::vector<cudaGraphNode_t> nodes(count);
  cudaGraphGetNodes(g, nodes.data(), &count);
  std::printf("n=%-5d %-8s recorded %zu node(s):", n, name, count);
  for (auto nd : nodes) {
    cudaGraphNodeType t{};
    cudaGraphNodeGetType(nd, &t);
    std::printf(" %s", node_type(t));
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {64, 256};
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  cublasHandle_t h;
  check(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
  cublasSetStream(h, s);
  cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  cublasLtHandle_t lt;
  check(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
  void* ws = nullptr;
  const std::size_t ws_bytes = 32u << 20;
  check(cudaMalloc(&ws, ws_bytes) == cudaSuccess, "workspace");

  for (int n : sizes) {
    const std::size_t bytes = sizeof(float) * n * n;
    void *pa = nullptr, *pb = nullptr, *pc = nullptr;
    check(cudaMalloc(&pa, bytes) == cudaSuccess && cudaMalloc(&pb, bytes) == cudaSuccess &&
              cudaMalloc(&pc, bytes) == cudaSuccess,
          "buffers");
    auto* a = static_cast<float*>(pa);
    auto* b = static_cast<float*>(pb);
    auto* c = static_cast<float*>(pc);
    cudaMemset(a, 0, bytes);
    cudaMemset(b, 0, bytes);
    const float one = 1, zero = 0;
    auto sgemm = [&] {
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
    };
    measure("sgemm", n, s, sgemm);

    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la;
    check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F) ==
              CUBLAS_STATUS_SUCCESS,
          "matmul desc");
    check(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, n, n) == CUBLAS_STATUS_SUCCESS, "layout");
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                         sizeof(ws_bytes));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    check(cublasLtMatmulAlgoGetHeuristic(lt, op, la, la, la, la, pref, 1, &heur, &found) ==
                  CUBLAS_STATUS_SUCCESS &&
              found > 0,
          "heuristic");
    auto ltcall = [&] {
      cublasLtMatmul(lt, op, &one, a, la, b, la, &zero, c, la, c, la, &heur.algo, ws, ws_bytes, s);
    };
    measure("lt", n, s, ltcall);

    for (const bool own_ws : {false, true}) {
      const char* name = own_ws ? "graph-ws" : "graph";
      if (own_ws) check(cublasSetWorkspace(h, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS, "workspace");
      cudaGraph_t g;
      cudaGraphExec_t ge;
      check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
      sgemm();
      check(cudaStreamEndCapture(s, &g) == cudaSuccess, "end capture");
      print_nodes(name, n, g);
      check(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
      measure(name, n, s, [&] { cudaGraphLaunch(ge, s); });
      if (const char* live = std::getenv("LIVE_GRAPHS"); live && std::atoi(live) > 0) {
        std::vector<cudaGraphExec_t> many;
        int failed = 0;
        for (int i = 0; i < std::atoi(live); ++i) {
          cudaGraphExec_t e;
          if (cudaGraphInstantiate(&e, g, 0) == cudaSuccess) {
            many.push_back(e);
            cudaGraphLaunch(e, s);  // launched once each, as the library's recordings are
          } else {
            ++failed;
            cudaGetLastError();
          }
        }
        check(cudaStreamSynchronize(s) == cudaSuccess, "live graphs");
        std::size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        std::printf("n=%-5d %-8s %zu live copies, %d failed to instantiate, %.0f MiB free\n", n,
                    name, many.size(), failed, free_b / 1048576.0);
        measure("sgemm+K", n, s, sgemm);
        measure(own_ws ? "gws+K" : "graph+K", n, s, [&] { cudaGraphLaunch(ge, s); });
        for (auto& e : many) cudaGraphExecDestroy(e);
      }
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
      // Back to cuBLAS's own workspace (setting the stream resets it).
      if (own_ws) cublasSetStream(h, s);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  return 0;
}
