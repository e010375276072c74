"""The compiled record layer's own sends (``seal_send``, ``send_data_chunks``), over real UDP sockets on
loopback only.

Not tested here: the EAGAIN/ENOBUFS path that hands the record back. Loopback UDP does not report a
full buffer (the kernel drops at the receiver instead), so it cannot be provoked without a fake socket.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

try:
    from engine.p2p.native import _records
except ImportError as e:  # the suite must not pass without the thing it tests: build it (make native)
    pytest.fail(f"compiled record layer not built ({e}): run make native", pytrace=False)

pytestmark = pytest.mark.integration


def _layers(cipher: str = "AES128-GCM") -> tuple[_records.RecordLayer, _records.RecordLayer]:
    key_len, iv_len = (32, 12) if cipher == "CHACHA20-POLY1305" else (16, 4)
    wk, wi, rk, ri = os.urandom(key_len), os.urandom(iv_len), os.urandom(key_len), os.urandom(iv_len)
    return (
        _records.RecordLayer(cipher, wk, wi, rk, ri, 1, 0, -1),
        _records.RecordLayer(cipher, rk, ri, wk, wi, 1, 0, -1),
    )


@pytest.fixture
def udp4() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    tx.setblocking(False)
    yield tx, rx
    tx.close()
    rx.close()


def _ipv6_pair() -> tuple[socket.socket, socket.socket]:
    if not socket.has_ipv6:
        pytest.skip("Python was built without IPv6")
    try:
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    except OSError as e:
        pytest.skip(f"the OS has no IPv6: {e}")
    try:
        rx.bind(("::1", 0))
    except OSError as e:  # a kernel booted with ipv6.disable=1, or no ::1 on lo (some containers)
        rx.close()
        pytest.skip(f"no IPv6 loopback (::1) here: {e}")
    return socket.socket(socket.AF_INET6, socket.SOCK_DGRAM), rx


@pytest.mark.parametrize("cipher", ["AES128-GCM", "CHACHA20-POLY1305"])
def test_records_sent_over_ipv4_open_on_the_other_side(
    cipher: str, udp4: tuple[socket.socket, socket.socket]
) -> None:
    tx, rx = udp4
    a, b = _layers(cipher)
    a.set_destination(tx.fileno(), "127.0.0.1", rx.getsockname()[1])
    payloads = [os.urandom(1189) for _ in range(100)]
    got = []
    for p in payloads:  # one at a time: a full buffer would hand the record back, not lose it
        assert a.seal_send(memoryview(p)) is None
        datagram, sender = rx.recvfrom(2048)
        assert sender == tx.getsockname()  # sent from the caller's socket, not one of its own
        got.append(b.open(datagram))
    assert got == payloads and a.sealed == 100 and a.write_seq == 100 and b.opened == 100


def test_records_sent_over_ipv6_open_on_the_other_side() -> None:
    tx, rx = _ipv6_pair()
    try:
        tx.setblocking(False)
        rx.settimeout(5)
        a, b = _layers()
        a.set_destination(tx.fileno(), "::1", rx.getsockname()[1])
        payloads = [os.urandom(1189) for _ in range(100)]
        got = []
        for p in payloads:
            assert a.seal_send(p) is None
            got.append(b.open(rx.recv(2048)))
        assert got == payloads and b.opened == 100
    finally:
        tx.close()
        rx.close()


def test_seal_send_and_seal_share_one_sequence(udp4: tuple[socket.socket, socket.socket]) -> None:
    tx, rx = udp4
    a, b = _layers()
    a.set_destination(tx.fileno(), "127.0.0.1", rx.getsockname()[1])
    assert a.seal_send(b"one", 23) is None
    alert = a.seal(b"\x01\x00", 21)  # a close_notify the caller sends itself
    assert a.seal_send(b"three") is None
    assert b.open(rx.recv(2048)) == b"one"
    assert alert[0] == 21 and alert[5:11] == (1).to_bytes(6, "big") and b.open(alert) is None
    assert b.open(rx.recv(2048)) == b"three" and b.read_seq_top == 2


def test_bad_destinations_are_valueerrors_and_keep_the_last_good_one(
    udp4: tuple[socket.socket, socket.socket],
) -> None:
    tx, rx = udp4
    a, b = _layers()
    port = rx.getsockname()[1]
    a.set_destination(tx.fileno(), "127.0.0.1", port)
    for host in ("not an address", "localhost", "256.1.1.1", "127.0.0.1%lo", "::g", "fe80::1%", "", "1.2.3"):
        with pytest.raises(ValueError):
            a.set_destination(tx.fileno(), host, port)
    for bad_port in (0, -1, 65536):
        with pytest.raises(ValueError):
            a.set_destination(tx.fileno(), "127.0.0.1", bad_port)
    with pytest.raises(ValueError):
        a.set_destination(-1, "127.0.0.1", port)
    assert a.seal_send(b"still there") is None
    assert b.open(rx.recv(2048)) == b"still there"


def test_seal_send_without_a_destination_spends_nothing() -> None:
    a, _ = _layers()
    with pytest.raises(RuntimeError, match="destination"):
        a.seal_send(b"x")
    assert a.write_seq == 0 and a.sealed == 0


def test_a_closed_socket_is_an_oserror() -> None:
    a, _ = _layers()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.set_destination(s.fileno(), "127.0.0.1", 9)
    s.close()  # the layer does not own the fd: it neither closes it nor notices it closed
    with pytest.raises(OSError):
        a.seal_send(b"x")
    assert a.write_seq == 1  # the record's sequence number is spent: it never repeats


def test_sctp_packets_sent_in_one_call_arrive_as_aiortc_would_have_written_them() -> None:
    """send_data_chunk/send_packet: packet, record and sendto in one call; the peer opens the record
    and aiortc's parse_packet (CRC checked) reads the chunk back."""
    from aiortc.rtcsctptransport import DataChunk, SackChunk, parse_packet, serialize_packet

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setblocking(False)
    a, b = _layers()
    a.set_destination(tx.fileno(), "127.0.0.1", rx.getsockname()[1])
    try:
        for n in (0, 1, 3, 1172):
            data = os.urandom(n)
            assert a.send_data_chunk(5000, 5000, 0xCAFE, 3, 100 + n, 1, 2, 51, data) is None
            chunk = DataChunk(flags=3)
            chunk.tsn, chunk.stream_id, chunk.stream_seq = 100 + n, 1, 2
            chunk.protocol, chunk.user_data = 51, data
            plain = b.open(rx.recv(2048))
            assert plain == serialize_packet(5000, 5000, 0xCAFE, chunk)
            assert parse_packet(plain)[3][0].user_data == data
        sack = SackChunk()
        sack.cumulative_tsn, sack.advertised_rwnd = 5, 1 << 20
        assert a.send_packet(5000, 5000, 0xCAFE, bytes(sack)) is None
        assert b.open(rx.recv(2048)) == serialize_packet(5000, 5000, 0xCAFE, sack)
        assert a.write_seq == 5 and b.opened == 5
    finally:
        tx.close()
        rx.close()


