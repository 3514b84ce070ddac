#!/usr/bin/env bash
# Runs the benchmarks on the GPU machine and gathers their JSON:
#   bash scripts/bench.sh            # all of them, into $OUT (or ./bench-out)
#   BENCHES="latency" bash scripts/bench.sh
# Then, here: copy the JSON into bench/results/ and run
#   python3 scripts/bench-summary.py && python3 scripts/bench-plot.py
set -u -o pipefail
out=${OUT:-$PWD/bench-out}
mkdir -p "$out"
build=${BUILD:-build-gpu}
[ -d "$build" ] || meson setup "$build" --buildtype=release >"$out/bench-setup.log" 2>&1 ||
  { tail -20 "$out/bench-setup.log"; exit 1; }
ninja -C "$build" >"$out/bench-build.log" 2>&1 || { tail -30 "$out/bench-build.log"; exit 1; }
rc=0
for b in ${BENCHES:-latency throughput one_actor streams large torch pipeline torch_pipeline isolation service}; do
  echo "=== $b"
  case $b in
    torch) cmd=(python3 bench/peers/torch_small.py --json "$out/torch_peer.json") ;;
    # Issue 19: the request pipeline's PyTorch peer (the C++ side is "pipeline").
    torch_pipeline) cmd=(python3 bench/peers/torch_pipeline.py --json "$out/torch_pipeline.json") ;;
    # Issue 21: atomr-serve + atomr-load against the library's own unit of the
    # same request (service_*.json).
    service) cmd=(bash scripts/bench-service.sh "$build" "$out") ;;
    # One io thread driving one actor (stream) per torch stream: the peer
    # comparison's configuration (torch: 8 streams from one Python thread).
    streams) cmd=("$build/bench/atomr-bench-throughput" --threads 1 --actors 8 ${BENCH_ARGS:-}
                  --json "$out/throughput_streams.json") ;;
    # Nine paired rounds: the raw ceiling of the small operations moves by up
    # to 40% between rounds on the shared host, and with five rounds one
    # slow stretch moved the sgemm 64 median at T = 8 by ~0.1 (docs/history/performance.md).
    throughput) cmd=("$build/bench/atomr-bench-throughput" --rounds 9 ${BENCH_ARGS:-}
                     --json "$out/throughput.json") ;;
    # One actor with default options shared by every io thread, as users
    # write it (lanes made on demand), against the same raw ceiling.
    one_actor) cmd=("$build/bench/atomr-bench-throughput" --actors 1 --default-actor --rounds 9
                    ${BENCH_ARGS:-} --json "$out/throughput_one_actor.json") ;;
    *) cmd=("$build/bench/atomr-bench-$b" ${BENCH_ARGS:-} --json "$out/$b.json") ;;
  esac
  echo "${cmd[*]}" | sed "s|$out/|bench/results/|g" >>"$out/command.txt"
  timeout "${BENCH_TIMEOUT:-240}" "${cmd[@]}" || { echo "$b rc=$?"; rc=1; }
done
exit $rc
