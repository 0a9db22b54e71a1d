#!/usr/bin/env bash
# The gateway's hardware counters during a bulk download, HTTP/3 against HTTPS, per GB: cycles,
# instructions (so IPC), cache and TLB misses, counted with `perf stat` for PROFILE_S seconds in
# the middle of each download; then, where the CPU has a last-level-cache miss event, the
# functions those misses land in (`perf record -e LLC-load-misses`, leaf symbols only). Says
# whether HTTP/3's extra CPU per GB is more instructions or more waiting on memory, and where.
# Needs a machine with hardware counters (not this project's VMs: there every row reads "not
# counted"). Gateway on CPU 0, client and upstream on CPU 1 unless the *_CPUS variables say
# otherwise, as in bench-h3.sh.
#   scripts/counters-bulk.sh                       # DURATION=7s PROFILE_S=3
#   PERF=/path/to/perf BIN=/path/to/rampart GW_CPUS=0 UPSTREAM_CPUS=2 LOAD_CPUS=4-7 CONNS=4 \
#     CLIENT_ARGS="--threads 4" scripts/counters-bulk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_perf_setup target/counters-bulk

EVENTS=cycles,instructions,cache-references,cache-misses,L1-dcache-load-misses,LLC-load-misses,LLC-store-misses,dTLB-load-misses,page-faults,context-switches
during_download() {
  sleep 2
  "$PERF" stat -x, -e "$EVENTS" -p "$gw" -o "$OUT/$kind.stat" -- sleep "$PROFILE_S" >/dev/null 2>&1 || true
  # Where the misses land: leaf symbols of sampled last-level-cache load misses, if the CPU
  # counts them (skipped, with the reason in $kind.record.log, where it does not).
  "$PERF" record -q -e LLC-load-misses -c 2000 -p "$gw" -o "$OUT/$kind.misses" \
    -- sleep 1 >"$OUT/$kind.record.log" 2>&1 || true
}
for kind in h3 https; do
  gw_log=$OUT/rampart-$kind.log
  bench_bulk_round "$OUT/rampart.toml" $kind "$OUT/$kind.json" ${client_args[@]+"${client_args[@]}"}
  if [ -s "$OUT/$kind.misses" ]; then
    "$PERF" report -i "$OUT/$kind.misses" --stdio --sort sym 2>/dev/null | grep -v '^#' | grep -v '^$' \
      | head -25 > "$OUT/$kind.misses.txt" || true
  fi
done

python3 - "$OUT" "$PROFILE_S" <<'PY'
import json, os, sys
out, secs = sys.argv[1], float(sys.argv[2])
def counters(kind):
    c = {}
    path = os.path.join(out, kind + ".stat")
    if not os.path.exists(path):
        return c
    for line in open(path):
        f = line.strip().split(",")
        if len(f) < 3 or line.startswith("#"):
            continue
        try:
            c[f[2]] = float(f[0])
        except ValueError:
            pass  # "<not supported>" or "<not counted>"
    return c
rows = {}
for kind in ("h3", "https"):
    r = json.load(open(os.path.join(out, kind + ".json")))
    gb = r["gbit_per_sec"] / 8 * secs  # GB moved while perf counted
    rows[kind] = (counters(kind), gb, r)
names = ["cycles", "instructions", "cache-references", "cache-misses", "L1-dcache-load-misses",
         "LLC-load-misses", "LLC-store-misses", "dTLB-load-misses", "page-faults", "context-switches"]
print(f"| per GB, counted for {secs:.0f} s mid-download | HTTP/3 ({rows['h3'][2]['gbit_per_sec']:.2f} Gbit/s, {rows['h3'][2]['server_cpu_seconds_per_gb']:.2f} CPU s/GB) | HTTPS ({rows['https'][2]['gbit_per_sec']:.2f} Gbit/s, {rows['https'][2]['server_cpu_seconds_per_gb']:.2f} CPU s/GB) | HTTP/3 ÷ HTTPS |")
print("|---|---|---|---|")
for n in names:
    h, s = rows["h3"][0].get(n), rows["https"][0].get(n)
    if h is None or s is None:
        print(f"| {n} | not counted | not counted | |")
        continue
    hg, sg = h / rows["h3"][1], s / rows["https"][1]
    print(f"| {n} | {hg:,.0f} | {sg:,.0f} | {hg / sg:.2f} |" if sg else f"| {n} | {hg:,.0f} | {sg:,.0f} | |")
for kind in ("h3", "https"):
    c = rows[kind][0]
    if c.get("cycles") and c.get("instructions"):
        print(f"{kind}: {c['instructions'] / c['cycles']:.2f} instructions per cycle")
    path = os.path.join(out, kind + ".misses.txt")
    if os.path.exists(path):
        print(f"\n{kind}: where last-level-cache load misses land (share of samples, by function)")
        print(open(path).read().rstrip())
PY
