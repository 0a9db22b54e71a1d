#!/usr/bin/env bash
# The WAF's cost (issue 37): request CPU and p99 through rampart with a route's WAF on (OWASP
# CRS, paranoia 1, block) against off, and through nginx with ModSecurity v3 and the same Core
# Rule Set (`rampart waf-rules` writes nginx's rules from rampart's route, so both run the same
# directives), against nginx without it; rounds alternate the four. The request set
# (scripts/data/waf-requests.jsonl: 8 ordinary requests, 6 attacks) says the status each must
# get, so a server with a different verdict shows errors. Keep-alive HTTP/1.1 over TLS, server
# on CPU 0 (rampart: one worker, one WAF thread), load generator and demo upstream on CPU 1.
# Last, whether inspection stalls other requests: one connection's requests to a route without
# the WAF, alone and while 16 connections keep the WAF busy (p50/p99), rampart and nginx.
#   scripts/bench-waf.sh                 # ROUNDS (3), DURATION (5s), CONC (16), BIN
# Needs nginx and libnginx-mod-http-modsecurity (WITH_BENCH_TOOLS=1 scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
CONC=${CONC:-16}
SET=$PWD/scripts/data/waf-requests.jsonl
MODULE=/usr/lib/nginx/modules/ngx_http_modsecurity_module.so
command -v nginx >/dev/null && [ -e $MODULE ] ||
  { echo "needs nginx and libnginx-mod-http-modsecurity (WITH_BENCH_TOOLS=1 scripts/install-deps.sh)" >&2; exit 1; }
bench_start target/bench-waf
rm -f "$OUT/probe.txt"
bench_site_certs "$OUT/certs"
UP=18080; GW=18443; NGX=18444
bench_h3_gateway_config "$OUT/off.toml" batch $GW $UP
sed -i 's/^\[listeners.quic\]$//; s/^enabled = true$//' "$OUT/off.toml"
{ cat "$OUT/off.toml"; printf '[waf]\nthreads = 1\nlog = "off"\n'; } |
  sed 's|^cluster = "up"$|name = "site"\ncluster = "up"\nwaf = { mode = "block", paranoia = 1, anomaly_threshold = 5 }\n[[routes]]\nname = "plain"\npath_prefix = "/plain"\ncluster = "up"|' > "$OUT/waf.toml"
grep -q 'waf = {' "$OUT/waf.toml" || { echo "waf.toml: no waf line" >&2; exit 1; }
"$BIN" waf-rules --config "$OUT/waf.toml" --route site > "$OUT/modsec.conf"
# Without the WAF the attacks reach the upstream: the same requests, any status taken.
sed 's/"expect": 403/"expect": 0/' "$SET" > "$OUT/any-status.jsonl"
nginx_config() { # $1: file, $2: the modsecurity lines
  { bench_nginx_head "load_module $MODULE;"; cat <<CFG
  client_body_buffer_size 128k;
  upstream up { server 127.0.0.1:$UP; keepalive 64; }
  server {
    listen 127.0.0.1:$NGX ssl;
    ssl_protocols TLSv1.3;
    ssl_certificate $OUT/certs/ecdsa.crt;
    ssl_certificate_key $OUT/certs/ecdsa.key;
    $2
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
    location /plain { modsecurity off; proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CFG
  } > "$1"
}
nginx_config "$OUT/nginx-off.conf" "modsecurity off;"
nginx_config "$OUT/nginx-waf.conf" "modsecurity on; modsecurity_rules_file $OUT/modsec.conf;"
bench_upstream 1 $UP
start_server() { # $1: config name; sets srv (the process to measure) and port
  case $1 in
    rampart-*)
      (cd "$OUT" && exec taskset -c 0 "$BIN" run --config "${1#rampart-}.toml" 2>"$1.log") &
      srv=$!; top=$srv; port=$GW ;;
    nginx-*)
      taskset -c 0 nginx -c "$OUT/$1.conf" -p "$OUT" 2>"$OUT/$1.log" &
      top=$!; port=$NGX ;;
  esac
  wait_port $port
  # nginx: the worker does the request work (its master none).
  if [ "${1%%-*}" = nginx ]; then sleep 0.5; srv=$(pgrep -P $top | head -1); fi
}
printf 'round\tserver\tserver_cpu_us_per_request\trequests_per_s\tp99_ms\terrors\n' | tee "$OUT/rows.tsv"
for round in $(seq "$ROUNDS"); do
  order=(rampart-off rampart-waf nginx-off nginx-waf)
  ((round % 2)) || order=(nginx-waf nginx-off rampart-waf rampart-off)
  for s in "${order[@]}"; do
    start_server "$s"
    set_file=$SET; [ "${s#*-}" = off ] && set_file=$OUT/any-status.jsonl
    taskset -c 1 "$BIN" bench https-requests --url "https://localhost:$port/" --http h1 -c "$CONC" \
      -d "$DURATION" --request-set "$set_file" --server-pid "$srv" --json | tail -1 |
      bench_tsv_row "$round" "$s" | tee -a "$OUT/rows.tsv"
    kill $top; wait $top 2>/dev/null || true
  done
done
# The probe: one connection to /plain (no WAF; the upstream answers 404), alone, then beside
# the WAF load.
echo '{"path": "/plain/probe", "expect": 404}' > "$OUT/probe.jsonl"
probe() {
  taskset -c 1 "$BIN" bench https-requests --url "https://localhost:$port/" --http h1 -c 1 \
    -d "$DURATION" --request-set "$OUT/probe.jsonl" --json | tail -1 |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); assert r["errors"] == 0, r; print("p50 %.2f ms, p99 %.2f ms, %d requests" % (r["latency_ms_p50"], r["latency_ms_p99"], r["ok"]))'
}
for s in rampart-waf nginx-waf; do
  start_server $s
  echo "$s, probe alone: $(probe)" | tee -a "$OUT/probe.txt"
  taskset -c 1 "$BIN" bench https-requests --url "https://localhost:$port/" --http h1 -c "$CONC" \
    -d "$DURATION" --request-set "$SET" --json > "$OUT/probe-load.json" &
  load=$!
  sleep 0.5
  echo "$s, probe beside the WAF load: $(probe)" | tee -a "$OUT/probe.txt"
  wait $load
  kill $top; wait $top 2>/dev/null || true
done
python3 - "$OUT/rows.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {}
for s in ("rampart-off", "rampart-waf", "nginx-off", "nginx-waf"):
    got = [r for r in rows if r["server"] == s]
    cpu = statistics.median(float(r["server_cpu_us_per_request"]) for r in got)
    med[s] = cpu
    print(f"{s}: median {cpu:.1f} us CPU/request, {statistics.median(float(r['requests_per_s']) for r in got):.0f} requests/s, "
          f"p99 {statistics.median(float(r['p99_ms']) for r in got):.2f} ms, errors {sum(int(r['errors']) for r in got)}")
rw, nw = med["rampart-waf"] - med["rampart-off"], med["nginx-waf"] - med["nginx-off"]
print(f"the WAF's own cost per request: rampart {rw:.1f} us, nginx {nw:.1f} us")
print(f"CPU per inspected request, rampart / nginx: {med['rampart-waf'] / med['nginx-waf']:.3f}")
PY
