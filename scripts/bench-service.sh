#!/usr/bin/env bash
# Issue 21's service numbers (scripts/bench.sh runs it as "service"): the
# reference service against the library doing the same work in the same run.
#   1. atomr-serve in process, T io threads; atomr-load: 64 connections for S
#      seconds of /v1/gemm n x n with raw bodies, then with JSON bodies, every
#      answer checked -> service_raw.json, service_json.json;
#   2. atomr-bench-pipeline --variants serve_gemm,serve_gemm_alloc: the same request (both
#      factors uploaded from pageable memory, the gemm, the download, one
#      element checked) as one compose() unit from 64 coroutines on T io
#      threads with the service's 10 s deadline on each unit (--timeout-ms), and
#      raw CUDA doing it -> service_pipeline.json;
#   3. atomr-serve --isolated --test-faults: 64 connections for 10 s of gemm
#      with an illegal-address fault every 3 s -> service_isolated.json;
#   4. 1 and 2 (raw bodies) again with T2 io threads for both the service and
#      the library (default 8; T2=0 leaves it out) -> service_raw_t8.json,
#      service_pipeline_t8.json (named t8 whatever T2 is).
# scripts/bench-summary.py puts them under "service" in summary.json; all of
# them are also packed into OUT_DIR/service-json.tgz.
# Usage: bench-service.sh BUILD_DIR OUT_DIR   (N, T, SECONDS_PER_RUN and LOAD_T,
# atomr-load's io threads, from the environment: defaults 64, 4, 10 and 8; at 2
# load threads the load generator was the limit on the H200 in session 24).
# SERVE_ARGS: more arguments for the in-process atomr-serve runs (1 and 4),
# e.g. "--strategy host_fn" or "--spin-us 100", to compare the service's
# completion settings against the same unit.
# Each load's JSON also gets the service's CPU per request (from /proc).
# Exit status 69 without a usable GPU.
set -u -o pipefail
build=$1 out=$2
n=${N:-64} threads=${T:-4} seconds=${SECONDS_PER_RUN:-10} load_threads=${LOAD_T:-8}
threads2=${T2:-8}
read -r -a serve_args <<<"${SERVE_ARGS:-}"
mkdir -p "$out"
build=$(realpath "$build") out=$(realpath "$out")
cd "$(dirname "$0")/.." || exit 1
pid='' port=''
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; fi; }
trap stop EXIT
# shellcheck source=samples/serve/start.sh
. samples/serve/start.sh
rc=0
# The service's CPU time so far (user + system, every thread), in clock ticks.
serve_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0; }
serve_threads=$threads
load() {  # load NAME ARGS...: atomr-load against $port, JSON into $out/NAME.json
  local name=$1
  shift
  local t0
  t0=$(serve_ticks)
  "$build/samples/atomr-load" --port "$port" --connections 64 --threads "$load_threads" \
    --endpoint gemm --size "$n" --check --quiet --json "$out/$name.json" "$@"
  local r=$?
  echo "$name: atomr-load rc=$r"
  # The service's CPU per answered request, next to the load generator's own.
  [ -f "$out/$name.json" ] && python3 - "$out/$name.json" "$t0" "$(serve_ticks)" \
    "$(getconf CLK_TCK)" "$serve_threads" <<'PY'
import json, sys
path, t0, t1, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
d = json.load(open(path))
d["server_threads"] = int(sys.argv[5])
answered = d["ok"] + d["failed"]
d["server_cpu_us_per_req"] = (t1 - t0) / hz * 1e6 / answered if answered else 0.0
json.dump(d, open(path, "w"))
print(f"  service CPU {d['server_cpu_us_per_req']:.1f} us/request, "
      f"load generator CPU {d.get('client_cpu_us_per_req', 0):.1f} us/request")
PY
  [ "$r" = 0 ] || rc=$r
  return "$r"
}

serve_start "$build/samples/atomr-serve" "$out/serve-inprocess.log" --threads "$threads" "${serve_args[@]}"
load service_raw --wait-healthy 20 --seconds "$seconds" --raw
[ "$rc" = 69 ] && { echo "bench-service: no usable GPU"; exit 69; }
load service_json --seconds "$seconds"
stop

"$build/bench/atomr-bench-pipeline" --variants serve_gemm,serve_gemm_alloc --n "$n" --in-flight 64 \
  --timeout-ms 10000 --threads "$threads" --seconds "$seconds" --json "$out/service_pipeline.json" || rc=$?

serve_start "$build/samples/atomr-serve" "$out/serve-isolated.log" --threads "$threads" \
  --isolated --test-faults
load service_isolated --wait-healthy 60 --seconds 10 --fault-every-ms 3000
stop

if [ "$threads2" != 0 ]; then
  serve_threads=$threads2
  serve_start "$build/samples/atomr-serve" "$out/serve-inprocess-t2.log" --threads "$threads2" \
    "${serve_args[@]}"
  load service_raw_t8 --wait-healthy 20 --seconds "$seconds" --raw
  stop
  "$build/bench/atomr-bench-pipeline" --variants serve_gemm --n "$n" --in-flight 64 \
    --timeout-ms 10000 --threads "$threads2" --seconds "$seconds" --json "$out/service_pipeline_t8.json" || rc=$?
fi
# The JSON files in one archive too: the device tool brings back only a few
# files of a call (session 44 lost the six JSON files of its run).
(cd "$out" && tar czf service-json.tgz ./service_*.json 2>/dev/null)
exit "$rc"
