#!/usr/bin/env bash
# Set-up command 1: install what is missing, build, run the main demo.
# Without a GPU the demo says so and exits 69.
set -eu
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release
ninja -C build
exec build/samples/atomr-device-info "$@"
