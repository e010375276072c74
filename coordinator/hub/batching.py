"""Many callers, one database statement: what lets a replica admit a failover's burst of hellos.

When a replica dies, its peers reconnect to the survivors within seconds of each other. Admitting one
costs a host lookup and a presence claim; made one by one, each is a database round trip (several,
through SQLAlchemy's session) and a few milliseconds of this process's CPU, which capped a survivor at
~100 hellos a second. A :class:`Batcher` collects the keys asked for while the previous batch runs
(and for at most ``window_s`` more), then makes ONE call of ``run`` for all of them: the round trips
and the per-statement cost are shared by the whole batch, so a busier replica pays less per hello.

Batches of one batcher run one after another, never at once: a key asked for twice (a peer that
reconnected twice in quick succession) is applied in the order asked, which "latest socket wins"
needs. ``run`` returns one value per key, in order; whatever it raises reaches every caller of that
batch, and the next batch is tried afresh. Errors::

    BatchError        run's answer lacks a key that was asked for (a bug in run, not bad input)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

WINDOW_S = 0.002  # how long a lone key waits for company when nothing is running
MAX_BATCH = 1000  # a statement's arrays stay small enough to plan and run in milliseconds


class BatchError(RuntimeError):
    pass


class Batcher(Generic[K, V]):
    """``await get(key)``: ``run(keys)`` answers a batch of them, one batch at a time.

    ``run`` gets the keys in the order they were asked for (repeats included) and returns one value per
    key, in that order.
    """

    def __init__(
        self,
        run: Callable[[list[K]], Awaitable[Sequence[V]]],
        *,
        window_s: float = WINDOW_S,
        max_batch: int = MAX_BATCH,
    ) -> None:
        if window_s < 0 or max_batch < 1:
            raise ValueError("a batcher needs window_s >= 0 and max_batch >= 1")
        self.run = run
        self.window_s = window_s
        self.max_batch = max_batch
        self._pending: list[tuple[K, asyncio.Future[V]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None
        self.batches = 0  # how many runs so far (tests and benchmarks read it)
        self.largest = 0

    async def get(self, key: K) -> V:
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._pending.append((key, future))
        if self._running is None:
            if len(self._pending) >= self.max_batch:
                self._start()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.window_s, self._start)
        return await future  # the batch runs on when its caller is cancelled: the others need it

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._running is not None or not self._pending:
            return
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        self._running = asyncio.ensure_future(self._run(batch))

    async def _run(self, batch: list[tuple[K, asyncio.Future[V]]]) -> None:
        self.batches += 1
        self.largest = max(self.largest, len(batch))
        try:
            values = await self.run([key for key, _ in batch])
            if len(values) != len(batch):
                raise BatchError(f"run answered {len(values)} of {len(batch)} keys")
        except BaseException as e:  # every caller of this batch hears it; cancellation included
            for _, future in batch:
                if not future.done():
                    if isinstance(e, Exception):
                        future.set_exception(e)
                    else:
                        future.cancel()
            if not isinstance(e, Exception):
                raise
        else:
            for (_, future), value in zip(batch, values, strict=True):
                if not future.done():
                    future.set_result(value)
        finally:
            self._running = None
            if self._pending:  # those that came meanwhile: at once, they have waited a batch already
                self._start()

    async def close(self) -> None:
        """Cancel a running batch (its callers get CancelledError) and refuse those still waiting."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for _, future in pending:
            if not future.done():
                future.cancel()
        if self._running is not None:
            self._running.cancel()
            with contextlib.suppress(BaseException):
                await self._running
