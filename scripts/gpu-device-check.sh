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
# rows (1,256,4096,16384,65536), SKIP_CPU_ENGINES=1 leaves out the CPU engines' `bench engine` rows,
# BIG_VARIANTS and BIG_SIZES the shapes and batch sizes measured at RSA-3072/4096,
# SKIP_E2E=1 the end-to-end handshake runs, LEVELS the gpu engine's `bench engine` concurrencies,
# ONLY=cache-start times the engine's start with an empty and a filled kernel cache instead;
# ONLY=engine skips the kernel sweep: CPU side (against $D/device_bench_old if carried), the engine
# over a worker process whose device faults, the engine in and out of process, end to end;
# ONLY=e2e runs the end-to-end rows only. E2E_RUNS ('engines|connections|gpu settings', ';'-separated)
# replaces the end-to-end rows. SUBMIT_THREADS (4): the threads `rampart bench engine` submits
# the gpu rows from.
# With prebuilt cubins in target/device/cubins (--prepare with PTXAS set) the kernel shapes are
# measured side by side instead of the built-in kernel's sweep, the fastest at RSA-2048 whose
# p99 stays within P99_MS (10) is picked (`best`), and the device-fault probe, the cached start,
# `rampart bench engine` and the end-to-end runs use that shape. ONLY=kernels stops after the
# kernel rows. On an H200 a run took 3-4 min.
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
    rm -rf "$D/cubins"; mkdir -p "$D/cubins"
    # name: device_bench flags (s = threads per request, g = group kernel of that many threads
    # per request, sh = window table in shared memory, cc = carry chains, f64 = FP64 arithmetic
    # (rsa_fp64.h; m: squarings as multiplications), w = window, b = block;
    # --define NAME=VALUE passes a kernel option the engine does not set).
    # VARIANTS (';'-separated) picks some of them.
    # The engine's defaults (shared table, carry chains, 4-bit window) apply unless a flag says
    # otherwise: a name without sh or cc passes --table-local / --no-carry-chains.
    IFS=';' read -r -a variants <<<"${VARIANTS:-s1w5 --split 1 --window 5;s2w5 --split 2 --window 5;\
g16w5 --split 16 --table-local --no-carry-chains --window 5;g16shw4 --split 16 --no-carry-chains;\
g16ccw4 --split 16 --table-local;g16shccw4 --split 16;g16shccw5 --split 16 --window 5;\
g8shccw4 --split 8;g32shccw4 --split 32;g16shccw4b64 --split 16 --block 64;\
s2f64w4 --split 2 --fp64 --window 4;s2f64w5 --split 2 --fp64 --window 5;\
s2f64w4m --split 2 --fp64 --window 4 --define RSA_F_SQR=0;g8f64w4 --split 8 --fp64;g16f64w4 --split 16 --fp64}"
    for v in "${variants[@]}"; do
      set -- $v; name=$1; shift
      LD_LIBRARY_PATH=${NVRTC_LIB:-} target/release/examples/device_bench --emit-ptx "$D/$name.ptx" "$@"
      "$PTXAS" -arch=sm_90 -v "$D/$name.ptx" -o "$D/cubins/$name.cubin" 2>"$D/cubins/$name.ptxas" && rm "$D/$name.ptx"
      echo "$*" > "$D/cubins/$name.flags"
    done
  fi
  . scripts/bench-lib.sh
  bench_site_certs "$D/certs"
  du -sh "$D"
  exit 0
