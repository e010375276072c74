"""The SCTP patches' per-packet shortcuts, each against stock aiortc as the oracle.

- ``_handle_data`` dispatching DATA/SACK directly: the same receiver state as stock after every packet of
  a hostile sequence (wrong tags, INIT with our tag, garbage, truncation, duplicates, unknown chunks).
- ``_receive_data_chunk`` without the deferred-reset coroutine: a deferred stream reset still completes
  when its last TSN arrives, as with stock.
- The lazy T3 timer, on a fake loop clock: it expires at the latest restart plus the RTO of that moment,
  as stock's cancel-and-create timer does, with one timer armed instead of one per restart.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp

from tests.unit.p2p.sctp_fakes import FakeDtls, StockTransport


def _established(cls: type[Any], base_tsn: int, tag: int = 0x1234ABCD) -> tuple[Any, FakeDtls]:
    dtls = FakeDtls("server")
    t: Any = cls(dtls)
    t._remote_port = 5000
    t._local_verification_tag = tag
    t._association_state = sctp.RTCSctpTransport.State.ESTABLISHED
    t._last_received_tsn = base_tsn
    t.rwnd0 = t._advertised_rwnd  # patched and stock advertise different windows: compare changes
    return t, dtls


def _data(tsn: int, stream: int = 1, flags: int = 3, size: int = 100) -> sctp.DataChunk:
    c = sctp.DataChunk()
    c.flags = flags
    c.tsn = tsn % 2**32
    c.stream_id = stream
    c.protocol = 53
    c.user_data = bytes([tsn % 256]) * size
    return c


def _packet(tag: int, *chunks: Any) -> bytes:
    """Chunks bundled into one packet with a valid checksum (serialize_packet takes only one)."""
    body = b"".join(bytes(c) + b"\x00" * (-len(bytes(c)) % 4) for c in chunks)
    header = struct.pack("!HHL", 5000, 5000, tag)
    checksum = sctp.crc32c(header + b"\x00\x00\x00\x00" + body)
    return header + struct.pack("<L", checksum) + body


def _hostile_sequence(tag: int, base: int) -> list[bytes]:
    rng = random.Random(5)
    init = sctp.InitChunk()
    init.initiate_tag, init.advertised_rwnd, init.outbound_streams, init.inbound_streams = 1, 1 << 20, 8, 8
    init.initial_tsn = 7
    unknown = sctp.Chunk(flags=0, body=b"abcd")
    unknown.type = 200  # an unrecognised chunk type
    good = _packet(tag, _data(base + 1))
    packets = [
        good,
        _packet(tag ^ 1, _data(base + 2)),  # another association's tag: dropped
        _packet(tag, init),  # INIT with our tag: stock drops it (INIT must carry tag 0)
        _packet(0, init),  # INIT with tag 0: stock handles it (answers with INIT ACK)
        good[:20],  # truncated
        rng.randbytes(64),  # garbage (bad checksum)
        good[:8] + b"\x00\x00\x00\x00" + good[12:],  # checksum zeroed
        _packet(tag, _data(base + 3), _data(base + 2)),  # out of order, two chunks in one packet
        _packet(tag, _data(base + 2)),  # duplicate
        _packet(tag, _data(base + 5), unknown),  # gap, with an unknown chunk bundled
        _packet(tag, _data(base + 4, flags=2), _data(base + 6, stream=2, flags=1)),  # fragments
        _packet(tag, _data(base + 7, stream=2, flags=0)),
        _packet(tag, _data(base + 8, stream=2, flags=2)),  # completes the fragmented message
    ]
    return packets


def _state(t: Any) -> tuple[Any, ...]:
    return (
        t._last_received_tsn,
        sorted(t._sack_misordered),
        sorted(t._sack_duplicates),
        t._advertised_rwnd - t.rwnd0,
        sorted(t._inbound_streams),
        t._association_state,
    )


@pytest.mark.parametrize("base", [100, 2**32 - 4])
async def test_handle_data_matches_stock_on_hostile_packets(base: int) -> None:
    tag = 0x1234ABCD
    patched, pd = _established(sctp.RTCSctpTransport, base, tag)
    stock, sd = _established(StockTransport, base, tag)
    assert type(patched)._handle_data is not StockTransport._handle_data  # the patch is what runs
    got: list[list[tuple[int, int, bytes]]] = [[], []]
    for i, t in enumerate((patched, stock)):
        t._receive = _recorder(got[i])
    for packet in _hostile_sequence(tag, base):
        for t in (patched, stock):
            await t._handle_data(packet)
        assert _state(patched) == _state(stock), packet[:16].hex()
    assert got[0] == got[1] and got[0]  # same messages delivered, in the same order
    for dtls in (pd, sd):  # both answered the tag-0 INIT alike (INIT ACK), whatever else they sent
        kinds = [c.type for p in dtls.sent for c in sctp.parse_packet(p)[3]]
        assert 2 in kinds
    if patched._sack_timer is not None:
        patched._sack_timer.cancel()


def _recorder(out: list[tuple[int, int, bytes]]) -> Any:
    async def _receive(stream_id: int, pp_id: int, data: bytes) -> None:
        out.append((stream_id, pp_id, data))

    return _receive


async def test_deferred_stream_reset_completes_like_stock() -> None:
    results = []
    for cls in (sctp.RTCSctpTransport, StockTransport):
        t, dtls = _established(cls, 500)
        t._receive = _recorder([])
        await t._handle_data(_packet(t._local_verification_tag, _data(501)))
        t._inbound_streams.setdefault(1, t._get_inbound_stream(1))
        request = sctp.StreamResetOutgoingParam(
            request_sequence=9, response_sequence=0, last_tsn=503, streams=[1]
        )
        await t._receive_reconfig_param(request)
        assert t._reconfig_deferred is request  # 502 and 503 are still owed
        await t._handle_data(_packet(t._local_verification_tag, _data(502)))
        assert t._reconfig_deferred is request
        await t._handle_data(_packet(t._local_verification_tag, _data(503)))
        reconfigs = [
            c for p in dtls.sent for c in sctp.parse_packet(p)[3] if isinstance(c, sctp.ReconfigChunk)
        ]
        results.append((t._reconfig_deferred, 1 in t._inbound_streams, len(reconfigs)))
        if getattr(t, "_sack_timer", None) is not None:
            t._sack_timer.cancel()
    assert results[0] == results[1]  # answered alike ("in progress", then "performed")
    assert results[0][:2] == (None, False) and results[0][2] >= 1


# --- lazy T3 -------------------------------------------------------------------------------------


class _Handle:
    def __init__(self, loop: _Loop, when: float, callback: Any, args: tuple[Any, ...]) -> None:
        self._when, self.callback, self.args, self.cancelled, self.loop = when, callback, args, False, loop

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """A clock the test moves by hand; timers fire only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> _Handle:
        h = _Handle(self, when, callback, args)
        self.handles.append(h)
        return h

    def call_later(self, delay: float, callback: Any, *args: Any) -> _Handle:
        return self.call_at(self.now + delay, callback, *args)

    def run_until(self, t: float) -> None:
        """Fire, in time order, every live timer due by ``t`` (timers they arm included)."""
        while True:
            due = [h for h in self.handles if not h.cancelled and h.when() <= t]
            if not due:
                break
            h = min(due, key=_Handle.when)
            self.handles.remove(h)
            self.now = max(self.now, h.when())
            h.callback(*h.args)
        self.now = t


