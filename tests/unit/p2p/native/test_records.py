"""The compiled DTLS 1.2 record layer (engine/p2p/native/dtls_record.c) against records built by hand.

The reference is the RFC's record layout with ``cryptography``'s AEADs (RFC 6347 4.1, RFC 5288 for
AES-GCM with OpenSSL's explicit nonce = epoch || sequence number, RFC 7905 for ChaCha20-Poly1305); the
integration tests add stock OpenSSL on the other end (tests/integration/test_dtls_fast_path.py) and real
sockets (tests/integration/test_native_records_socket.py). No sockets here.
"""

from __future__ import annotations

import os
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from engine.p2p.native import _records
except ImportError as e:  # the suite must not pass without the thing it tests: build it (make native)
    pytest.fail(f"compiled record layer not built ({e}): run make native", pytrace=False)

RecordLayer = _records.RecordLayer
CIPHERS = {"AES128-GCM": (16, 4), "AES256-GCM": (32, 4), "CHACHA20-POLY1305": (32, 12)}
Keys = tuple[bytes, bytes, bytes, bytes]


def _keys(cipher: str) -> Keys:
    key_len, iv_len = CIPHERS[cipher]
    return os.urandom(key_len), os.urandom(iv_len), os.urandom(key_len), os.urandom(iv_len)


def _pair(
    cipher: str, epoch: int = 1, seq: int = 0
) -> tuple[_records.RecordLayer, _records.RecordLayer, Keys]:
    """A sender and its peer: the same keys, write and read swapped."""
    wk, wi, rk, ri = k = _keys(cipher)
    a = RecordLayer(cipher, wk, wi, rk, ri, epoch, seq, -1)
    b = RecordLayer(cipher, rk, ri, wk, wi, epoch, 0, -1)
    return a, b, k


def _reference(cipher: str, key: bytes, iv: bytes, epoch: int, seq: int, ctype: int, payload: bytes) -> bytes:
    """The record as RFC 6347 + RFC 5288 / RFC 7905 spell it, with cryptography's AEADs."""
    es = struct.pack("!H", epoch) + seq.to_bytes(6, "big")
    aad = es + bytes([ctype, 0xFE, 0xFD]) + struct.pack("!H", len(payload))
    if cipher == "CHACHA20-POLY1305":
        nonce = bytes(a ^ b for a, b in zip(iv, bytes(4) + es, strict=True))
        body = ChaCha20Poly1305(key).encrypt(nonce, payload, aad)
    else:
        body = es + AESGCM(key).encrypt(iv + es, payload, aad)
    return bytes([ctype, 0xFE, 0xFD]) + es + struct.pack("!H", len(body)) + body


def test_module_surface() -> None:
    assert _records.__version__ == "1"
    assert "OpenSSL" in _records.openssl_version()
    assert _records.__doc__ and "OpenSSL" in _records.__doc__
    for doc in (RecordLayer.__doc__, RecordLayer.seal.__doc__, RecordLayer.open.__doc__):
        assert doc and len(doc) > 60


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
@pytest.mark.parametrize(("epoch", "seq"), [(0, 0), (1, 5), (2, 1 << 32), (65535, (1 << 48) - 2)])
@pytest.mark.parametrize("size", [0, 1, 1189, 16384])
def test_seal_is_the_rfc_record(cipher: str, epoch: int, seq: int, size: int) -> None:
    wk, wi, rk, ri = _keys(cipher)
    layer = RecordLayer(cipher, wk, wi, rk, ri, epoch, seq, -1)
    payload = os.urandom(size)
    assert layer.seal(payload) == _reference(cipher, wk, wi, epoch, seq, 23, payload)
    assert layer.write_seq == seq + 1
    assert layer.seal(bytearray(payload), 21) == _reference(cipher, wk, wi, epoch, seq + 1, 21, payload)
    assert layer.write_seq == seq + 2
    assert layer.sealed == 2 and layer.cipher == cipher


