# Shared by the bench-*.sh scripts (sourced, not run).

# RSA-2048 and ECDSA P-256 certificates for localhost in $1 (rsa.crt/.key, ecdsa.crt/.key).
bench_site_certs() {
  local dir=$1
  mkdir -p "$dir"
  [ -f "$dir/rsa.crt" ] && return 0
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/rsa.key" -out "$dir/rsa.crt" -days 30 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost 2>/dev/null
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/ecdsa.key" \
    -out "$dir/ecdsa.crt" -days 30 -subj /CN=localhost -addext subjectAltName=DNS:localhost 2>/dev/null
}

# Processes to stop on exit: append their pids to `pids`.
pids=()
# One TSV row from a `rampart bench ... --server-pid --json` summary on stdin: the arguments (the
# round and the variant's name), then server CPU µs per operation, operations per second, p99
# (ms) and errors.
bench_tsv_row() {
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("\t".join(sys.argv[1:] + ["%.1f" % r["server_cpu_us_per_op"], "%.0f" % r["rate_per_sec"],
      "%.2f" % r["latency_ms_p99"], str(r["errors"])]))' "$@"
}
bench_cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap bench_cleanup EXIT

# Waits (up to 10 s) until a TCP port on 127.0.0.1 accepts connections.
wait_port() {
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "port $1 never opened" >&2; exit 1
}

# Starts the gateway ($BIN) on CPU 0 with $OUT/$1.toml, its stderr in $OUT/$1.log, its pid in
# $gw, and waits until its port $GW accepts connections.
bench_gateway_up() {
  (cd "$OUT" && exec taskset -c 0 "$BIN" run --config "$1.toml" 2>"$1.log") &
  gw=$!
  wait_port "$GW"
}

# One-worker gateway config for the HTTP/3-and-HTTPS benchmarks, written to $1: key engine $2,
# TLS and QUIC on 127.0.0.1:$3 (certificates in certs/ beside $1, from bench_site_certs),
# everything routed to an upstream on 127.0.0.1:$4.
bench_h3_gateway_config() {
  cat > "$1" <<CFG
[server]
worker_threads = 1
access_log = "off"
[admin]
listen = "127.0.0.1:19901"
[key_engine]
engines = ["$2"]
[[listeners]]
name = "https"
listen = "127.0.0.1:$3"
[listeners.quic]
enabled = true
[[listeners.certificates]]
server_names = ["localhost"]
rsa = { cert = "certs/rsa.crt", key = "certs/rsa.key" }
ecdsa = { cert = "certs/ecdsa.crt", key = "certs/ecdsa.key" }
[[routes]]
cluster = "up"
[[clusters]]
name = "up"
endpoints = ["127.0.0.1:$4"]
CFG
}

# Starts the demo upstream ($BIN upstream) on 127.0.0.1:$2, pinned to CPU $1, and waits for it.
# It sends with the kernel TCP congestion control UPSTREAM_TCP_CC, cubic (Linux's default) unless
# set; set it empty for the kernel's default. Pinned because the figures depend on it: on
# loopback without an fq qdisc a BBR sender paces with per-socket timers, which fire on the CPU
# that processed the ACK arming them, often the gateway's (docs/benchmarks-history.md, 2026-11-25).
bench_upstream() {
  local cc=${UPSTREAM_TCP_CC-cubic} log=${OUT:-/tmp}/upstream.log
  taskset -c "$1" "$BIN" upstream --listen 127.0.0.1:"$2" ${cc:+--tcp-congestion "$cc"} 2>"$log" &
  pids+=($!)
  (wait_port "$2") || { echo "the demo upstream's log:" >&2; cat "$log" >&2; exit 1; }
}

# The start of an nginx config as the benchmarks run nginx (one worker in the foreground, its
# pid and error log in $OUT, keep-alive without a request limit, no access log), up to and
# with `http {`; what follows is the caller's. $1: lines before it (a load_module).
bench_nginx_head() {
  cat <<CFG
${1:-}
worker_processes 1;
daemon off;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
CFG
}

# The common start of a benchmark: BIN (default target/release/rampart, built if missing) made
# absolute, and OUT (default $1) created and made absolute, so both survive a `cd`.
bench_start() {
  OUT=${OUT:-$1}
  BIN=${BIN:-./target/release/rampart}
  [ -x "$BIN" ] || cargo build --release -p rampart
  BIN=$(realpath "$BIN")
  mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
}

# The common start of the scripts that watch the gateway with perf during bulk downloads
# (profile-bulk.sh, counters-bulk.sh): DURATION (7s), PROFILE_S (3), BIN and PERF defaulted, the
# binary built if missing, OUT (default $1) created and made absolute, the certificates, the
# gateway config ($OUT/rampart.toml on 127.0.0.1:$GW) and the upstream started, CLIENT_ARGS read
# into the array client_args.
bench_perf_setup() {
  DURATION=${DURATION:-7s}
  PROFILE_S=${PROFILE_S:-3}
  PERF=${PERF:-perf}
  command -v "$PERF" >/dev/null || { echo "perf not found (apt install linux-perf)" >&2; exit 1; }
  bench_start "$1"
  bench_site_certs "$OUT/certs"
  UP=18080; GW=18443
  bench_h3_gateway_config "$OUT/rampart.toml" batch $GW $UP
  bench_upstream "${UPSTREAM_CPUS:-1}" $UP
  read -r -a client_args <<< "${CLIENT_ARGS:-}"
}

