"""Tail latency of a call whose last packet is lost: in memory, ours vs stock aiortc (for wan.py).

Two SCTP associations joined by an in-memory path with a fixed one-way delay: a 64 KiB request whose
last DATA packet is dropped, then a 1-byte reply; the round trip is timed from send to reply. Our sender
repairs the tail with its loss probe; stock aiortc waits for its retransmission timer (>= 1 s).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from aiortc import rtcsctptransport as sctp
from aiortc.rtcdatachannel import RTCDataChannel, RTCDataChannelParameters

from engine.p2p import patches
from engine.p2p.patches import ack_frequency
from tests.unit.p2p.sctp_fakes import FakeDtls, StockTransport


async def _one_side(cls: Any, n: int, one_way: float) -> list[float]:
    drop_next_last = [False]

    def drop(data: bytes) -> bool:
        if not drop_next_last[0]:
            return False
        for c in sctp.parse_packet(data)[3]:
            if isinstance(c, sctp.DataChunk) and c.flags & sctp.SCTP_DATA_LAST_FRAG and len(c.user_data) > 1:
                drop_next_last[0] = False
                return True
        return False

    da, db = FakeDtls("client", one_way), FakeDtls("server", one_way)
    da.peer, db.peer = db, da
    da.drop = drop
    a: Any = cls(da)
    b: Any = cls(db)
    # As two nodes' links run: both descriptions ask for fewer SACKs (a no-op on stock transports).
    sdp = ack_frequency.advertise("m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n")
    for t in (a, b):
        ack_frequency.apply(t, sdp, sdp)
    replies: asyncio.Queue[bytes] = asyncio.Queue()

    @b.on("datachannel")
    def _on_channel(channel: Any) -> None:
        channel.on("message", lambda m: channel.send(b"k"))

    await a.start(b.getCapabilities(), 5000)
    await b.start(a.getCapabilities(), 5000)
    times = []
    try:
        async with asyncio.timeout(30 + n * 5):
            while a.state != "connected" or b.state != "connected":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            ch = RTCDataChannel(a, RTCDataChannelParameters(label="rpc"))
            ch.on("message", replies.put_nowait)
            while ch.readyState != "open":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            for i in range(n + 3):
                drop_next_last[0] = i >= 3  # three clean calls first: an RTT estimate
                t0 = time.monotonic()
                ch.send(b"q" * 65536)
                await replies.get()
                if i >= 3:
                    times.append((time.monotonic() - t0) * 1000)
                await asyncio.sleep(0.05)
    finally:
        await a.stop()
        await b.stop()
    return times


def _p99(xs: list[float]) -> float:
    return round(statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else xs[0], 1)


async def tail_call_times(n: int, one_way: float) -> dict[str, float]:
    patches.install(strict=True)
    ours = await _one_side(sctp.RTCSctpTransport, n, one_way)
    stock = await _one_side(StockTransport, max(5, n // 4), one_way)
    return {
        "ours_p50_ms": round(statistics.median(ours), 1),
        "ours_p99_ms": _p99(ours),
        "stock_p50_ms": round(statistics.median(stock), 1),
        "stock_p99_ms": _p99(stock),
    }
