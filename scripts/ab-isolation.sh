#!/usr/bin/env bash
# Alternating rounds of atomr-bench-isolation for several worker settings,
# so that settings are compared on one machine within minutes (runs on the
# GPU hosts move by a third between calls; docs/history/performance.md,
# "The isolated device, sessions 23 to 33"). Each variant is LABEL=ARGS:
# ARGS are the bench's arguments, separated by ';' (one may hold spaces, as
# --worker-arg's does), and LABEL names the variant in the table; "base="
# is the bench's defaults.
#   ab-isolation.sh BUILD_DIR OUT_DIR base= 'lanes0=--worker-arg=--lanes 0' \
#     'r2l8=--rings=2;--worker-arg=--lanes 8'
# ROUNDS (3), PARTS (throughput), IO_THREADS (8), SECONDS_PER_PART (1),
# REPS (3000, the latency part's), RUN_TIMEOUT (60 s a run), STOP_AFTER
# (seconds since the start after which no new run begins; default none:
# for a device call with a limit). Every run's output is OUT_DIR/LABEL-ROUND.log;
# the table (one line per run: each work's isolated share of in process,
# or the added latency) goes to stdout and OUT_DIR/ab.txt.
set -u -o pipefail
[ $# -ge 3 ] || {
  echo "usage: $0 BUILD_DIR OUT_DIR LABEL=ARGS LABEL=ARGS..." >&2
  exit 64
}
build=$1 out=$2
shift 2
bench=${BENCH:-$build/bench/atomr-bench-isolation}
[ -x "$bench" ] || {
  echo "$0: no $bench (build the benchmarks first)" >&2
  exit 66
}
mkdir -p "$out"
rounds=${ROUNDS:-3} parts=${PARTS:-throughput} io=${IO_THREADS:-8}
seconds=${SECONDS_PER_PART:-1} reps=${REPS:-3000} run_timeout=${RUN_TIMEOUT:-60}
stop_after=${STOP_AFTER:-0}
for v in "$@"; do
  case $v in
  *=*) ;;
  *)
    echo "$0: a variant is LABEL=ARGS, not '$v'" >&2
    exit 64
    ;;
  esac
done

# One line from the bench's "throughput WORK T=N in_process X isolated Y ops/s"
# and "latency WORK in_process X isolated Y us median" lines.
summarise() {
  awk '$1 == "throughput" { printf "%s %s %.1f%% (%.0fk/%.0fk) | ", $2, $3, 100 * $7 / $5, $7 / 1000, $5 / 1000 }
       $1 == "latency" { printf "%s %+.2f us (%.2f/%.2f) | ", $2, $6 - $4, $6, $4 }' "$1"
}

: >"$out/ab.txt"
rc=0
for ((r = 1; r <= rounds; r++)); do
  for v in "$@"; do
    if [ "$stop_after" -gt 0 ] && [ "$SECONDS" -ge "$stop_after" ]; then
      echo "stopped before round $r, $v: ${SECONDS} s of ${stop_after}" | tee -a "$out/ab.txt"
      exit "$rc"
    fi
    label=${v%%=*} args=${v#*=}
    log="$out/$label-$r.log"
    extra=()
    [ -n "$args" ] && IFS=';' read -ra extra <<<"$args"
    timeout "$run_timeout" "$bench" --parts "$parts" --io-threads "$io" --seconds "$seconds" \
      --reps "$reps" "${extra[@]}" >"$log" 2>&1
    r_rc=$?
    [ "$r_rc" = 0 ] || rc=$r_rc
    printf 'r%d %-10s rc=%d %s\n' "$r" "$label" "$r_rc" "$(summarise "$log")" | tee -a "$out/ab.txt"
  done
done
exit "$rc"
