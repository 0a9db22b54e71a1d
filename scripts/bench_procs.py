"""Processes the Python benchmark scripts start and stop (bench-control.py, bench-fleet.py):
loopback ports, processes pinned to a CPU with their output in a log, their CPU time, and
stopping every one of them at the end."""
import os
import socket
import subprocess

procs = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, cpu, log, **kw):
    """`args` on CPU `cpu` (taskset), stdout and stderr appended to `log`; stopped by stop_all."""
    out = open(log, "ab")
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + args, stdout=out, stderr=subprocess.STDOUT, **kw)
    procs.append(p)
    return p


def cpu_seconds(pid):
    """User and system CPU seconds process `pid` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_all(grace=30):
    """Terminates every process spawn started, killing those still running after `grace` s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
