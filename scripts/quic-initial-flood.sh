#!/usr/bin/env bash
# Issue 32's memory goal: the gateway's resident memory under a flood of QUIC Initials (each a
# new client's first flight, from a new UDP port, never continued) with the default QUIC
# settings (retry = "when_busy", max_pending_handshakes = 1024). Gateway on CPU 0 with one
# worker, the flood (`rampart bench h3-initial-flood`) on CPU 1. Prints the RSS before, the peak
# during and the RSS after, sampled every 0.5 s, and what the gateway counted.
#   scripts/quic-initial-flood.sh                 # RATE=10000 DURATION=30s
#   RATE=2000 DURATION=10s scripts/quic-initial-flood.sh
#   QUIC_EXTRA='retry = "never"\nmax_pending_handshakes = 1000000' RATE=1300 DURATION=10s ...
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
RATE=${RATE:-10000}
DURATION=${DURATION:-30s}
OUT=${OUT:-target/quic-initial-flood}
UP=18180; GW=18543
# QUIC_EXTRA: settings added to [listeners.quic], e.g. the old defaults as an anchor:
#   QUIC_EXTRA='retry = "never"\nmax_pending_handshakes = 1000000'
# GATEWAY_BIN: the gateway under test (default $BIN, which also runs the flood).
bench_attack_setup $GW $UP 19911
[ -n "${QUIC_EXTRA:-}" ] && sed -i "s/^enabled = true$/enabled = true\n${QUIC_EXTRA//\//\\/}/" "$OUT/rampart.toml"
(cd "$OUT" && exec taskset -c 0 "$gw_path" run --config rampart.toml 2>gateway.log) &
gw=$!
pids+=($gw)
wait_port $GW
sleep 1
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$gw/status"; }
before=$(rss)
peak=$before
taskset -c 1 "$BIN" bench h3-initial-flood --url "https://localhost:$GW/" --rate "$RATE" \
  -c 64 -d "$DURATION" --json > "$OUT/flood.json" &
flood=$!
while kill -0 $flood 2>/dev/null; do
  now=$(rss); [ "$now" -gt "$peak" ] && peak=$now
  sleep 0.5
done
wait $flood || true
sleep 12 # past tls.handshake_timeout (10 s): the pending handshakes end
after=$(rss)
python3 - "$OUT/flood.json" "$before" "$peak" "$after" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
b, p, a = (int(x) / 1024 for x in sys.argv[2:5])
print(f"initials sent: {r['ok']} in {r['seconds']:.1f} s ({r['rate_per_sec']:.0f}/s), "
      f"errors {r['errors']}")
print(f"gateway RSS: before {b:.0f} MB, peak {p:.0f} MB, after {a:.0f} MB")
PY
curl -s "http://127.0.0.1:19911/metrics" | grep -E '^rampart_(quic_retries_total|quic_handshakes_pending|connections_rejected_total|tls_handshake_errors_total)' || true
