#!/usr/bin/env bash
# Set-up command 2: check for (and install, where apt can) what the build
# needs, build, run the whole test suite; then build the CPU tests with
# AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/ and run them.
# GPU tests report SKIP (exit 77, with the reason in the log) without a GPU;
# the API documentation check (suite docs) likewise without doxygen.
# TOOLKIT_PREFIX: the CUDA toolkit (default /usr/local/cuda); ASAN=0 leaves
# the sanitizer stage out.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
toolkit=${TOOLKIT_PREFIX:-/usr/local/cuda}
[ -d build ] || meson setup build --buildtype=release -Dtoolkit_prefix="$toolkit"
ninja -C build
rc=0
meson test -C build --print-errorlogs || rc=$?
# Show why tests were skipped, if they were.
grep -h "^SKIP:" build/meson-logs/testlog.txt || true
[ "$rc" = 0 ] || exit "$rc"

if [ "${ASAN:-1}" = 1 ]; then
  # Only the CPU test binary (the library and the CPU tests): the GPU tests
  # would skip here anyway, and scripts/device-check.sh runs them sanitized on
  # the GPU machine. UBSan findings abort (no recovery).
  [ -d build-asan ] || meson setup build-asan --buildtype=debug -Dtoolkit_prefix="$toolkit" \
    -Db_sanitize=address,undefined -Db_lundef=false \
    -Dcpp_args=-fno-sanitize-recover=all -Dsamples=false -Dbenchmarks=false
  # The worker process is what the supervision tests start (when built).
  ninja -C build-asan test/atomr_cpu_tests $(ninja -C build-asan -t targets all 2>/dev/null |
    grep -o '^atomr-cuda-worker' | head -1)
  # protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap is.
  ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:abort_on_error=0} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
    build-asan/test/atomr_cpu_tests
  echo "asan+ubsan: CPU tests passed"
fi
