"""The signaling peers replica_load.py drives through the proxy, and the bench that times their offers.

A :class:`Peer` is one raw WebSocket (challenge, signed hello with its token, welcome) that reads offers
and answers them, and, when its socket closes under it (a replica killed), reconnects as the engine's
client does: ``reconnect_delay``, jittered, counted from the start of the failed try. The
:class:`SignalingBench` they share holds the session, when each offer was sent and arrived, when each
peer was welcomed again after a kill, and every close code, Error frame and failed join, by kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import msgspec
from figures import description  # benchmarks/ is the running script's folder, first on sys.path

from engine.p2p import signaling_protocol as sp
from engine.p2p.identity import Identity
from engine.p2p.signaling import reconnect_delay


class Peer:
    """One raw signaling socket through the proxy; reconnects as the engine's client does."""

    def __init__(self, bench: SignalingBench, identity: Identity, token: str) -> None:
        self.bench = bench
        self.identity = identity
        self.token = token
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.replica = ""
        self.joins = 0
        self.task: asyncio.Task[None] | None = None

    async def join(self) -> None:
        ws = await self.bench.session.ws_connect(self.bench.url, max_msg_size=1 << 20)
        challenge = sp.client_decoder.decode(await ws.receive_str(timeout=60))
        assert isinstance(challenge, sp.Challenge)
        sig = self.identity.sign(sp.DOMAIN + challenge.nonce)
        await ws.send_str(
            sp.encode(sp.Hello(public_key=self.identity.public_key, signature=sig, token=self.token))
        )
        welcome = sp.client_decoder.decode(await ws.receive_str(timeout=60))
        if isinstance(welcome, sp.Error):  # refused (e.g. unavailable): counted, and tried again
            self.bench.errors[welcome.code] = self.bench.errors.get(welcome.code, 0) + 1
            await ws.close()
        assert isinstance(welcome, sp.Welcome), welcome
        self.replica = ws._response.headers.get("X-Lah-Replica", "") if ws._response else ""
        self.ws = ws
        self.joins += 1
        self.bench.joined_at.setdefault(self.id, time.perf_counter())

    async def run(self) -> None:
        failures = 0
        spent = 0.0
        while not self.bench.closing:
            ws = self.ws
            if ws is not None:
                with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                    await self.read(ws)
                self.ws = None
                self.bench.dropped(self, ws.close_code)
            if self.bench.closing:
                return
            # the engine's client's own policy: jittered, and counted from the start of the failed try
            await asyncio.sleep(reconnect_delay(failures, 30.0, spent=spent))
            started = time.perf_counter()
            try:
                await self.join()
                failures, spent = 0, 0.0
            except (aiohttp.ClientError, AssertionError, TimeoutError, msgspec.DecodeError) as e:
                spent = time.perf_counter() - started
                status = getattr(e, "status", None)  # a refused upgrade: whose answer, which status
                kind = type(e).__name__ + (f" {status}" if status else "")
                self.bench.join_failures[kind] = self.bench.join_failures.get(kind, 0) + 1
                failures += 1

    async def read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            m = sp.client_decoder.decode(msg.data)
            if isinstance(m, sp.Error):
                self.bench.errors[m.code] = self.bench.errors.get(m.code, 0) + 1
            if isinstance(m, sp.Signal) and m.description.type == "offer":
                self.bench.arrived(m.id, self)
                answer = sp.Signal(
                    id=-m.id, to=m.sender, description=description(self.id, m.sender, "answer")
                )
                await ws.send_str(sp.encode(answer))

    @property
    def id(self) -> str:
        return self.identity.peer_id

    async def offer(self, msg_id: int, to: Peer) -> bool:
        """False when this peer's socket is down (the offer is not sent: it counts as lost)."""
        if self.ws is None or self.ws.closed:
            return False
        signal = sp.Signal(id=msg_id, to=to.id, description=description(self.id, to.id, "offer"))
        try:
            await self.ws.send_str(sp.encode(signal))
        except (aiohttp.ClientError, ConnectionError):
            return False
        return True


class SignalingBench:
    def __init__(self, url: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.closing = False
        self.sent_at: dict[int, float] = {}
        self.latencies: list[tuple[int, float]] = []  # (offer id, ms)
        self.on_arrival: dict[int, Peer] = {}  # failover probes: offer id -> the orphan it was for
        self.back_at: dict[str, float] = {}
        self.joined_at: dict[str, float] = {}  # failover: when each peer was welcomed again
        self.ids = iter(range(1, 1 << 62))
        self.drops: dict[str, int] = {}  # close code -> sockets closed under their peer
        self.errors: dict[str, int] = {}  # the hub's Error frames by code
        self.join_failures: dict[str, int] = {}  # reconnects that failed (then backed off), by exception

    def arrived(self, msg_id: int, peer: Peer) -> None:
        started = self.sent_at.pop(msg_id, None)
        if started is not None:
            self.latencies.append((msg_id, (time.perf_counter() - started) * 1000))
        probe = self.on_arrival.pop(msg_id, None)
        if probe is not None:
            self.back_at.setdefault(probe.id, time.perf_counter())

    def dropped(self, peer: Peer, code: int | None) -> None:
        """A socket closed under a peer (the kill, or anything else: reported by close code)."""
        key = str(code)
        self.drops[key] = self.drops.get(key, 0) + 1

    async def close(self, peers: list[Peer]) -> None:
        self.closing = True
        await asyncio.gather(*(p.ws.close() for p in peers if p.ws is not None), return_exceptions=True)
        for p in peers:
            if p.task is not None:
                p.task.cancel()
        await asyncio.gather(*(p.task for p in peers if p.task is not None), return_exceptions=True)
        await self.session.close()
