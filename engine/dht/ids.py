"""160-bit identifiers: node ids from peer ids, key ids from key strings, and XOR distance. Pure."""

from __future__ import annotations

import hashlib

from .errors import BadRequest

ID_BITS = 160
ID_BYTES = ID_BITS // 8
MAX_ID = (1 << ID_BITS) - 1


def node_id_of(peer_id: str) -> int:
    """A peer id is already a hash of a public key (20 bytes, hex): its integer is the node id."""
    if len(peer_id) != 2 * ID_BYTES:
        raise BadRequest(f"a peer id has {2 * ID_BYTES} hex digits, got {len(peer_id)}")
    try:
        return int(peer_id, 16)
    except ValueError as e:
        raise BadRequest(f"peer id {peer_id[:12]!r}... is not hex") from e


def peer_id_of_node(node_id: int) -> str:
    return f"{node_id:0{2 * ID_BYTES}x}"


def key_id_of(key: str) -> int:
    """Where a key lives: the first 160 bits of SHA-256 of its UTF-8 bytes."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:ID_BYTES], "big")


def distance(a: int, b: int) -> int:
    return a ^ b


def id_to_bytes(node_id: int) -> bytes:
    return node_id.to_bytes(ID_BYTES, "big")


def id_from_bytes(raw: bytes) -> int:
    if len(raw) != ID_BYTES:
        raise BadRequest(f"an id has {ID_BYTES} bytes, got {len(raw)}")
    return int.from_bytes(raw, "big")
