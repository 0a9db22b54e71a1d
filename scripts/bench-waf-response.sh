#!/usr/bin/env bash
# What reading response bodies costs the WAF (waf.response_body, phase 4): gateway CPU per
# request and p99 for one page, the route's WAF (OWASP CRS, paranoia 1, block) with
# `response_headers` (phase 3 only) against `response_body` (phases 3 and 4, the page held
# and inspected), rounds alternating. The page is the demo upstream's /text/SIZE (text/plain,
# a type read by default; no content coding). Keep-alive HTTP/1.1 over TLS, server on CPU 0
# (one worker, one WAF thread), load generator and upstream on CPU 1.
#   scripts/bench-waf-response.sh        # ROUNDS (3), DURATION (5s), CONC (16), SIZE (16384), BIN
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
CONC=${CONC:-16}
SIZE=${SIZE:-16384}
bench_start target/bench-waf-response
bench_site_certs "$OUT/certs"
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/base.toml" batch $GW $UP
sed -i 's/^\[listeners.quic\]$//; s/^enabled = true$//' "$OUT/base.toml"
for mode in headers body; do
  { cat "$OUT/base.toml"; printf '[waf]\nthreads = 1\nlog = "off"\n'; } |
    sed "s|^cluster = \"up\"\$|cluster = \"up\"\nwaf = { mode = \"block\", response_$mode = true }|" > "$OUT/$mode.toml"
  grep -q "response_$mode = true" "$OUT/$mode.toml" || { echo "$mode.toml: no waf line" >&2; exit 1; }
done
bench_upstream 1 $UP
printf 'round\tmode\tserver_cpu_us_per_request\trequests_per_s\tp99_ms\terrors\n' | tee "$OUT/rows.tsv"
for round in $(seq "$ROUNDS"); do
  order=(headers body); ((round % 2)) || order=(body headers)
  for mode in "${order[@]}"; do
    bench_gateway_up "$mode"
    taskset -c 1 "$BIN" bench https-requests --url "https://localhost:$GW/text/$SIZE" --http h1 \
      -c "$CONC" -d "$DURATION" --server-pid "$gw" --json | tail -1 |
      bench_tsv_row "$round" "$mode" | tee -a "$OUT/rows.tsv"
    kill $gw; wait $gw 2>/dev/null || true
  done
done
python3 - "$OUT/rows.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {}
for m in ("headers", "body"):
    got = [r for r in rows if r["mode"] == m]
    med[m] = statistics.median(float(r["server_cpu_us_per_request"]) for r in got)
    print(f"response_{m}: median {med[m]:.1f} us CPU/request, "
          f"{statistics.median(float(r['requests_per_s']) for r in got):.0f} requests/s, "
          f"p99 {statistics.median(float(r['p99_ms']) for r in got):.2f} ms, errors {sum(int(r['errors']) for r in got)}")
ratios = []
for rnd in sorted({r["round"] for r in rows}):
    by = {r["mode"]: float(r["server_cpu_us_per_request"]) for r in rows if r["round"] == rnd}
    ratios.append(by["body"] / by["headers"])
print(f"phase 4's own cost: {med['body'] - med['headers']:.1f} us a request; body / headers: "
      f"{statistics.median(ratios):.3f} (per-round {min(ratios):.3f}-{max(ratios):.3f})")
PY
