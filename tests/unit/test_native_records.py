"""The compiled DTLS 1.2 record layer (engine/p2p/native/_records.c) against records built by hand.

The reference is the RFC's record layout with ``cryptography``'s AEADs (RFC 6347 4.1, RFC 5288 for
AES-GCM with OpenSSL's explicit nonce = epoch || sequence number, RFC 7905 for ChaCha20-Poly1305); the
integration tests add stock OpenSSL on the other end (tests/integration/test_dtls_fast_path.py).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.p2p import native

_records: Any = native.records()
if _records is None:  # the suite must not pass without the thing it tests: build it (make native)
    pytest.fail(f"compiled record layer not built: {native.status()}", pytrace=False)
RecordLayer = _records.RecordLayer

CIPHERS = {"AES128-GCM": (16, 4), "AES256-GCM": (32, 4), "CHACHA20-POLY1305": (32, 12)}


def _keys(cipher: str) -> tuple[bytes, bytes, bytes, bytes]:
    key_len, iv_len = CIPHERS[cipher]
    return os.urandom(key_len), os.urandom(iv_len), os.urandom(key_len), os.urandom(iv_len)


def _pair(cipher: str, epoch: int = 1, seq: int = 0) -> tuple[Any, Any, tuple[bytes, bytes, bytes, bytes]]:
    wk, wi, rk, ri = k = _keys(cipher)
    a = RecordLayer(cipher, wk, wi, rk, ri, epoch, seq, -1)
    b = RecordLayer(cipher, rk, ri, wk, wi, epoch, 0, -1)
    return a, b, k


def _reference(cipher: str, key: bytes, iv: bytes, epoch: int, seq: int, ctype: int, payload: bytes) -> bytes:
    es = struct.pack("!H", epoch) + seq.to_bytes(6, "big")
    aad = es + bytes([ctype, 0xFE, 0xFD]) + struct.pack("!H", len(payload))
    if cipher == "CHACHA20-POLY1305":
        nonce = bytes(a ^ b for a, b in zip(iv, bytes(4) + es, strict=True))
        body = ChaCha20Poly1305(key).encrypt(nonce, payload, aad)
    else:
        body = es + AESGCM(key).encrypt(iv + es, payload, aad)
    return bytes([ctype, 0xFE, 0xFD]) + es + struct.pack("!H", len(body)) + body


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
@pytest.mark.parametrize(("epoch", "seq"), [(1, 0), (1, 5), (2, 1 << 32), (65535, (1 << 48) - 2)])
@pytest.mark.parametrize("size", [0, 1, 1189, 16384])
def test_seal_is_the_rfc_record(cipher: str, epoch: int, seq: int, size: int) -> None:
    wk, wi, rk, ri = _keys(cipher)
    layer = RecordLayer(cipher, wk, wi, rk, ri, epoch, seq, -1)
    payload = os.urandom(size)
    for ctype in (23, 21):
        assert layer.seal(payload, ctype) == _reference(cipher, wk, wi, epoch, seq, ctype, payload)
        seq += 1
        assert layer.write_seq == seq
    assert layer.sealed == 2 and layer.cipher == cipher


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_open_what_the_peer_sealed(cipher: str) -> None:
    a, b, _ = _pair(cipher)
    payloads = [os.urandom(n) for n in (0, 1, 100, 1189, 16384)]
    for p in payloads:
        assert b.open(a.seal(p)) == p
    assert b.open(bytearray(a.seal(b"x"))) == b"x" and b.open(memoryview(a.seal(b"y"))) == b"y"
    assert b.opened == len(payloads) + 2 and b.read_seq_top == len(payloads) + 1


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_a_changed_byte_is_a_forgery_and_moves_nothing(cipher: str) -> None:
    a, b, _ = _pair(cipher)
    record = a.seal(os.urandom(300))
    dropped = 0
    for i in list(range(5, 11)) + list(range(13, len(record))):  # sequence number, nonce, body, tag
        forged = bytearray(record)
        forged[i] ^= 0x40
        assert b.open(bytes(forged)) == b"", i
        dropped += 1
    assert b.dropped_auth == dropped and b.read_seq_top == -1 and b.opened == 0
    assert b.open(record) != b""  # the window did not move: the real one still opens


def test_header_fields_that_make_a_record_someone_elses() -> None:
    a, b, _ = _pair("AES128-GCM")
    record = a.seal(b"payload")
    other_epoch = RecordLayer("AES128-GCM", *_keys("AES128-GCM"), 2, 0, -1).seal(b"x")
    for not_mine in (
        b"",
        record[:12],
        bytes([22]) + record[1:],  # handshake
        bytes([21]) + record[1:],  # alert
        record[:1] + b"\xfe\xff" + record[3:],  # DTLS 1.0
        other_epoch,
        record + b"\x00",  # trailing byte
        record + record,  # two records in one datagram
        record[:11] + b"\x00\x05" + record[13:],  # length says less than there is
    ):
        assert b.open(not_mine) is None
    assert b.opened == b.dropped_auth == b.dropped_replay == 0


def test_too_short_for_a_nonce_and_tag() -> None:
    a, b, _ = _pair("AES128-GCM")
    header = a.seal(b"")[:11]
    assert b.open(header + b"\x00\x10" + bytes(16)) == b""  # 16 < explicit nonce 8 + tag 16
    assert b.dropped_short == 1


def test_replays_and_the_window() -> None:
    a, b, _ = _pair("AES128-GCM")
    records = [a.seal(bytes([i])) for i in range(200)]
    assert b.open(records[100]) == bytes([100])
    assert b.open(records[100]) == b""  # the same record again
    assert b.open(records[37]) == bytes([37])  # 63 behind the top: the window's oldest slot, new
    assert b.open(records[36]) == b""  # 64 behind: older than the window
    assert b.open(records[99]) == bytes([99])  # late but new: accepted once
    assert b.open(records[99]) == b""
    assert b.open(records[150]) == bytes([150]) and b.open(records[100]) == b""
    assert b.open(records[120]) == bytes([120])
    assert b.open(records[86]) == b""  # 64 behind the new top
    assert b.dropped_replay == 5 and b.read_seq_top == 150


def test_a_start_top_marks_everything_up_to_it_as_seen() -> None:
    wk, wi, rk, ri = _keys("AES128-GCM")
    sender = RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, 0, -1)
    records = [sender.seal(bytes([i])) for i in range(12)]
    b = RecordLayer("AES128-GCM", rk, ri, wk, wi, 1, 0, 9)  # OpenSSL opened up to 9
    assert [b.open(r) for r in records] == [b""] * 10 + [b"\x0a", b"\x0b"]
    assert b.dropped_replay == 10


def test_seal_refuses_what_dtls_cannot_carry() -> None:
    wk, wi, rk, ri = _keys("AES128-GCM")
    layer = RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, (1 << 48) - 1, -1)
    with pytest.raises(ValueError, match="16384"):
        layer.seal(bytes(16385))
    layer.seal(b"the last one")
    with pytest.raises(OverflowError):
        layer.seal(b"one too many")


@pytest.mark.parametrize(
    "args",
    [
        ("AES128-CBC", 16, 4, 1, 0, -1),
        ("AES128-GCM", 32, 4, 1, 0, -1),
        ("AES128-GCM", 16, 12, 1, 0, -1),
        ("CHACHA20-POLY1305", 32, 4, 1, 0, -1),
        ("AES128-GCM", 16, 4, 65536, 0, -1),
        ("AES128-GCM", 16, 4, 1, 1 << 48, -1),
        ("AES128-GCM", 16, 4, 1, -1, -1),
        ("AES128-GCM", 16, 4, 1, 0, -2),
    ],
)
def test_bad_construction_is_a_clear_error(args: tuple[Any, ...]) -> None:
    cipher, key_len, iv_len, epoch, seq, top = args
    key, iv = bytes(key_len), bytes(iv_len)
    with pytest.raises(ValueError):
        RecordLayer(cipher, key, iv, key, iv, epoch, seq, top)


def test_seal_send_without_a_destination() -> None:
    a, _, _ = _pair("AES128-GCM")
    with pytest.raises(RuntimeError, match="destination"):
        a.seal_send(b"x")
    for host in ("not an address", "256.1.1.1", "::g"):
        with pytest.raises(ValueError):
            a.set_destination(0, host, 1)
    with pytest.raises(ValueError):
        a.set_destination(0, "127.0.0.1", 70000)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1500))
def test_open_never_raises_on_noise(data: bytes) -> None:
    _, b, _ = _pair("AES128-GCM")
    assert b.open(data) in (None, b"")
    # the same noise behind a header that makes it this layer's record
    framed = bytes([23, 0xFE, 0xFD, 0, 1]) + bytes(6) + struct.pack("!H", len(data)) + data
    assert b.open(framed) == b""


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_open_never_raises_on_a_mutated_record(data: st.DataObject) -> None:
    a, b, _ = _pair(data.draw(st.sampled_from(sorted(CIPHERS))))
    record = bytearray(a.seal(data.draw(st.binary(max_size=200))))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(record) - 1))
        record[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(record)))
    assert b.open(bytes(record[:cut])) in (None, b"") or cut == len(record)
