#!/usr/bin/env bash
# A/B of atomr-serve's per-request machinery (env switches of scratch/ab.patch).
# Usage: ab-serve.sh BUILD OUT   (T io threads, default 4; S seconds, default 6)
set -u
build=$1 out=$2; mkdir -p "$out"
. samples/serve/start.sh
T=${T:-4} S=${S:-6}
wait_h=(); nvidia-smi -L >/dev/null 2>&1 && wait_h=(--wait-healthy 20)
for cfg in ${CFGS:-base AB_NO_DEADLINE AB_NO_WATCH AB_NO_GPU_TIMEOUT AB_NO_STRAND}; do
  envs=(); for e in $cfg; do [ "$e" = base ] || envs+=("$e=1"); done
  env "${envs[@]}" true
  pid= port=
  ( for e in "${envs[@]}"; do export "$e"; done; exec "$build/samples/atomr-serve" --port 0 --threads "$T" ) >"$out/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$out/serve.log" | grep -o '[0-9]*$') && break; sleep 0.05; done
  t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  "$build/samples/atomr-load" --port "$port" --connections 64 --threads "${LOAD_T:-8}" --endpoint gemm --size 64 --check --quiet --raw --seconds "$S" "${wait_h[@]}" --json "$out/l.json" >"$out/load.log" 2>&1
  t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill -TERM $pid; wait $pid
  python3 - "$out/l.json" "$t0" "$t1" "$cfg" <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); n=d["ok"]+d["failed"]
print(f'{sys.argv[4]:60s} ok {d["ok"]:8d} failed {d["failed"]:7d} wrong {d.get("wrong",0)} req/s {n/d.get("seconds",1):9.0f} p50 {d.get("p50_us",0):8.1f} svc CPU {(float(sys.argv[3])-float(sys.argv[2]))/100*1e6/max(n,1):6.1f} us/req')
PY
done
