#!/usr/bin/env bash
# The foundation benchmark: rampart (one run per key engine) vs Debian nginx, in one run.
# Gateway/nginx pinned to CPU 0; load generator and upstream pinned to CPU 1. Each load run is
# bounded by DURATION. Prints a markdown table and leaves raw JSON in $OUT.
#
#   scripts/bench-foundation.sh            # DURATION=10s CONC=32 by default
#   ENGINES="inline batch" SUITE=handshakes scripts/bench-foundation.sh   # the batch-engine run
#   ENGINES=inline SUITE=bulk DURATION=6s scripts/bench-foundation.sh     # HTTPS bulk CPU per GB
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
DURATION=${DURATION:-10s}
CONC=${CONC:-32}
ENGINES=${ENGINES:-inline threads}
SUITE=${SUITE:-all}   # all, handshakes, or bulk
# Extra nginx proxy directives, e.g. larger buffers for the bulk row:
#   NGINX_TUNE="proxy_buffers 16 64k; proxy_buffer_size 64k; proxy_busy_buffers_size 128k;"
NGINX_TUNE=${NGINX_TUNE:-}
OUT=${OUT:-target/bench-foundation}
BIN=./target/release/rampart
[ -x "$BIN" ] || cargo build --release -p rampart
command -v nginx >/dev/null || { echo "nginx not installed (WITH_BENCH_TOOLS=1 scripts/install-deps.sh)"; exit 1; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
CERTS="$OUT/certs"
bench_site_certs "$CERTS"

UP_PORT=18080; GW_PORT=18443; NGX_PORT=18444

bench_upstream 1 $UP_PORT

rampart_config() { # $1 = engine
  cat > "$OUT/rampart-$1.toml" <<CFG
[server]
worker_threads = 1
access_log = "off"
[admin]
listen = "127.0.0.1:19901"
[key_engine]
engines = ["$1"]
threads = 1
[[listeners]]
name = "https"
listen = "127.0.0.1:$GW_PORT"
[[listeners.certificates]]
server_names = ["localhost"]
rsa = { cert = "$CERTS/rsa.crt", key = "$CERTS/rsa.key" }
ecdsa = { cert = "$CERTS/ecdsa.crt", key = "$CERTS/ecdsa.key" }
[[routes]]
cluster = "up"
[[clusters]]
name = "up"
endpoints = ["127.0.0.1:$UP_PORT"]
CFG
}

{ bench_nginx_head; cat <<CFG
  upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$NGX_PORT ssl http2;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate $CERTS/rsa.crt;
    ssl_certificate_key $CERTS/rsa.key;
    ssl_certificate $CERTS/ecdsa.crt;
    ssl_certificate_key $CERTS/ecdsa.key;
    ssl_session_tickets on;
    # Large responses stay in memory (no spooling to temp files), as a bulk proxy is tuned.
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_max_temp_file_size 0; $NGINX_TUNE }
  }
}
CFG
} > "$OUT/nginx.conf"


bench() { # $1=label $2=pid $3=port, rest = bench args
  local label=$1 pid=$2 port=$3; shift 3
  taskset -c 1 "$BIN" bench "$@" --url "https://localhost:$port/bytes/100" --concurrency "$CONC" \
    --duration "$DURATION" --server-pid "$pid" --json > "$OUT/$label.json"
  echo "$label: $(cat "$OUT/$label.json")" >&2
}

# Bulk: two connections downloading 100 MB objects through the proxy, server CPU s per GB.
bench_bulk() { # $1=label $2=pid $3=port
  taskset -c 1 "$BIN" bench https-download --url "https://localhost:$3/bytes/100000000" -c 2 \
    --duration "$DURATION" --server-pid "$2" --json > "$OUT/$1.json"
  echo "$1: $(cut -c1-200 "$OUT/$1.json")" >&2
}

run_suite() { # $1=server label $2=pid $3=port
  if [ "$SUITE" = bulk ]; then bench_bulk "$1-bulk" "$2" "$3"; return; fi
  bench "$1-rsa-handshake" "$2" "$3" https-handshake --sigalgs rsa_pss_rsae_sha256
  bench "$1-ecdsa-handshake" "$2" "$3" https-handshake --sigalgs ecdsa_secp256r1_sha256
  [ "$SUITE" = handshakes ] && return
  bench "$1-rsa-resumed" "$2" "$3" https-handshake --resume --sigalgs rsa_pss_rsae_sha256
  bench "$1-requests-h1" "$2" "$3" https-requests --http h1
  bench "$1-requests-h2" "$2" "$3" https-requests --http h2
  bench_bulk "$1-bulk" "$2" "$3"
}

for engine in $ENGINES; do
  rampart_config $engine
  taskset -c 0 "$BIN" run --config "$OUT/rampart-$engine.toml" 2>"$OUT/rampart-$engine.log" &
  pid=$!; pids+=($pid)
  wait_port $GW_PORT
  run_suite "rampart-$engine" $pid $GW_PORT
  kill $pid; wait $pid 2>/dev/null || true
done

taskset -c 0 nginx -c "$OUT/nginx.conf" -p "$OUT" 2>"$OUT/nginx-stderr.log" &
npid=$!; pids+=($npid)
wait_port $NGX_PORT
# Measure the worker process (the master does no request work).
sleep 0.3
wpid=$(pgrep -P $npid | head -1)
run_suite nginx "$wpid" $NGX_PORT

python3 - "$OUT" "$SUITE" $ENGINES <<'PY'
import json, sys, os
out, suite, engines = sys.argv[1], sys.argv[2], sys.argv[3:]
# (title, JSON key, figure, its format, rate, its format): per operation, then the bulk row per GB.
op = ("server_cpu_us_per_op", "{:.1f}", "rate_per_sec", "{:.0f}")
per_gb = ("server_cpu_seconds_per_gb", "{:.3f} s/GB", "gbit_per_sec", "{:.1f} Gbit/s")
rows = [("TLS 1.3 full handshake, RSA-2048", "rsa-handshake", *op),
        ("TLS 1.3 full handshake, ECDSA P-256", "ecdsa-handshake", *op),
        ("TLS 1.3 resumed (ticket), RSA cert", "rsa-resumed", *op),
        ("keep-alive proxied request, HTTP/1.1", "requests-h1", *op),
        ("keep-alive proxied request, HTTP/2", "requests-h2", *op),
        ("bulk download, 100 MB objects, 2 connections (CPU per GB, not per op)", "bulk", *per_gb)]
if suite == "handshakes":
    rows = rows[:2]
elif suite == "bulk":
    rows = rows[-1:]
servers = [f"rampart-{e}" for e in engines] + ["nginx"]
print("| operation | " + " | ".join(f"{s} ops/s | {s} CPU µs/op" for s in servers) + " | " + " | ".join(f"{e}/nginx CPU" for e in engines) + " |")
print("|---|" + "---|---|" * len(servers) + "---|" * len(engines))
for title, key, figure, figure_fmt, rate, rate_fmt in rows:
    cells, cpu = [], {}
    for s in servers:
        j = json.load(open(os.path.join(out, f"{s}-{key}.json")))
        cpu[s] = j[figure]
        err = f" ({j['errors']} err)" if j["errors"] else ""
        cells += [rate_fmt.format(j[rate]) + err, figure_fmt.format(cpu[s])]
    print(f"| {title} | " + " | ".join(cells) + " | " + " | ".join(f"{cpu['rampart-' + e]/cpu['nginx']:.2f}" for e in engines) + " |")
PY
