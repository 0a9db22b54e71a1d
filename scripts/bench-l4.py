#!/usr/bin/env python3
"""rampart l4's forwarding cost: datagrams per CPU-second of the balancer, against a plain
userspace UDP forwarder (`rampart bench udp-forward`: recv_from, then send_to, one datagram
at a time) on the same path, both pinned to CPU 1.

Three network namespaces on one bridge: `gen` sends QUIC short-header datagrams whose
connection IDs carry the sink's QUIC-LB server ID (`rampart bench udp-flood`, CPU 0) to the
VIP; `l4` runs the forwarder under test; `sink` owns the VIP and a socket on it that is never
read (datagrams end in its full receive buffer, as they would in a busy gateway's), and
answers the balancer's health probes on another port. The figure is datagrams forwarded
divided by the forwarder's CPU seconds (user + system, from /proc): datagrams per second per
core, were the core given to it whole. The kernel's work of delivering each frame into the
sink's namespace runs in the sender's context on a veth pair, so both forwarders' system time
includes it alike.

  sudo scripts/bench-l4.py [--seconds 5] [--rounds 3] [--sizes 64,1200]

Needs root (namespaces, the balancer's packet socket) and target/release/rampart.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_procs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAMPART = os.path.join(ROOT, "target/release/rampart")
TAG = f"bl4{os.getpid() % 100000}"
VIP, GEN, L4, SINK = "10.78.1.1", "10.78.0.10", "10.78.0.2", "10.78.0.30"
KEY = "8f95f09245765f80256934e50c66207f"


def ns(node):
    return f"{TAG}-{node}"


def sh(*args):
    subprocess.run(list(args), check=True)


def topology():
    sh("ip", "netns", "add", ns("sw"))
    sh("ip", "-n", ns("sw"), "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", ns("sw"), "link", "set", "br0", "up")
    for node, addr in [("gen", GEN), ("l4", L4), ("sink", SINK)]:
        sh("ip", "netns", "add", ns(node))
        sh("ip", "-n", ns("sw"), "link", "add", f"p-{node}", "type", "veth", "peer", "name", "eth0",
           "netns", ns(node))
        sh("ip", "-n", ns("sw"), "link", "set", f"p-{node}", "master", "br0", "up")
        sh("ip", "-n", ns(node), "link", "set", "lo", "up")
        sh("ip", "-n", ns(node), "link", "set", "eth0", "up")
        sh("ip", "-n", ns(node), "addr", "add", f"{addr}/24", "dev", "eth0")
    sh("ip", "-n", ns("gen"), "route", "add", f"{VIP}/32", "via", L4)
    sh("ip", "-n", ns("l4"), "addr", "add", f"{VIP}/32", "dev", "lo")
    sh("ip", "-n", ns("sink"), "addr", "add", f"{VIP}/32", "dev", "lo")
    sh("ip", "netns", "exec", ns("sink"), "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1",
       "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.eth0.rp_filter=0")


def teardown():
    for node in ["gen", "l4", "sink", "sw"]:
        subprocess.run(["ip", "netns", "del", ns(node)], stderr=subprocess.DEVNULL)


SINK_PROGRAM = r"""
import socket, sys
# Datagrams to the VIP (forwarded by either forwarder) land here and are never read.
drop = []
for addr in [(sys.argv[1], 443), (sys.argv[2], 443)]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind(addr)
    drop.append(s)
# Health probes: a QUIC version negotiation answer (RFC 9000 section 17.2.1).
h = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
h.bind((sys.argv[2], 4433))
while True:
    d, peer = h.recvfrom(2048)
    if len(d) < 7 or not d[0] & 0x80:
        continue
    dl = d[5]; dcid = d[6:6 + dl]; sl = d[6 + dl]; scid = d[7 + dl:7 + dl + sl]
    h.sendto(bytes([0x80]) + b"\0\0\0\0" + bytes([len(scid)]) + scid + bytes([len(dcid)]) + dcid
             + b"\0\0\0\1", peer)
"""


def l4_config(path):
    with open(path, "w") as f:
        f.write(f"""
