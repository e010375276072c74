"""SCTP packets built in C (engine/p2p/native/sctp_packet.c) against aiortc's ``serialize_packet``.

The compiled send path must put on the wire exactly the bytes the Python path would: the same common
header, CRC32c and DATA chunk padding. aiortc's ``parse_packet`` (which checks the CRC) reads them back.
"""

from __future__ import annotations

import os

import pytest
from aiortc.rtcsctptransport import DataChunk, HeartbeatChunk, SackChunk, parse_packet, serialize_packet
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from engine.p2p.native import _records
except ImportError as e:  # the suite must not pass without the thing it tests: build it (make native)
    pytest.fail(f"compiled record layer not built ({e}): run make native", pytrace=False)

u16, u32 = st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF)


@settings(max_examples=300, deadline=None)
@given(u16, u16, u32, st.integers(0, 255), u32, u16, u16, u32, st.binary(max_size=1300))
def test_a_data_packet_is_aiortcs(
    src: int, dst: int, vtag: int, flags: int, tsn: int, sid: int, ssn: int, ppid: int, data: bytes
) -> None:
    chunk = DataChunk(flags=flags)
    chunk.tsn, chunk.stream_id, chunk.stream_seq, chunk.protocol, chunk.user_data = tsn, sid, ssn, ppid, data
    built = _records.data_packet(src, dst, vtag, flags, tsn, sid, ssn, ppid, data)
    assert built == serialize_packet(src, dst, vtag, chunk)
    _, _, tag, (back,) = parse_packet(built)  # raises on a wrong checksum
    assert tag == vtag and back.user_data == data and back.tsn == tsn


def test_other_chunks_are_aiortcs() -> None:
    sack = SackChunk()
    sack.cumulative_tsn, sack.advertised_rwnd, sack.gaps, sack.duplicates = 77, 4 << 20, [(2, 5), (9, 9)], [3]
    beat = HeartbeatChunk()
    beat.params = [(1, os.urandom(37))]
    for chunk in (sack, beat):
        expected = serialize_packet(5000, 5000, 0xDEADBEEF, chunk)
        assert _records.packet(5000, 5000, 0xDEADBEEF, bytes(chunk)) == expected


def test_the_largest_data_chunk_and_one_byte_more() -> None:
    most = 16384 - 12 - 16 - 3  # padded to 16,372 bytes of chunk: a 16,384-byte packet, one record
    assert len(_records.data_packet(1, 2, 3, 0, 0, 0, 0, 0, bytes(most))) == 16384
    with pytest.raises(ValueError, match="at most"):
        _records.data_packet(1, 2, 3, 0, 0, 0, 0, 0, bytes(most + 1))
    with pytest.raises(ValueError, match="at most"):
        _records.packet(1, 2, 3, bytes(16384 - 11))


@pytest.mark.parametrize(
    "fields",
    [(1 << 16, 2, 3, 0, 0, 0, 0, 0), (1, 2, 1 << 32, 0, 0, 0, 0, 0), (1, 2, 3, 256, 0, 0, 0, 0),
     (1, 2, 3, 0, 1 << 32, 0, 0, 0), (1, 2, 3, 0, 0, 1 << 16, 0, 0), (1, 2, 3, 0, 0, 0, 0, 1 << 32)],
)
def test_fields_out_of_range_are_clear_errors(fields: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"out of range|16 bits"):
        _records.data_packet(*fields, b"x")


def test_send_without_a_destination_is_refused() -> None:
    key, iv = bytes(16), bytes(4)
    layer = _records.RecordLayer("AES128-GCM", key, iv, key, iv, 1, 0, -1)
    with pytest.raises(RuntimeError, match="destination"):
        layer.send_data_chunk(1, 2, 3, 0, 0, 0, 0, 0, b"x")
    with pytest.raises(RuntimeError, match="destination"):
        layer.send_packet(1, 2, 3, b"x")
    assert layer.write_seq == 0  # nothing was sealed


def _link() -> tuple[_records.RecordLayer, _records.RecordLayer]:
    wk, wi, rk, ri = os.urandom(16), os.urandom(4), os.urandom(16), os.urandom(4)
    return (
        _records.RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, 0, -1),
        _records.RecordLayer("AES128-GCM", rk, ri, wk, wi, 1, 0, -1),
    )


