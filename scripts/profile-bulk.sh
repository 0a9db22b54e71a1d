#!/usr/bin/env bash
# Where the gateway's CPU goes during a bulk download, HTTP/3 against HTTPS: samples the gateway
# with `perf record` (cpu-clock, DWARF call stacks) for PROFILE_S seconds in the middle of each
# download and turns the shares into CPU seconds per GB, using the CPU per GB that `rampart
# bench` measured in the same download. Gateway on CPU 0, client and upstream on CPU 1, as in
# bench-h3.sh.
#   scripts/profile-bulk.sh        # DURATION=7s PROFILE_S=3; needs `perf` (apt install linux-perf)
#   CLIENT_ARGS="--udp-recv-buffer 0" scripts/profile-bulk.sh    # extra load-generator arguments
#   PERF=/path/to/perf BIN=/path/to/rampart GW_CPUS=0 UPSTREAM_CPUS=2 LOAD_CPUS=4-7 CONNS=4 \
#     CLIENT_ARGS="--threads 4" scripts/profile-bulk.sh    # another perf, binary or placement
#   UPLOAD=1 scripts/profile-bulk.sh   # uploads (h3-upload, https-upload to /discard) instead;
#                                      # the rows then read: sending = to the upstream, receiving =
#                                      # the client's body, AEAD = opening, quiche receiving = the body
# On loopback the sender's CPU runs the receiver's protocol processing. The table counts two such
# pieces of other processes' work that ran on the gateway's CPU: the client's receive processing
# inside the gateway's sends, and the upstream's transmits inside the gateway's receives (the
# gateway's window update reaches the upstream's socket there, which then sends). Behind a NIC
# both run on the other machines; the last line gives the ratio without them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
bench_perf_setup target/profile-bulk

during_download() {
  sleep 2
  "$PERF" record -q -e cpu-clock -F 800 --call-graph dwarf,16384 -p "$gw" -o "$OUT/$kind.perf" \
    -- sleep "$PROFILE_S" >/dev/null 2>&1
}
suffix=; [ -n "${UPLOAD:-}" ] && suffix=-upload
for kind in h3$suffix https$suffix; do
  gw_log=$OUT/rampart-$kind.log
  bench_bulk_round "$OUT/rampart.toml" $kind "$OUT/$kind.json" ${client_args[@]+"${client_args[@]}"}
  "$PERF" script -i "$OUT/$kind.perf" -F ip,sym 2>/dev/null > "$OUT/$kind.stacks"
done

python3 - "$OUT" "$suffix" <<'PY'
import json, os, sys
out, suffix = sys.argv[1], sys.argv[2]
import re
AEAD = ("aes_gcm_", "aes_hw_", "gcm_", "gcm128", "aead_aes", "EVP_AEAD", "CRYPTO_xor16", "ghash", "packetseal::")
KERNEL = [
    ("kernel: sending to the client", ("sys_sendmsg", "sys_sendto", "sys_write", "do_writev")),
    ("kernel: receiving (upstream body, client ACKs)", ("sys_recvmsg", "sys_recvfrom", "sys_read", "sys_recvmmsg")),
]
KERNEL_REST = "kernel: the rest (timers, epoll, scheduling)"
# A user-space sample goes to the first of these found walking its stack from the leaf up.
USER = [
    ("user: quiche building packets and recovery", ("::send_single", "::send_on_path", "::send_stream_burst_at", "::send_stream_only")),
    ("user: quiche receiving (ACK processing)", ("quiche::Connection::recv", "recv_single", "::process_frame", "::on_ack_received")),
    ("user: TLS records (BoringSSL, not AEAD)", ("SSL_", "ssl3_", "tls_")),
    ("user: HTTP (hyper, HTTP/3 framing and buffering, gateway)", ("hyper::", "quiche::h3::", "H3Driver", "gateway::")),
    ("user: tokio-quiche I/O loop", ("tokio_quiche::",)),
]
AEAD_LABEL = "user: AEAD sealing (AES-GCM, header protection)"
USER_REST = "user: the rest (runtime, allocation)"
LABELS = [l for l, _ in KERNEL] + [KERNEL_REST, AEAD_LABEL] + [l for l, _ in USER] + [USER_REST]
def plain(name):  # a frame's name without generic parameters
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            return name
        name = shorter
