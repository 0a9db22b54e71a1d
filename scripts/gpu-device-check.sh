#!/usr/bin/env bash
# The GPU engine's measurements on a CUDA machine (issue 6), in one bounded run: the kernel
# checked against the CPU core and measured against batch size (RSA-2048/3072/4096), a few
# launch shapes, `rampart bench engine` with the gpu engine, and end-to-end RSA handshakes
# through the gateway with the batch (CPU) engine, the gpu engine and both.
#
# Build here, run there (the device machine has the driver and NVRTC, no Rust):
#   scripts/gpu-device-check.sh --prepare      # release build, stripped copies in target/device
#   (on the device, from the repo root)  OUT=/some/dir scripts/gpu-device-check.sh
# Settings: SECS per batch size (1), DURATION per end-to-end row (8s), VSIZES for the variant
# rows (1,1024,16384,65536), SKIP_CPU_ENGINES=1 leaves out the CPU engines' `bench engine` rows,
# ONLY=cache-start times the engine's start with an empty and a filled kernel cache instead.
# With prebuilt cubins in target/device/cubins (--prepare with PTXAS set) the variants are
# measured side by side instead of the built-in kernel's sweep. On an H200 a run took 3-4 min.
# Every load run is bounded by SECS / DURATION; everything talks to 127.0.0.1 only.
set -uo pipefail
cd "$(dirname "$0")/.."
D=target/device
if [ "${1:-}" = --prepare ]; then
  set -e
  cargo build --release -p rampart
  cargo build --release -p gpu-engine --example device_bench
  mkdir -p "$D/certs"
  strip -o "$D/rampart" target/release/rampart
  strip -o "$D/device_bench" target/release/examples/device_bench
  # Kernel variants as cubins for sm_90 (H100/H200), if NVRTC and ptxas are at hand (pip wheels
  # nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12: NVRTC_LIB=<its lib dir> PTXAS=<ptxas>).
  if [ -n "${PTXAS:-}" ]; then
    mkdir -p "$D/cubins"
    for v in "s1w5" "s2w5 --split 2" "s2w4 --split 2 --window 4"; do
      set -- $v; name=$1; shift
      LD_LIBRARY_PATH=${NVRTC_LIB:-} target/release/examples/device_bench --emit-ptx "$D/$name.ptx" "$@"
      "$PTXAS" -arch=sm_90 "$D/$name.ptx" -o "$D/cubins/$name.cubin" && rm "$D/$name.ptx"
    done
  fi
  . scripts/bench-lib.sh
  bench_site_certs "$D/certs"
  du -sh "$D"
  exit 0
fi
OUT=${OUT:-/tmp/gpu-device-check}
SECS=${SECS:-1}            # per batch size in device_bench
DURATION=${DURATION:-8s}   # per end-to-end handshake run
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
say() { echo "== $*"; }
. scripts/bench-lib.sh   # wait_port
metrics() { python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:19901/metrics").read().decode())'; }
# Waits ($1 tries, $2 s apart) until the metrics say the gpu engine is done starting
# (`rampart_gpu_starting 0`: its kernel built, loaded or given up on); leaves the last metrics
# in `m`. Fails if the tries run out first (a gateway without the gpu engine never says so).
wait_gpu_started() {
  for _ in $(seq "$1"); do
    if m=$(metrics 2>/dev/null) && grep -q '^rampart_gpu_starting 0' <<<"$m"; then return 0; fi
    sleep "$2"
  done
  return 1
}
# The device's gateway config, to $OUT/gw.toml: $1 worker threads, $2 the [key_engine] lines;
# RSA-2048 on 127.0.0.1:$GW, everything routed to the demo upstream on 127.0.0.1:$UP.
gw_config() {
  cat > "$OUT/gw.toml" <<CFG
[server]
worker_threads = $1
access_log = "off"
[admin]
listen = "127.0.0.1:19901"
[key_engine]
$2
[[listeners]]
name = "https"
listen = "127.0.0.1:$GW"
[[listeners.certificates]]
server_names = ["localhost"]
rsa = { cert = "$PWD/$D/certs/rsa.crt", key = "$PWD/$D/certs/rsa.key" }
[[routes]]
cluster = "up"
[[clusters]]
name = "up"
endpoints = ["127.0.0.1:$UP"]
CFG
}

say machine
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512ifma|vaes|vpclmulqdq)$' | tr '\n' ' ')"
# cudarc looks for libnvrtc.so (or .so.12); CUDA 13 machines have libnvrtc.so.13 only.
if ! ldconfig -p | grep -q 'libnvrtc\.so '; then
  nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | grep -v -e builtins -e alt | sort | head -1)
  [ -n "$nv" ] || { echo "no libnvrtc on this machine"; exit 1; }
  mkdir -p /tmp/nvrtc && ln -sf "$nv" /tmp/nvrtc/libnvrtc.so
  export LD_LIBRARY_PATH=/tmp/nvrtc:$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "nvrtc: $nv"
