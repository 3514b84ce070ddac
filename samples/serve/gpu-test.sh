#!/usr/bin/env bash
# The reference service on the GPU (issue 21; meson test 'serve-gpu'):
#   1. in process: 64 connections for 10 s of mixed gemm, FFT and model
#      requests, every answer's numbers checked (JSON bodies), then 3 s of
#      raw bodies; no wrong answer, no failed request;
#   2. isolated (--isolated --test-faults): 64 connections for 10 s of gemm
#      with an illegal-address fault every 3 s (three faults), every answer
#      checked: no wrong answer, the service serving after each, at most
#      1.5 s of failed requests per fault, three worker restarts;
#   3. the bad-request cases of atomr_serve_tests against a working device.
# Exits 77 (meson: SKIP) without a usable GPU. Results (JSON) in $OUT_DIR.
# Usage: gpu-test.sh ATOMR_SERVE ATOMR_LOAD ATOMR_SERVE_TESTS OUT_DIR
set -u
serve=$1 load=$2 tests=$3 out=$4
mkdir -p "$out"
pid=
cleanup() { [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; pid=; }
trap cleanup EXIT

. "$(dirname "$0")/start.sh"
start() {  # start NAME ARGS...: atomr-serve with ARGS, its log $out/serve-NAME.log
  log=$out/serve-$1.log
  shift
  serve_start "$serve" "$log" --threads 8 "$@"
}

field() {  # field FILE NAME: a number from atomr-load's JSON
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"
}

start inprocess
"$load" --port "$port" --wait-healthy 20 --requests 1 --quiet >/dev/null 2>"$out/probe.txt"
if [ $? = 69 ]; then
  echo "SKIP: no usable GPU: $(cat "$out/probe.txt")"
  exit 77
fi
fail=0
"$load" --port "$port" --connections 64 --seconds 10 --endpoint mix --size 64 --check \
  --json "$out/inprocess.json" || { echo "FAIL: in-process mixed load (rc $?)"; fail=1; }
"$load" --port "$port" --connections 64 --seconds 3 --endpoint mix --size 64 --raw --check \
  --json "$out/inprocess-raw.json" || { echo "FAIL: in-process raw load (rc $?)"; fail=1; }
for f in inprocess inprocess-raw; do
  [ "$(field "$out/$f.json" wrong)" = 0 ] || { echo "FAIL: $f: wrong answers"; fail=1; }
  [ "$(field "$out/$f.json" failed)" = 0 ] || { echo "FAIL: $f: failed requests"; fail=1; }
done
cleanup
cat "$out/serve-inprocess.log"

start isolated --isolated --test-faults
"$load" --port "$port" --wait-healthy 60 --connections 64 --seconds 10 --endpoint gemm --size 64 \
  --check --fault-every-ms 3000 --json "$out/isolated.json" ||
  { echo "FAIL: isolated load with faults (rc $?)"; fail=1; }
python3 - "$out/isolated.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
health = json.loads(r["health_after"])
problems = []
if r["wrong"]: problems.append(f"{r['wrong']} wrong answers")
if r["faults"] != 3: problems.append(f"{r['faults']} faults injected, not 3")
if r["failed_seconds"] > 3 * 1.5: problems.append(f"{r['failed_seconds']:.2f} s of failures for 3 faults")
if health.get("worker_restarts") != 3: problems.append(f"worker_restarts {health.get('worker_restarts')}")
if health.get("health") != "healthy": problems.append(f"health {health.get('health')}")
if r["ok"] == 0: problems.append("no successful request")
print(f"isolated: {r['ok']} ok, {r['req_per_s']:.0f} req/s, p99 {r['p99_us']:.0f} us, "
      f"{r['faults']} faults, {r['failed_seconds']:.3f} s with failures, health {health}")
for p in problems: print("FAIL: isolated:", p)
sys.exit(1 if problems else 0)
PY
cleanup
cat "$out/serve-isolated.log"

ATOMR_SERVE_DEVICE=0 "$tests" --test-case='*bad request*,*over the limit*' ||
  { echo "FAIL: bad requests against a working device"; fail=1; }
exit $fail
