"""Kademlia routing table: k-buckets over the 160-bit id space, split as in the paper. No I/O.

The table starts as one bucket covering the whole space. A full bucket splits in two when its range
holds our own id, so the table is fine-grained near us and coarse far away (O(k · log n) contacts);
it also splits when the newcomer would be one of our k closest contacts (the paper's fix for
unbalanced trees, section 4.2), so we always know our k closest neighbours.
A full bucket that may not split keeps the newcomer in a bounded *replacement cache* and names its
least recently seen contact for the node to ping: alive, it stays (old contacts are the most likely
to stay up); dead, it is evicted and the newest replacement takes its place. A contact that fails
``max_failures`` calls in a row is evicted the same way.

``nearest`` is the k-closest query every lookup starts from: O(c log k) for c contacts.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from .ids import ID_BITS

Contact = tuple[int, str]  # (node id, peer id)


@dataclass
class KBucket:
    lo: int  # inclusive
    hi: int  # exclusive
    contacts: OrderedDict[int, str] = field(default_factory=OrderedDict)  # least recently seen first
    replacements: OrderedDict[int, str] = field(default_factory=OrderedDict)  # newest last
    failures: dict[int, int] = field(default_factory=dict)
    last_lookup: float = 0.0

    def covers(self, node_id: int) -> bool:
        return self.lo <= node_id < self.hi

    @property
    def depth(self) -> int:
        return ID_BITS - (self.hi - self.lo).bit_length() + 1


class RoutingTable:
    def __init__(self, node_id: int, k: int = 20, max_failures: int = 2) -> None:
        self.node_id = node_id
        self.k = k
        self.max_failures = max_failures
        self.buckets: list[KBucket] = [KBucket(0, 1 << ID_BITS)]
        self._los: list[int] = [0]
        self.evicted = 0

    def __len__(self) -> int:
        return sum(len(b.contacts) for b in self.buckets)

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, int) and node_id in self.bucket_of(node_id).contacts

    def bucket_of(self, node_id: int) -> KBucket:
        return self.buckets[bisect.bisect_right(self._los, node_id) - 1]

    def contacts(self) -> list[Contact]:
        return [c for b in self.buckets for c in b.contacts.items()]

    def add(self, node_id: int, peer_id: str) -> Contact | None:
        """Note that ``node_id`` answered or called us. Return a contact to ping if its bucket is full."""
        if node_id == self.node_id:
            return None
        bucket = self.bucket_of(node_id)
        if node_id in bucket.contacts:
            bucket.contacts.move_to_end(node_id)
            bucket.failures.pop(node_id, None)
            return None
        if len(bucket.contacts) < self.k:
            bucket.contacts[node_id] = peer_id
            bucket.replacements.pop(node_id, None)
            return None
        if bucket.hi - bucket.lo > 1 and (bucket.covers(self.node_id) or self._among_closest(node_id)):
            self._split(bucket)
            return self.add(node_id, peer_id)
        bucket.replacements[node_id] = peer_id
        bucket.replacements.move_to_end(node_id)
        while len(bucket.replacements) > self.k:
            bucket.replacements.popitem(last=False)
        lru = next(iter(bucket.contacts.items()))
        return lru

    def _among_closest(self, node_id: int) -> bool:
        """Would ``node_id`` be one of our k closest? Then its bucket may split too (paper, 4.2)."""
        mine = self.nearest(self.node_id, self.k)
        return len(mine) < self.k or node_id ^ self.node_id < mine[-1][0] ^ self.node_id

    def _split(self, bucket: KBucket) -> None:
        index = self.buckets.index(bucket)
        mid = (bucket.lo + bucket.hi) // 2
        low, high = KBucket(bucket.lo, mid), KBucket(mid, bucket.hi)
        for half in (low, high):
            half.last_lookup = bucket.last_lookup
        for node_id, peer_id in bucket.contacts.items():  # keeps least-recently-seen order
            (low if node_id < mid else high).contacts[node_id] = peer_id
        for node_id, peer_id in bucket.replacements.items():
            (low if node_id < mid else high).replacements[node_id] = peer_id
        for node_id, count in bucket.failures.items():
            (low if node_id < mid else high).failures[node_id] = count
        self.buckets[index : index + 1] = [low, high]
        self._los[index : index + 1] = [low.lo, high.lo]
        for half in (low, high):  # promote cached replacements into the room the split made
            while half.replacements and len(half.contacts) < self.k:
                node_id, peer_id = half.replacements.popitem()
                half.contacts[node_id] = peer_id

    def remove(self, node_id: int) -> bool:
        """Drop a contact, promoting the newest replacement; False if it was not in the table."""
        bucket = self.bucket_of(node_id)
        bucket.replacements.pop(node_id, None)
        if bucket.contacts.pop(node_id, None) is None:
            return False
        bucket.failures.pop(node_id, None)
        self.evicted += 1
        if bucket.replacements:
            new_id, peer_id = bucket.replacements.popitem()
            bucket.contacts[new_id] = peer_id
        return True

    def record_failure(self, node_id: int) -> bool:
        """Count a failed call; evict after ``max_failures`` in a row. True if evicted."""
        bucket = self.bucket_of(node_id)
        if node_id not in bucket.contacts:
            bucket.replacements.pop(node_id, None)
            return False
        count = bucket.failures.get(node_id, 0) + 1
        bucket.failures[node_id] = count
        if count >= self.max_failures:
            return self.remove(node_id)
        return False

    def nearest(self, target: int, k: int | None = None, exclude: int | None = None) -> list[Contact]:
        """The ``k`` known contacts closest to ``target`` by XOR, closest first."""
        pool = (c for b in self.buckets for c in b.contacts.items() if c[0] != exclude)
        return heapq.nsmallest(k or self.k, pool, key=lambda c: c[0] ^ target)

    def mark_lookup(self, target: int, now: float) -> None:
        self.bucket_of(target).last_lookup = now

    def stale_buckets(self, now: float, interval: float) -> list[KBucket]:
        return [b for b in self.buckets if now - b.last_lookup >= interval]