fi

# ONLY=cache-start: how long the gpu engine takes to become ready in a gateway start, first with
# an empty `kernel_cache` (NVRTC builds the cubin) and then with it filled; and the CPU's share of
# a GPU signature (device_bench cpu-side). Nothing else is run.
if [ "${ONLY:-}" = cache-start ]; then
  say "the CPU's share of a GPU signature (device_bench cpu-side)"
  timeout 60 $D/device_bench cpu-side
  UP=18080; GW=18443; cache=$OUT/kernel-cache
  rm -rf "$cache"
  for start in empty filled; do
    gw_config 2 "engines = [\"gpu\"]
gpu = { kernel_cache = \"$cache\" }"
    t0=$(date +%s.%N)
    $D/rampart run --config "$OUT/gw.toml" >"$OUT/gw-$start.log" 2>&1 &
    gw=$!
    wait_port $GW
    ready=; wait_gpu_started 1200 0.05 && ready=1
    t1=$(date +%s.%N)
    took=$(python3 -c "print(f'{$t1 - $t0:.2f} s')")
    if [ -n "$ready" ]; then echo "kernel cache $start: gpu engine done starting after $took (rampart_gpu_available below)"
    else echo "kernel cache $start: gpu engine still starting after $took"; fi
    grep -E '^rampart_(gpu_available|keyengine_available)' <<<"$m" | head -4
    ls -la "$cache" 2>/dev/null | tail -n +2
    kill $gw; wait $gw 2>/dev/null
    grep -i -E 'warn|error|kernel' "$OUT/gw-$start.log" | head -5
  done
  say done
  exit 0
fi

C=$D/cubins
if [ -d "$C" ]; then
  # Prebuilt modules (--prepare): variants measured side by side, no JIT on the device.
  say "kernel variants, RSA-2048 (prebuilt cubins: s=threads per request, w=window, nu=no forced unrolling)"
  for v in $(ls $C | sed 's/\.cubin$//'); do
    split=1; case $v in s2*) split=2;; esac
    echo "-- $v"
    timeout 60 $D/device_bench 2048 "$SECS" --sizes ${VSIZES:-1,1024,16384,65536} --split $split --cubin $C/$v.cubin | grep -E '^batch|crossover'
  done
  for bits in 3072 4096; do
    for v in s1w5 s2w5; do
      split=1; case $v in s2*) split=2;; esac
      say "kernel: RSA-$bits, $v"
      timeout 90 $D/device_bench $bits "$SECS" --sizes 1,4096,65536 --split $split --cubin $C/$v.cubin | grep -E '^(cpu|batch|crossover)'
    done
  done
else
  say "kernel: RSA-2048 against batch size"
  timeout 120 $D/device_bench 2048 "$SECS"
fi
say "rampart bench engine (RSA-2048 and P-256; gpu takes RSA only)"
[ -n "${SKIP_CPU_ENGINES:-}" ] || timeout 60 $D/rampart bench engine --engines inline,batch --levels 1,64,1024 -d 2s
timeout 150 $D/rampart bench engine --engines gpu --levels 1,64,1024,16384,65536 -d 2s

say "end to end: RSA-2048 handshakes, gateway on CPUs 0-7, client on 8-15"
UP=18080; GW=18443
$D/rampart upstream --listen 127.0.0.1:$UP >"$OUT/upstream.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null' EXIT
for run in '"batch"|512' '"gpu"|512' '"batch", "gpu"|512' '"gpu"|2048'; do
  engines=${run%|*}; conc=${run#*|}
  gw_config 8 "engines = [$engines]
batch = { threads = 8 }"
  taskset -c 0-7 $D/rampart run --config "$OUT/gw.toml" >"$OUT/gw.log" 2>&1 &
  gw=$!
  wait_port $GW
  # The gateway listens at once; the gpu engine joins once its kernel is built (tens of
  # seconds): measure from then, not the CPU engines standing in.
  wait_gpu_started 300 0.5 || true
  echo "engines [$engines], $conc connections:"
  timeout 60 taskset -c 8-15 $D/rampart bench https-handshake --url "https://localhost:$GW/bytes/100" \
    -c "$conc" --threads 8 -d "$DURATION" --server-pid $gw --sigalgs rsa_pss_rsae_sha256 --json | cut -c1-600
  metrics | grep -E '^rampart_(gpu_|keyengine_operations|keyengine_failovers|batch_operations)' | grep -v ' 0$' | head -24
  kill $gw; wait $gw 2>/dev/null
  grep -i -E 'warn|error' "$OUT/gw.log" | head -5
done
say done
