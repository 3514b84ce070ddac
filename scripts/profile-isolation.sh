#!/usr/bin/env bash
# Where an isolated device's latency goes: atomr-bench-isolation --parts
# latency under bench/tools/sampler.cpp, the service process and its worker
# each profiled, once with the defaults and once with the worker's
# --ring-io-poll. The worker is killed (SIGKILL) when the device closes, so
# the sampler rewrites its file every half second (SAMPLER_WRITE_EVERY_S):
# that writer is a thread of each process, seen in the reports as one whose
# frames are in write_samples (leave it out when reading the shares).
# The reports are symbolised on the machine that ran them.
# Usage: profile-isolation.sh BUILD_DIR OUT_DIR   (REPS, default 20000: the
#   latency part's repetitions of fill4 and sgemm 256; sgemm 1024 a fifth)
# Writes OUT_DIR/profile-{default,ring-io-poll}-{service,worker}.txt, the
# benchmark's lines ({default,ring-io-poll}.log) and the raw samples.
set -u -o pipefail
build=$1 out=$2
reps=${REPS:-20000}
mkdir -p "$out"
build=$(realpath "$build") out=$(realpath "$out")
cd "$(dirname "$0")/.." || exit 1
bins=$(mktemp -d)
trap 'rm -rf "$bins"' EXIT

g++ -O2 -shared -fPIC -o "$bins/sampler.so" bench/tools/sampler.cpp -ldl || exit 1
# The report resolves frames of the modules it finds here by file name.
for f in "$build"/libatomr-accel-cuda.so* "$build/atomr-cuda-worker" \
  "$build/bench/atomr-bench-isolation"; do
  [ -f "$f" ] && cp -L "$f" "$bins/"
done

rc=0
for mode in default ring-io-poll; do
  args=()
  [ "$mode" = ring-io-poll ] && args=(--worker-arg=--ring-io-poll)
  rm -f "$out/$mode"-*.samples
  # The preload after `timeout` (else timeout's own exit would write a file).
  timeout 300 env SAMPLER_OUT="$out/$mode-%p.samples" SAMPLER_WRITE_EVERY_S=0.5 \
    LD_PRELOAD="$bins/sampler.so" "$build/bench/atomr-bench-isolation" --parts latency \
    --reps "$reps" "${args[@]}" >"$out/$mode.log" 2>&1
  r=$?
  echo "$mode: atomr-bench-isolation rc=$r"
  grep '^latency' "$out/$mode.log"
  [ "$r" = 0 ] || { rc=$r; continue; }
  for f in "$out/$mode"-*.samples; do
    [ -s "$f" ] || continue
    role=service
    grep -q atomr-cuda-worker "$f" && role=worker
    python3 scripts/sampler-report.py "$f" --bin "$bins" --top 45 --threads \
      >"$out/profile-$mode-$role.txt"
    echo "  profile-$mode-$role.txt: $(head -1 "$out/profile-$mode-$role.txt")"
  done
done
exit "$rc"
