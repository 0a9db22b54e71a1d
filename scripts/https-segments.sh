#!/usr/bin/env bash
# HTTPS bulk rounds, and per round how the gateway's TCP sends to the client were cut: from
# `ss -ti` on the gateway's client-facing sockets over 3.5 s in the middle of each download,
# segments sent and received (the client's ACKs) per MB, beside the gateway's CPU per GB and how
# busy it was. Gateway on CPU 0, client and upstream on CPU 1, as in bench-h3.sh.
#   ROUNDS=8 scripts/https-segments.sh
#   CLIENT_ARGS="--http h2" scripts/https-segments.sh     # HTTP/2 downloads
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
OUT=${OUT:-target/https-segments}
ROUNDS=${ROUNDS:-6}
BIN=./target/release/rampart
[ -x "$BIN" ] || cargo build --release -p rampart
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
bench_site_certs "$OUT/certs"
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/rampart.toml" batch $GW $UP
bench_upstream 1 $UP
# segs_in segs_out bytes_acked, summed over the gateway's established client sockets
snap() {
  ss -tinH state established "( sport = :$GW )" | tr '\n' ' ' | python3 -c '
import re, sys
t = sys.stdin.read()
total = lambda key: sum(int(x) for x in re.findall(r"\b" + key + r":(\d+)", t))
print(total("segs_in"), total("segs_out"), total("bytes_acked"))'
}
read -r -a client_args <<< "${CLIENT_ARGS:-}"
DURATION=6s; gw_log=$OUT/rampart.log
during_download() { sleep 1.5; before=$(snap); sleep 3.5; after=$(snap); }
for r in $(seq 1 "$ROUNDS"); do
  bench_bulk_round "$OUT/rampart.toml" https "$OUT/round-$r.json" ${client_args[@]+"${client_args[@]}"}
  python3 - "$OUT/round-$r.json" "$before" "$after" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
a, b = (list(map(int, s.split())) for s in sys.argv[2:4])
mb = (b[2] - a[2]) / 1e6
print(f"busy {d['server_cpu_seconds'] / d['seconds']:.2f}  CPU s/GB {d['server_cpu_seconds_per_gb']:.3f}  "
      f"{d['gbit_per_sec']:.1f} Gbit/s  segments sent per MB {(b[1] - a[1]) / mb:.1f}  "
      f"received per MB {(b[0] - a[0]) / mb:.1f}")
PY
done
