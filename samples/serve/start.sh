# Sourced by scripts/demo.sh and samples/serve/gpu-test.sh (bash).
# serve_start EXE LOG ARGS...: starts atomr-serve EXE on a free loopback port
# with ARGS, its output in LOG; sets $pid and $port once it listens, or prints
# LOG and exits 1 when it has not within 10 s.
serve_start() {
  local exe=$1 log=$2
  shift 2
  "$exe" --port 0 "$@" >"$log" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 200); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$') && return 0
    sleep 0.05
  done
  echo "atomr-serve did not start:"
  cat "$log"
  exit 1
}
