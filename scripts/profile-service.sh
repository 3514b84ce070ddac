#!/usr/bin/env bash
# Where the reference service's CPU goes, beside the library's own unit doing
# the same work: atomr-serve under the load of scripts/bench-service.sh's
# first run (64 connections, raw gemm n x n, every answer checked), then
# atomr-bench-pipeline's serve_gemm variant (the same request as one compose()
# unit from 64 coroutines), each under bench/tools/sampler.cpp. The reports
# are symbolised on the machine that ran them (addr2line against BUILD_DIR's
# binaries), so they need nothing copied back but the text.
# Usage: profile-service.sh BUILD_DIR OUT_DIR
#   N, T, SECONDS_PER_RUN, LOAD_T, SERVE_ARGS as in bench-service.sh (defaults
#   64, 4, 6, 8, none).
# Writes OUT_DIR/profile-serve.txt and OUT_DIR/profile-unit.txt (flat,
# inclusive and per-thread profiles), the raw samples next to them, and the
# load generator's summary (profile-serve-load.json). Without a usable GPU the
# service answers 503 and the profile is of that path (the unit exits 69).
set -u -o pipefail
build=$1 out=$2
n=${N:-64} threads=${T:-4} seconds=${SECONDS_PER_RUN:-6} load_threads=${LOAD_T:-8}
read -r -a serve_args <<<"${SERVE_ARGS:-}"
mkdir -p "$out"
build=$(realpath "$build") out=$(realpath "$out")
cd "$(dirname "$0")/.." || exit 1
bins=$(mktemp -d)
pid='' port=''
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; fi; }
trap 'stop; rm -rf "$bins"' EXIT
# shellcheck source=samples/serve/start.sh
. samples/serve/start.sh

g++ -O2 -shared -fPIC -o "$bins/sampler.so" bench/tools/sampler.cpp -ldl || exit 1
# The report resolves frames of the modules it finds here by file name.
for f in "$build"/libatomr-accel-cuda.so* "$build/samples/atomr-serve" \
  "$build/bench/atomr-bench-pipeline"; do
  [ -f "$f" ] && cp -L "$f" "$bins/"
done
# With a GPU, wait for the device to serve; without one, profile the 503s.
wait_healthy=()
nvidia-smi -L >/dev/null 2>&1 && wait_healthy=(--wait-healthy 20)
report() {  # report SAMPLES REPORT
  if [ -s "$1" ]; then
    python3 scripts/sampler-report.py "$1" --bin "$bins" --top 45 --threads >"$2"
    echo "$(basename "$2"): $(head -1 "$2")"
  else
    echo "$(basename "$2"): no samples ($1 empty or missing)"
  fi
}

# SAMPLER_OUT and LD_PRELOAD reach atomr-serve only (not the load generator).
SAMPLER_OUT="$out/serve-samples.txt" LD_PRELOAD="$bins/sampler.so" \
  serve_start "$build/samples/atomr-serve" "$out/profile-serve.log" --threads "$threads" \
  "${serve_args[@]}"
"$build/samples/atomr-load" --port "$port" --connections 64 --threads "$load_threads" \
  --endpoint gemm --size "$n" --raw --check --quiet "${wait_healthy[@]}" --seconds "$seconds" \
  --json "$out/profile-serve-load.json"
echo "atomr-load rc=$?"
stop  # the sampler writes its file when the service exits
report "$out/serve-samples.txt" "$out/profile-serve.txt"

SAMPLER_OUT="$out/unit-samples.txt" LD_PRELOAD="$bins/sampler.so" \
  "$build/bench/atomr-bench-pipeline" --variants serve_gemm --n "$n" --in-flight 64 \
  --threads "$threads" --seconds "$seconds" >"$out/profile-unit.log" 2>&1
echo "atomr-bench-pipeline rc=$?"
tail -4 "$out/profile-unit.log"
report "$out/unit-samples.txt" "$out/profile-unit.txt"
