#!/usr/bin/env bash
# quiche's stream-only packet writer against its own seal, per binary, as shares of one run's
# samples: `rampart bench quic-send` under `perf record` (DWARF stacks), and for each run the
# samples of `send_stream_only` outside `encrypt_pkt` (the writer's own work: header, STREAM
# frame, recovery record, pacer, checks) divided by those inside it (the seal and header
# protection). A noisy machine moves `quic-send`'s ns per packet by ±15% between runs; it moves
# this ratio far less, because both parts run in the same second. Binaries alternate run by run.
#   scripts/quic-send-shares.sh /tmp/rampart-before ./target/release/rampart
#   RUNS=4 SECS=6 CPU=1 scripts/quic-send-shares.sh A B ...   # defaults: 2 runs, 6 s, CPU 1
# Also printed: ACK processing (`on_ack_received`) per seal sample. Needs `perf`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf not found (apt install linux-perf)" >&2; exit 1; }
RUNS=${RUNS:-2}; SECS=${SECS:-6}; CPU=${CPU:-1}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for run in $(seq "$RUNS"); do
  for bin in "$@"; do
    taskset -c "$CPU" perf record -q -e cpu-clock -F 2500 --call-graph dwarf,8192 -o "$tmp/p" \
      "$bin" bench quic-send -d "${SECS}s" >"$tmp/out" 2>&1
    perf script -i "$tmp/p" -F ip,sym 2>/dev/null | python3 -c '
import sys
run, label, summary = sys.argv[1], sys.argv[2], sys.argv[3]
samples, cur = [], []
for line in sys.stdin:
    line = line.strip()
    if not line:
        if cur: samples.append(cur); cur = []
        continue
    cur.append(line.partition(" ")[2])
if cur: samples.append(cur)
has = lambda x, key: any(key in f for f in x)
writer = [x for x in samples if has(x, "send_stream_only")]
seal = [x for x in writer if has(x, "encrypt_pkt")]
own = len(writer) - len(seal)
acks = sum(1 for x in samples if has(x, "on_ack_received"))
if not seal:
    sys.exit(f"{label}: no seal samples (is this a rampart binary with symbols?)")
print(f"run {run}  {label:<40} writer ÷ seal {own / len(seal):.3f}  ACKs ÷ seal {acks / len(seal):.3f}"
      f"  ({len(seal)} seal samples; {summary})")
' "$run" "$bin" "$(tail -1 "$tmp/out" | sed 's/^ *//')"
  done
done