def _timer_transport(cls: type[Any]) -> tuple[Any, _Loop, list[float]]:
    t, _ = _established(cls, 0)
    loop = _Loop()
    t._loop = loop
    t._rto = 1.0
    fired: list[float] = []
    t._t3_expired = lambda: (fired.append(loop.now), setattr(t, "_t3_handle", None))
    return t, loop, fired


@pytest.mark.parametrize(
    "script",
    [
        [("start", 0.0)],
        [("start", 0.0), ("restart", 0.4), ("restart", 0.9)],  # restarts push the expiry out
        [("start", 0.0), ("rto", 0.2), ("restart", 0.5)],  # the RTO shrank: fires earlier than armed
        [("start", 0.0), ("restart", 0.3), ("cancel", 0.6), ("start", 2.0), ("restart", 2.5)],
        [("restart", 0.1), ("rto", 3.0), ("restart", 0.7)],  # restart with nothing armed starts it
    ],
)
async def test_lazy_t3_expires_when_stock_would(script: list[tuple[str, float]]) -> None:
    expiries = []
    for cls in (sctp.RTCSctpTransport, StockTransport):
        t, loop, fired = _timer_transport(cls)
        for op, at in script:
            if op == "rto":
                t._rto = at
                continue
            loop.run_until(at)
            {"start": t._t3_start, "restart": t._t3_restart, "cancel": t._t3_cancel}[op]()
        loop.run_until(20.0)
        expiries.append(fired)
    assert len(expiries[0]) == 1
    assert expiries[0] == pytest.approx(expiries[1])


async def test_lazy_t3_keeps_one_timer_across_restarts() -> None:
    t, loop, fired = _timer_transport(sctp.RTCSctpTransport)
    t._t3_start()
    for i in range(1, 200):
        loop.run_until(i * 0.01)
        t._t3_restart()
    assert len(loop.handles) == 1  # stock would have created 200 timers and cancelled 199
    loop.run_until(1.5)
    assert fired == [] and len(loop.handles) == 1  # re-armed once, for the rest of the RTO
    loop.run_until(2.99)
    assert fired == [pytest.approx(2.99)]  # the last restart (1.99) plus the RTO
    assert t._t3_handle is None