def test_seal_takes_any_buffer_and_keywords() -> None:
    wk, wi, rk, ri = _keys("AES128-GCM")
    layer = RecordLayer("AES128-GCM", wk, wi, rk, ri, epoch=3, write_seq=7, read_seq_top=-1)
    data = bytearray(b"..payload..")
    assert layer.seal(memoryview(data)[2:-2], content_type=21) == _reference(
        "AES128-GCM", wk, wi, 3, 7, 21, b"payload"
    )
    assert layer.seal(payload=b"x") == _reference("AES128-GCM", wk, wi, 3, 8, 23, b"x")
    with pytest.raises(TypeError):
        layer.seal("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        layer.seal()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        layer.seal(b"x", 23, payload=b"y")  # type: ignore[misc]
    for bad_type in (-1, 256):
        with pytest.raises(ValueError, match="content_type"):
            layer.seal(b"x", bad_type)
    assert layer.write_seq == 9  # failed calls spend no sequence number


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_open_what_the_peer_sealed(cipher: str) -> None:
    a, b, _ = _pair(cipher)
    payloads = [os.urandom(n) for n in (0, 1, 100, 1189, 16384)]
    for p in payloads:
        assert b.open(a.seal(p)) == p
    assert b.open(bytearray(a.seal(b"x"))) == b"x" and b.open(memoryview(a.seal(b"y"))) == b"y"
    assert b.opened == len(payloads) + 2 and b.read_seq_top == len(payloads) + 1
    assert b.dropped_auth == b.dropped_replay == b.dropped_short == 0


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_open_a_hand_built_record(cipher: str) -> None:
    """Not only our own seal: a record any RFC-conforming stack writes, at an arbitrary epoch/seq."""
    wk, wi, rk, ri = _keys(cipher)
    b = RecordLayer(cipher, rk, ri, wk, wi, 7, 0, -1)
    payload = os.urandom(1189)
    assert b.open(_reference(cipher, wk, wi, 7, 123456789, 23, payload)) == payload
    assert b.read_seq_top == 123456789


def test_gcm_takes_the_senders_explicit_nonce() -> None:
    """RFC 5288 lets the sender choose the explicit nonce; OpenSSL uses epoch || seq, others may not."""
    wk, wi, rk, ri = _keys("AES128-GCM")
    b = RecordLayer("AES128-GCM", rk, ri, wk, wi, 1, 0, -1)
    es, explicit = b"\x00\x01" + (5).to_bytes(6, "big"), os.urandom(8)
    aad = es + b"\x17\xfe\xfd" + struct.pack("!H", 3)
    body = explicit + AESGCM(wk).encrypt(wi + explicit, b"abc", aad)
    assert b.open(b"\x17\xfe\xfd" + es + struct.pack("!H", len(body)) + body) == b"abc"


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
def test_a_changed_byte_is_a_forgery_and_moves_nothing(cipher: str) -> None:
    a, b, _ = _pair(cipher)
    payload = os.urandom(300)
    record = a.seal(payload)
    dropped = 0
    # sequence number (5..10), explicit nonce (GCM), ciphertext, tag; type/version/epoch/length: below
    for i in list(range(5, 11)) + list(range(13, len(record))):
        for flip in (0x01, 0x80):
            forged = bytearray(record)
            forged[i] ^= flip
            assert b.open(bytes(forged)) == b"", i
            dropped += 1
    assert b.dropped_auth == dropped and b.read_seq_top == -1 and b.opened == 0
    assert b.open(record) == payload  # the window did not move: the real one still opens


def test_a_forged_record_far_ahead_does_not_slide_the_window() -> None:
    a, b, _ = _pair("CHACHA20-POLY1305")
    records = [a.seal(bytes([i % 256])) for i in range(600)]
    assert b.open(records[10]) == b"\x0a"
    forged = bytearray(records[500])
    forged[-1] ^= 1
    assert b.open(bytes(forged)) == b""
    assert b.read_seq_top == 10 and b.dropped_auth == 1 and b.dropped_replay == 0
    assert b.open(records[5]) == b"\x05"  # had the top moved to 500, 5 would be too old
    assert b.open(records[500]) == bytes([500 % 256])  # and the real 500 was never marked seen


def test_header_fields_that_make_a_record_someone_elses() -> None:
    a, b, _ = _pair("AES128-GCM")
    record = a.seal(b"payload")
    other_epoch = RecordLayer("AES128-GCM", *_keys("AES128-GCM"), 2, 0, -1).seal(b"x")
    for not_mine in (
        b"",
        record[:1],
        record[:12],
        record[:13],  # a header whose length says 31 bytes follow
        bytes([22]) + record[1:],  # handshake
        bytes([21]) + record[1:],  # alert
        bytes([20]) + record[1:],  # change_cipher_spec
        record[:1] + b"\xfe\xff" + record[3:],  # DTLS 1.0
        record[:1] + b"\x03\x03" + record[3:],  # TLS 1.2
        other_epoch,
        record[:3] + b"\x00\x00" + record[5:],  # epoch 0
        record + b"\x00",  # trailing byte
        record + record,  # two records in one datagram
        record[:-1],  # one byte missing
        record[:11] + b"\x00\x05" + record[13:],  # length says less than there is
        record[:11] + b"\xff\xff" + record[13:],  # and more
    ):
        assert b.open(not_mine) is None, not_mine[:16]
    assert b.opened == b.dropped_auth == b.dropped_replay == b.dropped_short == 0


@pytest.mark.parametrize(("cipher", "minimum"), [("AES128-GCM", 24), ("CHACHA20-POLY1305", 16)])
def test_too_short_for_a_nonce_and_tag(cipher: str, minimum: int) -> None:
    a, b, _ = _pair(cipher)
    header = a.seal(b"")[:11]
    for n in range(minimum):
        assert b.open(header + struct.pack("!H", n) + bytes(n)) == b""
    assert b.dropped_short == minimum and b.dropped_auth == 0
    assert b.open(header + struct.pack("!H", minimum) + bytes(minimum)) == b""  # long enough: a forgery
    assert b.dropped_short == minimum and b.dropped_auth == 1


@pytest.mark.parametrize("cipher", sorted(CIPHERS))
@pytest.mark.parametrize("size", [16385, 20000, 65535 - 24])
def test_an_authentic_but_overlong_record_is_dropped(cipher: str, size: int) -> None:
    """No conforming peer seals more than 2**14 bytes (RFC 5246 6.2.3); it must not reach memory sized
    for that limit either (this once overflowed the layer's buffer)."""
    wk, wi, rk, ri = _keys(cipher)
    b = RecordLayer(cipher, rk, ri, wk, wi, 1, 0, -1)
    record = _reference(cipher, wk, wi, 1, 0, 23, os.urandom(size))
    assert len(record) <= 65535 + 13
    assert b.open(record) == b"" and b.dropped_auth == 1 and b.read_seq_top == -1
    exact = os.urandom(16384)
    assert b.open(_reference(cipher, wk, wi, 1, 1, 23, exact)) == exact


def test_replays_and_the_window() -> None:
    a, b, _ = _pair("AES128-GCM")
    records = [a.seal(bytes([i])) for i in range(200)]
    assert b.open(records[100]) == bytes([100])
    assert b.open(records[100]) == b""  # the same record again
    assert b.open(records[37]) == bytes([37])  # 63 behind the top: the window's oldest slot, new
    assert b.open(records[36]) == b""  # 64 behind: older than the window
    assert b.open(records[0]) == b""
    assert b.open(records[99]) == bytes([99])  # late but new: accepted once
    assert b.open(records[99]) == b""
    assert b.open(records[150]) == bytes([150]) and b.open(records[100]) == b""
    assert b.open(records[120]) == bytes([120])
    assert b.open(records[87]) == bytes([87])  # 63 behind the new top, never seen
    assert b.open(records[86]) == b""  # 64 behind the new top
    assert b.open(records[199]) == bytes([199])  # a jump wider than the window
    assert b.open(records[150]) == b"" and b.open(records[140]) == bytes([140])
    assert b.dropped_replay == 7 and b.read_seq_top == 199 and b.opened == 8


def test_out_of_order_within_the_window_each_once() -> None:
    a, b, _ = _pair("AES256-GCM")
    records = [a.seal(bytes([i])) for i in range(64)]
    order = list(range(63, -1, -1))  # newest first: every older one is still inside the window
    assert [b.open(records[i]) for i in order] == [bytes([i]) for i in order]
    assert [b.open(records[i]) for i in order] == [b""] * 64
    assert b.opened == 64 and b.dropped_replay == 64 and b.read_seq_top == 63


@pytest.mark.parametrize("top", [0, 9, 63, 64, 1000])
def test_a_start_top_marks_everything_up_to_it_as_seen(top: int) -> None:
    wk, wi, rk, ri = _keys("AES128-GCM")
    sender = RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, 0, -1)
    records = [sender.seal(i.to_bytes(2, "big")) for i in range(top + 3)]
    b = RecordLayer("AES128-GCM", rk, ri, wk, wi, 1, 0, top)  # OpenSSL opened up to top
    assert b.read_seq_top == top
    assert [b.open(r) for r in records] == [b""] * (top + 1) + [
        i.to_bytes(2, "big") for i in range(top + 1, top + 3)
    ]
    assert b.dropped_replay == top + 1 and b.read_seq_top == top + 2