[l4]
listen = "{VIP}:443"
workers = 1
batch = 64
[l4.lb]
nonce_len = 8
key = "{KEY}"
[[l4.backends]]
server_id = "01"
address = "{SINK}"
health = "{SINK}:4433"
[l4.health]
interval = "500ms"
timeout = "200ms"
[admin]
listen = "127.0.0.1:9903"
""")


def cpu_split(pid):
    """(user, system) CPU seconds of process `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def metric(text, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name) and not l.startswith("#"))


def scrape():
    out = subprocess.run(["ip", "netns", "exec", ns("l4"), "curl", "-sf",
                          "http://127.0.0.1:9903/metrics"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def flood(seconds, size, log):
    out = subprocess.run(["taskset", "-c", "0", "ip", "netns", "exec", ns("gen"), RAMPART, "bench",
                          "udp-flood", "--url", f"udp://{VIP}:443", "--duration", f"{seconds}s",
                          "--datagram-bytes", str(size), "--lb-server-ids", "01", "--lb-key", KEY,
                          "-c", "4"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_l4(seconds, size, tmp):
    cfg = os.path.join(tmp, "l4.toml")
    l4_config(cfg)
    p = bench_procs.spawn(["ip", "netns", "exec", ns("l4"), RAMPART, "l4", "--config", cfg], 1,
                          os.path.join(tmp, "l4.log"), env=dict(os.environ, RAMPART_LOG="warn"))
    deadline = time.time() + 20
    while True:
        m = scrape()
        if m and metric(m, "rampart_l4_backend_up") == 1:
            break
        if time.time() > deadline:
            sys.exit(f"l4 never saw the sink up; see {tmp}/l4.log")
        time.sleep(0.1)
    fwd0, (u0, s0) = metric(m, "rampart_l4_datagrams_total"), cpu_split(p.pid)
    sent = flood(seconds, size, tmp)
    time.sleep(0.3)
    m = scrape()
    u1, s1 = cpu_split(p.pid)
    fwd, user, system = metric(m, "rampart_l4_datagrams_total") - fwd0, u1 - u0, s1 - s0
    cpu = user + system
    batches = metric(m, "rampart_l4_receive_batches_total")
    received = metric(m, "rampart_l4_received_total")
    p.terminate()
    p.wait(timeout=10)
    return {"sent": sent["sent"], "forwarded": fwd, "cpu_user_s": round(user, 2),
            "cpu_system_s": round(system, 2), "per_core": round(fwd / cpu) if cpu else 0,
            "user_ns_per_datagram": round(user / fwd * 1e9) if fwd else None,
            "batch": round(received / batches, 1) if batches else 0}


def run_plain(seconds, size, tmp):
    result = {}

    def forwarder():
        out = subprocess.run(["taskset", "-c", "1", "ip", "netns", "exec", ns("l4"), RAMPART,
                              "bench", "udp-forward", "--url", f"udp://{VIP}:443",
                              "--forward-to", f"{SINK}:443", "--duration", f"{seconds + 2}s"],
                             capture_output=True, text=True, check=True)
        result.update(json.loads(out.stdout.strip().splitlines()[-1]))

    t = threading.Thread(target=forwarder)
    t.start()
    time.sleep(0.5)
    sent = flood(seconds, size, tmp)
    t.join()
    user, system = result["cpu_user"], result["cpu_system"]
    fwd = result["forwarded"]
    return {"sent": sent["sent"], "forwarded": fwd, "cpu_user_s": round(user, 2),
            "cpu_system_s": round(system, 2),
            "per_core": round(fwd / (user + system)) if user + system else 0,
            "user_ns_per_datagram": round(user / fwd * 1e9) if fwd else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="64,1200")
    a = ap.parse_args()
    if not os.path.exists(RAMPART):
        sys.exit("build first: cargo build --release -p rampart")
    tmp = tempfile.mkdtemp(prefix="bench-l4-")
    topology()
    try:
        sink = bench_procs.spawn(["ip", "netns", "exec", ns("sink"), "python3", "-c", SINK_PROGRAM,
                                  VIP, SINK], 0, os.path.join(tmp, "sink.log"))
        time.sleep(0.3)
        for size in [int(s) for s in a.sizes.split(",")]:
            for r in range(a.rounds):
                plain = run_plain(a.seconds, size, tmp)
                l4 = run_l4(a.seconds, size, tmp)
                print(json.dumps({"size": size, "round": r, "plain": plain, "l4": l4,
                                  "ratio": round(l4["per_core"] / plain["per_core"], 3)
                                  if plain["per_core"] else None}), flush=True)
    finally:
        bench_procs.stop_all()
        teardown()


if __name__ == "__main__":
    main()
