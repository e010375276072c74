"""Which ICE servers a new connection gathers candidates from: live ones, found within a deadline.

aiortc uses only the first STUN and the first TURN URL it is given, and aioice then waits up to 5 s
for them while gathering, on every connection: one dead server (the first of several configured, or
a TURN server that is down) made every connection wait 5 s, and a dead first STUN server hid the live
ones behind it. So before a connection is made, every STUN URL and every TURN URL over UDP is probed
(a STUN Binding request; for TURN an unauthenticated Allocate, which any TURN server answers, with a
401) concurrently, for at most ``deadline`` seconds; aiortc is then given the first live STUN URL and
only live TURN servers. Results are cached for ``ttl`` seconds (a dead server is probed again after
``retry_dead``; a failed connection forgets them all), so a burst of connections pays one probe: one
round trip while every server answers, ``deadline`` once when one is dead. TURN over TCP or TLS is
passed through unprobed. Nothing here raises: a server that cannot be resolved or answered is dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aioice import stun
from aiortc.rtcicetransport import parse_stun_turn_uri

from .signaling_protocol import IceServer

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE = 1.5
_UDP_TRANSPORT = 0x11000000  # REQUESTED-TRANSPORT: UDP (RFC 8656)


class _Probe(asyncio.DatagramProtocol):
    def __init__(self, transaction_id: bytes) -> None:
        self.transaction_id = transaction_id
        self.answered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        with contextlib.suppress(ValueError):
            if stun.parse_message(data).transaction_id == self.transaction_id and not self.answered.done():
                self.answered.set_result(True)

    def error_received(self, exc: Exception) -> None:  # ICMP port unreachable: nobody there
        if not self.answered.done():
            self.answered.set_result(False)


async def answers(host: str, port: int, *, turn: bool, timeout: float) -> bool:
    """Whether a STUN (or TURN) server at ``host:port`` answers a request over UDP within ``timeout``."""
    loop = asyncio.get_running_loop()
    transport: asyncio.DatagramTransport | None = None
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM)
            method = stun.Method.ALLOCATE if turn else stun.Method.BINDING
            request = stun.Message(message_method=method, message_class=stun.Class.REQUEST)
            if turn:
                request.attributes["REQUESTED-TRANSPORT"] = _UDP_TRANSPORT
            probe = _Probe(request.transaction_id)
            address = (str(infos[0][4][0]), int(infos[0][4][1]))
            transport, _ = await loop.create_datagram_endpoint(lambda: probe, remote_addr=address)
            delay = 0.1
            while True:  # retransmit, doubling, until an answer or the deadline
                transport.sendto(bytes(request))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        return await asyncio.shield(probe.answered)
                delay *= 2
    except (TimeoutError, OSError, IndexError):
        return False
    finally:
        if transport is not None:
            transport.close()


@dataclass
class IceServerProbe:
    """Caches which servers answer; shared by every connection of a process (one node)."""

    deadline: float = DEFAULT_DEADLINE
    ttl: float = 10.0
    retry_dead: float = 30.0
    _known: dict[tuple[str, int, bool], tuple[bool, float]] = field(default_factory=dict)
    _probing: dict[tuple[str, int, bool], asyncio.Future[bool]] = field(default_factory=dict)
    probes: int = 0

    async def alive(self, host: str, port: int, turn: bool) -> bool:
        key = (host, port, turn)
        known = self._known.get(key)
        now = time.monotonic()
        if known is not None and now - known[1] < (self.ttl if known[0] else self.retry_dead):
            return known[0]
        running = self._probing.get(key)
        if running is None:
            running = asyncio.ensure_future(answers(host, port, turn=turn, timeout=self.deadline))
            self._probing[key] = running
            self.probes += 1
            try:
                result = await asyncio.shield(running)
            finally:
                self._probing.pop(key, None)
            self._known[key] = (result, time.monotonic())
            if not result:
                logger.info(
                    "%s server %s:%d does not answer; skipped", "TURN" if turn else "STUN", host, port
                )
            return result
        return await asyncio.shield(running)

    def forget(self) -> None:
        """Probe every server again next time (a connection failed: what answered may be gone)."""
        self._known.clear()

    async def usable(self, servers: Sequence[IceServer]) -> list[IceServer]:
        """The first live STUN URL and the live TURN URLs of ``servers`` (TCP/TLS TURN as given)."""
        checks: list[tuple[IceServer, str, asyncio.Future[bool] | None]] = []
        for server in servers:
            for url in server.urls:
                try:
                    parsed = parse_stun_turn_uri(url)
                except ValueError:
                    logger.warning("ignoring an ICE server URL that does not parse: %r", url)
                    continue
                scheme, transport = parsed["scheme"], parsed.get("transport")
                if scheme == "stun" or (scheme == "turn" and transport == "udp"):
                    check = asyncio.ensure_future(
                        self.alive(parsed["host"], parsed["port"], scheme == "turn")
                    )
                    checks.append((server, url, check))
                elif scheme in ("turn", "turns"):
                    checks.append((server, url, None))
        results = await asyncio.gather(*(check for _, _, check in checks if check is not None))
        alive = iter(results)
        chosen: list[IceServer] = []
        have_stun = False
        for server, url, probed in checks:
            live = True if probed is None else next(alive)
            if not live or (url.startswith("stun") and have_stun):
                continue
            have_stun = have_stun or url.startswith("stun")
            chosen.append(IceServer(urls=[url], username=server.username, credential=server.credential))
        return chosen


DEFAULT_PROBE = IceServerProbe()