def test_seal_refuses_what_dtls_cannot_carry() -> None:
    wk, wi, rk, ri = _keys("AES128-GCM")
    layer = RecordLayer("AES128-GCM", wk, wi, rk, ri, 1, (1 << 48) - 1, -1)
    with pytest.raises(ValueError, match="16384"):
        layer.seal(bytes(16385))
    assert layer.write_seq == (1 << 48) - 1
    assert layer.seal(b"the last one") == _reference(
        "AES128-GCM", wk, wi, 1, (1 << 48) - 1, 23, b"the last one"
    )
    for _ in range(2):
        with pytest.raises(OverflowError):
            layer.seal(b"one too many")
    assert layer.sealed == 1


@pytest.mark.parametrize(
    "args",
    [
        ("AES128-CBC", 16, 4, 1, 0, -1),
        ("aes128-gcm", 16, 4, 1, 0, -1),
        ("", 16, 4, 1, 0, -1),
        ("AES128-GCM", 32, 4, 1, 0, -1),
        ("AES128-GCM", 16, 12, 1, 0, -1),
        ("AES256-GCM", 16, 4, 1, 0, -1),
        ("CHACHA20-POLY1305", 32, 4, 1, 0, -1),
        ("CHACHA20-POLY1305", 16, 12, 1, 0, -1),
        ("AES128-GCM", 16, 4, -1, 0, -1),
        ("AES128-GCM", 16, 4, 65536, 0, -1),
        ("AES128-GCM", 16, 4, 1 << 80, 0, -1),
        ("AES128-GCM", 16, 4, 1, 1 << 48, -1),
        ("AES128-GCM", 16, 4, 1, -1, -1),
        ("AES128-GCM", 16, 4, 1, 1 << 70, -1),
        ("AES128-GCM", 16, 4, 1, 0, -2),
        ("AES128-GCM", 16, 4, 1, 0, 1 << 48),
        ("AES128-GCM", 16, 4, 1, 0, -(1 << 70)),
    ],
)
def test_bad_construction_is_a_clear_error(args: tuple[str, int, int, int, int, int]) -> None:
    cipher, key_len, iv_len, epoch, seq, top = args
    key, iv = bytes(key_len), bytes(iv_len)
    with pytest.raises(ValueError):
        RecordLayer(cipher, key, iv, key, iv, epoch, seq, top)


