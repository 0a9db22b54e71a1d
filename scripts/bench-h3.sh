#!/usr/bin/env bash
# HTTP/3 vs HTTPS on the same gateway, one run: full-handshake CPU (RSA-2048, ECDSA P-256) and
# bulk-download CPU per GB; then Caddy (GOMAXPROCS=1, same certificates, static files) over
# HTTP/3 when a `caddy` binary is found. Servers pinned to CPU 0, load generator and upstream
# to CPU 1.
#   scripts/bench-h3.sh        # DURATION=8s ENGINE=batch ROUNDS=3 by default
# The bulk downloads, HTTP/3 then HTTPS, run ROUNDS times in turn; the tables give each one's
# median and the HTTP/3 ÷ HTTPS ratio of every round, since this machine drifts between runs.
#   go install github.com/caddyserver/caddy/v2/cmd/caddy@latest   # for the Caddy rows
# On a machine with more cores: GW_CPUS (servers, default 0), LOAD_CPUS and UPSTREAM_CPUS
# (default 1), LOAD_THREADS (the load generator's threads, default 1), CONNS (bulk connections,
# default 2); BIN picks the rampart binary (default ./target/release/rampart, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
DURATION=${DURATION:-8s}
ENGINE=${ENGINE:-batch}
ROUNDS=${ROUNDS:-3}
CADDY=${CADDY:-$(command -v caddy || echo "$HOME/go/bin/caddy")}
OUT=${OUT:-target/bench-h3}
BIN=${BIN:-./target/release/rampart}
[ -x "$BIN" ] || cargo build --release -p rampart
GW_CPUS=${GW_CPUS:-0}; LOAD_CPUS=${LOAD_CPUS:-1}; CONNS=${CONNS:-2}
LOAD=(taskset -c "$LOAD_CPUS" "$BIN" bench --threads "${LOAD_THREADS:-1}")
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
C="$OUT/certs"
bench_site_certs "$C"
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/rampart.toml" "$ENGINE" $GW $UP
bench_upstream "${UPSTREAM_CPUS:-1}" $UP
taskset -c "$GW_CPUS" "$BIN" run --config "$OUT/rampart.toml" 2>"$OUT/rampart.log" & gw=$!; pids+=($gw)
wait_port $GW; sleep 0.5
b() { local label=$1; shift; "${LOAD[@]}" "$@" -d "$DURATION" --server-pid $gw --json > "$OUT/$label.json"; echo "$label: $(cut -c1-200 "$OUT/$label.json")" >&2; }
U="https://localhost:$GW"
b h3-rsa h3-handshake --url "$U/bytes/100" -c 16 --sigalgs rsa_pss_rsae_sha256
b https-rsa https-handshake --url "$U/bytes/100" -c 16 --sigalgs rsa_pss_rsae_sha256
b h3-ecdsa h3-handshake --url "$U/bytes/100" -c 16 --sigalgs ecdsa_secp256r1_sha256
b https-ecdsa https-handshake --url "$U/bytes/100" -c 16 --sigalgs ecdsa_secp256r1_sha256
for i in $(seq 1 "$ROUNDS"); do
  b h3-download-$i h3-download --url "$U/bytes/100000000" -c "$CONNS"
  b https-download-$i https-download --url "$U/bytes/100000000" -c "$CONNS"
done
# The same download with the client reading datagram by datagram (no UDP_GRO): on loopback the
# kernel then splits each GSO send into datagrams on the server's CPU.
b h3-download-nogro h3-download --url "$U/bytes/100000000" -c "$CONNS" --no-gro
kill $gw; wait $gw 2>/dev/null || true

if [ -x "$CADDY" ]; then
  # The same objects as files: /bytes/100 and /bytes/100000000.
  mkdir -p "$OUT/www/bytes"
  head -c 100 /dev/zero > "$OUT/www/bytes/100"
  [ -f "$OUT/www/bytes/100000000" ] || head -c 100000000 /dev/urandom > "$OUT/www/bytes/100000000"
  CP=18445
  for kind in rsa ecdsa; do
    cat > "$OUT/Caddyfile-$kind" <<CFG
{
	admin off
	auto_https off
	servers {
		protocols h1 h2 h3
	}
}
https://localhost:$CP {
	tls $C/$kind.crt $C/$kind.key
	root * $OUT/www
	file_server
}
CFG
    GOMAXPROCS=1 taskset -c "$GW_CPUS" "$CADDY" run --config "$OUT/Caddyfile-$kind" --adapter caddyfile 2>"$OUT/caddy-$kind.log" & cp=$!; pids+=($cp)
    wait_port $CP; sleep 0.5
    sig=rsa_pss_rsae_sha256; [ $kind = ecdsa ] && sig=ecdsa_secp256r1_sha256
    "${LOAD[@]}" h3-handshake --url "https://localhost:$CP/bytes/100" -c 16 --sigalgs $sig -d "$DURATION" --server-pid $cp --json > "$OUT/caddy-h3-$kind.json"
    echo "caddy-h3-$kind: $(cut -c1-200 "$OUT/caddy-h3-$kind.json")" >&2
    if [ $kind = rsa ]; then
      "${LOAD[@]}" h3-download --url "https://localhost:$CP/bytes/100000000" -c "$CONNS" -d "$DURATION" --server-pid $cp --json > "$OUT/caddy-h3-download.json"
      echo "caddy-h3-download: $(cut -c1-200 "$OUT/caddy-h3-download.json")" >&2
    fi
    kill $cp; wait $cp 2>/dev/null || true
  done
