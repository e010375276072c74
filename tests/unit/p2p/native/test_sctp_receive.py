"""The compiled receiver (``open_receive``, engine/p2p/native/sctp_receive.c) against the Python receiver.

Two patched transports get the same packets: one through ``_handle_data`` (the Python path, the
oracle), one as sealed records through ``open_receive`` and :func:`compiled_sctp.deliver_opened`, as the DTLS
reader hands them over. After every packet the receiver state, the streams' reassembly, the delivered
messages and the SACKs sent must be equal. No sockets: the records are sealed by a second layer.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.p2p.patches import ack_frequency, compiled_sctp, sctp_receiver
from tests.unit.p2p.sctp_fakes import FakeDtls, StockTransport, sacks

try:
    from engine.p2p.native import _records
except ImportError as e:  # the suite must not pass without the thing it tests: build it (make native)
    pytest.fail(f"compiled record layer not built ({e}): run make native", pytrace=False)

TAG = 0x1234ABCD
ESTABLISHED = sctp.RTCSctpTransport.State.ESTABLISHED
_records.receiver_types(sctp.DataChunk, sctp_receiver.FastInboundStream, ESTABLISHED, object.__new__)


def _layers() -> tuple[Any, Any]:
    wk, wi, rk, ri = os.urandom(16), os.urandom(4), os.urandom(16), os.urandom(4)
    return _records.RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, 0, -1), _records.RecordLayer(
        "AES128-GCM", rk, ri, wk, wi, 1, 0, -1
    )


Delivered = list[tuple[int, int, bytes]]


def _receiver(cls: type[Any], base: int, sack_every: int) -> tuple[Any, FakeDtls, Delivered]:
    d = FakeDtls("server")
    t: Any = cls(d)
    t._remote_port = 5000
    t._local_verification_tag = TAG
    t._association_state = ESTABLISHED
    t._last_received_tsn = base
    sdp = f"m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=lah-sack-frequency:{sack_every}\r\n"
    ack_frequency.apply(t, sdp, sdp)
    delivered: Delivered = []

    async def receive(stream_id: int, pp_id: int, data: bytes) -> None:
        delivered.append((stream_id, pp_id, data))

    t._receive = receive
    return t, d, delivered


def _packet(tsn: int, flags: int, stream: int = 1, ssn: int = 0, size: int = 100) -> bytes:
    c = sctp.DataChunk()
    c.flags, c.tsn, c.stream_id, c.stream_seq, c.protocol = flags, tsn % 2**32, stream, ssn, 53
    c.user_data = bytes([tsn % 251]) * size
    return sctp.serialize_packet(5000, 5000, TAG, c)


def _state(t: Any) -> dict[str, Any]:
    streams = {
        sid: ([(c.tsn, c.flags, c.user_data) for c in s.reassembly], s.sequence_number, type(s).__name__)
        for sid, s in t._inbound_streams.items()
    }
    ours = {
        name: getattr(t, name, None)
        for name in (
            "_sack_packets",
            "_sack_urgent",
            "_sack_reported_gaps",
            "_lah_fragment_room",
            "_lah_window_drops",
        )
    }
    return {
        "last": t._last_received_tsn,
        "rwnd": t._advertised_rwnd,
        "needed": t._sack_needed,
        "misordered": sorted(t._sack_misordered),
        "duplicates": list(t._sack_duplicates),
        "waiting": getattr(t, "_sack_due_at", None) is not None,
        "streams": streams,
        **ours,  # the patched receiver's own (a stock transport has none)
    }


def _sack_fields(d: FakeDtls) -> list[tuple[Any, ...]]:
    return [(s.cumulative_tsn, s.advertised_rwnd, s.gaps, s.duplicates) for s in sacks(d)]


async def _run(
    packets: list[bytes],
    base: int,
    sack_every: int,
    cls: Any = sctp.RTCSctpTransport,
    window: int | None = None,
) -> int:
    """Both receivers take ``packets``; returns how many the compiled one took in C."""
    seal, layer = _layers()
    py, py_dtls, py_got = _receiver(cls, base, sack_every)
    c, c_dtls, c_got = _receiver(cls, base, sack_every)
    if window is not None:
        py._advertised_rwnd = c._advertised_rwnd = window
    taken = 0
    try:
        for p in packets:
            await py._handle_data(p)
            opened = layer.open_receive(seal.seal(p), c)
            taken += type(opened) is int
            if opened:
                await compiled_sctp.deliver_opened(c, opened)
            assert _state(c) == _state(py)
            assert c_got == py_got and _sack_fields(c_dtls) == _sack_fields(py_dtls)
    finally:
        for t in (py, c):
            if getattr(t, "_sack_timer", None) is not None:
                t._sack_timer.cancel()
    return taken


def _messages(base: int, sizes: list[int], i_bits: set[int], stream: int = 1) -> list[bytes]:
    """In-order packets of messages of ``sizes`` fragments on one stream; I bits on the given TSNs."""
    out, tsn = [], base
    for ssn, n in enumerate(sizes):
        for k in range(n):
            tsn += 1
            flags = (2 if k == 0 else 0) | (1 if k == n - 1 else 0) | (8 if tsn in i_bits else 0)
            out.append(_packet(tsn, flags, stream, ssn % 65536))
    return out


@pytest.mark.parametrize("sack_every", [2, 16])
@pytest.mark.parametrize("base", [1000, 2**32 - 40])
async def test_in_order_fragments_are_taken_in_c_to_the_same_effect(base: int, sack_every: int) -> None:
    packets = _messages(base, [1, 40, 3, 17, 2], i_bits={base + 9, base + 44})
    taken = await _run(packets, base, sack_every)
    assert taken == len(packets) - 5  # every fragment but the 5 last ones (the first makes the stream)


async def test_a_full_window_is_left_to_python_which_drops_alike() -> None:
    """A message that never ends (a peer ignoring the receive window): the C path takes fragments while
    the window has room, counting the fragment room as Python does, and none once it is shut, so Python
    drops them."""
    packets = _messages(100, [60], set())[:-1]  # never the LAST fragment
    taken = await _run(packets, 100, 2, window=20 * 100)
    assert taken == 19  # the first fragment made the stream (Python), 19 more filled the window in C


async def test_a_stock_stream_or_transport_is_never_taken() -> None:
    assert await _run(_messages(7, [30], set()), 7, 2, cls=StockTransport) == 0


@st.composite
def _sequences(draw: Any) -> tuple[int, list[bytes], int]:
    base = draw(st.sampled_from([5, 2**32 - 30]))
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    packets = _messages(base, sizes, set(draw(st.sets(st.integers(base + 1, base + 80), max_size=6))))
    packets += _messages(base + len(packets), [3], set(), stream=2)  # a second stream
    op = st.tuples(st.sampled_from(["swap", "dup", "drop"]), st.integers(0, len(packets) - 1))
    ops = draw(st.lists(op))
    for op, i in ops:  # reorder, duplicate, lose: the gaps and duplicates the Python path must take
        if op == "swap" and i + 1 < len(packets):
            packets[i], packets[i + 1] = packets[i + 1], packets[i]
        elif op == "dup":
            packets.insert(i, packets[i])
        elif op == "drop" and len(packets) > 1:
            packets.append(packets.pop(i))  # arrives last
    return base, packets, draw(st.sampled_from([2, 4, 16]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_sequences())
def test_any_sequence_leaves_both_receivers_alike(case: tuple[int, list[bytes], int]) -> None:
    base, packets, sack_every = case
    asyncio.run(_run(packets, base, sack_every))


async def test_not_taken_outside_the_common_case() -> None:
    seal, layer = _layers()
    t, _, _ = _receiver(sctp.RTCSctpTransport, 100, 16)
    await t._handle_data(_packet(101, 2))  # the stream exists now
    t._association_state = sctp.RTCSctpTransport.State.SHUTDOWN_PENDING
    assert type(layer.open_receive(seal.seal(_packet(102, 0)), t)) is tuple
    t._association_state = ESTABLISHED
    t._reconfig_deferred = object()
    assert type(layer.open_receive(seal.seal(_packet(102, 0)), t)) is tuple
    t._reconfig_deferred = None
    del t._lah_sack_every  # not the transport this path knows: Python takes the packet, no error
    assert type(layer.open_receive(seal.seal(_packet(102, 0)), t)) is tuple
    assert t._last_received_tsn == 101  # untouched by a packet C did not take
    t._lah_sack_every = 16
    assert layer.open_receive(seal.seal(_packet(102, 0)), t) == 0  # taken; the SACK's timer runs already
    t._sack_timer.cancel()
    t._sack_timer = t._sack_due_at = None
    t._sack_packets = 0
    assert layer.open_receive(seal.seal(_packet(103, 0)), t) == 2  # taken; a SACK waits: arm its timer
    assert t._last_received_tsn == 103 and t._sack_packets == 1
    for tsn in range(104, 118):
        assert layer.open_receive(seal.seal(_packet(tsn, 0)), t) == 2  # (nobody armed it)
    assert layer.open_receive(seal.seal(_packet(118, 0)), t) == 1  # the 16th packet: SACK now
    new_stream = layer.open_receive(seal.seal(_packet(119, 0, stream=3)), t)
    assert new_stream == (0, 119, 3, 0, 53, bytes([119]) * 100)  # parsed, left to Python
    other_tag = sctp.serialize_packet(5000, 5000, TAG + 1, sctp.DataChunk())
    assert type(layer.open_receive(seal.seal(other_tag), t)) is bytes


async def test_bad_arguments_are_errors_not_crashes() -> None:
    seal, layer = _layers()
    record = seal.seal(_packet(1, 3))
    with pytest.raises(TypeError, match="SCTP transport"):
        layer.open_receive(record, object())
    with pytest.raises(TypeError):
        layer.open_receive(record)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        layer.open_receive("text", StockTransport(FakeDtls("server")))  # type: ignore[arg-type]
    t, _, _ = _receiver(sctp.RTCSctpTransport, 0, 16)
    t._local_verification_tag = -1
    with pytest.raises(OverflowError):
        layer.open_receive(record, t)
