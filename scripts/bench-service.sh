#!/usr/bin/env bash
# Issue 21's service numbers (scripts/bench.sh runs it as "service"): the
# reference service against the library doing the same work in the same run.
#   1. atomr-serve in process, T io threads; atomr-load: 64 connections for S
#      seconds of /v1/gemm n x n with raw bodies, then with JSON bodies, every
#      answer checked -> service_raw.json, service_json.json;
#   2. atomr-bench-pipeline --variants serve_gemm: the same request (both
#      factors uploaded from pageable memory, the gemm, the download, one
#      element checked) as one compose() unit from 64 coroutines on T io
#      threads, and raw CUDA doing it -> service_pipeline.json;
#   3. atomr-serve --isolated --test-faults: 64 connections for 10 s of gemm
#      with an illegal-address fault every 3 s -> service_isolated.json.
# scripts/bench-summary.py puts them under "service" in summary.json.
# Usage: bench-service.sh BUILD_DIR OUT_DIR   (N, T, SECONDS from the environment:
# defaults 64, 4 and 10). Exit status 69 without a usable GPU.
set -u -o pipefail
build=$1 out=$2
n=${N:-64} threads=${T:-4} seconds=${SECONDS_PER_RUN:-10}
mkdir -p "$out"
build=$(realpath "$build") out=$(realpath "$out")
cd "$(dirname "$0")/.." || exit 1
pid='' port=''
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; fi; }
trap stop EXIT
# shellcheck source=samples/serve/start.sh
. samples/serve/start.sh
rc=0
load() {  # load NAME ARGS...: atomr-load against $port, JSON into $out/NAME.json
  local name=$1
  shift
  "$build/samples/atomr-load" --port "$port" --connections 64 --endpoint gemm --size "$n" --check \
    --quiet --json "$out/$name.json" "$@"
  local r=$?
  echo "$name: atomr-load rc=$r"
  [ "$r" = 0 ] || rc=$r
  return "$r"
}

serve_start "$build/samples/atomr-serve" "$out/serve-inprocess.log" --threads "$threads"
load service_raw --wait-healthy 20 --seconds "$seconds" --raw
[ "$rc" = 69 ] && { echo "bench-service: no usable GPU"; exit 69; }
load service_json --seconds "$seconds"
stop

"$build/bench/atomr-bench-pipeline" --variants serve_gemm --n "$n" --in-flight 64 \
  --threads "$threads" --seconds "$seconds" --json "$out/service_pipeline.json" || rc=$?

serve_start "$build/samples/atomr-serve" "$out/serve-isolated.log" --threads "$threads" \
  --isolated --test-faults
load service_isolated --wait-healthy 60 --seconds 10 --fault-every-ms 3000
stop
exit "$rc"
