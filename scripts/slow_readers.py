#!/usr/bin/env python3
"""Slow readers for scripts/overload-pressure.sh: N TLS connections each ask for a large
response and read it at RATE bytes/s, for DURATION seconds. Prints how many connections were
admitted (got a response head) and how many were refused or failed."""
import asyncio, ssl, sys, time

async def reader(host, port, path, rate, until, stats):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), 10)
        w.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
        if not head.startswith(b"HTTP/1.1 200"):
            stats["refused"] += 1
            return
        stats["admitted"] += 1
        while time.monotonic() < until:
            chunk = await r.read(max(rate // 10, 1))
            if not chunk:
                stats["cut"] += 1
                return
            await asyncio.sleep(0.1)
        w.close()
    except Exception:
        stats["refused"] += 1

async def main():
    port, n, rate, secs = (int(a) for a in sys.argv[1:5])
    until = time.monotonic() + secs
    stats = {"admitted": 0, "refused": 0, "cut": 0}
    tasks = []
    for _ in range(n):
        tasks.append(asyncio.create_task(reader("127.0.0.1", port, "/bytes/1000000000", rate, until, stats)))
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    print(f"slow readers: {stats['admitted']} admitted, {stats['refused']} refused or failed, "
          f"{stats['cut']} cut by the gateway")

asyncio.run(main())
