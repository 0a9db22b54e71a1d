#!/usr/bin/env bash
# Issue 32's overload scenario: a gateway with `[server.overload] memory_limit_bytes = LIMIT_MB`
# under READERS slow readers of large responses (each reads 10 KB/s; scripts/slow_readers.py)
# plus a TLS handshake flood (`rampart bench https-handshake`, 32 connections) for DURATION.
# Samples the gateway's RSS every 0.5 s and probes it with curl every 0.5 s; prints the peak
# against the limit, the probe's success rate and the overload actions that turned on.
#   scripts/overload-pressure.sh                        # LIMIT_MB=128 READERS=1500 DURATION=30s
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
LIMIT_MB=${LIMIT_MB:-128}
READERS=${READERS:-1500}
DURATION=${DURATION:-30s}
OUT=${OUT:-target/overload-pressure}
UP=18380; GW=18743
bench_attack_setup $GW $UP 19931
sed -i "s/^access_log = \"off\"$/access_log = \"off\"\noverload = { memory_limit_bytes = $((LIMIT_MB << 20)) }/" "$OUT/rampart.toml"
(cd "$OUT" && exec taskset -c 0 "$gw_path" run --config rampart.toml 2>gateway.log) &
gw=$!
pids+=($gw)
wait_port $GW
secs=${DURATION%s}
ulimit -n $((READERS + 1024))
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$gw/status"; }
before=$(rss); peak=$before
timeout $((secs + 60)) taskset -c 1 python3 scripts/slow_readers.py $GW "$READERS" 10000 "$secs" > "$OUT/readers.txt" &
readers=$!
timeout $((secs + 30)) taskset -c 1 "$BIN" bench https-handshake --url "https://localhost:$GW/bytes/100" \
  -c 32 -d "$DURATION" --json > "$OUT/handshakes.json" 2>/dev/null &
flood=$!
ok=0; tries=0; end=$((SECONDS + secs))
while [ $SECONDS -lt $end ]; do
  now=$(rss); [ "$now" -gt "$peak" ] && peak=$now
  code=$(curl -sk -o /dev/null -w '%{http_code}' --max-time 2 "https://localhost:$GW/" || true)
  tries=$((tries + 1)); [ "$code" = 200 ] && ok=$((ok + 1))
  sleep 0.5
done
wait $flood || true
wait $readers || true
cat "$OUT/readers.txt" || true
echo "gateway RSS: before $((before / 1024)) MB, peak $((peak / 1024)) MB, limit $LIMIT_MB MB"
echo "probe: $ok/$tries requests served"
curl -s "http://127.0.0.1:19931/metrics" | grep -E '^rampart_(overload_actions_total|connections_rejected_total\{listener="https"\}|connections_closed_total)' || true
