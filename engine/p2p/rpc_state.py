"""The RPC endpoint's state per request and per stream, as plain objects it owns and drives.

- :class:`WaitingRequests`: requests that arrived while every handler slot was taken, in arrival
  order and findable by id (a CANCEL may take one out of the middle). Each is held as its bytes only
  (:class:`Waiting`, already counted by the link's receive window): no task, no decoded tensors.
- :class:`StreamCredit`: a served stream's producer side. Streams have their own flow control on top
  of the link's: the producer may run ``stream_window`` bytes ahead of what the consumer has taken,
  and the consumer grants more with CREDIT messages as it reads, so one stalled consumer holds at
  most that much of the link's window, not all of it. Each item counts ``ITEM_OVERHEAD`` bytes more
  than its size, so an honest producer of tiny items queues at most ``stream_window / ITEM_OVERHEAD``
  of them.

The endpoint (:mod:`engine.p2p.rpc`) decides when to add, start, cancel, grant and wait.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from engine.wire import MessageHead

ITEM_OVERHEAD = 64  # stream credit per item beyond its bytes: what holding one costs (queue, objects)


@dataclass
class Waiting:
    """A request waiting for a handler slot: only its bytes (already counted by the window)."""

    buffer: bytearray
    head: MessageHead
    size: int


class WaitingRequests:
    """Requests waiting for a handler slot: first come, first started; found by id in O(1)."""

    def __init__(self) -> None:
        self._queue: deque[Waiting] = deque()
        self._ids: set[int] = set()

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._ids

    def append(self, waiting: Waiting) -> None:
        self._queue.append(waiting)
        self._ids.add(waiting.head.request_id)

    def first(self) -> Waiting:
        return self._queue[0]

    def pop_first(self) -> Waiting:
        waiting = self._queue.popleft()
        self._ids.discard(waiting.head.request_id)
        return waiting

    def remove(self, request_id: int) -> Waiting | None:
        """Take out the request with this id (a cancelled one); None where none waits."""
        if request_id in self._ids:
            for waiting in self._queue:
                if waiting.head.request_id == request_id:
                    self._queue.remove(waiting)
                    self._ids.discard(request_id)
                    return waiting
        return None

    def clear(self) -> None:
        self._queue.clear()
        self._ids.clear()


class StreamCredit:
    """The producer's side of one stream's window: it may send while ``available`` is positive."""

    def __init__(self, window: int) -> None:
        self.available = window
        self._changed = asyncio.Event()

    def grant(self, n: int) -> None:
        self.available += n
        self._changed.set()

    def spend(self, n: int) -> None:
        self.available -= n

    async def wait(self) -> None:
        while self.available <= 0:
            self._changed.clear()
            await self._changed.wait()
