#!/usr/bin/env bash
# The whole GPU check, as run on the H200 through the device tool:
# configure, build, full test suite (CPU + GPU), the samples, the GPU tests
# under compute-sanitizer memcheck, and the GPU tests (the isolated suite with its
# worker first) built with ASan + UBSan.
# Full logs go to $OUT (or ./device-out); the summary lines go to stdout.
# SAMPLES=0, SANITIZE=0, ASAN=0 leave those stages out; TESTS=0 leaves out the
# test suite and the device-info sample (e.g. the ASan stage alone on a warm
# machine: TESTS=0 SAMPLES=0 SANITIZE=0 bash scripts/device-check.sh). A cold
# machine's build takes about 1 to 2.5 min, the suite about 75 s, the samples
# 60 s, memcheck 200 to 300 s, the ASan stage about 330 s (H200, session 23):
# split the whole check over two calls of at most 600 s.
# CALL_LIMIT: the seconds one device call may run (600 there, less a margin);
# memcheck's and ASan's timeouts are cut to what is left of it, and a stage
# with less than a minute left is skipped with a line saying so, so that a
# long call still ends with its logs packed (session 29's call A ran out of
# its 600 s inside memcheck on a cold H100 and brought back nothing).
set -u -o pipefail
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
call_limit=${CALL_LIMIT:-585}
# The seconds left of the call for a stage wanting `$1`, or 0 (then say why).
budget() {
  local left=$((call_limit - SECONDS - 15))
  if [ "$left" -lt 60 ]; then
    echo "$2 left out: ${left} s left of the call's ${call_limit} (run it in a call of its own)" >&2
    echo 0
  elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# The device tool brings back only a few files: the logs so far, in one.
pack() { (cd "$out" && tar czf logs.tgz ./*.log 2>/dev/null); }
build=${BUILD:-build-gpu}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[ -d "$build" ] || meson setup "$build" --buildtype=release >"$out/setup.log" 2>&1 ||
  { tail -20 "$out/setup.log"; exit 1; }
grep -h "NCCL (collective_actor)" "$out/setup.log" 2>/dev/null  # found in the toolkit, system or wheel?
# NINJA_TARGETS: build only these (e.g. test/atomr_gpu_tests: a quicker call
# on a cold machine when one test is to be run); default everything.
# shellcheck disable=SC2086  # a list of targets
ninja -C "$build" ${NINJA_TARGETS:-} >"$out/build.log" 2>&1; echo "build rc=$? warnings=$(grep -c 'warning:' "$out/build.log")"
if [ "${TESTS:-1}" = 1 ]; then
  # -t scales the per-test timeouts in test/meson.build (gpu: 600 s).
  meson test -C "$build" -t "${TIMEOUT_MULTIPLIER:-0.25}" --print-errorlogs >"$out/test.log" 2>&1
  echo "meson test rc=$?"
  cp "$build/meson-logs/testlog.txt" "$out/testlog-full.log" 2>/dev/null
  grep -h "^SKIP:" "$out/testlog-full.log"  # why a test skipped (consumer: pkg-config missing?)
  grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout): |test cases:|assertions:|ERROR:|values:|logged:|THREW|CRASHED" "$out/test.log" | head -60
  "$build"/samples/atomr-device-info --mib 64 --reps 5 >"$out/sample.log" 2>&1
  echo "sample rc=$?"
  tail -22 "$out/sample.log"
fi
# The library-actor samples, each bounded so a hang costs a line, not the call.
run_sample() {
  local name=$1; shift
  sample_no=$((${sample_no:-0} + 1))
  local log="$out/sample-$sample_no-$name.log"
  timeout 60 "$build/samples/$name" "$@" >"$log" 2>&1
  echo "$name $* rc=$?"; tail -"${SAMPLE_TAIL:-8}" "$log"
}
if [ "${SAMPLES:-1}" = 1 ]; then
  run_sample atomr-sgemm --n 4096 --reps 20
  run_sample atomr-sgemm --n 4096 --reps 20 --tf32
  run_sample atomr-sgemm --n 256 --reps 200 --strategy host_fn
  run_sample atomr-fft --n 1048576 --reps 20
  run_sample atomr-fft --n 4096 --batch 64 --reps 20 --double --strategy blocking_sync
  run_sample atomr-rng --count 16777216 --reps 20
  run_sample atomr-rng --count 1048576 --generator sobol32
  [ -x "$build/samples/atomr-conv2d" ] && run_sample atomr-conv2d
  run_sample atomr-concurrent --coroutines 1000 --threads 4
  run_sample atomr-concurrent --coroutines 1000 --threads 1 --strategy host_fn
fi
# API errors are not counted: the tests provoke some on purpose (out of memory,
# invalid launch) and assert them themselves; memcheck's job here is memory.
if [ "${SANITIZE:-1}" = 1 ]; then
  # ATOMR_TEST_UNDER_SANITIZER: timing-dependent counts (how many units a
  # stress test managed to cancel) are reported, not asserted, and the
  # heaviest loads are scaled down. -d: each case's seconds go to the log
  # (the slow ones under memcheck are what decides whether it fits a call).
  pack
  t=$(budget "${SANITIZE_TIMEOUT:-200}" memcheck)
  if [ "$t" -gt 0 ]; then
    # shellcheck disable=SC2086  # SANITIZE_ARGS is a list of arguments
    ATOMR_TEST_UNDER_SANITIZER=1 timeout "$t" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
      "$build"/test/atomr_gpu_tests -d ${SANITIZE_ARGS:-} >"$out/sanitizer.log" 2>&1
    rc=$?
    summary=$(grep -m1 "ERROR SUMMARY" "$out/sanitizer.log" || echo "no ERROR SUMMARY line (timed out after ${t} s, or crashed)")
    echo "sanitizer rc=$rc: $summary"
    grep -E "test cases:|assertions:|ERROR:|CRASHED|THREW" "$out/sanitizer.log" | head -20
    echo "slowest under memcheck:"
    grep -E '^[0-9]+\.[0-9]+ s: ' "$out/sanitizer.log" | sort -rn | head -5
  fi
fi
# The GPU tests (and the fault scenarios, one process each) built with
# AddressSanitizer + UndefinedBehaviorSanitizer in a build dir of their own.
# protect_shadow_gap=0: the CUDA driver maps memory inside ASan's shadow gap;
# detect_leaks=0: the driver keeps allocations until exit, which LeakSanitizer
# would report. UBSan findings abort (-fno-sanitize-recover).
if [ "${ASAN:-1}" = 1 ]; then
  asan_build=${ASAN_BUILD:-build-gpu-asan}
  if [ ! -d "$asan_build" ] && ! meson setup "$asan_build" --buildtype=debugoptimized \
    -Db_sanitize=address,undefined -Db_lundef=false -Dcpp_args=-fno-sanitize-recover=all \
    -Dsamples=false -Dbenchmarks=false >"$out/asan-setup.log" 2>&1; then
    echo "asan setup failed"; tail -20 "$out/asan-setup.log"
  else
    # The CPU tests start the isolated device's worker (when Boost.Process v2
    # was found): build it too, and the isolated suite, whose worker then
    # runs with the sanitizers as well.
    targets=$(ninja -C "$asan_build" -t targets all 2>/dev/null)
    worker=$(grep -o '^atomr-cuda-worker' <<<"$targets" | head -1)
    isolated=$(grep -o '^test/atomr_isolated_tests' <<<"$targets" | head -1)
    # shellcheck disable=SC2086  # $worker and $isolated are empty or one target
    ninja -C "$asan_build" test/atomr_gpu_tests test/atomr_gpu_fault_tests test/atomr_cpu_tests \
      $worker $isolated >"$out/asan-build.log" 2>&1
    echo "asan build rc=$? warnings=$(grep -c 'warning:' "$out/asan-build.log")"
    asan_run() {
      local name=$1; shift
      pack
      local t
      t=$(budget "${ASAN_TIMEOUT:-400}" "asan $name")
      [ "$t" -gt 0 ] || return 0
      ATOMR_TEST_UNDER_SANITIZER=1 ASAN_OPTIONS=${ASAN_GPU_OPTIONS:-protect_shadow_gap=0:detect_leaks=0} \
        UBSAN_OPTIONS=${UBSAN_GPU_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        timeout "$t" "$@" >"$out/asan-$name.log" 2>&1
      local rc=$?
      echo "asan $name rc=$rc: asan errors=$(grep -c 'ERROR: AddressSanitizer' "$out/asan-$name.log")" \
        "ubsan errors=$(grep -c 'runtime error:' "$out/asan-$name.log")" \
        "$(grep -m1 -E '^\[doctest\] test cases:' "$out/asan-$name.log" || echo '(no doctest summary)')"
      grep -m3 -E "ERROR: AddressSanitizer|runtime error:|SUMMARY: " "$out/asan-$name.log"
    }
    # The isolated suite first: the shortest, and the only one whose worker
    # runs GPU work (its ring threads, the launch hand-off) under ASan.
    [ -n "$isolated" ] && asan_run isolated "$asan_build"/test/atomr_isolated_tests
    # shellcheck disable=SC2086  # ASAN_ARGS is a list of arguments
    asan_run gpu "$asan_build"/test/atomr_gpu_tests ${ASAN_ARGS:-}
    asan_run cpu "$asan_build"/test/atomr_cpu_tests
    for strategy in event_poll host_fn blocking_sync; do
      asan_run "fault-$strategy" "$asan_build"/test/atomr_gpu_fault_tests \
        "--test-case=fault awaited by $strategy*"
    done
  fi
fi
# Pack the logs into one for the last time.
(cd "$out" && tar czf logs.tgz --remove-files ./*.log 2>/dev/null)
