#!/usr/bin/env python3
"""Control-plane benchmarks against a real etcd (Debian's etcd-server), every process local:

  propagation  time from a write through one gateway's admin API (what `rampart ctl apply`
               does) to the change in force on each of 1, 3 and 10 gateway processes, p50/p99
               over CHANGES writes (the applied revision polled on every gateway's /status);
  scale        10,000 routes and 1,000 clusters in etcd: a gateway's start to all of them in
               force; the CPU one change among them costs it; and keep-alive request CPU with
               them against with 10 routes (`rampart bench https-requests --server-pid`).
  split        keep-alive request CPU through a 95/5 split sticky by client address against
               the same route without a split (issue 35), ROUNDS (3) alternating rounds.
  matchers     keep-alive request CPU with 10,000 routes that each match a path pattern, a
               method and a header against with 10 such routes (issue 35), ROUNDS (3)
               alternating rounds; and the time the 10,000 take to be in force.

    scripts/bench-control.py [propagation] [scale] [split] [matchers]   # propagation, scale by default
Settings (environment): CHANGES (30), BIN (./target/release/rampart), OUT
(target/bench-control). Gateways run with one worker thread each on CPU 0; etcd, the upstream
and the load on CPU 1. Every loop is bounded in count and time.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import base64

from bench_procs import cpu_seconds, free_port, spawn, stop_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(os.environ.get("BIN", os.path.join(ROOT, "target/release/rampart")))
OUT = os.path.abspath(os.environ.get("OUT", os.path.join(ROOT, "target/bench-control")))
CHANGES = int(os.environ.get("CHANGES", "30"))
TOKEN = "bench-token-0123456789"


def wait_until(check, limit, what):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise SystemExit(f"{what} not within {limit} s")


def http(method, url, body=None, headers=None, timeout=10):
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method)
    req.add_header("Authorization", f"Bearer {TOKEN}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Etcd:
    def __init__(self, workdir):
        os.makedirs(workdir, exist_ok=True)
        self.port, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        p = f"http://127.0.0.1:{peer}"
        spawn(["etcd", "--data-dir", f"{workdir}/etcd", "--listen-client-urls", self.url,
               "--advertise-client-urls", self.url, "--listen-peer-urls", p,
               "--initial-advertise-peer-urls", p, "--initial-cluster", f"default={p}",
               "--quota-backend-bytes", str(1 << 31)], 1, f"{workdir}/etcd.log")
        wait_until(lambda: b"true" in urllib.request.urlopen(self.url + "/health", timeout=1).read(),
                   20, "etcd healthy")

    def put_all(self, kvs):
        b64 = lambda s: base64.b64encode(s.encode()).decode()
        for i in range(0, len(kvs), 128):  # etcd's default limit of operations per txn
            ops = [{"requestPut": {"key": b64(k), "value": b64(v)}} for k, v in kvs[i:i + 128]]
            req = urllib.request.Request(self.url + "/v3/kv/txn",
                                         data=json.dumps({"success": ops}).encode())
            with urllib.request.urlopen(req, timeout=10) as r:
                assert json.loads(r.read()).get("succeeded"), "etcd txn failed"


class Gateway:
    def __init__(self, workdir, name, etcd, upstream, certs):
        self.dir = f"{workdir}/{name}"
        os.makedirs(self.dir, exist_ok=True)
        self.port, self.admin = free_port(), free_port()
        with open(f"{self.dir}/token", "w") as f:
            f.write(TOKEN + "\n")
        with open(f"{self.dir}/rampart.toml", "w") as f:
            f.write(f"""
