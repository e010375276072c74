"""In-memory SCTP associations for tests: two RTCSctpTransports joined by a fake DTLS pair.

No sockets: packets go from one transport's ``_send_data`` to the other's ``_handle_data``, after an
optional one-way delay and loss. :class:`StockTransport` is aiortc 1.16.0's transport exactly as shipped
(every patched method put back), so one process can run a patched peer against a stock one.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from typing import Any

from aiortc import rtcsctptransport as sctp
from aiortc.rtcdatachannel import RTCDataChannel, RTCDataChannelParameters

from engine.p2p.patches import ack_frequency, registry

_StockInbound: Any = registry.ORIGINALS["aiortc.rtcsctptransport.InboundStream"]


class StockTransport(sctp.RTCSctpTransport):
    """The stock transport (the oracle peer): every replaced method is the original again."""

    def _get_inbound_stream(self, stream_id: int) -> Any:
        if stream_id not in self._inbound_streams:
            self._inbound_streams[stream_id] = _StockInbound()
        return self._inbound_streams[stream_id]


for _p in registry.PATCHES:
    _prefix = "aiortc.rtcsctptransport.RTCSctpTransport."
    if _p.replacement is not None and _p.name.startswith(_prefix):
        setattr(StockTransport, _p.name[len(_prefix) :], registry.ORIGINALS[_p.name])


class FakeDtls:
    """Just enough of RTCDtlsTransport for RTCSctpTransport: records or forwards packets."""

    def __init__(self, role: str, delay: float = 0.0) -> None:
        self.state = "connected"
        self._role = role
        self.delay = delay
        self.sent: list[bytes] = []
        self.dropped: list[bytes] = []
        self.peer: FakeDtls | None = None
        self.receiver: Any = None
        self.drop: Callable[[bytes], bool] = lambda data: False
        self.duplicate: Callable[[bytes], bool] = lambda data: False
        self._tasks: set[asyncio.Future[Any]] = set()

    def _register_data_receiver(self, receiver: Any) -> None:
        self.receiver = receiver

    def _unregister_data_receiver(self, receiver: Any) -> None:
        self.receiver = None

    def _deliver(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.receiver is not None:
            task = asyncio.ensure_future(peer.receiver._handle_data(data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_data(self, data: bytes) -> None:
        self.sent.append(data)
        if self.drop(data):
            self.dropped.append(data)
            return
        for _ in range(2 if self.duplicate(data) else 1):
            if self.delay:
                asyncio.get_running_loop().call_later(self.delay, self._deliver, data)
            else:
                self._deliver(data)


def established(base_tsn: int, sack_every: int | None = None) -> tuple[Any, FakeDtls]:
    """A patched receiver in ESTABLISHED whose last TSN is ``base_tsn``; with ``sack_every``, agreed to
    SACK every that many packets (as two descriptions asking for it would make it)."""
    dtls = FakeDtls("server")
    t: Any = sctp.RTCSctpTransport(dtls)  # type: ignore[arg-type]
    t._remote_port = 5000
    t._association_state = sctp.RTCSctpTransport.State.ESTABLISHED
    t._last_received_tsn = base_tsn
    if sack_every is not None:
        ack_frequency.apply(t, _sdp(sack_every), _sdp(sack_every))
    return t, dtls


def data_packet(t: Any, tsn: int, flags: int = 3) -> bytes:
    """One DATA chunk of 100 bytes on stream 1, as a packet to ``t``."""
    c = sctp.DataChunk()
    c.flags = flags
    c.tsn = tsn
    c.stream_id = 1
    c.protocol = 53
    c.user_data = b"x" * 100
    return sctp.serialize_packet(5000, 5000, t._local_verification_tag, c)


def _sdp(sack_every: int | None) -> str:
    """The application section of a description, with the SACK-frequency attribute or without."""
    sdp = "v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=sctp-port:5000\r\n"
    return sdp if sack_every is None else sdp + f"a={ack_frequency.ATTRIBUTE}:{sack_every}\r\n"


def data_tsns(packets: list[bytes]) -> list[int]:
    return [c.tsn for p in packets for c in sctp.parse_packet(p)[3] if isinstance(c, sctp.DataChunk)]


def retransmitted(dtls: FakeDtls) -> int:
    """DATA chunks sent more than once (sent minus distinct TSNs)."""
    tsns = data_tsns(dtls.sent)
    return len(tsns) - len(set(tsns))


def sacks(dtls: FakeDtls) -> list[sctp.SackChunk]:
    out = []
    for packet in dtls.sent:
        out += [c for c in sctp.parse_packet(packet)[3] if isinstance(c, sctp.SackChunk)]
    return out


async def run_pair(
    *,
    loss: float = 0.0,
    n: int = 40,
    size: int = 50_000,
    ordered: bool = True,
    delay: float = 0.0,
    sender_cls: type[Any] = sctp.RTCSctpTransport,
    receiver_cls: type[Any] = sctp.RTCSctpTransport,
    seed: int = 11,
    data_loss_only: bool = False,
    duplicate: float = 0.0,
    timeout: float = 60.0,
    sack_every: int | None = None,
    agree_on: str = "both",
    measure: list[float] | None = None,
) -> tuple[list[bytes], list[bytes], Any, FakeDtls]:
    """Send ``n`` random messages a -> b; returns (sent, received, sender transport, sender's dtls).

    ``sack_every``: each patched side (``agree_on``: "both", or only the "sender") asks for a SACK every
    that many packets in its description, as ``ack_frequency.advertise`` would, and each side applies
    what the two descriptions agree. ``measure``: gets the seconds from the first send until the
    sender's last chunk was acknowledged."""
    rng = random.Random(seed)
    da, db = FakeDtls("client", delay), FakeDtls("server", delay)
    da.peer, db.peer = db, da
    da.drop = lambda data: data[12] == 0 and rng.random() < loss  # DATA packets a -> b
    db.drop = lambda data: not data_loss_only and rng.random() < loss
    da.duplicate = lambda data: rng.random() < duplicate
    a: Any = sender_cls(da)
    b: Any = receiver_cls(db)
    received: list[bytes] = []
    done = asyncio.Event()

    @b.on("datachannel")
    def _on_channel(channel: Any) -> None:
        @channel.on("message")
        def _on_message(message: bytes) -> None:
            received.append(message)
            if len(received) == n:
                done.set()

    if sack_every is not None:
        asks = {"both": (a, b), "sender": (a,)}[agree_on]
        sdps = [_sdp(sack_every if t in asks and hasattr(t, "_lah_sack_every") else None) for t in (a, b)]
        ack_frequency.apply(a, sdps[0], sdps[1])
        ack_frequency.apply(b, sdps[1], sdps[0])
    await a.start(b.getCapabilities(), 5000)
    await b.start(a.getCapabilities(), 5000)
    try:
        async with asyncio.timeout(timeout):
            while a.state != "connected" or b.state != "connected":
                await asyncio.sleep(0.01)
            channel = RTCDataChannel(a, RTCDataChannelParameters(label="t", ordered=ordered))
            while channel.readyState != "open":
                await asyncio.sleep(0.01)
            sent = [os.urandom(rng.randrange(1, size)) for _ in range(n)]
            if measure is not None:  # fixed sizes, and the channel's opening SACKed (by its timer)
                sent = [os.urandom(size) for _ in range(n)]
                await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            for message in sent:
                channel.send(message)
            await done.wait()
            if measure is not None:
                while a._sent_queue or a._outbound_queue:
                    await asyncio.sleep(0.0005)
                measure.append(asyncio.get_running_loop().time() - started)
    finally:
        await a.stop()
        await b.stop()
    return sent, received, a, da
