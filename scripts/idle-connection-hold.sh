#!/usr/bin/env bash
# Issue 32's descriptor-hold attack: an attacker completes TLS handshakes and holds the
# connections idle (`rampart bench https-hold`, HOLD connections at once, opening a new one
# whenever the gateway closes one) while a probe client (curl, one request every 0.5 s) asks
# for a page. The gateway runs with a small descriptor limit (NOFILE, so its connection budget
# is (NOFILE - 256) / 2) and its default timers. Prints the probe's success rate during the
# hold, how long the gateway kept the attacker's connections, and what it counted.
# The attacker and the probe share 127.0.0.1, so per-address limits cannot tell them apart.
#   scripts/idle-connection-hold.sh                       # HOLD=20000 NOFILE=4096 DURATION=30s
#   HOLD=3000 DURATION=10s scripts/idle-connection-hold.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
HOLD=${HOLD:-20000}
NOFILE=${NOFILE:-4096}
DURATION=${DURATION:-30s}
OUT=${OUT:-target/idle-connection-hold}
UP=18280; GW=18643
# GATEWAY_BIN: the gateway under test (default $BIN, which also runs the attack).
bench_attack_setup $GW $UP 19921
(cd "$OUT" && ulimit -n "$NOFILE" && exec taskset -c 0 "$gw_path" run --config rampart.toml 2>gateway.log) &
pids+=($!)
wait_port $GW
ulimit -n $((HOLD + 1024))
# REOPEN=1: each attacker worker opens a new connection whenever the gateway closes one (a
# handshake flood as well); REOPEN=0 (default): each opens one and holds it.
once=(-n "$HOLD"); [ "${REOPEN:-0}" = 1 ] && once=()
timeout $((${DURATION%s} + 60)) taskset -c 1 "$BIN" bench https-hold --url "https://localhost:$GW/" -c "$HOLD" -d "$DURATION" \
  "${once[@]}" --json > "$OUT/hold.json" &
hold=$!
sleep 3 # let the hold build up
ok=0; tries=0
secs=${DURATION%s}
end=$((SECONDS + secs - 3))
# The probe runs while the attacker holds its connections (DURATION), not after.
while kill -0 $hold 2>/dev/null && [ $SECONDS -lt $end ]; do
  code=$(curl -sk -o /dev/null -w '%{http_code}' --max-time 2 "https://localhost:$GW/" || true)
  tries=$((tries + 1)); [ "$code" = 200 ] && ok=$((ok + 1))
  sleep 0.5
done
wait $hold || true
python3 - "$OUT/hold.json" "$ok" "$tries" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().strip().splitlines()
ok, tries = int(sys.argv[2]), int(sys.argv[3])
print(f"probe: {ok}/{tries} requests served during the hold ({100 * ok / max(tries, 1):.0f}%)")
if not lines:
    sys.exit("attacker: no summary (stopped by its time limit)")
r = json.loads(lines[-1])
print(f"attacker: {r['ok']} connections held and closed by the gateway, {r['errors']} refused or failed; "
      f"held p50 {r['latency_ms_p50'] / 1000:.1f} s, p99 {r['latency_ms_p99'] / 1000:.1f} s")
PY
grep -m1 "max_connections lowered" "$OUT/gateway.log" || true
curl -s "http://127.0.0.1:19921/metrics" | grep -E '^rampart_connections_(closed|rejected)_total' || true
