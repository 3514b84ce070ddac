#!/usr/bin/env bash
# The consumer test (meson test 'consumer'): builds the downstream project in
# test/consumer/ the two ways a user gets the library, and runs both programs.
#   (a) subproject: a copy of test/consumer/ whose subprojects/atomr-accel-cuda
#       is a link to this source tree, found by dependency('atomr-accel-cuda')
#       (the library calls meson.override_dependency);
#   (b) pkg-config: this source tree configured with tests, samples and
#       benchmarks off, installed into a temporary prefix, and the consumer
#       configured with PKG_CONFIG_PATH pointing there
#       (dependency('atomr-accel-cuda', method: 'pkg-config')).
# Both must build and link. A program exits 77 without a usable GPU; this
# script then exits 77 (SKIP) with the reason, and 0 only when both programs
# ran all their checks.
#
# Usage: consumer.sh SOURCE_ROOT BUILD_ROOT TOOLKIT_PREFIX [MESON [NINJA]]
# Scratch space is a mktemp directory under BUILD_ROOT, removed at exit
# (kept when KEEP_CONSUMER=1, for a look at the logs).
set -u -o pipefail

src=$(cd "$1" && pwd) || exit 1
build_root=$2
toolkit=$3
meson=${4:-meson}
ninja=${5:-ninja}
# A meson run from its source has "python3 meson.py" as its command: take the
# one on the PATH then.
case $(basename "$meson") in python*) meson=meson ;; esac

work=$(mktemp -d "$build_root/consumer.XXXXXX") || exit 1
if [ "${KEEP_CONSUMER:-0}" = 1 ]; then
  trap 'echo "kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi

# Runs a step quietly; on failure shows the end of its log and exits 1.
step() {
  local name=$1
  shift
  local log="$work/$name.log"
  local t0=$SECONDS
  if ! "$@" >"$log" 2>&1; then
    echo "FAIL: $name: $*"
    tail -40 "$log"
    exit 1
  fi
  local warnings
  warnings=$(grep -c 'warning:' "$log")
  echo "$name: ok ($((SECONDS - t0)) s, $warnings compiler warnings)"
}

# The library only: quick to build, and all a consumer needs.
lib_opts=(-Dtoolkit_prefix="$toolkit" -Dtests=false -Dsamples=false -Dbenchmarks=false)
# No optimisation and no debug info: these builds only have to compile, link and run.
common=(--buildtype=plain)

# (a) subproject
sub="$work/sub"
mkdir -p "$sub/subprojects"
cp "$src/test/consumer/meson.build" "$src/test/consumer/meson_options.txt" \
  "$src/test/consumer/main.cpp" "$sub/"
ln -s "$src" "$sub/subprojects/atomr-accel-cuda"
step subproject-setup "$meson" setup "${common[@]}" --wrap-mode=nodownload \
  --force-fallback-for=atomr-accel-cuda "${lib_opts[@]/#-D/-Datomr-accel-cuda:}" \
  "$sub/build" "$sub"
step subproject-build "$ninja" -C "$sub/build"

# (b) pkg-config, against an installed copy
pkg_config=${PKG_CONFIG:-pkg-config}
build_pkgconfig_consumer() {
  local prefix="$work/prefix"
  step install-setup "$meson" setup "${common[@]}" --prefix="$prefix" --libdir=lib \
    "${lib_opts[@]}" "$work/lib-build" "$src"
  step install-build "$ninja" -C "$work/lib-build"
  step install "$meson" install -C "$work/lib-build" --no-rebuild

  # Every public header must be installed (detail/ included).
  local h missing=0 count=0
  while IFS= read -r h; do
    count=$((count + 1))
    if [ ! -f "$prefix/include/$h" ]; then
      echo "FAIL: header not installed: include/$h"
      missing=1
    fi
  done < <(cd "$src/include" && find . -name '*.hpp' | sed 's|^\./||' | sort)
  [ "$missing" = 0 ] || exit 1
  echo "headers: all $count installed"

  local pcdir="$prefix/lib/pkgconfig"
  [ -f "$pcdir/atomr-accel-cuda.pc" ] || { echo "FAIL: $pcdir/atomr-accel-cuda.pc not installed"; exit 1; }
  local path="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  echo "pkg-config --libs: $(PKG_CONFIG_PATH="$path" "$pkg_config" --libs atomr-accel-cuda)"
  step pkgconfig-setup env PKG_CONFIG_PATH="$path" \
    "$meson" setup "${common[@]}" -Dvia=pkg-config "$work/pc/build" "$src/test/consumer"
  step pkgconfig-build "$ninja" -C "$work/pc/build"
}

programs=("sub:$sub/build/consumer")
not_built=""
if command -v "$pkg_config" >/dev/null 2>&1; then
  build_pkgconfig_consumer
  programs+=("pc:$work/pc/build/consumer")
else
  # scripts/deps.sh lets the build go on without pkg-config; say what that costs.
  not_built="$pkg_config not found: the pkg-config half was not built"
  echo "$not_built"
fi

# Run the programs.
status=0
skipped=0
reason=""
for entry in "${programs[@]}"; do
  how=${entry%%:*}
  exe=${entry#*:}
  out=$("$exe" 2>&1)
  rc=$?
  while IFS= read -r line; do echo "  [$how] $line"; done <<<"$out"
  case $rc in
    0) echo "run ($how): ok" ;;
    77)
      skipped=$((skipped + 1))
      reason=$(echo "$out" | sed -n 's/^SKIP: //p' | head -1)
      ;;
    *)
      echo "FAIL: run ($how): exit status $rc"
      status=1
      ;;
  esac
done
[ "$status" = 0 ] || exit 1
if [ "$skipped" -gt 0 ]; then
  echo "SKIP: the consumer programs built and linked, but did not run: ${reason:-no reason given}${not_built:+; $not_built}"
  exit 77
fi
if [ -n "$not_built" ]; then
  echo "SKIP: the subproject program ran every check, but $not_built"
  exit 77
fi
echo "consumer: both programs ran every check"