def label(frames, names, kernel):
    if kernel:
        for lab, keys in KERNEL:
            if any(k in n for n in names for k in keys):
                return lab
        return KERNEL_REST
    # perf lists inlined functions as frames of their own ("... (inlined)"): an intrinsic
    # inlined into packetseal's seal is a leaf named `_mm256_aesenc_epi128`. The sample is
    # AEAD work if the leaf or any frame up to the first real (not inlined) one is.
    real = next((i for i, n in enumerate(names) if not n.endswith("(inlined)")), 0)
    if any(k in n for n in names[: real + 1] for k in AEAD):
        return AEAD_LABEL
    for n in names:
        for lab, keys in USER:
            if any(k in n for k in keys):
                return lab
    return USER_REST
PEER = "of the kernel rows: the client's receive processing, run on the gateway's CPU"
def peer_receive(names, kernel):
    # On loopback the sender's CPU delivers the packet into the receiver's socket (softirq
    # `process_backlog` inside the send). Within the gateway's own sends to the client that is
    # the client's receive work, which behind a NIC would run on the client's machine.
    return kernel and "process_backlog" in names and any(
        k in n for n in names for k in ("sys_sendmsg", "sys_sendto", "sys_write", "do_writev"))
UPSTREAM = "of the kernel rows: the upstream's transmits, run inside the gateway's receives"
def upstream_send(names, kernel):
    # `tcp_write_xmit` under the gateway's own receive call is the upstream's socket sending
    # (the gateway's sockets send from its send calls and from ACKs; its receives only ACK).
    # What a nested `process_backlog` below it delivers is the gateway's own receive work.
    if not kernel:
        return False
    w = next((i for i, n in enumerate(names) if n == "tcp_write_xmit"), None)
    if w is None or not any(k in n for n in names[w:] for k in ("sys_recvfrom", "sys_recvmsg", "sys_read")):
        return False
    b = next((i for i, n in enumerate(names) if n == "process_backlog"), None)
    return b is None or b > w
def shares(path):
    counts, total, frames = {}, 0, []
    def take(frames):
        names = [plain(n) for _, n in frames]  # each frame's name without generic parameters
        kernel = frames[0][0].startswith("ffff")  # the sample's leaf is in the kernel
        lab = label(frames, names, kernel)
        counts[lab] = counts.get(lab, 0) + 1
        if peer_receive(names, kernel):
            counts[PEER] = counts.get(PEER, 0) + 1
        if upstream_send(names, kernel):
            counts[UPSTREAM] = counts.get(UPSTREAM, 0) + 1
    for line in open(path):
        line = line.strip()
        if not line:
            if frames:
                take(frames); total += 1; frames = []
            continue
        ip, _, sym = line.partition(" ")
        frames.append((ip, sym))
    if frames:
        take(frames); total += 1
    return {k: v / total for k, v in counts.items()}, total
runs = {}
for kind in ("h3", "https"):
    d = json.load(open(os.path.join(out, kind + suffix + ".json")))
    s, n = shares(os.path.join(out, kind + suffix + ".stacks"))
    runs[kind] = (d["server_cpu_seconds_per_gb"], d["gbit_per_sec"], s, n)
(h, hg, hs, hn), (t, tg, ts, tn) = runs["h3"], runs["https"]
print(f"| CPU s per GB (share of samples) | HTTP/3: {h:.2f} at {hg:.2f} Gbit/s, {hn} samples | HTTPS: {t:.2f} at {tg:.2f} Gbit/s, {tn} samples |")
print("|---|---|---|")
for lab in LABELS + [PEER, UPSTREAM]:
    a, b = hs.get(lab, 0), ts.get(lab, 0)
    print(f"| {lab} | {a * h:.3f} ({100 * a:.1f}%) | {b * t:.3f} ({100 * b:.1f}%) |")
a, b = hs.get(PEER, 0), ts.get(PEER, 0)
print(f"\nWithout the client's receive processing: HTTP/3 {h * (1 - a):.3f}, HTTPS {t * (1 - b):.3f} "
      f"CPU s per GB, HTTP/3 ÷ HTTPS {h * (1 - a) / (t * (1 - b)):.2f} (as measured: {h / t:.2f}).")
a, b = a + hs.get(UPSTREAM, 0), b + ts.get(UPSTREAM, 0)
print(f"The gateway's own work (without the upstream's transmits either): HTTP/3 {h * (1 - a):.3f}, "
      f"HTTPS {t * (1 - b):.3f} CPU s per GB, HTTP/3 ÷ HTTPS {h * (1 - a) / (t * (1 - b)):.2f}.")
PY
