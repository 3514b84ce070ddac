#!/usr/bin/env bash
# The whole GPU check, as run on the H200 through the device tool:
# configure, build, full test suite, the sample, and the GPU tests under
# compute-sanitizer memcheck. Logs go to $OUT (or ./device-out).
set -u -o pipefail
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
build=${BUILD:-build-gpu}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  meson setup "$build" --buildtype=release --wipe >/dev/null 2>&1 || meson setup "$build" --buildtype=release
  ninja -C "$build" 2>&1 | grep -E "warning|error|FAILED" ; echo "build rc=${PIPESTATUS[0]}"
  meson test -C "$build" --print-errorlogs --num-processes 1; echo "meson test rc=$?"
  "$build"/samples/atomr-device-info --mib 64 --reps 5; echo "sample rc=$?"
  if [ "${SANITIZE:-1}" = 1 ]; then
    timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool memcheck --error-exitcode 99 "$build"/test/atomr_gpu_tests \
      ${SANITIZE_ARGS:-} 2>&1 | tail -15; echo "sanitizer rc=${PIPESTATUS[0]}"
  fi
} 2>&1 | tee "$out/device-check.log"
cp "$build"/meson-logs/testlog.txt "$out/" 2>/dev/null || true