fi
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, os
o, rounds = sys.argv[1], int(sys.argv[2])
L = lambda n: json.load(open(os.path.join(o, n + ".json")))
def median_run(name):  # the round whose CPU per GB is the median
    runs = sorted((L(f"{name}-{i}") for i in range(1, rounds + 1)), key=lambda d: d[GB])
    return runs[(len(runs) - 1) // 2]
US, GB = "server_cpu_us_per_op", "server_cpu_seconds_per_gb"
def hs(d, err=True):  # handshake cell: CPU µs (rate, errors)
    return f"{d[US]:.1f} ({d['rate_per_sec']:.0f}/s" + (f", {d['errors']} err)" if err else ")")
def bulk(d):  # bulk cell: CPU s/GB (throughput)
    return f"{d[GB]:.2f} ({d['gbit_per_sec']:.2f} Gbit/s)"
HANDSHAKES = (("rsa", "full handshake, RSA-2048: server CPU µs"), ("ecdsa", "full handshake, ECDSA P-256: server CPU µs"))
print("| measurement | HTTP/3 | HTTPS (TLS 1.3 / TCP) | HTTP/3 ÷ HTTPS |")
print("|---|---|---|---|")
for k, t in HANDSHAKES:
    h, s = L("h3-" + k), L("https-" + k)
    print(f"| {t} | {hs(h)} | {hs(s)} | {h[US]/s[US]:.2f} |")
h, s = median_run("h3-download"), median_run("https-download")
print(f"| bulk download 100 MB objects, median of {rounds}: server CPU s per GB | {bulk(h)} | {bulk(s)} | {h[GB]/s[GB]:.2f} |")
each = lambda name: [L(f"{name}-{i}")[GB] for i in range(1, rounds + 1)]
hs_, ss_ = each("h3-download"), each("https-download")
fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
print(f"| the same, each round in turn | {fmt(hs_)} | {fmt(ss_)} | {fmt(a / b for a, b in zip(hs_, ss_))} |")
sys.path.insert(0, "scripts")
from bench_stats import ratio_interval
med, lo, hi = ratio_interval([a / b for a, b in zip(hs_, ss_)])
print(f"| the rounds' ratios: median and 90% bootstrap interval | | | {med:.2f} ({lo:.2f}–{hi:.2f}) |")
# How busy the gateway was: HTTPS's CPU per GB follows this from run to run at the same
# throughput (other processes' kernel work landing on the gateway's CPU, and a client that
# keeps up acknowledging more often), so it says which state a round ran in.
busy = lambda name: [d["server_cpu_seconds"] / d["seconds"] for d in (L(f"{name}-{i}") for i in range(1, rounds + 1))]
print(f"| the same rounds: the gateway's CPU busy (CPU seconds ÷ seconds) | {fmt(busy('h3-download'))} | {fmt(busy('https-download'))} | |")
UG, KG = "server_user_cpu_seconds_per_gb", "server_system_cpu_seconds_per_gb"
split = lambda d: f"user {d[UG]:.2f} + kernel {d[KG]:.2f}"
print(f"| the median round's CPU s per GB split: user space + kernel | {split(h)} | {split(s)} | user {h[UG]/s[UG]:.2f}, kernel {h[KG]/s[KG]:.2f} |")
n = L("h3-download-nogro")
print(f"| the same, client without UDP_GRO (one run) | {bulk(n)} | | {n[GB]/s[GB]:.2f} |")
if os.path.exists(os.path.join(o, "caddy-h3-rsa.json")):
    print()
    print("| HTTP/3 measurement | rampart | Caddy (GOMAXPROCS=1) | rampart ÷ Caddy |")
    print("|---|---|---|---|")
    for k, t in HANDSHAKES:
        r, c = L("h3-" + k), L("caddy-h3-" + k)
        print(f"| {t} | {hs(r, err=False)} | {hs(c)} | {r[US]/c[US]:.2f} |")
    r, c = median_run("h3-download"), L("caddy-h3-download")
    print(f"| bulk download 100 MB: server CPU s per GB (rampart proxies from an upstream; Caddy serves a file) | {bulk(r)} | {bulk(c)} | {r[GB]/c[GB]:.2f} |")
PY