def test_a_failed_init_again_keeps_the_working_layer() -> None:
    a, b, (wk, wi, rk, ri) = _pair("AES128-GCM")
    with pytest.raises(ValueError):
        b.__init__("AES256-GCM", rk, ri, wk, wi, 1, 0, -1)  # type: ignore[misc]  # 16-byte keys
    assert b.cipher == "AES128-GCM" and b.open(a.seal(b"still")) == b"still"


def test_an_object_never_initialised_raises_rather_than_crashes() -> None:
    layer = RecordLayer.__new__(RecordLayer)
    with pytest.raises(RuntimeError):
        layer.seal(b"x")
    with pytest.raises(RuntimeError):
        layer.seal_send(b"x")
    with pytest.raises(RuntimeError):
        layer.open(b"\x17\xfe\xfd" + bytes(10))
    assert layer.write_seq == 0 and layer.sealed == 0


def test_attributes_are_read_only() -> None:
    a, _, _ = _pair("AES128-GCM")
    counters = ("sealed", "opened", "dropped_auth", "dropped_replay", "dropped_short")
    for name in ("write_seq", "read_seq_top", "cipher", *counters):
        with pytest.raises(AttributeError):
            setattr(a, name, 5)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(CIPHERS)),
    st.binary(max_size=1500),
    st.integers(0, 65535),
    st.integers(0, (1 << 48) - 1),
)
def test_open_never_raises_on_noise(cipher: str, data: bytes, epoch: int, seq: int) -> None:
    _, b, _ = _pair(cipher, epoch=epoch)
    assert b.open(data) in (None, b"")
    # the same noise behind a header that makes it this layer's record: dropped, never raised
    before = b.dropped_short + b.dropped_auth
    framed = bytes([23, 0xFE, 0xFD]) + struct.pack("!H", epoch) + seq.to_bytes(6, "big")
    assert b.open(framed + struct.pack("!H", len(data)) + data) == b""
    assert b.dropped_short + b.dropped_auth == before + 1 and b.opened == 0


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_open_never_raises_on_a_mutated_record(data: st.DataObject) -> None:
    a, b, _ = _pair(data.draw(st.sampled_from(sorted(CIPHERS))))
    payload = data.draw(st.binary(max_size=200))
    original = a.seal(payload)
    record = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        record[data.draw(st.integers(0, len(record) - 1))] = data.draw(st.integers(0, 255))
    record = record[: data.draw(st.integers(0, len(record)))] + data.draw(st.binary(max_size=3))
    result = b.open(bytes(record))
    if bytes(record) == original:
        assert result == payload
    else:  # any change is someone else's record, or a forgery
        assert result in (None, b"")
