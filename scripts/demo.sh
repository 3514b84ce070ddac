#!/usr/bin/env bash
# Set-up command 1: check for (and install, where apt can) what the build
# needs, build, and run the main demo: atomr-serve, the reference HTTP service
# (samples/serve/), driven by atomr-load for a few seconds: first in process
# (gemm, FFT and a small model, every answer checked), then on the isolated
# device with one injected GPU fault, which costs a worker restart, not the
# service. Without a GPU it says so, shows the service answering without one,
# and exits 69. TOOLKIT_PREFIX: the CUDA toolkit (default /usr/local/cuda).
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release -Dtoolkit_prefix="${TOOLKIT_PREFIX:-/usr/local/cuda}"
ninja -C build
bin=build/samples
[ -x "$bin/atomr-serve" ] || { echo "demo: atomr-serve was not built (it needs cuBLAS, cuFFT and cuDNN)"; exit 1; }
log=$(mktemp)
pid=
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pid=; cat "$log"; fi; }
trap 'stop; rm -f "$log"' EXIT

. samples/serve/start.sh
serve() { serve_start "$bin/atomr-serve" "$log" "$@"; }

echo "== atomr-serve in process: 32 connections, 4 s of gemm, FFT and model requests, every answer checked"
serve
rc=0
"$bin/atomr-load" --port "$port" --wait-healthy 10 --connections 32 --seconds 4 --endpoint mix \
  --size 64 --check || rc=$?
if [ "$rc" = 69 ]; then
  echo "demo: no usable GPU here. The service above ran without one: it answered /health"
  echo "demo: (its reason is printed above) and would answer 503 to GPU requests."
  echo "demo: scripts/test.sh runs what needs no GPU; on a GPU machine this demo serves."
  exit 69
fi
stop
[ "$rc" = 0 ] || exit "$rc"

echo "== atomr-serve --isolated: the GPU in a worker process; 4 s of gemm, one illegal-address fault at 2 s"
serve --isolated --test-faults
"$bin/atomr-load" --port "$port" --wait-healthy 60 --connections 32 --seconds 4 --endpoint gemm \
  --size 64 --check --fault-every-ms 2000 || rc=$?
stop
exit "$rc"
