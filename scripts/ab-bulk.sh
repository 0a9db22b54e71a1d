#!/usr/bin/env bash
# A/B of the gateway's bulk-transfer CPU per GB, variants alternating round by round so that the
# machine's drift falls on every variant alike. A variant is a gateway binary (a path),
# environment settings for ./target/release/rampart (NAME=VALUE, several joined with commas), or
# settings added to the listener's [listeners.quic] table (quic:KEY=VALUE, several joined with
# semicolons), or arguments for the load generator (client:ARGS, space-separated), or the kind
# of transfer (kind:h3, kind:https, kind:h3-upload, ...; default $KIND).
# Each round restarts the gateway for each variant: gateway on CPU 0, client and upstream on
# CPU 1, 100 MB objects, 2 connections, as in bench-h3.sh.
#   scripts/ab-bulk.sh /tmp/rampart-before ./target/release/rampart
#   scripts/ab-bulk.sh ./target/release/rampart RAMPART_QUIC_SEAL=boringssl
#   scripts/ab-bulk.sh quic:pmtu_discovery=true quic:pmtu_discovery=false
#   scripts/ab-bulk.sh client:--udp-recv-buffer=4194304 client:--udp-recv-buffer=0
#   ROUNDS=5 KIND=https DURATION=6s scripts/ab-bulk.sh A B ...    # defaults: 3, h3, 6s
#   KIND=h3-upload scripts/ab-bulk.sh A B     # uploads (h3-upload, https-upload) instead of downloads
#   CLIENT_ARGS="--ack-every 10" scripts/ab-bulk.sh A B     # load-generator arguments for every variant
#   scripts/ab-bulk.sh kind:h3 kind:https     # HTTP/3 against HTTPS, alternating
# After the per-variant table, each earlier-listed variant ÷ each later one, as the median of the
# rounds' ratios with a 90% bootstrap interval (kind:h3 kind:https: HTTP/3 ÷ HTTPS).
# GW_CPUS, LOAD_CPUS and UPSTREAM_CPUS (defaults 0, 1, 1) and CONNS (2) move the processes and
# set the connections; BIN picks the binary (default ./target/release/rampart, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
[ $# -ge 1 ] || { sed -n '2,21p' "$0" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
KIND=${KIND:-h3}
DURATION=${DURATION:-6s}
OUT=${OUT:-target/ab-bulk}
BIN=${BIN:-./target/release/rampart}
[ -x "$BIN" ] || cargo build --release -p rampart
mkdir -p "$OUT"
bench_site_certs "$OUT/certs"
UP=18080; GW=18443
bench_h3_gateway_config "$OUT/rampart.toml" batch $GW $UP
bench_upstream "${UPSTREAM_CPUS:-1}" $UP

: > "$OUT/results.tsv"
for round in $(seq "$ROUNDS"); do
  for variant in "$@"; do
    gw_bin=$BIN; gw_env=(); gw_cfg=$OUT/rampart.toml; kind=$KIND
    read -r -a client_args <<< "${CLIENT_ARGS:-}"
    if [[ $variant == client:* ]]; then
      read -r -a variant_args <<< "${variant#client:}"; client_args+=("${variant_args[@]}")
    elif [[ $variant == kind:* ]]; then
      kind=${variant#kind:}
    elif [[ $variant == quic:* ]]; then
      gw_cfg=$OUT/variant.toml
      awk -v add="${variant#quic:}" '{ print } /^enabled = true$/ { n = split(add, kv, ";"); for (i = 1; i <= n; i++) print kv[i] }' \
        "$OUT/rampart.toml" > "$gw_cfg"
    elif [[ $variant == *=* ]]; then IFS=, read -r -a gw_env <<< "$variant"; else gw_bin=$variant; fi
    bench_bulk_round "$gw_cfg" "$kind" "$OUT/run.json" ${client_args[@]+"${client_args[@]}"}
    python3 - "$OUT/run.json" "$round" "$variant" >> "$OUT/results.tsv" <<'PY'
import json, os, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
# HTTP/3: the share of the gateway's packets declared lost, and the UDP receive-buffer drops.
lost, drops, per_received = "-", "-", "-"
if os.path.exists(sys.argv[1] + ".losses"):
    sent, n_lost, n_drops, received = map(int, open(sys.argv[1] + ".losses").read().split())
    if sent:
        lost, drops = f"{100 * n_lost / sent:.2f}%", str(n_drops)
        per_received = f"{sent / max(received, 1):.0f}"
print("\t".join([sys.argv[2], sys.argv[3], f"{r['server_cpu_seconds_per_gb']:.3f}",
                 f"{r['server_user_cpu_seconds_per_gb']:.3f}",
                 f"{r['server_system_cpu_seconds_per_gb']:.3f}", f"{r['gbit_per_sec']:.2f}",
                 f"{r['server_cpu_seconds'] / r['seconds']:.2f}", lost, drops, per_received]))
PY
    tail -1 "$OUT/results.tsv" | awk -F'\t' '{printf "round %s  %-40s %s CPU s/GB (user %s, kernel %s), %s Gbit/s, gateway busy %s", $1, $2, $3, $4, $5, $6, $7; if ($8 != "-") printf ", lost %s, UDP drops %s, %s sent per received", $8, $9, $10; printf "\n"}'
  done
done

python3 - "$OUT/results.tsv" "$@" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print("\n| variant | CPU s/GB, each round | min–max | median, user + kernel | Gbit/s, min–max | gateway busy |\n|---|---|---|---|---|---|")
for v in sys.argv[2:]:
    mine = [r for r in rows if r[1] == v]
    cpu = [float(r[2]) for r in mine]
    gbit = [float(r[5]) for r in mine]
    busy = [float(r[6]) for r in mine]
    med = sorted(mine, key=lambda r: float(r[2]))[(len(mine) - 1) // 2]
    print(f"| `{v}` | {', '.join(f'{c:.2f}' for c in cpu)} | {min(cpu):.2f}–{max(cpu):.2f} "
          f"| {float(med[2]):.2f} = {float(med[3]):.2f} + {float(med[4]):.2f} "
          f"| {min(gbit):.1f}–{max(gbit):.1f} | {min(busy):.2f}–{max(busy):.2f} |")

# Each earlier-listed variant against each later one, round by round: the variants of a round
# ran one right after the other, so a round's ratio leaves out most of the machine's drift. The interval
# resamples the rounds (bootstrap, fixed seed): where it straddles a goal, more rounds decide.
sys.path.insert(0, "scripts")
from bench_stats import ratio_interval
def cpu_by_round(v):
    return {r[0]: float(r[2]) for r in rows if r[1] == v}
variants = sys.argv[2:]
pairs = [(a, b) for i, a in enumerate(variants) for b in variants[i + 1:]]
if pairs:
    print("\n| ratio of CPU s/GB | median of the rounds' ratios | 90% interval (bootstrap) | each round |\n|---|---|---|---|")
for a, b in pairs:
    ca, cb = cpu_by_round(a), cpu_by_round(b)
    ratios = [ca[k] / cb[k] for k in ca if k in cb and cb[k] > 0]
    if not ratios:
        continue
    med, lo, hi = ratio_interval(ratios)
    print(f"| `{a}` ÷ `{b}` | {med:.3f} | {lo:.3f}–{hi:.3f} "
          f"| {', '.join(f'{x:.2f}' for x in ratios)} |")
PY
