#!/usr/bin/env bash
# Handshake CPU with client certificates (issue 37): the same gateway binary with the listener
# asking for none and with `tls.client_auth = "required"` (client CA and CRL), alternating round
# by round; the client presents a P-256 certificate either way (it is only sent when asked).
# Full TLS 1.3 handshakes with ECDSA P-256 server certificates and one request each, gateway on
# CPU 0 with one worker, load generator and demo upstream on CPU 1, 16 connections.
#   scripts/bench-mtls.sh                        # ROUNDS (5), DURATION (4s), BIN
# Prints per round: server CPU µs per handshake and handshakes/s for each; then the medians and
# the median of the per-round ratios (mTLS ÷ none).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-4s}
bench_start target/bench-mtls
mkdir -p "$OUT/clients"
bench_site_certs "$OUT/certs"
[ -f "$OUT/clients/alice.pem" ] || (cd "$OUT/clients" && sh "$OLDPWD/crates/gateway/tests/data/client-certs.sh")
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/none.toml" batch $GW $UP
sed 's|^listen = "127.0.0.1:'$GW'"$|&\ntls.client_auth = "required"\ntls.client_ca = "clients/ca.pem"\ntls.client_crl = "clients/ca.crl"|' \
  "$OUT/none.toml" > "$OUT/mtls.toml"
grep -q client_auth "$OUT/mtls.toml" || { echo "mtls.toml: no client_auth line" >&2; exit 1; }
bench_upstream 1 $UP
printf 'round\tconfig\tserver_cpu_us_per_handshake\thandshakes_per_s\n' | tee "$OUT/rows.tsv"
for round in $(seq "$ROUNDS"); do
  order=(none mtls); ((round % 2)) || order=(mtls none)
  for cfg in "${order[@]}"; do
    bench_gateway_up "$cfg"
    taskset -c 1 "$BIN" bench https-handshake --url "https://localhost:$GW/bytes/100" -c 16 \
      -d "$DURATION" --sigalgs ecdsa_secp256r1_sha256 --server-pid $gw --json \
      --client-cert "$OUT/clients/alice.pem" --client-key "$OUT/clients/alice.key" | tail -1 |
      python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r["errors"] == 0, r
print("\t".join(sys.argv[1:3] + ["%.1f" % r["server_cpu_us_per_op"], "%.0f" % r["rate_per_sec"]]))' \
        "$round" "$cfg" | tee -a "$OUT/rows.tsv"
    kill $gw; wait $gw 2>/dev/null || true
  done
done
python3 - "$OUT/rows.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
by = {}
for r in rows:
    by.setdefault(r["round"], {})[r["config"]] = float(r["server_cpu_us_per_handshake"])
ratios = [v["mtls"] / v["none"] for v in by.values() if "mtls" in v and "none" in v]
for cfg in ("none", "mtls"):
    cpu = [float(r["server_cpu_us_per_handshake"]) for r in rows if r["config"] == cfg]
    rate = [float(r["handshakes_per_s"]) for r in rows if r["config"] == cfg]
    print(f"{cfg}: median {statistics.median(cpu):.1f} us/handshake, {statistics.median(rate):.0f} handshakes/s")
print(f"mtls / none, median of per-round ratios: {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")
PY