def test_open_data_parses_the_receivers_common_case() -> None:
    a, b = _link()
    for n in (0, 1, 2, 3, 4, 1172):
        data = os.urandom(n)
        packet = _records.data_packet(5000, 5000, 0xCAFE, 3, 0xFFFFFFFF, 65535, 7, 51, data)
        assert b.open_data(a.seal(packet), 0xCAFE) == (3, 0xFFFFFFFF, 65535, 7, 51, data)


def test_open_data_hands_every_other_packet_to_aiortc() -> None:
    a, b = _link()
    data_packet = _records.data_packet(5000, 5000, 0xCAFE, 3, 1, 0, 0, 51, b"abc")
    sack = SackChunk()
    sack.cumulative_tsn, sack.advertised_rwnd = 1, 1 << 20
    chunk = DataChunk(flags=3)
    chunk.user_data = b"abc"
    two = serialize_packet(5000, 5000, 0xCAFE, chunk)
    two = two[:8] + bytes(4) + two[12:] + bytes(sack)  # a bundle: DATA then SACK, checksum redone below
    two = _records.packet(5000, 5000, 0xCAFE, two[12:])
    long_says = bytearray(data_packet)
    long_says[14:16] = (0xFFF).to_bytes(2, "big")  # the chunk claims more than the packet holds
    long_says = _records.packet(5000, 5000, 0xCAFE, bytes(long_says[12:]))
    beat = HeartbeatChunk()
    beat.params = [(1, b"x" * 9)]
    for packet in (
        _records.packet(5000, 5000, 0xCAFE, bytes(beat)),  # neither DATA nor SACK
        two,  # more than one chunk
        long_says,
        bytes(11),  # shorter than the common header
    ):
        assert b.open_data(a.seal(packet), 0xCAFE) == packet
    assert b.open_data(a.seal(data_packet), 0xBEEF) == data_packet  # another association's tag
    assert b.dropped_crc == 0


def test_open_data_drops_a_wrong_checksum_and_counts_it() -> None:
    a, b = _link()
    packet = bytearray(_records.data_packet(5000, 5000, 0xCAFE, 3, 1, 0, 0, 51, b"abc"))
    packet[-4] ^= 1
    assert b.open_data(a.seal(bytes(packet)), 0xCAFE) == b""
    assert b.dropped_crc == 1
    assert b.open_data(b"not a record", 0xCAFE) is None  # OpenSSL's, as open() says


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1400), u32)
def test_open_data_never_raises_on_sealed_noise(noise: bytes, tag: int) -> None:
    a, b = _link()
    got = b.open_data(a.seal(noise), tag)
    assert got in (noise, b"") or (isinstance(got, tuple) and len(got) == 6)


@settings(max_examples=200, deadline=None)
@given(u32, u32, st.lists(st.tuples(u16, u16), max_size=20), st.lists(u32, max_size=20))
def test_open_data_parses_a_sack_as_aiortc_does(
    cum: int, rwnd: int, gaps: list[tuple[int, int]], dups: list[int]
) -> None:
    a, b = _link()
    sack = SackChunk()
    sack.cumulative_tsn, sack.advertised_rwnd, sack.gaps, sack.duplicates = cum, rwnd, gaps, dups
    packet = serialize_packet(5000, 5000, 0xCAFE, sack)
    (theirs,) = parse_packet(packet)[3]
    assert b.open_data(a.seal(packet), 0xCAFE) == (
        theirs.cumulative_tsn, theirs.advertised_rwnd, theirs.gaps, theirs.duplicates
    )


def test_a_sack_whose_counts_disagree_with_its_length_is_left_to_aiortc() -> None:
    a, b = _link()
    sack = SackChunk()
    sack.cumulative_tsn, sack.advertised_rwnd, sack.gaps = 1, 2, [(3, 4)]
    body = bytearray(bytes(sack))
    body[13] = 2  # two gaps announced, one there
    packet = _records.packet(5000, 5000, 0xCAFE, bytes(body))
    assert b.open_data(a.seal(packet), 0xCAFE) == packet
