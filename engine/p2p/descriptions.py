"""Session descriptions signed by their peer's identity key.

The coordinator relays offers and answers, so it could swap one for its own and sit in the middle of
the DTLS handshake. To rule that out the sender signs the SDP (which carries its DTLS certificate's
fingerprint) with its identity key; the receiver checks the key hashes to the peer id it expects, the
signature, freshness and the addressee. aiortc then refuses a DTLS peer whose certificate does not
match the fingerprint, and :mod:`engine.p2p.connection` checks it once more after the handshake.
"""

from __future__ import annotations

import re
import secrets
import time

import msgspec

from .errors import IdentityError, PeerMismatch
from .identity import Identity, peer_id_of, verify

DOMAIN = b"lah-sdp-v1\x00"
MAX_SDP_BYTES = 16 * 1024
MAX_AGE_S = 120.0
_FINGERPRINT = re.compile(r"^a=fingerprint:(\S+) ([0-9A-Fa-f:]+)\s*$", re.MULTILINE)


class SignedDescription(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str  # "offer" or "answer"
    sdp: str
    sender: str
    recipient: str
    session: str
    issued_at: float
    public_key: bytes
    signature: bytes = b""

    def signed_bytes(self) -> bytes:
        body = msgspec.msgpack.encode(
            [self.type, self.sdp, self.sender, self.recipient, self.session, self.issued_at, self.public_key]
        )
        return DOMAIN + body


def new_session_id() -> str:
    return secrets.token_hex(8)


def sign_description(
    identity: Identity, type: str, sdp: str, recipient: str, session: str
) -> SignedDescription:
    unsigned = SignedDescription(
        type=type,
        sdp=sdp,
        sender=identity.peer_id,
        recipient=recipient,
        session=session,
        issued_at=time.time(),
        public_key=identity.public_key,
    )
    return msgspec.structs.replace(unsigned, signature=identity.sign(unsigned.signed_bytes()))


def verify_description(
    desc: SignedDescription, *, expected_sender: str, me: str, now: float | None = None
) -> list[tuple[str, str]]:
    """Check ``desc`` came from ``expected_sender`` for us; return its DTLS fingerprints."""
    if desc.type not in ("offer", "answer"):
        raise PeerMismatch(f"unknown description type {desc.type!r}")
    if len(desc.sdp) > MAX_SDP_BYTES:
        raise PeerMismatch(f"SDP of {len(desc.sdp)} bytes is over {MAX_SDP_BYTES}")
    try:
        key_owner = peer_id_of(desc.public_key)
    except IdentityError as e:
        raise PeerMismatch(str(e)) from e
    if key_owner != expected_sender or desc.sender != expected_sender:
        raise PeerMismatch(
            f"description claims {desc.sender[:12]}, its key belongs to {key_owner[:12]}, "
            f"we expected {expected_sender[:12]}"
        )
    if desc.recipient != me:
        raise PeerMismatch(f"description is addressed to {desc.recipient[:12]}, not to us")
    try:
        verify(desc.public_key, desc.signed_bytes(), desc.signature)
    except IdentityError as e:
        raise PeerMismatch(f"description from {expected_sender[:12]} has a bad signature") from e
    age = (time.time() if now is None else now) - desc.issued_at
    if not -MAX_AGE_S < age < MAX_AGE_S:
        raise PeerMismatch(f"description is {age:.0f} s old, outside ±{MAX_AGE_S:.0f} s")
    fingerprints = sdp_fingerprints(desc.sdp)
    if not fingerprints:
        raise PeerMismatch("description carries no DTLS fingerprint")
    return fingerprints


def sdp_fingerprints(sdp: str) -> list[tuple[str, str]]:
    """(algorithm, upper-case hex with colons) for each ``a=fingerprint`` line."""
    return [(m.group(1).lower(), m.group(2).upper()) for m in _FINGERPRINT.finditer(sdp)]
