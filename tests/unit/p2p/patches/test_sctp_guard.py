"""Hostile SCTP packets (a malformed parameter, a window ignored), without sockets.

- The parser (:mod:`engine.p2p.patches.sctp_guard`): the 20-byte packet whose zero-length parameter
  froze aiortc's ``decode_params``, every chunk type that holds parameters, every fixed-field chunk cut
  short, an INIT bundled with another chunk; each is a :class:`MalformedPacket` (a ``ValueError``), never
  a loop, a ``struct.error`` or an ``AssertionError``. Well-formed packets parse as stock parses them
  (hypothesis), and random bytes with a valid checksum either parse or raise ``ValueError``.
- The receive window (:mod:`engine.p2p.patches.sctp_receiver`): a peer that ignores it cannot grow the
  reassembly past the window or the fragment bound, cannot make more gaps than the horizon allows, and
  gets its link closed; every SACK fits one packet; an honest sender whose data was in flight when the
  window shut loses nothing.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import pytest
from aiortc import rtcsctptransport as sctp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.p2p.errors import ProtocolError
from engine.p2p.patches import registry, sctp_guard, sctp_receiver
from engine.p2p.patches.sctp_guard import MalformedPacket
from engine.p2p.patches.sctp_receiver import MAX_SACK_ENTRIES, sack_blocks
from tests.unit.p2p.sctp_fakes import FakeDtls, sacks

STOCK_PARSE: Any = registry.ORIGINALS["aiortc.rtcsctptransport.parse_packet"]
TAG = 0x1234ABCD
PARAM_CHUNKS = {
    1: "INIT",
    2: "INIT ACK",
    4: "HEARTBEAT",
    5: "HEARTBEAT ACK",
    6: "ABORT",
    9: "ERROR",
    130: "RECONFIG",
}


def packet(tag: int, *chunks: bytes) -> bytes:
    """Raw chunks (type, flags, length, body already in each) in one packet with a valid checksum."""
    body = b"".join(c + b"\x00" * (-len(c) % 4) for c in chunks)
    header = struct.pack("!HHL", 5000, 5000, tag)
    return header + struct.pack("<L", sctp.crc32c(header + b"\x00" * 4 + body)) + body


def chunk(kind: int, body: bytes, flags: int = 0) -> bytes:
    return struct.pack("!BBH", kind, flags, 4 + len(body)) + body


def parse_bounded(data: bytes, seconds: float = 2.0) -> Any:
    """guard.parse_packet in a thread, so that a parser that loops fails the test instead of hanging it."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(sctp_guard.parse_packet(data))
        except BaseException as e:
            out.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"parse_packet did not return within {seconds} s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_the_guard_is_what_aiortc_calls() -> None:
    assert sctp.parse_packet is sctp_guard.parse_packet
    assert sctp.decode_params is sctp_guard.decode_params
    assert sctp_receiver._parse_packet is sctp_guard.parse_packet


def test_the_20_byte_packet_is_dropped_at_once() -> None:
    """An INIT ACK whose body is 16 fixed bytes and one parameter header of length 0 (20 bytes of chunk
    after the common header, the packet that froze aiortc): stock loops forever on it."""
    fixed = struct.pack("!LLHHL", 1, 1 << 20, 8, 8, 7)
    bad = packet(TAG, chunk(2, fixed + struct.pack("!HH", 0x8008, 0)))
    with pytest.raises(MalformedPacket, match="parameter of length 0"):
        parse_bounded(bad)


@pytest.mark.parametrize("kind", sorted(PARAM_CHUNKS))
@pytest.mark.parametrize(
    "params, why",
    [
        (struct.pack("!HH", 1, 0), "length 0"),
        (struct.pack("!HH", 1, 3), "length 3"),
        (struct.pack("!HH", 1, 40) + b"abcd", "length 40"),  # longer than what is left
        (struct.pack("!HH", 1, 8) + b"abcd" + struct.pack("!HH", 2, 0), "length 0"),  # the second one
        (struct.pack("!HH", 1, 4) * (sctp_guard.MAX_PARAMS + 1), "more than"),
    ],
)
def test_bad_parameters_in_every_chunk_that_has_them(kind: int, params: bytes, why: str) -> None:
    fixed = struct.pack("!LLHHL", 1, 1 << 20, 8, 8, 7) if kind in (1, 2) else b""
    with pytest.raises(MalformedPacket, match=why):
        parse_bounded(packet(0 if kind == 1 else TAG, chunk(kind, fixed + params)))


