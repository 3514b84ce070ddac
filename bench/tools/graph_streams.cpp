// A diagnostic: does launching recorded cuBLAS graphs from several threads
// (each with its own stream, as the library's actors at T = 8) scale like
// plain cublasSgemm calls, and do many live recorded graphs slow plain
// calls made afterwards? No library involved. Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -pthread -o /tmp/graph_streams bench/tools/graph_streams.cpp
//       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcublas -lcudart
//   /tmp/graph_streams [n] [threads] [graphs per thread]   (default 64 8 128)
// Each thread owns a stream, a cuBLAS handle (pedantic math, a 32 MiB
// workspace of its own) and `graphs` buffer triples. Phases, each one second
// per thread count, all threads launching back to back and synchronizing
// once at the end; printed as total ops/s:
//   raw            cublasSgemm, rotating over the thread's buffers
//   (record)       each thread records one graph per buffer triple (on a
//                  capture stream of its own) and launches each once
//   raw+live       raw again, the graphs alive and idle
//   graph          cudaGraphLaunch, rotating over the thread's graphs
//   graph-one      cudaGraphLaunch of the thread's first graph only
//   raw+live       raw again
//   (destroy)      every graph destroyed
//   raw-after      raw again
// Each phase is measured at 1 thread and at all threads.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "graph_streams: %s failed\n", what);
    std::exit(1);
  }
}

struct worker {
  cudaStream_t s = nullptr, cap = nullptr;
  cublasHandle_t h = nullptr;
  void* ws = nullptr;
  std::vector<float*> a, b, c;
  std::vector<cudaGraphExec_t> graphs;
};

int n = 64;
const float one = 1, zero = 0;

void sgemm(worker& w, std::size_t i) {
  cublasSgemm(w.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, w.a[i], n, w.b[i], n, &zero, w.c[i], n);
}

/// Runs `op(worker, i)` back to back on `threads` workers for ~1 s; total ops/s.
double phase(std::vector<worker>& ws, unsigned threads,
             const std::function<void(worker&, std::size_t)>& op) {
  std::atomic<bool> stop{false};
  std::vector<long long> counts(threads, 0);
  std::vector<std::thread> ts;
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      auto& w = ws[t];
      long long k = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int j = 0; j < 64; ++j, ++k) op(w, static_cast<std::size_t>(k) % w.a.size());
      }
      cudaStreamSynchronize(w.s);
      counts[t] = k;
    });
  std::this_thread::sleep_for(std::chrono::seconds(1));
  stop = true;
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long long total = 0;
  for (auto c : counts) total += c;
  return total / secs;
}

void report(const char* name, std::vector<worker>& ws, unsigned threads,
            const std::function<void(worker&, std::size_t)>& op) {
  const double one_t = phase(ws, 1, op);
  const double all_t = phase(ws, threads, op);
  std::printf("n=%-4d %-10s T=1 %9.0f ops/s   T=%u %9.0f ops/s\n", n, name, one_t, threads, all_t);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) n = std::atoi(argv[1]);
  const unsigned threads = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 8;
  const int per = argc > 3 ? std::atoi(argv[3]) : 128;
  const std::size_t bytes = sizeof(float) * n * n, ws_bytes = 32u << 20;
  std::vector<worker> ws(threads);
  for (auto& w : ws) {
    check(cudaStreamCreateWithFlags(&w.s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    check(cudaStreamCreateWithFlags(&w.cap, cudaStreamNonBlocking) == cudaSuccess, "stream");
    check(cublasCreate(&w.h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    cublasSetMathMode(w.h, CUBLAS_PEDANTIC_MATH);
    check(cudaMalloc(&w.ws, ws_bytes) == cudaSuccess, "workspace");
    cublasSetStream(w.h, w.s);
    cublasSetWorkspace(w.h, w.ws, ws_bytes);
    for (int i = 0; i < per; ++i) {
      void *pa, *pb, *pc;
      check(cudaMalloc(&pa, bytes) == cudaSuccess && cudaMalloc(&pb, bytes) == cudaSuccess &&
                cudaMalloc(&pc, bytes) == cudaSuccess,
            "buffers");
      cudaMemset(pa, 0, bytes);
      cudaMemset(pb, 0, bytes);
      w.a.push_back(static_cast<float*>(pa));
      w.b.push_back(static_cast<float*>(pb));
      w.c.push_back(static_cast<float*>(pc));
    }
  }
  check(cudaDeviceSynchronize() == cudaSuccess, "setup");
  report("raw", ws, threads, sgemm);

  for (auto& w : ws) {
    cublasSetStream(w.h, w.cap);
    cublasSetWorkspace(w.h, w.ws, ws_bytes);
    for (std::size_t i = 0; i < w.a.size(); ++i) {
      cudaGraph_t g;
      cudaGraphExec_t e;
      check(cudaStreamBeginCapture(w.cap, cudaStreamCaptureModeThreadLocal) == cudaSuccess,
            "capture");
      sgemm(w, i);
      check(cudaStreamEndCapture(w.cap, &g) == cudaSuccess, "end capture");
      check(cudaGraphInstantiate(&e, g, 0) == cudaSuccess, "instantiate");
      cudaGraphDestroy(g);
      cudaGraphLaunch(e, w.s);
      w.graphs.push_back(e);
    }
    cublasSetStream(w.h, w.s);
    cublasSetWorkspace(w.h, w.ws, ws_bytes);
  }
  check(cudaDeviceSynchronize() == cudaSuccess, "record");
  report("raw+live", ws, threads, sgemm);
  report("graph", ws, threads, [](worker& w, std::size_t i) { cudaGraphLaunch(w.graphs[i], w.s); });
  report("graph-one", ws, threads,
         [](worker& w, std::size_t) { cudaGraphLaunch(w.graphs[0], w.s); });
  report("raw+live", ws, threads, sgemm);
  for (auto& w : ws) {
    for (auto e : w.graphs) cudaGraphExecDestroy(e);
    w.graphs.clear();
  }
  report("raw-after", ws, threads, sgemm);
  return 0;
}