fi
OUT=${OUT:-/tmp/gpu-device-check}
TMPD=$(mktemp -d)   # per-shape rows and the kernel cache: $OUT brings back few files
trap 'rm -rf "$TMPD"' EXIT
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
echo "profilers: $(command -v ncu nsys nvprof 2>/dev/null | tr '\n' ' ')"
# cudarc looks for libnvrtc.so (or .so.12); CUDA 13 machines have libnvrtc.so.13 only.
if ! ldconfig -p | grep -q 'libnvrtc\.so '; then
  nv=$(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' 2>/dev/null | grep -v -e builtins -e alt | sort | head -1)
  [ -n "$nv" ] || { echo "no libnvrtc on this machine"; exit 1; }
  mkdir -p /tmp/nvrtc && ln -sf "$nv" /tmp/nvrtc/libnvrtc.so
  export LD_LIBRARY_PATH=/tmp/nvrtc:$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "nvrtc: $nv"
fi

# How long the gpu engine takes to become ready in a gateway start, first with an empty
# `kernel_cache` (NVRTC builds the cubin) and then with it filled; $1: more [key_engine.gpu]
# settings (the kernel shape). Leaves the cache in $TMPD/kernel-cache for the runs after.
cache_start() {
  say "gpu engine start with an empty and a filled kernel cache (${1:-default shape})"
  UP=18080; GW=18443; cache=$TMPD/kernel-cache
  rm -rf "$cache"
  for start in empty filled; do
    gw_config 2 "engines = [\"gpu\"]
gpu = { kernel_cache = \"$cache\"${1:+, $1} }"
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
}

# ONLY=cache-start: the cached start with the default shape, and the CPU's share of a GPU
# signature (device_bench cpu-side). Nothing else is run.
if [ "${ONLY:-}" = cache-start ]; then
  say "the CPU's share of a GPU signature (device_bench cpu-side)"
  timeout 60 $D/device_bench cpu-side
  cache_start ""
  say done
  exit 0
fi

C=$D/cubins
P99_MS=${P99_MS:-10}
best=; best_flags=
if [ "${ONLY:-}" = e2e ]; then
  : # ONLY=e2e: the end-to-end rows only (E2E_RUNS picks them).
elif [ "${ONLY:-}" = engine ]; then
  # ONLY=engine: no kernel sweep. The CPU side of this build against an older one's
  # ($D/device_bench_old, if carried; alternating), then the engine over a worker process whose
  # device faults, then the engine rows and the end-to-end rows with the default shape.
  say "the CPU's share of a GPU signature: this build and the old one, alternating"
  for i in 1 2 3; do
    echo "new: $(timeout 60 $D/device_bench cpu-side 2048)"
    # The old build takes no size: its first line (RSA-2048), the rest cut off.
    [ -x $D/device_bench_old ] && echo "old: $(timeout 60 $D/device_bench_old cpu-side 2>/dev/null | head -1)"
  done
  # Loaded: every core at once, as the engine runs the steps (CPU time per signature).
  echo "loaded: $(timeout 90 $D/device_bench cpu-side 2048 "$(nproc)")"
  say "the engine over a worker process whose device faults on its fifth batch"
  timeout 120 $D/device_bench engine-fault
  # The harness's own ceiling: the replay engine answers from a thread without signing. One
  # submitting thread (a current-thread runtime) capped the engine rows before run 8; they now
  # submit from SUBMIT_THREADS (4) threads, as a gateway's workers do.
  say "rampart bench engine: replay (no signing: the harness's ceiling), 1 and ${SUBMIT_THREADS:-4} submitting threads"
  for t in 1 "${SUBMIT_THREADS:-4}"; do
    timeout 40 $D/rampart bench engine --engines replay --levels "${LEVELS:-1,1024,16384,65536}" -d 2s --threads "$t" | grep rsa2048
  done
  # ENGINE_SPECS: other shapes as `rampart bench engine` names them (e.g. gpu:16f for FP64
  # arithmetic over groups of 8 lanes, gpu:16shccw4s3 for three streams).
  say "rampart bench engine: ${ENGINE_SPECS:-gpu:16shccw4 in this process and gpu:16shccw4p in a worker}, ${SUBMIT_THREADS:-4} submitting threads"
  timeout 150 $D/rampart bench engine --engines "${ENGINE_SPECS:-gpu:16shccw4,gpu:16shccw4p}" --levels "${LEVELS:-1,1024,16384,65536}" -d 2s --threads "${SUBMIT_THREADS:-4}"
elif [ -d "$C" ]; then
  # Prebuilt modules (--prepare): shapes measured side by side, no JIT on the device.
  say "kernel shapes, RSA-2048 (prebuilt cubins; registers and spills as ptxas reported them)"
  best_rate=0
  for f in $C/*.flags; do
    v=$(basename "$f" .flags); flags=$(cat "$f")
    echo "-- $v ($flags): $(grep -h -o 'Used [0-9]* registers' $C/$v.ptxas | tr '\n' ' ')"
    timeout 60 $D/device_bench 2048 "$SECS" --sizes ${VSIZES:-1,256,4096,16384,65536} $flags --cubin $C/$v.cubin \
      | grep -E '^batch|crossover|panicked' | tee "$TMPD/v-$v.txt"
    # The best rate among batch sizes whose p99 is within P99_MS.
    rate=$(python3 - "$TMPD/v-$v.txt" "$P99_MS" <<'PY'
import re, sys
best = 0
for line in open(sys.argv[1]):
    m = re.match(r"batch\s+(\d+):\s+(\d+) signs/s\s+p50\s+(\S+)\s+p99\s+(\S+)", line)
    if not m: continue
    p99 = m.group(4)
    ms = float(re.sub(r"[a-zµ]+$", "", p99)) * {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1, "s": 1e3}[re.search(r"[a-zµ]+$", p99).group(0)]
    if ms <= float(sys.argv[2]): best = max(best, int(m.group(2)))
print(best)
PY
)
    echo "   best within p99 ${P99_MS} ms: $rate signs/s"
    if [ "${rate:-0}" -gt "$best_rate" ]; then best_rate=$rate; best=$v; best_flags=$flags; fi
  done
  say "best RSA-2048 shape within p99 ${P99_MS} ms: $best ($best_flags): $best_rate signs/s"
  # BIG_VARIANTS (space-separated) and BIG_SIZES: the shapes and batch sizes for RSA-3072/4096.
  for bits in 3072 4096; do
    for v in ${BIG_VARIANTS:-s1w5 s2w5 g16w5 g16ccw4 g16shccw4 s2f64w4 g16f64w4} $best; do
      [ -f "$C/$v.flags" ] || continue
      say "kernel: RSA-$bits, $v"
      timeout 90 $D/device_bench $bits "$SECS" --sizes ${BIG_SIZES:-1,4096,65536} $(cat $C/$v.flags) --cubin $C/$v.cubin | grep -E '^(batch|crossover)|panicked'
    done
  done
  if [ -n "$best" ]; then
    say "a real device fault (illegal address) on the $best kernel's context, and after"
    timeout 60 $D/device_bench 2048 fault $best_flags --cubin $C/$best.cubin
  fi
  [ "${ONLY:-}" = kernels ] && { say done; exit 0; }
else
  say "kernel: RSA-2048 against batch size"
  timeout 120 $D/device_bench 2048 "$SECS"
fi
# The best shape as `rampart bench engine` names it and as [key_engine.gpu] settings.
shape=; gpu_settings=
if [ -n "$best" ]; then
  tpr=$(sed -E 's/.*--split ([0-9]+).*/\1/' <<<"$best_flags")
  shape=$tpr; gpu_settings="threads_per_request = $tpr"
  # The engine's defaults unless the flags say otherwise (see --prepare).
  if [ "$tpr" -gt 2 ]; then  # the group kernels' options
    case $best_flags in *--table-local*) gpu_settings="$gpu_settings, table_shared = false";; *) shape=${shape}sh;; esac
    case $best_flags in *--no-carry-chains*) gpu_settings="$gpu_settings, carry_chains = false";; *) shape=${shape}cc;; esac
  fi
  win=4; case $best_flags in *"--window "*) win=$(sed -E 's/.*--window ([0-9]+).*/\1/' <<<"$best_flags");; esac
  shape=${shape}w$win; gpu_settings="$gpu_settings, window = $win"
  case $best_flags in *"--block "*)
    block=$(sed -E 's/.*--block ([0-9]+).*/\1/' <<<"$best_flags")
    shape=${shape}b$block; gpu_settings="$gpu_settings, threads_per_block = $block";; esac
