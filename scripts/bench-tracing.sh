#!/usr/bin/env bash
# Request CPU with distributed tracing (issue 37): the same gateway without [tracing], and
# with it at 1% and 100% sampling (new traces: the load sends no traceparent), rounds
# alternating the three. Spans go over OTLP/HTTP to the demo upstream's /discard (a sink that
# reads each export and answers 200: the collector's own cost stays out of the figure).
# Keep-alive HTTP/1.1 over TLS, 16 connections, /bytes/100; gateway on CPU 0 with one worker,
# load generator and upstream on CPU 1.
#   scripts/bench-tracing.sh               # ROUNDS (3), DURATION (5s), BIN
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
bench_start target/bench-tracing
bench_site_certs "$OUT/certs"
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/off.toml" batch $GW $UP
sed -i 's/^\[listeners.quic\]$//; s/^enabled = true$//' "$OUT/off.toml"
for ratio in 0.01 1.0; do
  { cat "$OUT/off.toml"
    printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s/discard"\nsample_ratio = %s\n' $UP $ratio
  } > "$OUT/sampled-$ratio.toml"
done
bench_upstream 1 $UP
printf 'round\tconfig\tserver_cpu_us_per_request\trequests_per_s\tp99_ms\n' | tee "$OUT/rows.tsv"
for round in $(seq "$ROUNDS"); do
  order=(off sampled-0.01 sampled-1.0); ((round % 2)) || order=(sampled-1.0 sampled-0.01 off)
  for cfg in "${order[@]}"; do
    bench_gateway_up "$cfg"
    taskset -c 1 "$BIN" bench https-requests --url "https://localhost:$GW/bytes/100" --http h1 -c 16 \
      -d "$DURATION" --server-pid $gw --json | tail -1 |
      python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r["errors"] == 0, r
print("\t".join(sys.argv[1:3] + ["%.2f" % r["server_cpu_us_per_op"], "%.0f" % r["rate_per_sec"], "%.2f" % r["latency_ms_p99"]]))' \
        "$round" "$cfg" | tee -a "$OUT/rows.tsv"
    if [ "$cfg" != off ]; then
      python3 -c 'import urllib.request as u; t=u.urlopen("http://127.0.0.1:19901/metrics").read().decode(); print("  " + " ".join(l for l in t.splitlines() if l.startswith("rampart_tracing_spans")))' || true
    fi
    kill $gw; wait $gw 2>/dev/null || true
  done
done
python3 - "$OUT/rows.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {c: statistics.median(float(r["server_cpu_us_per_request"]) for r in rows if r["config"] == c)
       for c in ("off", "sampled-0.01", "sampled-1.0")}
for c, v in med.items():
    p99 = statistics.median(float(r["p99_ms"]) for r in rows if r["config"] == c)
    print(f"{c}: median {v:.2f} us CPU/request, p99 {p99:.2f} ms" + ("" if c == "off" else f", {v / med['off']:.3f}x off"))
PY