@pytest.mark.parametrize(
    "kind, body, why",
    [
        (0, b"\x00" * 11, "DATA chunk of 15"),
        (3, b"\x00" * 11, "SACK chunk of 15"),
        (3, struct.pack("!LLHH", 1, 1, 2, 0) + b"\x00" * 4, "2 gap blocks"),  # counts past the chunk
        (3, struct.pack("!LLHH", 1, 1, 0xFFFF, 0xFFFF), "65535 gap blocks"),
        (3, struct.pack("!LLHH", 1, 1, 0, 0) + b"\x00" * 4, "0 gap blocks"),  # bytes beyond the counts
        (1, b"\x00" * 15, "INIT chunk of 19"),
        (2, b"\x00" * 8, "INIT chunk of 12"),
        (7, b"\x00" * 3, "SHUTDOWN chunk of 7"),
        (192, b"\x00" * 3, "FORWARD TSN chunk of 7"),
        (192, b"\x00" * 6, "FORWARD TSN chunk of 10"),
        (130, struct.pack("!HH", 13, 4 + 11) + b"\x00" * 11, "parameter 13 of 11"),  # reset request, short
        (130, struct.pack("!HH", 13, 4 + 13) + b"\x00" * 13, "parameter 13 of 13"),  # half a stream id
        (130, struct.pack("!HH", 16, 4 + 4) + b"\x00" * 4, "parameter 16 of 4"),  # response, short
        (130, struct.pack("!HH", 17, 4 + 9) + b"\x00" * 9, "parameter 17 of 9"),  # add streams, long
    ],
)
def test_fixed_fields_cut_short_are_malformed_not_struct_errors(kind: int, body: bytes, why: str) -> None:
    with pytest.raises(MalformedPacket, match=why):
        parse_bounded(packet(TAG, chunk(kind, body)))


def test_init_bundled_with_another_chunk_is_malformed() -> None:
    bundled = packet(0, chunk(1, struct.pack("!LLHHL", 1, 1 << 20, 8, 8, 7)), chunk(10, b"cookie"))
    assert len(STOCK_PARSE(bundled)[3]) == 2  # stock parses it; its _handle_data then asserts one chunk
    with pytest.raises(MalformedPacket, match="INIT bundled"):
        parse_bounded(bundled)


def test_a_bad_checksum_is_still_a_plain_value_error() -> None:
    good = packet(TAG, chunk(0, struct.pack("!LHHL", 1, 1, 0, 53) + b"x", flags=3))
    with pytest.raises(ValueError, match="checksum") as info:
        sctp_guard.parse_packet(good[:8] + b"\x00\x00\x00\x00" + good[12:])
    assert not isinstance(info.value, MalformedPacket)


# --- well-formed packets parse as stock parses them ------------------------------------------------

_params = st.lists(st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=24)), max_size=5)


@st.composite
def well_formed_chunk(draw: Any) -> Any:
    kind = draw(st.sampled_from([0, 3, 4, 6, 9, 7, 192, 10, 11, 130, 200]))
    flags = draw(st.integers(0, 255))
    if kind == 0:
        c: Any = sctp.DataChunk(flags=flags)
        c.tsn, c.stream_id, c.stream_seq, c.protocol = draw(
            st.tuples(*[st.integers(0, m) for m in (2**32 - 1, 0xFFFF, 0xFFFF, 2**32 - 1)])
        )
        c.user_data = draw(st.binary(min_size=1, max_size=64))
        return bytes(c)
    if kind == 3:
        c = sctp.SackChunk(flags=flags)
        c.cumulative_tsn, c.advertised_rwnd = draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))
        c.gaps = draw(st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)), max_size=8))
        c.duplicates = draw(st.lists(st.integers(0, 2**32 - 1), max_size=8))
        return bytes(c)
    if kind in (4, 6, 9):
        c = sctp.CHUNK_TYPES[kind](flags=flags)
        c.params = draw(_params)
        return bytes(c)
    if kind == 130:
        c = sctp.ReconfigChunk(flags=flags)
        n = draw(st.integers(0, 4))
        c.params = [(13, bytes(sctp.StreamResetOutgoingParam(1, 2, 3, list(range(n)))))]
        return bytes(c)
    if kind == 7:
        return chunk(7, struct.pack("!L", draw(st.integers(0, 2**32 - 1))), flags)
    if kind == 192:
        c = sctp.ForwardTsnChunk(flags=flags)
        c.cumulative_tsn = draw(st.integers(0, 2**32 - 1))
        c.streams = draw(st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)), max_size=4))
        return bytes(c)
    return chunk(kind, draw(st.binary(max_size=32)), flags)  # COOKIE ECHO/ACK bodies, an unknown type


