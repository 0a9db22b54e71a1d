#!/usr/bin/env bash
# Remote-signing benchmark (keyless): key server vs in-process signing, and gateway CPU per
# RSA-2048 handshake with the remote engine vs the inline engine. Every load run is bounded.
#   scripts/bench-keyless.sh        # DURATION=8s by default
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
DURATION=${DURATION:-8s}
OUT=${OUT:-target/bench-keyless}
BIN=./target/release/rampart
[ -x "$BIN" ] || cargo build --release -p rampart
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
scripts/issue-keyless-pki.sh "$OUT/pki" >/dev/null
C="$OUT/certs"
bench_site_certs "$C"
KS=127.0.0.1:12407; UP=18080; GW=18443
REMOTE=(--ca "$OUT/pki/ca.crt" --client-cert "$OUT/pki/gateway.crt" --client-key "$OUT/pki/gateway.key" --keyserver $KS)
j() { python3 -c "import json,sys; d=json.load(open('$1')); print(d$2)"; }

cat > "$OUT/keyserver.toml" <<CFG
[keyserver]
listen = "$KS"
cert = "pki/keyserver.crt"
key = "pki/keyserver.key"
client_ca = "pki/ca.crt"
keys = ["certs/rsa.key", "certs/ecdsa.key"]
[admin]
listen = "127.0.0.1:19902"
[key_engine]
# On a key server the runtime's threads do nothing but sign: inline avoids a thread hop.
engines = ["inline"]
CFG

echo "## signing throughput on one core (concurrency 64) and latency at concurrency 1" >&2
taskset -c 0 "$BIN" bench sign-load --engine inline --key-file "$C/rsa.key" -c 64 -d "$DURATION" --json > "$OUT/inproc-c64.json"
taskset -c 0 "$BIN" bench sign-load --engine inline --key-file "$C/rsa.key" -c 1 -d "$DURATION" --json > "$OUT/inproc-c1.json"
taskset -c 0 "$BIN" keyserver --config "$OUT/keyserver.toml" 2>"$OUT/keyserver.log" & kspid=$!; pids+=($kspid)
wait_port 12407
taskset -c 1 "$BIN" bench sign-load --engine remote "${REMOTE[@]}" --connections 2 --key-file "$C/rsa.key" -c 64 -d "$DURATION" --server-pid $kspid --json > "$OUT/remote-c64.json"
taskset -c 1 "$BIN" bench sign-load --engine remote "${REMOTE[@]}" --key-file "$C/rsa.key" -c 1 -d "$DURATION" --json > "$OUT/remote-c1.json"
kill $kspid; wait $kspid 2>/dev/null || true

echo "## gateway CPU per RSA-2048 full handshake: inline vs remote" >&2
bench_upstream 1 $UP
taskset -c 1 "$BIN" keyserver --config "$OUT/keyserver.toml" 2>>"$OUT/keyserver.log" & pids+=($!)
wait_port 12407
for engine in inline remote; do
  if [ $engine = remote ]; then
    KE="engines = [\"remote\"]
[key_engine.remote]
servers = [\"$KS\"]
server_name = \"keyserver.internal\"
ca = \"pki/ca.crt\"
client_cert = \"pki/gateway.crt\"
client_key = \"pki/gateway.key\"
connections_per_server = 2"
    RSA='rsa = { cert = "certs/rsa.crt" }'
  else
    KE='engines = ["inline"]'
    RSA='rsa = { cert = "certs/rsa.crt", key = "certs/rsa.key" }'
  fi
  cat > "$OUT/gateway-$engine.toml" <<CFG
[server]
worker_threads = 1
access_log = "off"
[admin]
listen = "127.0.0.1:19901"
[key_engine]
$KE
[[listeners]]
name = "https"
listen = "127.0.0.1:$GW"
[[listeners.certificates]]
server_names = ["localhost"]
$RSA
[[routes]]
cluster = "up"
[[clusters]]
name = "up"
endpoints = ["127.0.0.1:$UP"]
CFG
  taskset -c 0 "$BIN" run --config "$OUT/gateway-$engine.toml" 2>"$OUT/gateway-$engine.log" & gpid=$!; pids+=($gpid)
  wait_port $GW; sleep 0.5
  taskset -c 1 "$BIN" bench https-handshake --url "https://localhost:$GW/bytes/100" -c 32 -d "$DURATION" --sigalgs rsa_pss_rsae_sha256 --server-pid $gpid --json > "$OUT/gateway-$engine.json"
  kill $gpid; wait $gpid 2>/dev/null || true
done

python3 - "$OUT" <<'PY'
import json, sys, os
o = sys.argv[1]
L = lambda n: json.load(open(os.path.join(o, n + ".json")))
ip64, rm64, ip1, rm1 = L("inproc-c64"), L("remote-c64"), L("inproc-c1"), L("remote-c1")
gi, gr = L("gateway-inline"), L("gateway-remote")
print("| measurement | in-process (inline, 1 core) | key server (inline, 1 core) | ratio / difference |")
print("|---|---|---|---|")
print(f"| RSA-2048 signs/s, concurrency 64 | {ip64['rate_per_sec']:.0f} | {rm64['rate_per_sec']:.0f} (key server CPU {rm64['server_cpu_seconds']:.2f} s of {rm64['seconds']:.1f} s) | {rm64['rate_per_sec']/ip64['rate_per_sec']:.2f}x |")
print(f"| sign latency p50, concurrency 1 | {ip1['latency_ms_p50']*1000:.0f} µs | {rm1['latency_ms_p50']*1000:.0f} µs | +{(rm1['latency_ms_p50']-ip1['latency_ms_p50'])*1000:.0f} µs |")
print(f"| sign latency p99, concurrency 1 | {ip1['latency_ms_p99']*1000:.0f} µs | {rm1['latency_ms_p99']*1000:.0f} µs | +{(rm1['latency_ms_p99']-ip1['latency_ms_p99'])*1000:.0f} µs |")
print()
print("| gateway engine | RSA-2048 TLS 1.3 handshakes/s | gateway CPU µs/handshake | errors |")
print("|---|---|---|---|")
for n, g in (("inline", gi), ("remote", gr)):
    print(f"| {n} | {g['rate_per_sec']:.0f} | {g['server_cpu_us_per_op']:.1f} | {g['errors']} |")
print(f"\nremote / inline gateway CPU per handshake: {gr['server_cpu_us_per_op']/gi['server_cpu_us_per_op']:.2f}")
PY