fi
say "the CPU's share of a GPU signature (device_bench cpu-side)"
if [ "${ONLY:-}" != engine ] && [ "${ONLY:-}" != e2e ]; then
timeout 60 $D/device_bench cpu-side
GPU_ENGINE=gpu${shape:+:$shape}
say "the gpu engine as configured: $GPU_ENGINE [key_engine.gpu] ${gpu_settings:-defaults}"
cache_start "${gpu_settings}"
say "rampart bench engine (RSA-2048 and P-256; gpu takes RSA only)"
[ -n "${SKIP_CPU_ENGINES:-}" ] || timeout 60 $D/rampart bench engine --engines inline,batch --levels 1,64,1024 -d 2s
timeout 150 $D/rampart bench engine --engines "$GPU_ENGINE" --levels "${LEVELS:-1,64,1024,16384,65536}" -d 2s --threads "${SUBMIT_THREADS:-4}"
fi

[ -n "${SKIP_E2E:-}" ] && { say done; exit 0; }
say "end to end: RSA-2048 handshakes, gateway on CPUs 0-7, client on 8-15"
UP=18080; GW=18443
$D/rampart upstream --listen 127.0.0.1:$UP >"$OUT/upstream.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; rm -rf "$TMPD"' EXIT
# engines|connections|more [key_engine.gpu] settings (the default isolation is a worker process)
default_runs=('"batch"|512|' '"gpu"|512|' '"gpu"|512|isolation = "none"' '"batch", "gpu"|512|' '"gpu"|2048|')
if [ -n "${E2E_RUNS:-}" ]; then IFS=';' read -r -a runs <<<"$E2E_RUNS"; else runs=("${default_runs[@]}"); fi
for run in "${runs[@]}"; do
  IFS='|' read -r engines conc extra <<<"$run"
  settings=$gpu_settings${extra:+${gpu_settings:+, }$extra}
  gw_config 8 "engines = [$engines]
batch = { threads = 8 }
gpu = { kernel_cache = \"$TMPD/kernel-cache\"${settings:+, $settings} }"
  taskset -c 0-7 $D/rampart run --config "$OUT/gw.toml" >"$OUT/gw.log" 2>&1 &
  gw=$!
  wait_port $GW
  # The gateway listens at once; the gpu engine joins once its kernel is built (tens of
  # seconds): measure from then, not the CPU engines standing in.
  case $engines in *gpu*) wait_gpu_started 300 0.5 || true;; esac
  echo "engines [$engines], $conc connections${extra:+, $extra}:"
  timeout 60 taskset -c 8-15 $D/rampart bench https-handshake --url "https://localhost:$GW/bytes/100" \
    -c "$conc" --threads 8 -d "$DURATION" --server-pid $gw --sigalgs rsa_pss_rsae_sha256 --json | cut -c1-600
  metrics | grep -E '^rampart_(gpu_|keyengine_operations|keyengine_failovers|batch_operations)' | grep -v ' 0$' | head -24
  kill $gw; wait $gw 2>/dev/null
  grep -i -E 'warn|error' "$OUT/gw.log" | head -5
done
say done
