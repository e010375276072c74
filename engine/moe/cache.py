"""Forward inputs (and graphs) kept for the backward pass, so a trainer never sends the same bytes twice.

A host answers ``moe.forward`` and later gets ``moe.backward`` for the same activation. Backpropagating
needs the forward's graph (:mod:`.graphs`) or, to recompute it, its inputs; keeping them here saves the
trainer re-uploading them (bytes on the wire bound everything) and, with the graph, the host a forward.
Memory is bounded twice: a byte budget (least recently used dropped first) and a time to live (a
trainer that never calls backward, e.g. at evaluation, must not pin memory). An evicted entry
is not an error in itself: the host answers ``inputs_evicted`` and the trainer re-sends the inputs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["ActivationCache"]


class ActivationCache:
    """LRU + TTL map from ``(uid, peer, activation id)`` to what a backward needs, bounded in bytes: an
    input tensor (its own size) or any value stored with the bytes it holds (``put(..., nbytes=)``).

    Used only from the event loop thread, so it needs no lock.
    """

    def __init__(
        self, max_bytes: int = 1 << 30, ttl_s: float = 120.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[Any, int, float]] = OrderedDict()
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        self._expire()
        return key in self._entries

    def put(self, key: Hashable, value: Any, nbytes: int | None = None) -> bool:
        """Keep ``value`` (a tensor, or anything holding ``nbytes``); ``False`` when it alone exceeds the
        budget (then it is not kept, and the backward will need a re-send)."""
        self._drop(key)
        size = value.numel() * value.element_size() if nbytes is None else nbytes
        if size > self.max_bytes:
            return False
        self._expire()
        while self.nbytes + size > self.max_bytes and self._entries:
            self._evict_oldest()
        self._entries[key] = (value, size, self._clock() + self.ttl_s)
        self.nbytes += size
        return True

    def pop(self, key: Hashable) -> Any:
        """Take the value out (each forward has one backward); ``None`` if expired or evicted."""
        self._expire()
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.nbytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[1]

    def _evict_oldest(self) -> None:
        _, (_, size, _) = self._entries.popitem(last=False)
        self.nbytes -= size
        self.evictions += 1

    def _expire(self) -> None:
        now = self._clock()
        # Entries are in insertion order and share one TTL, so expiry times are ordered too.
        while self._entries and next(iter(self._entries.values()))[2] <= now:
            self._evict_oldest()
