#!/usr/bin/env python3
"""Fleet-state costs (issue 36), ROUNDS (3) alternating rounds, the order turned every round:

  limit        keep-alive request CPU and latency through a route whose rate_limit counts in
               Redis (scope = "fleet") against the same limit counted on the node, the limits
               high enough never to refuse;
  anti-replay  server CPU per resumed HTTP/3 handshake with 0-RTT early data
               (`rampart bench h3-handshake --early-data`) with [fleet] redis (each attempt
               recorded in Redis before its early data is accepted) against without.

    scripts/bench-fleet.py [limit] [anti-replay]      # both by default
Settings (environment): ROUNDS (3), DURATION (5s), BIN (./target/release/rampart), OUT
(target/bench-fleet). The gateway runs one worker on CPU 0; Redis (Debian's redis-server), the
demo upstream and the load generator on CPU 1. Redis's own CPU per request is reported beside
(it is another process: the gateway's figure does not include it). Every loop is bounded.
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench_procs import cpu_seconds, free_port, spawn, stop_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(os.environ.get("BIN", os.path.join(ROOT, "target/release/rampart")))
OUT = os.path.abspath(os.environ.get("OUT", os.path.join(ROOT, "target/bench-fleet")))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURATION = os.environ.get("DURATION", "5s")


def wait_port(port, limit=30):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"port {port} never opened")


def gateway(workdir, name, scope, redis_port, upstream, certs, quic=False, fleet=True):
    d = f"{workdir}/{name}"
    os.makedirs(d, exist_ok=True)
    port = free_port()
    fleet_table = f'[fleet]\nredis = "redis://127.0.0.1:{redis_port}"' if fleet else ""
    quic_table = "[listeners.quic]\nenabled = true\nearly_data = true" if quic else ""
    with open(f"{d}/rampart.toml", "w") as f:
        f.write(f"""
[server]
worker_threads = 1
access_log = "off"
[key_engine]
engines = ["threads"]
{fleet_table}
[[listeners]]
name = "https"
listen = "127.0.0.1:{port}"
{quic_table}
[[listeners.certificates]]
server_names = ["localhost"]
ecdsa = {{ cert = "{certs}/ecdsa.crt", key = "{certs}/ecdsa.key" }}
[[routes]]
name = "api"
cluster = "app"
rate_limit = {{ per_second = 1000000000, scope = "{scope}" }}
[[clusters]]
name = "app"
endpoints = ["127.0.0.1:{upstream}"]
""")
    p = spawn([BIN, "run", "--config", "rampart.toml"], 0, f"{d}/gateway.log", cwd=d)
    wait_port(port)
    time.sleep(1)  # the fleet connection is made in the background
    return p, port


def main():
    if not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release", "-p", "rampart"], cwd=ROOT, check=True)
    os.makedirs(OUT, exist_ok=True)
    workdir = tempfile.mkdtemp(dir=OUT)
    certs = f"{workdir}/certs"
    os.makedirs(certs)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", f"{certs}/ecdsa.key", "-out", f"{certs}/ecdsa.crt", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    upstream, redis_port = free_port(), free_port()
    spawn([BIN, "upstream", "--listen", f"127.0.0.1:{upstream}"], 1, f"{workdir}/upstream.log")
    redis = spawn(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no"], 1, f"{workdir}/redis.log")
    wait_port(redis_port)
    which = sys.argv[1:] or ["limit", "anti-replay"]
    rows = {"node": [], "fleet": []}
    handshakes = {"off": [], "on": []}
    try:
        for rnd in range(ROUNDS if "anti-replay" in which else 0):
            for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
                g, port = gateway(workdir, f"0rtt-{mode}-{rnd}", "node", redis_port, upstream, certs,
                                  quic=True, fleet=(mode == "on"))
                out = subprocess.run(["taskset", "-c", "1", BIN, "bench", "h3-handshake", "--early-data",
                                      "--url", f"https://localhost:{port}/bytes/100", "-c", "16",
                                      "-d", DURATION, "--server-pid", str(g.pid), "--json"],
                                     capture_output=True, text=True, timeout=120).stdout
                res = json.loads(out.strip().splitlines()[-1])
                assert res.get("errors", 0) == 0, res
                checks = 0
                if mode == "on":
                    checks = int(subprocess.run(["redis-cli", "-p", str(redis_port), "DBSIZE"],
                                                capture_output=True, text=True).stdout.strip() or 0)
                handshakes[mode].append((res["server_cpu_us_per_op"], res["ok"], checks))
                g.terminate()
                g.wait(timeout=30)
        for rnd in range(ROUNDS if "limit" in which else 0):
            for scope in ("node", "fleet") if rnd % 2 == 0 else ("fleet", "node"):
                g, port = gateway(workdir, f"{scope}-{rnd}", scope, redis_port, upstream, certs)
                r0 = cpu_seconds(redis.pid)
                out = subprocess.run(["taskset", "-c", "1", BIN, "bench", "https-requests", "--http", "h1",
                                      "--url", f"https://localhost:{port}/bytes/100", "-c", "16",
                                      "-d", DURATION, "--server-pid", str(g.pid), "--json"],
                                     capture_output=True, text=True, timeout=120).stdout
                redis_cpu = cpu_seconds(redis.pid) - r0
                res = json.loads(out.strip().splitlines()[-1])
                assert res.get("errors", 0) == 0, res
                rows[scope].append((res["server_cpu_us_per_op"], res["latency_ms_p99"],
                                    redis_cpu / max(res["ok"], 1) * 1e6))
                g.terminate()
                g.wait(timeout=30)
    finally:
        stop_all()
    if handshakes["on"]:
        print("round\twithout_us\twith_us\tadded_us\trecords_in_redis")
        for i, (off, on) in enumerate(zip(handshakes["off"], handshakes["on"])):
            print(f"{i + 1}\t{off[0]:.1f}\t{on[0]:.1f}\t{on[0] - off[0]:+.1f}\t{on[2]}")
        added = statistics.median([on[0] - off[0] for off, on in zip(handshakes["off"], handshakes["on"])])
        print(f"median added: {added:+.1f} µs of gateway CPU per resumed 0-RTT handshake")
    if not rows["node"]:
        return
    print("round\tnode_us\tfleet_us\tadded_us\tnode_p99_ms\tfleet_p99_ms\tredis_us_per_request")
    for i, (n, f) in enumerate(zip(rows["node"], rows["fleet"])):
        print(f"{i + 1}\t{n[0]:.1f}\t{f[0]:.1f}\t{f[0] - n[0]:+.1f}\t{n[1]:.2f}\t{f[1]:.2f}\t{f[2]:.1f}")
    added = statistics.median([f[0] - n[0] for n, f in zip(rows["node"], rows["fleet"])])
    added_p99 = statistics.median([f[1] - n[1] for n, f in zip(rows["node"], rows["fleet"])])
    print(f"median added: {added:+.1f} µs of gateway CPU per request, {added_p99:+.2f} ms at p99")


if __name__ == "__main__":
    main()
