"""Signed statements, in their canonical byte form: host bindings, receipts and spot-check reports.

A trainer signs these with its identity key and the coordinator verifies them, so both must build
the very same bytes: a domain prefix (so a signature over one kind can never pass as another) and
the fields as one msgpack array, in this order. Change nothing here without a new domain version.
"""

from __future__ import annotations

import msgspec

BIND_DOMAIN = b"lah-bind-host-v1\x00"
RECEIPT_DOMAIN = b"lah-receipt-v1\x00"
SPOT_CHECK_DOMAIN = b"lah-spot-check-v1\x00"

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
