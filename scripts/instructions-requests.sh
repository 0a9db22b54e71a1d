#!/usr/bin/env bash
# Instructions and allocations per keep-alive HTTP/1.1 request, counted by valgrind's callgrind:
# deterministic where CPU time on this VM varies by ±5% between runs, so it settles request-path
# A/Bs of a percent or two. Each binary serves 2,000 warm-up requests, then 20,000 counted ones
# (4 connections, /bytes/100, one worker, gateway on CPU 0 and load on CPU 1). Prints one row
# per binary; with CALLGRIND_DIFF=1 also the functions whose own instructions changed most
# between the first binary and each other one.
#   scripts/instructions-requests.sh /tmp/rampart-before ./target/release/rampart
# Counts are the gateway's user-space instructions only (system calls are not in them), and
# valgrind counts a `rep movsb` copy per byte, so large memcpys weigh more than on hardware.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
[ $# -ge 1 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt install valgrind)" >&2; exit 1; }
OUT=${OUT:-target/instructions-requests}
BIN=./target/release/rampart
[ -x "$BIN" ] || cargo build --release -p rampart
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
bench_site_certs "$OUT/certs"
UP=18080; GW=18443; N=20000
bench_h3_gateway_config "$OUT/rampart.toml" threads $GW $UP
pids=()
trap bench_cleanup EXIT
bench_upstream 1 $UP
load() {
  taskset -c 1 "$BIN" bench https-requests --http h1 --url "https://localhost:$GW/bytes/100" \
    -c 4 -n "$1" -d 120s --json | tail -1
}
profiles=()
for i in $(seq $#); do
  gw_bin=${!i}
  case $gw_bin in /*) ;; *) gw_bin=$PWD/$gw_bin ;; esac
  prof=$OUT/callgrind.$i
  rm -f "$prof"*
  (cd "$OUT" && exec taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$prof" \
    --dump-instr=no --compress-strings=no --compress-pos=no "$gw_bin" run --config rampart.toml \
    2>"$OUT/gateway.$i.log") &
  gw=$!
  # Valgrind starts the gateway far slower than wait_port waits.
  for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/$GW) 2>/dev/null && break; sleep 0.2; done
  load 2000 >/dev/null
  callgrind_control -z $gw >/dev/null 2>&1
  ok=$(load $N | python3 -c 'import json,sys; print(json.load(sys.stdin)["ok"])')
  [ "$ok" = $N ] || { echo "$gw_bin: $ok of $N requests answered" >&2; exit 1; }
  callgrind_control -d $gw >/dev/null 2>&1
  kill $gw; wait $gw 2>/dev/null || true
  profiles+=("$gw_bin=$prof.1")
done
python3 scripts/callgrind_per_request.py $N "${profiles[@]}"
