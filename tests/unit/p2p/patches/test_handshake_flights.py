"""How engine/p2p/patches/handshake.py tells a DTLS flight from OpenSSL's resend of it, on bytes alone."""

from __future__ import annotations

from engine.p2p.patches.handshake import FIRST_COPY_S, MAX_FIRST_COPY_S, flight_signature, unified_header


def record(kind: int, epoch: int, seq: int, body: bytes) -> bytes:
    return (
        bytes([kind, 0xFE, 0xFD])
        + epoch.to_bytes(2, "big")
        + seq.to_bytes(6, "big")
        + len(body).to_bytes(2, "big")
        + body
    )


def handshake(msg_type: int, message_seq: int, fragment_offset: int = 0, payload: bytes = b"x" * 20) -> bytes:
    length = len(payload).to_bytes(3, "big")
    return (
        bytes([msg_type])
        + length
        + message_seq.to_bytes(2, "big")
        + fragment_offset.to_bytes(3, "big")
        + length
        + payload
    )


def client_flight(first_seq: int) -> bytes:
    """Certificate, ClientKeyExchange, CertificateVerify, ChangeCipherSpec, encrypted Finished."""
    return (
        record(22, 0, first_seq, handshake(11, 1))
        + record(22, 0, first_seq + 1, handshake(16, 2))
        + record(22, 0, first_seq + 2, handshake(15, 3))
        + record(20, 0, first_seq + 3, b"\x01")
        + record(22, 1, 0 if first_seq == 1 else 1, b"\x99" * 40)
    )


def test_a_resend_with_new_record_numbers_is_the_same_flight() -> None:
    assert flight_signature(client_flight(1)) == flight_signature(client_flight(7))


def test_the_next_flight_differs() -> None:
    hello = record(22, 0, 0, handshake(1, 0))
    server_last = record(20, 0, 9, b"\x01") + record(22, 1, 0, b"\x99" * 40)
    signatures = {flight_signature(d) for d in (hello, client_flight(1), server_last)}
    assert len(signatures) == 3
    assert flight_signature(hello) == ((22, 0, 1, 0, 0),)


def test_fragments_of_one_message_differ_by_offset() -> None:
    first = record(22, 0, 3, handshake(11, 1, 0))
    second = record(22, 0, 4, handshake(11, 1, 1000))
    assert flight_signature(first) != flight_signature(second)


def test_truncated_and_empty_datagrams_do_not_raise() -> None:
    assert flight_signature(b"") == ()
    assert flight_signature(client_flight(1)[:20]) == ((22, 0),)  # header whole, body cut: type and epoch


def test_dtls13_ciphertext_is_recognised() -> None:
    assert unified_header(bytes([0x2C, 1, 2, 3]))  # 001CSLEE: a DTLS 1.3 encrypted record
    assert not unified_header(client_flight(1))
    assert not unified_header(b"")


def test_first_copy_bounds() -> None:
    assert 0 < FIRST_COPY_S <= MAX_FIRST_COPY_S < 1.0  # earlier than OpenSSL's own 1 s resend
