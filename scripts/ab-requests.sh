#!/usr/bin/env bash
# A/B of gateway binaries on request-path CPU: keep-alive HTTP/1.1 requests and ECDSA P-256 full
# handshakes, server CPU µs per operation (`rampart bench ... --server-pid`), the binaries
# alternating round by round (and which goes first) so the machine's drift falls on each alike. Gateway on CPU 0 with
# one worker, load generator and demo upstream on CPU 1, 16 connections, /bytes/100.
#   scripts/ab-requests.sh /tmp/rampart-before ./target/release/rampart
#   ROUNDS=5 DURATION=6s scripts/ab-requests.sh A B ...     # defaults: 3 rounds, 4s
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
[ $# -ge 1 ] || { sed -n '2,7p' "$0" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-4s}
OUT=${OUT:-target/ab-requests}
BIN=./target/release/rampart
[ -x "$BIN" ] || cargo build --release -p rampart
mkdir -p "$OUT"
bench_site_certs "$OUT/certs"
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/rampart.toml" threads $GW $UP
bench_upstream 1 $UP
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
printf 'round\tbinary\tmode\tserver_cpu_us_per_op\n'
bins=("$@")
reversed=(); for ((i = $# - 1; i >= 0; i--)); do reversed+=("${bins[i]}"); done
for round in $(seq "$ROUNDS"); do
  # The order turns every round (A B, B A, ...): the second to run in a round measured about
  # 1% dearer in an A/A test of one binary against its copy.
  order=("${bins[@]}"); ((round % 2)) || order=("${reversed[@]}")
  for gw_bin in "${order[@]}"; do
    gw_path=$(abs "$gw_bin")
    (cd "$OUT" && exec taskset -c 0 "$gw_path" run --config rampart.toml 2>gateway.log) &
    gw=$!
    wait_port $GW
    for mode in "https-requests --http h1" "https-handshake --sigalgs ecdsa_secp256r1_sha256"; do
      # shellcheck disable=SC2086
      taskset -c 1 "$BIN" bench $mode --url "https://localhost:$GW/bytes/100" -c 16 \
        -d "$DURATION" --server-pid $gw --json | tail -1 | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("\t".join(sys.argv[1:4] + ["%.1f" % r["server_cpu_us_per_op"]]))' \
        "$round" "$gw_bin" "${mode%% *}"
    done
    kill $gw; wait $gw 2>/dev/null || true
  done
done