def _fields(c: Any) -> tuple[Any, ...]:
    return (type(c).__name__, bytes(c))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(well_formed_chunk(), min_size=1, max_size=4))
def test_well_formed_packets_parse_as_stock(chunks: list[bytes]) -> None:
    data = packet(TAG, *chunks)
    ours, stock = sctp_guard.parse_packet(data), STOCK_PARSE(data)
    assert ours[:3] == stock[:3]
    assert [_fields(c) for c in ours[3]] == [_fields(c) for c in stock[3]]


@settings(max_examples=1500, deadline=None)
@given(st.binary(min_size=4, max_size=200), st.sampled_from([0, 1, 2, 3, 4, 6, 9, 130, 192]))
def test_fuzzed_chunks_parse_or_raise_value_error(body: bytes, kind: int) -> None:
    """Random bodies under every chunk type, with a valid checksum: the parser returns or raises a
    ValueError, in bounded time; whatever it accepts, stock accepts alike."""
    data = packet(TAG, struct.pack("!BBH", kind, 0, 4 + len(body)) + body)
    try:
        ours = parse_bounded(data)
    except ValueError:
        return
    stock = STOCK_PARSE(data)  # it terminates on what we accept: no zero-length parameter got through
    assert [_fields(c) for c in ours[3]] == [_fields(c) for c in stock[3]]


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=0, max_size=300))
def test_random_parameter_lists(body: bytes) -> None:
    try:
        params = sctp_guard.decode_params(body)
    except MalformedPacket:
        return
    assert len(params) <= sctp_guard.MAX_PARAMS
    assert all(len(v) <= len(body) for _, v in params)


# --- the receive window ----------------------------------------------------------------------------


def receiver(base: int = 1000) -> tuple[Any, FakeDtls]:
    d = FakeDtls("server")
    t: Any = sctp.RTCSctpTransport(d)  # type: ignore[arg-type]
    t._remote_port = 5000
    t._local_verification_tag = TAG
    t._association_state = sctp.RTCSctpTransport.State.ESTABLISHED
    t._last_received_tsn = base
    delivered: list[bytes] = []

    async def receive(stream_id: int, pp_id: int, data: bytes) -> None:
        delivered.append(data)

    t._receive = receive
    t.delivered = delivered
    return t, d


def data(tsn: int, flags: int, size: int = 1000, ssn: int = 0) -> bytes:
    c = sctp.DataChunk(flags=flags)
    c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn % 2**32, 1, ssn, 53, b"d" * size
    return sctp.serialize_packet(5000, 5000, TAG, c)


def held(t: Any) -> tuple[int, int]:
    """(fragments, bytes) buffered for reassembly."""
    frags = [c for s in t._inbound_streams.values() for c in s.reassembly]
    return len(frags), sum(len(c.user_data) for c in frags)


def _stop(t: Any) -> None:
    if t._sack_timer is not None:
        t._sack_timer.cancel()


async def test_a_message_that_never_ends_stops_at_the_window_and_the_link_is_closed() -> None:
    t, d = receiver()
    window = t._advertised_rwnd
    await t._handle_data(data(1001, flags=2, size=1100))  # FIRST fragment
    tsn = 1002
    with pytest.raises(ProtocolError, match="ignores the receive window"):
        while tsn < 1002 + window // 1100 + sctp_receiver.ABUSE_LIMIT + 10:
            await t._handle_data(data(tsn, flags=0, size=1100))  # middle fragments, forever
            tsn += 1
    frags, size = held(t)
    assert size <= window + 1100  # one chunk may take the last bytes of the window
    assert frags == size // 1100
    assert t._lah_window_drops == sctp_receiver.ABUSE_LIMIT
    assert all(s.advertised_rwnd >= 0 for s in sacks(d))
    _stop(t)


