#!/usr/bin/env bash
# HTTP/3 against HTTPS bulk downloads on a machine with cores to spare (the lent device machine:
# 16 cores of an Intel Xeon with AVX-512), in layouts picked by LAYOUTS (default "saturated
# 2-core"); the first three run HTTP/3 and HTTPS alternating round by round (scripts/ab-bulk.sh):
#   saturated: gateway on CPU 0, upstream on CPU 2, load generator on CPUs 4-7 (4 threads,
#              4 connections), so the gateway's one core, not the load generator, bounds the rate;
#   saturated-2: the same with 2 connections and 2 load-generator threads;
#   2-core:    this project's usual layout (gateway on CPU 0, upstream and load generator sharing
#              CPU 1, 2 connections), as bench-h3.sh runs it on a 2-core machine;
#   bench-h3:  the whole of scripts/bench-h3.sh (handshakes, bulk, Caddy) in the saturated
#              layout, Caddy from target/device/caddy.xz (--prepare packs ~/go/bin/caddy);
#   profile:   scripts/profile-bulk.sh in the saturated layout, with this machine's perf and
#              the libraries it needs beside glibc (target/device/perf.tar.xz) and a rampart
#              binary keeping its symbols (target/device/rampart-symbols);
#   counters:  scripts/counters-bulk.sh the same way: the gateway's hardware counters per GB
#              (IPC, cache and TLB misses) and where its last-level-cache misses land.
# Build here, run there (the device machine has no Rust):
#   scripts/bulk-device.sh --prepare     # release build, stripped into target/device, certificates
#   (on the device)  OUT=/some/dir scripts/bulk-device.sh
# To compare two builds: BEFORE=/tmp/rampart-before scripts/bulk-device.sh --prepare strips that
# binary into target/device/rampart-before as well, and on the device
#   VARIANTS="target/device/rampart-before kind:h3 kind:https" scripts/bulk-device.sh
# alternates the old build's HTTP/3, the new one's and the new one's HTTPS (the ab-bulk layouts
# take any scripts/ab-bulk.sh variants; each median is also given against kind:https's).
# ROUNDS (3) and DURATION (5s) per layout. On the H200 lease an ab-bulk layout took about 100 s
# (3 rounds), bench-h3 with 5 rounds about 100 s, profile about 50 s (counters: about as long). Every load run is bounded by
# DURATION; everything talks to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
D=target/device
if [ "${1:-}" = --prepare ]; then
  cargo build --release -p rampart
  mkdir -p "$D"
  strip -o "$D/rampart" target/release/rampart
  if [ -n "${BEFORE:-}" ]; then strip -o "$D/rampart-before" "$BEFORE"; fi
  . scripts/bench-lib.sh
  bench_site_certs "$D/certs"
  caddy=$(command -v caddy || echo "$HOME/go/bin/caddy")
  if [ -x "$caddy" ]; then strip -o "$D/caddy" "$caddy" && xz -T2 -f "$D/caddy"; fi
  if command -v perf >/dev/null; then
    objcopy --strip-debug target/release/rampart "$D/rampart-symbols"
    rm -rf "$D/perf" && mkdir -p "$D/perf/lib" && cp "$(readlink -f "$(command -v perf)")" "$D/perf/"
    for l in $(ldd "$D/perf/perf" | awk '/=>/ {print $3}'); do
      case $(basename "$l") in libc.so*|libm.so*|libpthread.so*|libdl.so*) ;; *) cp -L "$l" "$D/perf/lib/" ;; esac
    done
    tar -C "$D" -cJf "$D/perf.tar.xz" perf && rm -rf "$D/perf"
  fi
  du -sh "$D"
  exit 0
fi
[ -x "$D/rampart" ] || { echo "run scripts/bulk-device.sh --prepare first" >&2; exit 1; }
OUT=${OUT:-/tmp/bulk-device}
mkdir -p "$OUT"
echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512vl|vaes|vpclmulqdq)$' | tr '\n' ' ')"
echo "kernel: $(uname -r); rmem_max $(cat /proc/sys/net/core/rmem_max), wmem_max $(cat /proc/sys/net/core/wmem_max); qdisc on lo: $(tc qdisc show dev lo 2>/dev/null | head -1)"
for layout in ${LAYOUTS:-saturated 2-core}; do
  case $layout in
    bench-h3)
      echo "== bench-h3, saturated layout"
      mkdir -p "$OUT/bench-h3" && cp -r "$D/certs" "$OUT/bench-h3/"
      if [ -f "$D/caddy.xz" ]; then
        python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$D/caddy.xz" "$OUT/caddy"
        chmod +x "$OUT/caddy"
      fi
      GW_CPUS=0 UPSTREAM_CPUS=2 LOAD_CPUS=4-7 LOAD_THREADS=4 CONNS=4 BIN=$D/rampart CADDY=$OUT/caddy \
        OUT="$OUT/bench-h3" ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5s} scripts/bench-h3.sh
      continue ;;
    profile|counters)
      echo "== $layout, saturated layout"
      mkdir -p "$OUT/$layout" && cp -r "$D/certs" "$OUT/$layout/"
      if [ ! -x "$OUT/perf.sh" ]; then
        tar -C "$OUT" -xJf "$D/perf.tar.xz"
        cat > "$OUT/perf.sh" <<SH
#!/bin/sh
LD_LIBRARY_PATH=$OUT/perf/lib exec $OUT/perf/perf "\$@"
SH
        chmod +x "$OUT/perf.sh"
      fi
      script=scripts/profile-bulk.sh; [ "$layout" = counters ] && script=scripts/counters-bulk.sh
      GW_CPUS=0 UPSTREAM_CPUS=2 LOAD_CPUS=4-7 CONNS=4 CLIENT_ARGS="--threads 4" PERF=$OUT/perf.sh \
        BIN=$D/rampart-symbols OUT="$OUT/$layout" $script
      continue ;;
    saturated) cpus=(GW_CPUS=0 UPSTREAM_CPUS=2 LOAD_CPUS=4-7 CONNS=4 CLIENT_ARGS="--threads 4") ;;
    saturated-2) cpus=(GW_CPUS=0 UPSTREAM_CPUS=2 LOAD_CPUS=4-7 CONNS=2 CLIENT_ARGS="--threads 2") ;;
    2-core) cpus=(GW_CPUS=0 UPSTREAM_CPUS=1 LOAD_CPUS=1 CONNS=2 CLIENT_ARGS=) ;;
    *) echo "unknown layout $layout" >&2; exit 2 ;;
  esac
  echo "== $layout: ${cpus[*]}"
  mkdir -p "$OUT/$layout" && cp -r "$D/certs" "$OUT/$layout/"
  env "${cpus[@]}" BIN=$D/rampart OUT="$OUT/$layout" ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-5s} \
    scripts/ab-bulk.sh ${VARIANTS:-kind:h3 kind:https}
  python3 - "$OUT/$layout/results.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
variants = list(dict.fromkeys(r[1] for r in rows))
med = {k: statistics.median(float(r[2]) for r in rows if r[1] == k) for k in variants}
for k in variants:
    if k != "kind:https" and "kind:https" in med:
        print(f"{k} ÷ HTTPS, medians: {med[k]:.3f} / {med['kind:https']:.3f} = {med[k] / med['kind:https']:.2f}")
PY
done
