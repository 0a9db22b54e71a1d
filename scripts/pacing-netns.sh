#!/usr/bin/env bash
# HTTP/3 pacing through a bottleneck: the gateway and the client in two network namespaces this
# script creates (and removes), joined by a veth pair whose gateway end sends through a token
# bucket (tbf: RATE, a queue of LIMIT bytes), so that packets cross a slow link with a shallow
# buffer instead of loopback.
#
#   gateway (rp-gw) ── tbf RATE, LIMIT bytes of queue ──> client (rp-cl)
#
# Each round runs one bulk HTTP/3 download per variant (pacing on, pacing off), restarting the
# gateway, and prints the goodput, the gateway's sent and lost packets (rampart_quic_packets_total,
# counted when the connection closes) and the bottleneck's drops. With an `fq` qdisc the kernel
# would hold each GSO send until its release time (SO_TXTIME); tbf ignores release times, so what
# paces here is the gateway's worker, which stops writing once a send's release time is more
# than 1 ms ahead and sleeps until it is near.
#   sudo scripts/pacing-netns.sh          # RATE=100mbit LIMIT=45000 DURATION=8s ROUNDS=2
# Needs root (ip netns, tc with tbf) and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
RATE=${RATE:-100mbit}
LIMIT=${LIMIT:-45000}
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-target/pacing-netns}
BIN=$PWD/target/release/rampart
[ -x "$BIN" ] || cargo build --release -p rampart
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
bench_site_certs "$OUT/certs"

GW=rp-gw CL=rp-cl
# (background processes are started with `ip netns exec` itself, so that $! is their pid)
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
teardown() { bench_cleanup; for ns in $GW $CL; do ip netns del "$ns" 2>/dev/null || true; done; }
trap teardown EXIT
trap 'exit 130' INT TERM  # through the EXIT trap, so the namespaces go too
teardown
for ns in $GW $CL; do ip netns add "$ns"; in_ns "$ns" ip link set lo up; done
ip link add gw0 netns $GW type veth peer name cl0 netns $CL
in_ns $GW ip addr add 10.77.1.1/24 dev gw0
in_ns $CL ip addr add 10.77.1.2/24 dev cl0
in_ns $GW ip link set gw0 up
in_ns $CL ip link set cl0 up
bottleneck() { # a fresh one, so its drop count starts at zero
  in_ns $GW tc qdisc del dev gw0 root 2>/dev/null || true
  in_ns $GW tc qdisc add dev gw0 root tbf rate "$RATE" burst 15000 limit "$LIMIT"
}

# The upstream beside the gateway, on the gateway namespace's loopback.
UP=18080
ip netns exec $GW "$BIN" upstream --listen 127.0.0.1:$UP 2>"$OUT/upstream.log" & pids+=($!)
sleep 1
bench_h3_gateway_config "$OUT/rampart.toml" batch 18443 $UP
sed -i 's/^listen = "127.0.0.1:18443"/listen = "10.77.1.1:18443"/' "$OUT/rampart.toml"

qdisc_count() { # $1 ns, $2 dev, $3 word: the number after it in `tc -s qdisc show`
  in_ns "$1" tc -s qdisc show dev "$2" | tr ' ' '\n' |
    awk -v w="$3" 'prev == w || prev == "(" w { print $1; exit } { prev = $1 }'
}
metric() { # $1 kind of rampart_quic_packets_total
  in_ns $GW curl -s http://127.0.0.1:19901/metrics |
    awk -v k="kind=\"$1\"" 'index($0, "rampart_quic_packets_total{") == 1 && index($0, k) { print $2 }'
}

rcvbuf_errors() { # the client namespace's UDP receive-buffer drops so far
  in_ns $CL awk '$1 == "Udp:" && n++ { print $6 }' /proc/net/snmp
}
echo "| round | pacing | Gbit/s | packets sent | lost | lost % | of them spurious | bottleneck drops | client socket drops |"
echo "|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for pacing in true false; do
    sed "s/^enabled = true$/enabled = true\npacing = $pacing/" "$OUT/rampart.toml" > "$OUT/variant.toml"
    bottleneck
    client_drops=$(rcvbuf_errors)
    ip netns exec $GW "$BIN" run --config "$OUT/variant.toml" 2>"$OUT/gateway-$pacing.log" & gw=$!
    for _ in $(seq 100); do in_ns $GW curl -s -o /dev/null http://127.0.0.1:19901/metrics && break; sleep 0.1; done
    in_ns $CL "$BIN" bench h3-download --url https://10.77.1.1:18443/bytes/10000000 -c 1 \
      -d "$DURATION" --json > "$OUT/run-$pacing.json"
    sleep 0.5
    gbit=$(python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(f\"{r['gbit_per_sec']:.3f}\")" "$OUT/run-$pacing.json")
    sent=$(metric sent); lost=$(metric lost); spurious=$(metric spurious_lost)
    drops=$(qdisc_count $GW gw0 dropped | tr -d ,)
    pct=$(python3 -c "print(f'{100 * ${lost:-0} / max(1, ${sent:-0}):.2f}')")
    client_drops=$(( $(rcvbuf_errors) - client_drops ))
    echo "| $round | $pacing | $gbit | ${sent:-?} | ${lost:-?} | $pct | ${spurious:-?} | ${drops:-?} | $client_drops |"
    kill $gw; wait $gw 2>/dev/null || true
  done
done
