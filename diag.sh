#!/usr/bin/env bash
# temporary (untracked): session 9 first H200 call
set -u
out=${OUT:-$PWD/device-out}; mkdir -p "$out"
b=build-gpu
[ -d $b ] || meson setup $b --buildtype=release >"$out/setup.log" 2>&1
ninja -C $b >"$out/build0.log" 2>&1; echo "build rc=$? warnings=$(grep -c 'warning:' "$out/build0.log")"
tail -5 "$out/build0.log" | grep -E "error|FAILED" 
timeout 200 $b/test/atomr_gpu_tests -tc='cudnn*' -s 2>&1 | grep -E "MESSAGE|graph API|ERROR|FAILED|test cases|assertions|error" | head -40
rc_t=${PIPESTATUS[0]}
echo "cudnn tests rc=$rc_t"
timeout 120 $b/bench/atomr-bench-large --work conv_resnet50_3x3_b64_f16 --json "$out/large-conv.json" 2>&1 | tail -30
if [ "$rc_t" = 0 ]; then
  SAMPLE_TAIL=2 SANITIZE_TIMEOUT=230 bash scripts/device-check.sh
fi
(cd "$out" && tar czf all.tgz --remove-files ./* 2>/dev/null)
