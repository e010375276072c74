"""Coordinator load, part (a): signaling WebSockets through one coordinator process, no tokens.

The coordinator (``coordinator.server.app.start()``, a hub without tokens) runs in a child process (this
file run as a script: it prints its port and serves until its stdin closes); :func:`bench_signaling`
opens ``peers`` raw WebSockets (challenge, signed hello, welcome), keeps them all open, and sends offers
between random pairs at ``rate`` per second for ``seconds`` (each recipient answers).
``relay_p99_ms``: offer sent -> offer received at the other peer, through the hub. coordinator_load.py
runs it on its own and, with ``--replicas``, as the one-process baseline of replica_load.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aiohttp
from figures import description, log, p99  # benchmarks/ is this script's folder, first on sys.path

from engine.p2p import signaling_protocol as sp
from engine.p2p.identity import Identity

SCRIPT = os.path.abspath(__file__)


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve_signaling() -> None:
    """Child process: the coordinator app, port on stdout, until stdin closes."""
    raise_fd_limit()
    from coordinator.server.app import start

    running = await start()
    print(running.port, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await running.stop()


async def bench_signaling(peers: int, rate: float, seconds: float) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    port = int((await asyncio.wait_for(proc.stdout.readline(), 30)).decode())
    url = f"http://127.0.0.1:{port}/ws/signal"
    connector = aiohttp.TCPConnector(limit=0)
    session = aiohttp.ClientSession(connector=connector)
    sockets: list[aiohttp.ClientWebSocketResponse] = []
    ids: list[str] = []
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    received = 0

    async def connect(identity: Identity) -> None:
        ws = await session.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=10), max_msg_size=1 << 20)
        challenge = sp.client_decoder.decode(await asyncio.wait_for(ws.receive_str(), 30))
        assert isinstance(challenge, sp.Challenge)
        hello = sp.Hello(public_key=identity.public_key, signature=identity.sign(sp.DOMAIN + challenge.nonce))
        await ws.send_str(sp.encode(hello))
        welcome = sp.client_decoder.decode(await asyncio.wait_for(ws.receive_str(), 30))
        assert isinstance(welcome, sp.Welcome), welcome
        sockets.append(ws)
        ids.append(identity.peer_id)

    t0 = time.perf_counter()
    identities = [Identity.generate() for _ in range(peers)]
    sem = asyncio.Semaphore(64)

    async def guarded(identity: Identity) -> None:
        async with sem:
            await connect(identity)

    await asyncio.gather(*(guarded(i) for i in identities))
    connect_s = time.perf_counter() - t0
    log(f"signaling: {len(sockets)} peers connected in {connect_s:.1f} s")

    async def reader(index: int) -> None:
        nonlocal received
        ws = sockets[index]
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            m = sp.client_decoder.decode(msg.data)
            if isinstance(m, sp.Signal) and m.description.type == "offer":
                started = sent_at.pop(m.id, None)
                if started is not None:
                    latencies.append((time.perf_counter() - started) * 1000)
                received += 1
                answer = sp.Signal(
                    id=-m.id, to=m.sender, description=description(ids[index], m.sender, "answer")
                )
                await ws.send_str(sp.encode(answer))

    readers = [asyncio.create_task(reader(i)) for i in range(len(sockets))]
    rng = random.Random(1)
    interval = 1.0 / rate
    n = int(rate * seconds)
    start = time.perf_counter()
    for k in range(1, n + 1):
        a, b = rng.sample(range(len(sockets)), 2)
        signal = sp.Signal(id=k, to=ids[b], description=description(ids[a], ids[b], "offer"))
        sent_at[k] = time.perf_counter()
        await sockets[a].send_str(sp.encode(signal))
        delay = start + k * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.sleep(1.0)
    still_open = sum(1 for ws in sockets if not ws.closed)
    for task in readers:
        task.cancel()
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    await session.close()
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
    return {
        "ws_peers": still_open,
        "ws_connect_s": round(connect_s, 2),
        "relay_offers": n,
        "relay_lost": n - len(latencies),
        "relay_p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "relay_p99_ms": round(p99(latencies), 2),
    }


if __name__ == "__main__":
    asyncio.run(serve_signaling())