def _chunk(tsn: int, data: bytes, flags: int = 3, ssn: int = 2) -> Any:
    from aiortc.rtcsctptransport import DataChunk

    chunk = DataChunk(flags=flags)
    chunk.tsn, chunk.stream_id, chunk.stream_seq, chunk.protocol, chunk.user_data = tsn, 1, ssn, 51, data
    return chunk


@pytest.fixture
def burst_pair(udp4: tuple[socket.socket, socket.socket]) -> Iterator[tuple[Any, Any, socket.socket]]:
    tx, rx = udp4
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # a whole burst waits in it
    a, b = _layers()
    a.set_destination(tx.fileno(), "127.0.0.1", rx.getsockname()[1])
    yield a, b, rx


@pytest.mark.parametrize("count", [1, 16, 64, 150])
def test_a_burst_arrives_in_order_as_one_call_each_would_have_sent_it(
    count: int, burst_pair: tuple[Any, Any, socket.socket]
) -> None:
    """send_data_chunks: the packets send_data_chunk would have sent for each chunk, in order, across
    sendmmsg batches (64 packets, 64 KiB) when the burst is longer; counts returned for the caller."""
    a, b, rx = burst_pair
    last = count - 1  # the last carries the I bit, as a sender's last before waiting does
    chunks = [_chunk(7 + i, os.urandom(1200 - i % 5), flags=3 | 8 * (i == last)) for i in range(count)]
    packets, packet_bytes, unsent = a.send_data_chunks(5000, 5001, 0xCAFE, chunks)
    expected = [
        _records.data_packet(5000, 5001, 0xCAFE, c.flags, c.tsn, 1, 2, 51, c.user_data) for c in chunks
    ]
    got = [b.open(rx.recv(2048)) for _ in chunks]
    assert got == expected and unsent is None
    assert packets == count and packet_bytes == sum(map(len, expected)) and a.write_seq == count


def test_an_empty_burst_sends_nothing(burst_pair: tuple[Any, Any, socket.socket]) -> None:
    a, _, _ = burst_pair
    assert a.send_data_chunks(5000, 5000, 1, []) == (0, 0, None) and a.write_seq == 0


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"tsn": 1 << 32}, ValueError),
        ({"stream_seq": -1}, OverflowError),
        ({"flags": 256}, ValueError),
        ({"user_data": "text"}, TypeError),
        ({"user_data": bytes(16_400)}, ValueError),
        ({"protocol": None}, TypeError),
    ],
)
def test_a_bad_chunk_raises_after_the_ones_before_it_went(
    bad: dict[str, Any], error: type[Exception], burst_pair: tuple[Any, Any, socket.socket]
) -> None:
    a, b, rx = burst_pair
    chunks = [_chunk(1 + i, os.urandom(100)) for i in range(5)]
    for name, value in bad.items():
        setattr(chunks[3], name, value)
    with pytest.raises(error):
        a.send_data_chunks(5000, 5000, 1, chunks)
    assert [b.open(rx.recv(2048))[12:] for _ in range(3)] == [bytes(c) for c in chunks[:3]]
    assert a.write_seq == 3  # nothing sealed for the bad chunk or after it
    rx.settimeout(0.2)
    with pytest.raises(TimeoutError):
        rx.recv(2048)


def test_burst_arguments_are_checked(burst_pair: tuple[Any, Any, socket.socket]) -> None:
    a, _, _ = burst_pair
    with pytest.raises(TypeError):
        a.send_data_chunks(5000, 5000, 1, (_chunk(1, b"x"),))  # a list, not any sequence
    with pytest.raises(ValueError, match="16 bits"):
        a.send_data_chunks(70000, 5000, 1, [_chunk(1, b"x")])
    nowhere, _ = _layers()
    with pytest.raises(RuntimeError, match="destination"):
        nowhere.send_data_chunks(5000, 5000, 1, [_chunk(1, b"x")])
    assert a.write_seq == 0 and nowhere.write_seq == 0
