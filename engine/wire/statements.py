"""Signed statements: host bindings, work receipts, spot-check reports and assignments, their schema
and bytes.

Nodes and trainers sign these with their identity key and the coordinator verifies them, so both must
build the very same bytes: a domain prefix (so a signature over one kind can never pass as another) and
the fields as one msgpack array, in this order. Change nothing here without a new domain version.
A receipt says "host H served expert E for N samples, forward or backward, at time T"; a spot-check
report says a host's outputs disagreed with another host's for the same inputs. An assignment
statement is the coordinator's (signed with its own key): "the host with this key is assigned this
expert of this experiment until then"; a host puts it in its DHT declarations, readers check it.
"""

from __future__ import annotations

import os
from typing import Annotated, Protocol

import msgspec

BIND_DOMAIN = b"lah-bind-host-v1\x00"
RECEIPT_DOMAIN = b"lah-receipt-v1\x00"
SPOT_CHECK_DOMAIN = b"lah-spot-check-v1\x00"
ASSIGNMENT_DOMAIN = b"lah-assignment-v1\x00"

_packer = msgspec.msgpack.Encoder()


def bind_message(account_id: int) -> bytes:
    """What a host signs with its identity key to be bound to ``account_id``: nobody can bind a key
    they do not hold, and the proof binds to that one account only."""
    return BIND_DOMAIN + str(account_id).encode("ascii")


def receipt_signed_bytes(
    receipt_id: str,
    trainer_peer_id: str,
    trainer_public_key: bytes,
    host_peer_id: str,
    expert_uid: str,
    samples: int,
    backward: bool,
    served_at: float,
) -> bytes:
    """What a trainer signs: this host served this expert for ``samples`` samples at ``served_at``."""
    fields = (
        receipt_id,
        trainer_peer_id,
        trainer_public_key,
        host_peer_id,
        expert_uid,
        samples,
        backward,
        float(served_at),
    )
    return RECEIPT_DOMAIN + _packer.encode(fields)


def spot_check_signed_bytes(
    report_id: str,
    reporter_peer_id: str,
    reporter_public_key: bytes,
    host_peer_id: str,
    expert_uid: str,
    period_start: float,
    period_end: float,
    reason: str,
) -> bytes:
    """What a trainer signs when a host's outputs disagreed with another host's for the same input."""
    fields = (
        report_id,
        reporter_peer_id,
        reporter_public_key,
        host_peer_id,
        expert_uid,
        float(period_start),
        float(period_end),
        reason,
    )
    return SPOT_CHECK_DOMAIN + _packer.encode(fields)


def assignment_signed_bytes(
    host_public_key: bytes, expert_uid: str, experiment: str, expires_at: float
) -> bytes:
    """What the coordinator signs when it assigns ``expert_uid`` to the host with ``host_public_key``."""
    return ASSIGNMENT_DOMAIN + _packer.encode(
        (bytes(host_public_key), expert_uid, experiment, float(expires_at))
    )


# -- the schema (JSON on the coordinator's API; bytes fields travel base64) --------------------------

Hex32 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]
PeerId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{40}$")]
PublicKey = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
Signature = Annotated[bytes, msgspec.Meta(min_length=64, max_length=64)]
ExpertUid = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# Sanity of the numbers (samples > 0, time not in the future) is the ledger's, per receipt, so one bad
# receipt is rejected with a reason instead of failing its whole batch; here only what fits the columns.
Samples = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Time = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
MAX_REASON = 256


class SignedReceipt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    receipt_id: Hex32  # random; the idempotency key: re-sending a receipt never credits twice
    trainer_peer_id: PeerId
    trainer_public_key: PublicKey
    host_peer_id: PeerId
    expert_uid: ExpertUid
    samples: Samples
    backward: bool
    served_at: Time  # unix time
    signature: Signature


class SpotCheckReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A trainer re-ran a request of ``host_peer_id`` on another host and the outputs disagreed."""

    report_id: Hex32
    reporter_peer_id: PeerId
    reporter_public_key: PublicKey
    host_peer_id: PeerId
    expert_uid: ExpertUid
    period_start: Time
    period_end: Time
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)]
    signature: Signature


class Signer(Protocol):
    """What signs a statement (engine.p2p.Identity)."""

    @property
    def peer_id(self) -> str: ...

    @property
    def public_key(self) -> bytes: ...

    def sign(self, data: bytes) -> bytes: ...


def new_id() -> str:
    return os.urandom(16).hex()


def sign_receipt(
    signer: Signer,
    host_peer_id: str,
    expert_uid: str,
    samples: int,
    backward: bool,
    served_at: float,
    receipt_id: str | None = None,
) -> SignedReceipt:
    """What a trainer sends for one answered request (a fresh random ``receipt_id`` unless given)."""
    rid = receipt_id or new_id()
    key, peer_id = signer.public_key, signer.peer_id
    data = receipt_signed_bytes(rid, peer_id, key, host_peer_id, expert_uid, samples, backward, served_at)
    return SignedReceipt(
        receipt_id=rid,
        trainer_peer_id=peer_id,
        trainer_public_key=key,
        host_peer_id=host_peer_id,
        expert_uid=expert_uid,
        samples=samples,
        backward=backward,
        served_at=float(served_at),
        signature=signer.sign(data),
    )


def sign_spot_check(
    signer: Signer,
    host_peer_id: str,
    expert_uid: str,
    period_start: float,
    period_end: float,
    reason: str,
    report_id: str | None = None,
) -> SpotCheckReport:
    rid = report_id or new_id()
    key, peer_id = signer.public_key, signer.peer_id
    data = spot_check_signed_bytes(
        rid, peer_id, key, host_peer_id, expert_uid, period_start, period_end, reason
    )
    return SpotCheckReport(
        report_id=rid,
        reporter_peer_id=peer_id,
        reporter_public_key=key,
        host_peer_id=host_peer_id,
        expert_uid=expert_uid,
        period_start=float(period_start),
        period_end=float(period_end),
        reason=reason,
        signature=signer.sign(data),
    )
