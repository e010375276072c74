"""Signed statements: host bindings, work receipts, spot-check reports and assignments, their schema
and bytes.

Nodes and trainers sign these with their identity key and the coordinator verifies them, so both must
build the very same bytes: a domain prefix (so a signature over one kind can never pass as another) and
the fields as one msgpack array, in this order. Change nothing here without a new domain version.
A receipt says "host H served expert E for N samples, forward or backward, at time T", and carries
the host's countersignature of the same work (a served statement, below), so neither a trainer nor a
host alone can make one; a spot-check
report says a host's outputs disagreed with another host's for the same inputs. An assignment
statement is the coordinator's (signed with its own key): "the host with this key is assigned this
expert of this experiment until then"; a host puts it in its DHT declarations, readers check it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import msgspec

BIND_DOMAIN = b"lah-bind-host-v1\x00"
RECEIPT_DOMAIN = b"lah-receipt-v1\x00"
SPOT_CHECK_DOMAIN = b"lah-spot-check-v1\x00"
ASSIGNMENT_DOMAIN = b"lah-assignment-v1\x00"
SERVED_DOMAIN = b"lah-served-v1\x00"
RECEIPT_ID_DOMAIN = b"lah-receipt-id-v1\x00"
MAX_SERVED_LEAVES = 1 << 16  # experts one served statement may cover (a reply holds at most 1,024)
MAX_SERVED_PATH = 16  # sibling hashes: log2(MAX_SERVED_LEAVES)

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


# -- served statements: the host's countersignature ------------------------------------------------
#
# A host signs once per reply, however many experts it answered: the leaves are one hash per answered
# expert (receipt id, expert, samples), the statement signs their Merkle root with who asked, which
# direction, when and how many leaves. A receipt carries its leaf's index and sibling hashes, so the
# coordinator checks it alone (a few sha256) and the host's signature once per reply.


def receipt_id_of(trainer_peer_id: str, activation_id: str, backward: bool) -> str:
    """The receipt id of one request, derived by both ends: one request can be credited once."""
    data = RECEIPT_ID_DOMAIN + _packer.encode((trainer_peer_id, activation_id, bool(backward)))
    return hashlib.sha256(data).hexdigest()[:32]


def served_leaf(receipt_id: str, expert_uid: str, samples: int) -> bytes:
    return hashlib.sha256(b"\x00" + _packer.encode((receipt_id, expert_uid, int(samples)))).digest()


def _parent(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_levels(leaves: list[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first; an odd node out goes up unchanged."""
    if not leaves:
        raise ValueError("a served statement covers at least one expert")
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        level = levels[-1]
        up = [_parent(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            up.append(level[-1])
        levels.append(up)
    return levels


def merkle_path(levels: list[list[bytes]], index: int) -> tuple[bytes, ...]:
    """The sibling hashes from leaf ``index`` up to the root."""
    path = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(level[sibling])
        index //= 2
    return tuple(path)


def root_from_path(leaf: bytes, index: int, count: int, path: tuple[bytes, ...]) -> bytes | None:
    """The root ``path`` leads to from ``leaf``; None when the path does not fit ``index`` of ``count``."""
    if not 0 <= index < count <= MAX_SERVED_LEAVES or any(len(p) != 32 for p in path):
        return None
    node, used, width = leaf, 0, count
    while width > 1:
        if index ^ 1 < width:
            if used == len(path):
                return None
            sibling = path[used]
            used += 1
            node = _parent(node, sibling) if index % 2 == 0 else _parent(sibling, node)
        index, width = index // 2, (width + 1) // 2
    return node if used == len(path) else None


def served_signed_bytes(
    host_peer_id: str, trainer_peer_id: str, backward: bool, served_at: float, count: int, root: bytes
) -> bytes:
    """What a host signs in a reply: it served ``count`` experts (the leaves under ``root``) to this
    trainer, forward or backward, at ``served_at``."""
    fields = (host_peer_id, trainer_peer_id, bool(backward), float(served_at), int(count), bytes(root))
    return SERVED_DOMAIN + _packer.encode(fields)


@dataclass(frozen=True)
class HostProof:
    """A host's countersignature as one receipt carries it: its leaf of the reply's statement."""

    host_public_key: bytes
    served_at: float
    leaf: int
    leaves: int
    path: tuple[bytes, ...]
    signature: bytes


def countersign_one(
    host: Signer,
    trainer_peer_id: str,
    receipt_id: str,
    expert_uid: str,
    samples: int,
    backward: bool,
    served_at: float,
) -> HostProof:
    """A host's statement for one expert (a reply of one leaf)."""
    root = served_leaf(receipt_id, expert_uid, samples)
    data = served_signed_bytes(host.peer_id, trainer_peer_id, backward, served_at, 1, root)
    return HostProof(host.public_key, float(served_at), 0, 1, (), host.sign(data))


def countersign(
    host: Signer, trainer_peer_id: str, backward: bool, served_at: float, leaves: list[bytes]
) -> bytes:
    """The host's one signature over a reply's ``leaves`` (:func:`served_leaf` of each answered expert)."""
    root = merkle_levels(leaves)[-1][0]
    return host.sign(
        served_signed_bytes(host.peer_id, trainer_peer_id, backward, served_at, len(leaves), root)
    )


def host_proofs(
    host_public_key: bytes, served_at: float, signature: bytes, leaves: list[bytes]
) -> list[HostProof]:
    """The trainer's side: one :class:`HostProof` per leaf of a reply, in order."""
    levels = merkle_levels(leaves)
    return [
        HostProof(host_public_key, float(served_at), i, len(leaves), merkle_path(levels, i), signature)
        for i in range(len(leaves))
    ]


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
    served_at: Time  # unix time, the host's (it signed it)
    signature: Signature
    # The host's countersignature (HostProof): checked by the coordinator, each flaw its own reason code,
    # so these are only bounded here (a malformed one is refused alone, never its batch).
    host_public_key: Annotated[bytes, msgspec.Meta(max_length=64)] = b""
    host_leaf: Annotated[int, msgspec.Meta(ge=0, le=2**31)] = 0
    host_leaves: Annotated[int, msgspec.Meta(ge=0, le=2**31)] = 0
    host_path: Annotated[
        tuple[Annotated[bytes, msgspec.Meta(max_length=64)], ...], msgspec.Meta(max_length=MAX_SERVED_PATH)
    ] = ()
    host_signature: Annotated[bytes, msgspec.Meta(max_length=128)] = b""


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
    host: str | Signer,
    expert_uid: str,
    samples: int,
    backward: bool,
    served_at: float,
    receipt_id: str | None = None,
    proof: HostProof | None = None,
) -> SignedReceipt:
    """What a trainer sends for one answered request (a fresh random ``receipt_id`` unless given), with
    the host's ``proof`` from its reply. ``host`` is the host's peer id, or its Signer, which then
    countersigns here (tests, benchmarks: a host and a trainer in one process)."""
    rid = receipt_id or new_id()
    key, peer_id = signer.public_key, signer.peer_id
    if not isinstance(host, str):
        proof = countersign_one(host, peer_id, rid, expert_uid, samples, backward, served_at)
        host = host.peer_id
    host_peer_id = host
    data = receipt_signed_bytes(rid, peer_id, key, host_peer_id, expert_uid, samples, backward, served_at)
    extra: dict[str, Any] = {}
    if proof is not None:
        extra = {
            "host_public_key": proof.host_public_key,
            "host_leaf": proof.leaf,
            "host_leaves": proof.leaves,
            "host_path": proof.path,
            "host_signature": proof.signature,
        }
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
        **extra,
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