# One bulk-download round against a gateway on 127.0.0.1:$GW:
#   bench_bulk_round CONFIG KIND JSON [CLIENT_ARG...]
# starts the gateway (binary $gw_bin, default $BIN; environment from the array gw_env; stderr to
# $gw_log, default $OUT/gateway.log) with CONFIG on CPU 0, then the load generator on CPU 1
# (GW_CPUS and LOAD_CPUS move them, CONNS sets the connections, default 2):
# KIND (h3 or https) downloads of 100 MB objects over $CONNS connections for $DURATION, the gateway's
# CPU measured, JSON to JSON. KIND h3-upload or https-upload POSTs 100 MB bodies to the demo
# upstream's /discard instead. If the caller defines `during_download`, it runs while the download
# does, with the gateway's pid in $gw. The gateway is stopped when the download ends.
bench_bulk_round() {
  local cfg=$1 kind=$2 json=$3 load drops0
  shift 3
  drops0=$(udp_rcvbuf_errors); rm -f "$json.losses"
  env ${gw_env[@]+"${gw_env[@]}"} taskset -c "${GW_CPUS:-0}" "${gw_bin:-$BIN}" run --config "$cfg" \
    2>"${gw_log:-$OUT/gateway.log}" &
  gw=$!
  wait_port "$GW"; sleep 0.5
  local mode=$kind-download url="https://localhost:$GW/bytes/100000000"
  case $kind in *-upload) mode=$kind; url="https://localhost:$GW/discard" ;; esac
  taskset -c "${LOAD_CPUS:-1}" "$BIN" bench "$mode" --url "$url" -c "${CONNS:-2}" \
    -d "$DURATION" --server-pid "$gw" --json "$@" > "$json" &
  load=$!
  if declare -F during_download >/dev/null; then during_download; fi
  wait "$load"
  sleep 0.3  # the client's connections close, and the gateway counts their packets then
  bench_quic_losses "$json.losses" "$drops0"
  kill "$gw"; wait "$gw" 2>/dev/null || true
}

# UDP datagrams the kernel has dropped for a full receive buffer since boot, all sockets
# (/proc/net/snmp RcvbufErrors).
udp_rcvbuf_errors() {
  awk '/^Udp:/ { if (!n) { for (i = 1; i <= NF; i++) if ($i == "RcvbufErrors") c = i; n = 1 } else print $c }' /proc/net/snmp
}

# Writes "SENT LOST DROPS RECEIVED" to $1: the QUIC packets the gateway sent and declared lost
# on the connections closed so far (its admin endpoint, 127.0.0.1:19901), the UDP datagrams
# dropped for a full receive buffer since udp_rcvbuf_errors gave $2 (on loopback: the client's
# drops), and the QUIC packets the gateway received (in a download, mostly the client's ACKs).
# Nothing is written where the admin endpoint does not answer.
bench_quic_losses() {
  python3 - "$1" "$2" "$(udp_rcvbuf_errors)" <<'PY' || true
import re, sys, urllib.request
try:
    text = urllib.request.urlopen("http://127.0.0.1:19901/metrics", timeout=2).read().decode()
except OSError:
    sys.exit(0)
total = {}
for m in re.finditer(r'^rampart_quic_packets_total\{[^}]*kind="(\w+)"[^}]*\} (\S+)$', text, re.M):
    total[m[1]] = total.get(m[1], 0) + float(m[2])
with open(sys.argv[1], "w") as f:
    print(int(total.get("sent", 0)), int(total.get("lost", 0)), int(sys.argv[3]) - int(sys.argv[2]),
          int(total.get("received", 0)), file=f)
PY
}

# The common start of the attack scripts (quic-initial-flood.sh, idle-connection-hold.sh):
# BIN built if missing, OUT created, certificates, a one-worker gateway config on $1 (TLS and
# QUIC) with its admin listener on 127.0.0.1:$3, and the demo upstream on $2 pinned to CPU 1.
# Sets `pids` (cleaned up on exit) and `gw_path`, the absolute path of GATEWAY_BIN (default
# $BIN: an older build can be the anchor while $BIN runs the attack).
bench_attack_setup() {
  BIN=${BIN:-./target/release/rampart}
  [ -x "$BIN" ] || cargo build --release -p rampart
  mkdir -p "$OUT"
  pids=()
  trap bench_cleanup EXIT
  bench_site_certs "$OUT/certs"
  bench_h3_gateway_config "$OUT/rampart.toml" threads "$1" "$2"
  sed -i "s/^listen = \"127.0.0.1:19901\"/listen = \"127.0.0.1:$3\"/" "$OUT/rampart.toml"
  bench_upstream 1 "$2"
  GATEWAY_BIN=${GATEWAY_BIN:-$BIN}
  gw_path=$(cd "$(dirname "$GATEWAY_BIN")" && pwd)/$(basename "$GATEWAY_BIN")
}
