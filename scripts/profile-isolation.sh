#!/usr/bin/env bash
# Where an isolated device's time goes: atomr-bench-isolation (its latency
# part by default) under bench/tools/sampler.cpp, the service process and
# its worker each profiled, once with the worker's defaults (one io thread,
# the ring threads running its handlers) and once with its settings before
# session 30 (--no-ring-io-poll --threads 4). The worker is killed (SIGKILL)
# when the device closes, so the sampler rewrites its file every half second
# (SAMPLER_WRITE_EVERY_S): that writer is a thread of each process, seen in
# the reports as one whose frames are in write_samples (leave it out when
# reading the shares). The reports are symbolised on the machine that ran
# them.
# Usage: profile-isolation.sh BUILD_DIR OUT_DIR   (REPS, default 20000: the
#   latency part's repetitions of fill4 and sgemm 256; sgemm 1024 a fifth;
#   PARTS, default latency: e.g. PARTS=throughput SECONDS_PER_PART=3 for the
#   throughput rows, each run that many seconds, at IO_THREADS io threads:
#   default 1,8; IO_THREADS=1 profiles T = 1 by itself)
# Writes OUT_DIR/profile-{default,old}-{service,worker}.txt, the benchmark's
# lines ({default,old}.log) and the raw samples.
set -u -o pipefail
build=$1 out=$2
reps=${REPS:-20000} parts=${PARTS:-latency} seconds=${SECONDS_PER_PART:-2}
io_threads=${IO_THREADS:-1,8}
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
for mode in default old; do
  args=()
  [ "$mode" = old ] && args=(--worker-arg="--no-ring-io-poll --threads 4")
  rm -f "$out/$mode"-*.samples
  # The preload after `timeout` (else timeout's own exit would write a file).
  timeout 300 env SAMPLER_OUT="$out/$mode-%p.samples" SAMPLER_WRITE_EVERY_S=0.5 \
    LD_PRELOAD="$bins/sampler.so" "$build/bench/atomr-bench-isolation" --parts "$parts" \
    --reps "$reps" --seconds "$seconds" --io-threads "$io_threads" "${args[@]}" >"$out/$mode.log" 2>&1
  r=$?
  echo "$mode: atomr-bench-isolation rc=$r"
  grep -E '^(latency|throughput)' "$out/$mode.log"
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
