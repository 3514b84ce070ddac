#!/usr/bin/env bash
# The second device call after scripts/device-check.sh, on the same warm
# machine (build-gpu built): the isolated test for ee5b5db alone (and, with
# REVERTED_WORKER=<a worker_main.cpp without the fix>, again against a worker
# built from it, where it should fail; the worker is rebuilt from the tree's
# source afterwards), serve-gpu RUNS_SERVE times (default 2), the pipeline
# benchmark RUNS_PIPE times (default 2; variants per_op, composed, fused,
# graph at 4 and 16 in flight) and one profile of composed at 16 in flight
# (bench/tools/sampler.cpp, symbolised there). Everything goes into one
# archive, $OUT/extra.tgz (the device tool brings back only a few files);
# the summary lines go to stdout.
# Without REVERTED_WORKER, one is made from the tree's worker_main.cpp and
# scripts/patches/ee5b5db-reverted-worker.patch (ee5b5db's worker change
# taken out of the current source; needs `patch`); REVERT=0 skips it.
set -u
b=${BUILD:-build-gpu}
w=$(mktemp -d)
pf=scripts/patches/ee5b5db-reverted-worker.patch
tc='--test-case=isolated: a fault request right after the worker starts*'
if [ -z "${REVERTED_WORKER:-}" ] && [ "${REVERT:-1}" != 0 ]; then
  if ! command -v patch >/dev/null; then
    echo "no reverted worker: \`patch\` is not installed here"
  elif patch -s -o "$w/reverted.cpp" lib/worker/worker_main.cpp "$pf" >"$w/rv-patch.log" 2>&1; then
    REVERTED_WORKER="$w/reverted.cpp"
  else
    echo "no reverted worker: $pf does not apply to this tree"; cat "$w/rv-patch.log"
  fi
fi
echo "== the isolated test for ee5b5db"
timeout 120 "$b/test/atomr_isolated_tests" "$tc" >"$w/iso-fixed.log" 2>&1
echo "rc=$?"; tail -3 "$w/iso-fixed.log"
if [ -n "${REVERTED_WORKER:-}" ]; then
  cp lib/worker/worker_main.cpp "$w/worker_main.keep"
  cp "$REVERTED_WORKER" lib/worker/worker_main.cpp
  ninja -C "$b" atomr-cuda-worker >"$w/rv-build.log" 2>&1; echo "reverted worker build rc=$?"
  timeout 120 "$b/test/atomr_isolated_tests" "$tc" >"$w/iso-reverted.log" 2>&1
  echo "without the fix rc=$? (should fail)"; grep -E "ERROR|test cases" "$w/iso-reverted.log" | head -6
  cp "$w/worker_main.keep" lib/worker/worker_main.cpp
  ninja -C "$b" atomr-cuda-worker >>"$w/rv-build.log" 2>&1; echo "worker rebuilt rc=$?"
fi
for i in $(seq "${RUNS_SERVE:-2}"); do
  echo "== serve-gpu $i"
  (cd "$b" && timeout 150 ../samples/serve/gpu-test.sh samples/atomr-serve samples/atomr-load \
    test/atomr_serve_tests "$w/serve-gpu-$i" >"$w/serve-gpu-$i.log" 2>&1)
  echo "rc=$?"; tail -4 "$w/serve-gpu-$i.log"
done
for i in $(seq "${RUNS_PIPE:-2}"); do
  echo "== pipeline $i"
  timeout 120 "$b/bench/atomr-bench-pipeline" --variants per_op,composed,fused,graph \
    --in-flight 4,16 --seconds 2 --json "$w/pipe$i.json" >"$w/pipe$i.log" 2>&1
  echo "rc=$?"; grep -E "^(variant|per_op|composed|fused|graph|raw)" "$w/pipe$i.log" | head -14
done
if [ "${PROFILE:-1}" = 1 ]; then
  echo "== profile: composed, 16 in flight"
  mkdir -p "$w/bins"
  g++ -O2 -shared -fPIC -o "$w/sampler.so" bench/tools/sampler.cpp -ldl &&
    for f in "$b"/libatomr-accel-cuda.so* "$b/bench/atomr-bench-pipeline"; do
      [ -d "$f" ] || cp -L "$f" "$w/bins/"  # (not the .so.p object folder)
    done
  timeout 60 env SAMPLER_OUT="$w/pipe-samples.txt" LD_PRELOAD="$w/sampler.so" \
    "$b/bench/atomr-bench-pipeline" --variants composed --in-flight 16 --seconds 2 >"$w/prof.log" 2>&1
  echo "rc=$?"; tail -3 "$w/prof.log"
  python3 scripts/sampler-report.py "$w/pipe-samples.txt" --bin "$w/bins" --top 45 --threads \
    >"$w/profile-composed-16.txt" 2>&1
  head -2 "$w/profile-composed-16.txt"
  rm -rf "$w/bins" "$w/sampler.so"; gzip -f "$w/pipe-samples.txt"
fi
(cd "$w" && tar czf "${OUT:-.}/extra.tgz" .)
