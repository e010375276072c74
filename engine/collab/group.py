"""A group: who averages together in one round, and which slice of the vector each of them reduces.

Formed by :mod:`matchmaking` (the leader computes it once and hands the same one to every member), used
by :mod:`allreduce`. ``parts[i]`` elements starting at ``sum(parts[:i])`` are reduced by ``members[i]``;
a client's part is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from engine.wire import Compression

from .errors import MatchmakingFailed

MAX_GROUP_SIZE = 64


@dataclass(frozen=True)
class Group:
    round_id: str
    members: tuple[str, ...]
    parts: tuple[int, ...]
    compression: Compression = Compression.NONE
    samples: int = 0  # the samples the members bring to the round, all together (0: not told)

    def __post_init__(self) -> None:
        if len(self.members) != len(self.parts) or not self.members:
            raise MatchmakingFailed("a group has one part size per member, and at least one member")
        if len(set(self.members)) != len(self.members) or len(self.members) > MAX_GROUP_SIZE:
            raise MatchmakingFailed("group members must be distinct and at most 64")
        if any(p < 0 for p in self.parts):
            raise MatchmakingFailed("part sizes must be >= 0")
        if not 0 <= self.samples < 2**53:
            raise MatchmakingFailed("a group's samples must be in [0, 2**53)")

    @property
    def vector_size(self) -> int:
        return sum(self.parts)

    def index(self, peer_id: str) -> int:
        return self.members.index(peer_id)

    def part_range(self, i: int) -> tuple[int, int]:
        lo = sum(self.parts[:i])
        return lo, lo + self.parts[i]

    def resized(self, size: int, round_id: str, compression: Compression) -> Group:
        """The same members reducing the same shares of another vector of ``size`` elements (a second
        round within one step). Deterministic, so every member derives the same group on its own."""
        total = self.vector_size
        if size < 0 or total <= 0:
            raise MatchmakingFailed("a resized group needs a non-empty original and size >= 0")
        ideal = [p * size / total for p in self.parts]
        parts = [p * size // total for p in self.parts]
        order = sorted((i for i, p in enumerate(self.parts) if p > 0), key=lambda i: (parts[i] - ideal[i], i))
        for j in range(size - sum(parts)):
            parts[order[j % len(order)]] += 1
        return Group(round_id, self.members, tuple(parts), compression, self.samples)


class GroupWire(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    round_id: str
    members: list[str]
    parts: list[int]
    compression: int
    samples: int = 0


def encode_group(group: Group) -> bytes:
    return msgspec.msgpack.encode(
        GroupWire(
            group.round_id, list(group.members), list(group.parts), int(group.compression), group.samples
        )
    )


def decode_group(raw: object) -> Group:
    if not isinstance(raw, bytes | bytearray):
        raise MatchmakingFailed("a group travels as bytes")
    try:
        w = msgspec.msgpack.decode(raw, type=GroupWire)
        return Group(w.round_id, tuple(w.members), tuple(w.parts), Compression(w.compression), w.samples)
    except (msgspec.DecodeError, ValueError) as e:
        raise MatchmakingFailed(f"undecodable group: {e}") from e