[server]
worker_threads = 1
access_log = "off"
[admin]
listen = "127.0.0.1:{self.admin}"
token_file = "token"
[key_engine]
engines = ["threads"]
[control.etcd]
endpoints = ["{etcd.url}"]
[[listeners]]
name = "https"
listen = "127.0.0.1:{self.port}"
[[listeners.certificates]]
server_names = ["localhost"]
ecdsa = {{ cert = "{certs}/ecdsa.crt", key = "{certs}/ecdsa.key" }}
[[routes]]
cluster = "app"
[[clusters]]
name = "app"
endpoints = ["127.0.0.1:{upstream}"]
""")
        self.started = time.monotonic()
        self.proc = spawn([BIN, "run", "--config", "rampart.toml"], 0, f"{self.dir}/gateway.log",
                          cwd=self.dir)
        self.api = f"http://127.0.0.1:{self.admin}"

    def status(self):
        return http("GET", self.api + "/status", timeout=5)[1]

    def ready(self, limit=30):
        wait_until(lambda: self.status()["control"]["etcd"]["connected"], limit, "gateway connected")

    def cpu_seconds(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def route(name, prefix, cluster="app"):
    return json.dumps({"path_prefix": prefix, "cluster": cluster,
                       "response_headers": {"set": {"x-route": name}}})


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def propagation(workdir, certs, upstream):
    rows = []
    for n in (1, 3, 10):
        etcd = Etcd(f"{workdir}/p{n}")
        fleet = [Gateway(f"{workdir}/p{n}", f"gw{i}", etcd, upstream, certs) for i in range(n)]
        for g in fleet:
            g.ready()
        samples = []
        for i in range(CHANGES):
            t0 = time.monotonic()
            status, body = http("PUT", fleet[0].api + f"/config/routes/r{i}", route(f"r{i}", f"/r{i}/"))
            assert status == 201, body
            rev = body["revision"]
            seen = {}

            def poll(g):
                end = time.monotonic() + 10
                while time.monotonic() < end:
                    if g.status()["control"]["applied_revision"] >= rev:
                        seen[g.admin] = time.monotonic() - t0
                        return
                    time.sleep(0.002)

            threads = [threading.Thread(target=poll, args=(g,)) for g in fleet]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(seen) == n, f"not in force everywhere within 10 s: {seen}"
            samples.extend(seen.values())
            time.sleep(0.05)
        rows.append((n, statistics.median(samples) * 1e3, pct(samples, 99) * 1e3, len(samples)))
        for g in fleet:
            g.stop()
    print("gateways\tp50_ms\tp99_ms\tsamples")
    for r in rows:
        print(f"{r[0]}\t{r[1]:.1f}\t{r[2]:.1f}\t{r[3]}")


def scale(workdir, certs, upstream):
    etcd = Etcd(f"{workdir}/scale")
    kvs = [(f"/rampart/clusters/c{i}", json.dumps({"name": f"c{i}", "endpoints": [f"127.0.0.1:{upstream}"]}))
           for i in range(1000)]
    kvs += [(f"/rampart/routes/r{i}", route(f"r{i}", f"/bytes/{i}", f"c{i % 1000}")) for i in range(10000)]
    t = time.monotonic()
    etcd.put_all(kvs)
    print(f"wrote 10,000 routes and 1,000 clusters to etcd in {time.monotonic() - t:.2f} s")
    g = Gateway(workdir, "scale-gw", etcd, upstream, certs)
    wait_until(lambda: g.status()["control"]["objects"]["routes"] == 10000, 60, "10,000 routes in force")
    print(f"start to 10,000 routes and 1,000 clusters in force: {time.monotonic() - g.started:.2f} s"
          " (process start, TLS set-up and the load together)")
    # One change among them: the gateway's CPU over the change, less its idle CPU over as long.
    time.sleep(1)
    idle0 = g.cpu_seconds(); time.sleep(2); idle = (g.cpu_seconds() - idle0) / 2
    costs = []
    for i in range(10):
        c0, t0 = g.cpu_seconds(), time.monotonic()
        status, body = http("GET", g.api + "/config/routes/r5")
        rev = body["revision"]
        status, body = http("PUT", g.api + "/config/routes/r5", route("r5", f"/moved{i}/", "c5"),
                            {"If-Match": f'"{rev}"'})
        assert status == 200, body
        time.sleep(0.5)
        costs.append(g.cpu_seconds() - c0 - idle * (time.monotonic() - t0))
    print(f"one route changed among 10,000: {statistics.median(costs) * 1e3:.0f} ms of gateway CPU"
          f" (median of 10; clock tick {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms)")
    # Request CPU: a route among 10,000 against the same with only 10 routes.
    def bench(port, path):
        out = subprocess.run(["taskset", "-c", "1", BIN, "bench", "https-requests", "--http", "h1",
                              "--url", f"https://localhost:{port}{path}", "-c", "16", "-d", "5s",
                              "--server-pid", str(g.proc.pid), "--json"],
                             capture_output=True, text=True, timeout=60).stdout
        return json.loads(out.strip().splitlines()[-1])["server_cpu_us_per_op"]
    many = bench(g.port, "/bytes/100")  # route r100 among 10,000
    g.stop()
    small = Etcd(f"{workdir}/small")
    small.put_all([(f"/rampart/clusters/c{i}", json.dumps({"name": f"c{i}", "endpoints": [f"127.0.0.1:{upstream}"]})) for i in range(10)]
                  + [(f"/rampart/routes/r{i}", route(f"r{i}", f"/bytes/{i}", f"c{i}")) for i in range(10)])
    g = Gateway(workdir, "small-gw", small, upstream, certs)
    g.ready()
    few = bench(g.port, "/bytes/100")  # route r1 among 10
    print(f"keep-alive request CPU: {many:.1f} µs with 10,000 routes, {few:.1f} µs with 10: ratio {many / few:.3f}")
    g.stop()


def split(workdir, certs, upstream):
    rows = {"plain": [], "split": []}
    for rnd in range(int(os.environ.get("ROUNDS", "3"))):
        for kind in ("plain", "split") if rnd % 2 == 0 else ("split", "plain"):
            etcd = Etcd(f"{workdir}/split-{kind}-{rnd}")
            clusters = [(f"/rampart/clusters/c{i}", json.dumps({"name": f"c{i}", "endpoints": [f"127.0.0.1:{upstream}"]}))
                        for i in range(2)]
            r = {"path_prefix": "/bytes/", "cluster": "c0"}
            if kind == "split":
                r.update({"split": [{"cluster": "c1", "weight": 5}], "sticky": {"client_address": True}})
            etcd.put_all(clusters + [("/rampart/routes/r", json.dumps(r))])
            g = Gateway(workdir, f"{kind}-gw-{rnd}", etcd, upstream, certs)
            g.ready()
            out = subprocess.run(["taskset", "-c", "1", BIN, "bench", "https-requests", "--http", "h1",
                                  "--url", f"https://localhost:{g.port}/bytes/100", "-c", "16", "-d", "5s",
                                  "--server-pid", str(g.proc.pid), "--json"],
                                 capture_output=True, text=True, timeout=60).stdout
            rows[kind].append(json.loads(out.strip().splitlines()[-1])["server_cpu_us_per_op"])
            g.stop()
    ratios = [s / p for s, p in zip(rows["split"], rows["plain"])]
    print("round\tplain_us\tsplit_us\tratio")
    for i, (p, s_) in enumerate(zip(rows["plain"], rows["split"])):
        print(f"{i + 1}\t{p:.1f}\t{s_:.1f}\t{s_ / p:.3f}")
    print(f"median ratio {statistics.median(ratios):.3f}")


def matcher_route(i, clusters):
    return json.dumps({"path_regex": f"/bytes/{i}[0-9]*", "methods": ["GET"],
                       "headers": [{"name": "x-tenant", "exact": f"t{i}"}],
                       "cluster": f"c{i % clusters}"})


def matchers(workdir, certs, upstream):
    rows = {10: [], 10000: []}
    for rnd in range(int(os.environ.get("ROUNDS", "3"))):
        for n in (10, 10000) if rnd % 2 == 0 else (10000, 10):
            etcd = Etcd(f"{workdir}/matchers-{n}-{rnd}")
            clusters = min(n, 1000)
            etcd.put_all([(f"/rampart/clusters/c{i}", json.dumps({"name": f"c{i}", "endpoints": [f"127.0.0.1:{upstream}"]}))
                          for i in range(clusters)]
                         + [(f"/rampart/routes/r{i}", matcher_route(i, clusters)) for i in range(n)])
            g = Gateway(workdir, f"matchers-{n}-gw-{rnd}", etcd, upstream, certs)
            wait_until(lambda: g.status()["control"]["objects"]["routes"] == n, 120, f"{n} routes in force")
            if n == 10000:
                print(f"start to 10,000 pattern routes in force: {time.monotonic() - g.started:.2f} s")
            # /bytes/7 with x-tenant: t7 is route r7's, among 10 or 10,000 (r70's pattern
            # would match it too, but its literal start /bytes/70 is not the path's).
            out = subprocess.run(["taskset", "-c", "1", BIN, "bench", "https-requests", "--http", "h1",
                                  "--url", f"https://localhost:{g.port}/bytes/7", "-H", "x-tenant: t7",
                                  "-c", "16", "-d", "5s", "--server-pid", str(g.proc.pid), "--json"],
                                 capture_output=True, text=True, timeout=60).stdout
            result = json.loads(out.strip().splitlines()[-1])
            assert result.get("errors", 0) == 0, result
            rows[n].append(result["server_cpu_us_per_op"])
            g.stop()
    print("round\t10_routes_us\t10000_routes_us\tratio")
    for i, (few, many) in enumerate(zip(rows[10], rows[10000])):
        print(f"{i + 1}\t{few:.1f}\t{many:.1f}\t{many / few:.3f}")
    print(f"median ratio {statistics.median([m / f for f, m in zip(rows[10], rows[10000])]):.3f}")


def main():
    which = sys.argv[1:] or ["propagation", "scale"]
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
    upstream = free_port()
    spawn([BIN, "upstream", "--listen", f"127.0.0.1:{upstream}"], 1, f"{workdir}/upstream.log")
    try:
        if "propagation" in which:
            propagation(workdir, certs, upstream)
        if "scale" in which:
            scale(workdir, certs, upstream)
        if "split" in which:
            split(workdir, certs, upstream)
        if "matchers" in which:
            matchers(workdir, certs, upstream)
    finally:
        stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
