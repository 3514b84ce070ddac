#!/usr/bin/env bash
# Set-up command 2: install what is missing, build, run the whole test suite.
# GPU tests report SKIP (exit 77, with the reason in the log) without a GPU.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release
ninja -C build
meson test -C build --print-errorlogs
# Show why the GPU tests were skipped, if they were.
grep -h "^SKIP:" build/meson-logs/testlog.txt || true
