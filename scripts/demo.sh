#!/usr/bin/env bash
# Set-up command 1: check for (and install, where apt can) what the build
# needs, build, run the main demo. Without a GPU the demo says so and exits 69.
# TOOLKIT_PREFIX: the CUDA toolkit (default /usr/local/cuda).
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release -Dtoolkit_prefix="${TOOLKIT_PREFIX:-/usr/local/cuda}"
ninja -C build
exec build/samples/atomr-device-info "$@"
