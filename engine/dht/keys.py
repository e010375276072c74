"""Expert uids and the DHT keys that declare them. Pure functions, no I/O.

A grid uid is a name and one or more coordinates joined by ``.``: ``ffn.3.7`` is expert (3, 7) of grid
``ffn``. A host declares each expert under every prefix, keyed by the next coordinate, so a beam search
can ask "which children of ``ffn.3.`` are alive?" with one get, and the hosts of one expert are the
records of its parent prefix under its last coordinate::

    key        subkey   value
    ffn.3.     "7"      [host, "ffn.3.7"]
    ffn.       "3"      [host, "ffn.3.7"]

No record sits under the full uid: it would say again what the parent prefix's record says, and a
host of a language model's two 256-expert grids re-declares every 20 s to every node near each key:
the uid records were half of every node's storing and signature checks (``expert_slot`` finds an
expert's record instead).

The owner of each record is the host (its signature); a slot is (owner, subkey), so many hosts share a
prefix key and a host declaring several experts under one prefix writes one slot per child coordinate.

A declaration may carry the coordinator's assignment statement for its uid (``engine.wire.statements``:
the coordinator signed "the host with this public key serves this uid of this experiment until
``assigned_until``"). ``proof_holds`` checks it against the record's signer, so a proof cannot be
lifted into another host's declaration, and against the coordinator's key, which readers learn from
the coordinator. Anyone may still declare anything; readers that know the key prefer assigned hosts.
"""

from __future__ import annotations

import msgspec

from engine.p2p.errors import IdentityError
from engine.p2p.identity import verify
from engine.wire.statements import assignment_signed_bytes

from .errors import BadRequest

UID_DELIMITER = "."


class Declaration(
    msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True, omit_defaults=True
):
    host: str
    uid: str
    assigned_until: float = 0.0  # the assignment statement's expiry; 0: no proof
    proof: bytes = b""  # the coordinator's signature of that statement


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Declaration)


def is_valid_uid(uid: str) -> bool:
    parts = uid.split(UID_DELIMITER)
    return len(parts) >= 2 and all(parts)


def is_valid_prefix(prefix: str) -> bool:
    return prefix.endswith(UID_DELIMITER) and all(prefix[:-1].split(UID_DELIMITER))


def declaration_slots(uid: str) -> list[tuple[str, str]]:
    """``ffn.3.7`` -> ``[("ffn.3.", "7"), ("ffn.", "3")]``: (key, subkey) pairs, the expert's own first."""
    if not is_valid_uid(uid):
        raise ValueError(f"not a grid uid: {uid!r}")
    parts = uid.split(UID_DELIMITER)
    return [
        (UID_DELIMITER.join(parts[:depth]) + UID_DELIMITER, parts[depth])
        for depth in range(len(parts) - 1, 0, -1)
    ]


def expert_slot(uid: str) -> tuple[str, str]:
    """Where the hosts of ``uid`` are found: its parent prefix and its last coordinate."""
    return declaration_slots(uid)[0]


def group_slots(uids: list[str]) -> dict[str, dict[str, str]]:
    """key -> {subkey -> a uid under it}: every record a host must write for ``uids``, deduplicated."""
    out: dict[str, dict[str, str]] = {}
    for uid in uids:
        for key, subkey in declaration_slots(uid):
            out.setdefault(key, {}).setdefault(subkey, uid)
    return out


def encode_declaration(host: str, uid: str, assigned_until: float = 0.0, proof: bytes = b"") -> bytes:
    return _ENCODER.encode(Declaration(host, uid, float(assigned_until), bytes(proof)))


def experiment_of(uid: str) -> str:
    return uid.split(UID_DELIMITER, 1)[0]


def proof_holds(
    declaration: Declaration, key: str, subkey: str, signer_key: bytes, coordinator_key: bytes, now: float
) -> bool:
    """Whether the declaration (under ``key``/``subkey``, signed by ``signer_key``) carries the
    coordinator's unexpired assignment of its uid to its signer."""
    if not declaration.proof or declaration.assigned_until <= now:
        return False
    uid = declaration.uid
    if uid != key + subkey and not (
        key.endswith(UID_DELIMITER) and uid.startswith(key + subkey + UID_DELIMITER)
    ):
        return False  # the proof is for another slot than the one it was put in
    data = assignment_signed_bytes(signer_key, uid, experiment_of(uid), declaration.assigned_until)
    try:
        verify(coordinator_key, data, declaration.proof)
    except IdentityError:
        return False
    return True


def decode_declaration(raw: bytes) -> Declaration:
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError as e:
        raise BadRequest(f"not a declaration: {e}") from e