async def test_tiny_fragments_stop_at_the_fragment_bound() -> None:
    """1-byte fragments would take 4 million before the byte window shut (a few hundred bytes of Python
    each): the fragment room shuts it first."""
    t, _ = receiver()
    await t._handle_data(data(1001, flags=2, size=1))
    with pytest.raises(ProtocolError):
        for tsn in range(1002, 1002 + sctp_receiver.MAX_FRAGMENTS + sctp_receiver.ABUSE_LIMIT + 10):
            await t._handle_data(data(tsn, flags=0, size=1))
    assert held(t)[0] <= sctp_receiver.MAX_FRAGMENTS
    assert t._lah_fragment_room == sctp_receiver.MAX_FRAGMENTS - held(t)[0]
    _stop(t)


async def test_gaps_stop_at_the_horizon_and_every_sack_fits_one_packet() -> None:
    """Every other TSN, far past the window: stock made a gap of each and its SACK overflowed 65,535."""
    t, d = receiver()
    tsn = 1002
    with pytest.raises(ProtocolError):
        while tsn < 1002 + 2 * (70_000):
            await t._handle_data(data(tsn, flags=3, size=20))
            tsn += 2
    assert len(t._sack_misordered) <= sctp_receiver.TSN_HORIZON // 2
    sent = sacks(d)
    assert sent and max(len(s.gaps) + len(s.duplicates) for s in sent) == MAX_SACK_ENTRIES
    assert all(len(bytes(s)) + sctp.SCTP_COMMON_HEADER_LENGTH <= sctp.SCTP_MAX_PACKET_LENGTH for s in sent)
    _stop(t)


async def test_an_honest_sender_in_flight_when_the_window_shut_loses_nothing() -> None:
    """Data sent past a full window is dropped, not kept; sent again once the window opens it is taken,
    and the messages arrive whole and in order, with no ProtocolError."""
    t, d = receiver()
    t._advertised_rwnd = 5 * 1000  # a window of five fragments
    messages = 4  # of three fragments each: 12 fragments, more than the window holds
    first = 1001

    def fragments(m: int) -> list[bytes]:
        base = first + 3 * m
        return [data(base, 2, ssn=m), data(base + 1, 0, ssn=m), data(base + 2, 1, ssn=m)]

    wire = [p for m in range(messages) for p in fragments(m)]
    # Out of order: message 0's last fragment is lost at first, so the others cannot be delivered.
    for i, p in enumerate(wire):
        if i != 2:
            await t._handle_data(p)
    assert t._lah_window_drops > 0
    for _ in range(3):  # the sender resends what the SACKs did not cover, until all is acknowledged
        for p in wire:
            parsed = sctp_guard.parse_packet(p)[3][0]
            if (
                sctp_receiver._uint32_gt(parsed.tsn, t._last_received_tsn)
                and parsed.tsn not in t._sack_misordered
            ):
                await t._handle_data(p)
    assert any(s.advertised_rwnd == 0 for s in sacks(d))  # the sender was told the window shut
    assert t._last_received_tsn == first + 3 * messages - 1
    assert t.delivered == [b"d" * 3000] * messages
    assert held(t) == (0, 0) and t._lah_fragment_room == sctp_receiver.MAX_FRAGMENTS
    _stop(t)


def test_sack_blocks_match_stock_gaps_where_they_fit() -> None:
    last = 100
    misordered = {102, 103, 104, 110, 120, 121}
    assert sack_blocks(last, misordered, [99, 101]) == ([(2, 4), (10, 10), (20, 21)], [99, 101])


def test_sack_blocks_across_the_tsn_wrap() -> None:
    last = 2**32 - 3
    misordered = {2**32 - 1, 0, 1, 4}  # offsets 2, 3, 4 and 7
    assert sack_blocks(last, misordered, []) == ([(2, 4), (7, 7)], [])


def test_sack_blocks_keep_the_lowest_and_fill_one_packet() -> None:
    misordered = set(range(2, 20_000, 2))
    gaps, dups = sack_blocks(0, misordered, list(range(500)))
    assert len(gaps) == MAX_SACK_ENTRIES and gaps[0] == (2, 2) and dups == []
    gaps, dups = sack_blocks(0, {5, 9}, list(range(500)))
    assert len(gaps) + len(dups) == MAX_SACK_ENTRIES and dups[0] == 0
