"""Signed records: what a DHT stores, how it is signed, checked and put on the wire. Pure functions.

A record is ``(key, subkey, value, expiration, public_key, signature)``. Its *owner* is the peer id of
``public_key``; the signature covers everything else, under a domain tag so it cannot be replayed as
any other signed object of the project. A key holds one record per ``(owner, subkey)`` slot, so many
owners share a key (a grid prefix holds declarations from many hosts) and none can touch another's slot.
Expiration is wall-clock seconds (``time.time()``); "newer" means a later expiration.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from engine.p2p.errors import IdentityError
from engine.p2p.identity import peer_id_of, verify

from .errors import BadRequest, BadSignature, ExpiredRecord, RecordTooLarge
from .ids import key_id_of

DOMAIN = "lah-dht-record/1"
MAX_KEY_BYTES = 256
MAX_SUBKEY_BYTES = 256
MAX_VALUE_BYTES = 2048
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class Signer(Protocol):
    """What signing needs of an identity (``engine.p2p.Identity`` is one)."""

    @property
    def public_key(self) -> bytes: ...

    def sign(self, data: bytes) -> bytes: ...


class Record(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    key: str
    subkey: str
    value: bytes
    expiration: float
    public_key: bytes
    signature: bytes

    @property
    def owner(self) -> str:
        """The signer's peer id; BadRequest for a public key that is not one (wrong length)."""
        try:
            return peer_id_of(self.public_key)
        except IdentityError as e:
            raise BadRequest(f"malformed record: {e}") from e

    @property
    def key_id(self) -> int:
        return key_id_of(self.key)

    @property
    def slot(self) -> tuple[str, str]:
        return (self.owner, self.subkey)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Record)


def signed_payload(key: str, subkey: str, value: bytes, expiration: float, public_key: bytes) -> bytes:
    return _ENCODER.encode([DOMAIN, key, subkey, value, float(expiration), public_key])


def sign_record(signer: Signer, key: str, value: bytes, expiration: float, subkey: str = "") -> Record:
    public_key = signer.public_key
    payload = signed_payload(key, subkey, value, expiration, public_key)
    record = Record(key, subkey, bytes(value), float(expiration), public_key, signer.sign(payload))
    check_sizes(record)
    return record


def check_sizes(record: Record) -> None:
    if len(record.key.encode()) > MAX_KEY_BYTES or not record.key:
        raise RecordTooLarge(f"key must have 1..{MAX_KEY_BYTES} bytes")
    if len(record.subkey.encode()) > MAX_SUBKEY_BYTES:
        raise RecordTooLarge(f"subkey over {MAX_SUBKEY_BYTES} bytes")
    if len(record.value) > MAX_VALUE_BYTES:
        raise RecordTooLarge(f"value of {len(record.value)} bytes > {MAX_VALUE_BYTES}")
    if len(record.public_key) != PUBLIC_KEY_BYTES or len(record.signature) != SIGNATURE_BYTES:
        raise BadSignature("public key or signature has the wrong length")


def verify_record(record: Record) -> None:
    """Raise a RecordRejected branch unless the record is well-sized and signed by its public key."""
    check_sizes(record)
    payload = signed_payload(record.key, record.subkey, record.value, record.expiration, record.public_key)
    try:
        verify(record.public_key, payload, record.signature)
    except IdentityError as e:
        raise BadSignature(f"record {record.key!r} is not signed by its owner") from e


def check_fresh(record: Record, now: float, max_ttl: float) -> None:
    if record.expiration <= now:
        raise ExpiredRecord(f"record {record.key!r} expired")
    if record.expiration > now + max_ttl:
        raise ExpiredRecord(f"record {record.key!r} expires more than {max_ttl:.0f} s ahead")


def encode_record(record: Record) -> bytes:
    return _ENCODER.encode(record)


def decode_record(raw: object) -> Record:
    """A record from the wire; BadRequest for anything malformed, a key or signature of the wrong
    length included (so no later step meets a key it cannot read)."""
    if not isinstance(raw, bytes | bytearray):
        raise BadRequest("a record travels as bytes")
    try:
        record = _DECODER.decode(raw)
    except msgspec.DecodeError as e:
        raise BadRequest(f"undecodable record: {e}") from e
    if len(record.public_key) != PUBLIC_KEY_BYTES or len(record.signature) != SIGNATURE_BYTES:
        raise BadRequest(
            f"malformed record: a {len(record.public_key)}-byte public key, a {len(record.signature)}-byte"
            f" signature (want {PUBLIC_KEY_BYTES} and {SIGNATURE_BYTES})"
        )
    return record
