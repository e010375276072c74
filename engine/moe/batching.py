"""Batching of requests for one expert, run on one worker thread per device.

Trainers send one request per expert per step, each a few samples to a few hundred. A GPU runs one big
batch far faster than many small ones, so requests that arrive close together are merged: a batch starts
when ``max_batch_size`` samples are waiting or when the oldest request has waited ``max_wait_s``. While a
batch runs, new requests queue up, so under load batches grow by themselves.

The compute (including concatenating and splitting, which copies megabytes) runs on the device's
single-thread executor (through :mod:`.dispatch`, with every other pool's batch that is ready at the
same time), never on the event loop: the loop pumps SCTP for every connection of the node,
and one stalled millisecond there stalls every transfer. One thread per device also serialises forward,
backward and optimizer steps of all experts on that device, so no expert's weights change mid-batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import torch

from .dispatch import GroupFn, Job, dispatcher_for
from .errors import ExpertUnavailable

__all__ = ["BatchFn", "RequestsFn", "TaskPool"]

logger = logging.getLogger(__name__)

#: Runs one batch: gets each argument position's batched tensor, returns outputs batched along dim 0
#: (a tensor, or an object whose ``split(sizes)`` gives each request its part, as a kept graph does).
BatchFn = Callable[[Sequence[torch.Tensor]], Sequence[Any]]
#: Runs one batch of requests as they came (``TaskPool(batched=False)``): one output tuple per request.
RequestsFn = Callable[[list[tuple[Any, ...]]], list[tuple[Any, ...]]]


@dataclass
class _Task:
    args: tuple[Any, ...]
    future: asyncio.Future[tuple[Any, ...]]
    size: int
    queued_at: float


class DutyCycle:
    """Keeps the node's compute under its share of the machine (the volunteer's CPU cap).

    After a batch that kept the worker busy ``busy`` seconds, every pool sharing this object waits
    ``rest_for(busy)`` before starting its next batch. The rest happens between batches, on the event
    loop, so it delays later work but never the answers of the batch that just ran.
    """

    def __init__(self, rest_for: Callable[[float], float]) -> None:
        self.rest_for = rest_for
        self.resume_at = 0.0
        self.rested_s = 0.0

    def ran(self, busy_s: float) -> None:
        rest = max(0.0, self.rest_for(busy_s))
        self.resume_at = max(self.resume_at, time.monotonic()) + rest
        self.rested_s += rest

    async def wait(self) -> None:
        delay = self.resume_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class TaskPool:
    """Queue of requests for one function; merges them into batches run on ``executor``."""

    def __init__(
        self,
        name: str,
        fn: BatchFn | RequestsFn,
        executor: Executor,
        *,
        max_batch_size: int = 256,
        max_wait_s: float = 0.005,
        duty: DutyCycle | None = None,
        batched: bool = True,
        together: GroupFn | None = None,
        owner: Any = None,
    ) -> None:
        """``batched``: ``fn`` is a :data:`BatchFn` (tensors concatenated per position, outputs split);
        else a :data:`RequestsFn` that gets each request's arguments as they came (not all tensors).
        ``together``: runs this pool's batch with other pools' that are ready at the same time, given
        each pool's ``owner`` (:mod:`.dispatch`); ``fn`` alone when that fails."""
        self.name = name
        self.together, self.owner = together, owner
        self.duty = duty
        self.fn = fn
        self.batched = batched
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queue: deque[_Task] = deque()
        self._arrived: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._busy = False
        self._drained: asyncio.Event | None = None
        self.batches = 0
        self.batch_sizes: list[int] = []  # the last few, for stats and tests
        self.closed = False

    @property
    def pending(self) -> int:
        return len(self._queue) + (1 if self._busy else 0)

    async def submit(self, *args: Any) -> tuple[Any, ...]:
        """Run ``fn`` on these arguments (batched with others). The first is a tensor whose dim 0 is the
        request's size; in a batched pool every argument is a tensor of that dim 0 size."""
        if self.closed:
            raise ExpertUnavailable(f"task pool {self.name} is closed")
        loop = asyncio.get_running_loop()
        if self._runner is None:
            self._arrived = asyncio.Event()
            self._runner = loop.create_task(self._run(), name=f"taskpool-{self.name}")
        task = _Task(args, loop.create_future(), int(args[0].shape[0]), loop.time())
        self._queue.append(task)
        assert self._arrived is not None
        self._arrived.set()
        return await task.future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._arrived is not None
        while True:
            while not self._queue:
                if self._drained is not None:
                    self._drained.set()
                self._arrived.clear()
                await self._arrived.wait()
            deadline = self._queue[0].queued_at + self.max_wait_s
            while sum(t.size for t in self._queue) < self.max_batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    async with asyncio.timeout(remaining):
                        await self._arrived.wait()
                except TimeoutError:
                    break
            batch = self._take()
            if not batch:
                continue
            self._busy = True
            try:
                await self._run_one(loop, batch)
            finally:
                self._busy = False
            self.batches += 1
            self.batch_sizes = [*self.batch_sizes[-31:], sum(t.size for t in batch)]
            # The results (a kept graph among them) belong to the callers now: holding them here until
            # the next batch would pin their memory after the cache let go of it.
            del batch

    async def _run_one(self, loop: asyncio.AbstractEventLoop, batch: list[_Task]) -> None:
        run = _run_batch if self.batched else _run_requests
        job = Job(run, self.fn, [t.args for t in batch], self.together, self.owner, self.duty)
        try:
            outputs = await dispatcher_for(self.executor).run(job)
        except Exception as e:
            for t in batch:
                if not t.future.done():
                    t.future.set_exception(e)
        else:
            for t, out in zip(batch, outputs, strict=True):
                if not t.future.done():
                    t.future.set_result(out)

    def _take(self) -> list[_Task]:
        batch: list[_Task] = []
        total = 0
        while self._queue:
            task = self._queue[0]
            if task.future.done():  # the caller gave up (cancelled or timed out) before we started
                self._queue.popleft()
                continue
            if batch and total + task.size > self.max_batch_size:
                break
            batch.append(self._queue.popleft())
            total += task.size
        return batch

    async def drain(self, timeout: float) -> None:
        """Stop accepting tasks and wait (at most ``timeout``) for queued ones to finish."""
        self.closed = True
        if self._runner is not None and self.pending:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._drained.wait()
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        for task in self._queue:
            if not task.future.done():
                task.future.set_exception(ExpertUnavailable(f"task pool {self.name} closed"))
        self._queue.clear()


def _run_batch(fn: Any, args: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], float]:
    """On the worker thread: concatenate per position, run, split back per request; and how long."""
    started = time.perf_counter()
    sizes = [int(a[0].shape[0]) for a in args]
    if len(args) == 1:
        batched: list[torch.Tensor] = list(args[0])
    else:
        batched = [torch.cat([a[i] for a in args]) for i in range(len(args[0]))]
    outputs = fn(batched)
    split = [torch.split(o, sizes) if isinstance(o, torch.Tensor) else o.split(sizes) for o in outputs]
    return [tuple(parts[j] for parts in split) for j in range(len(sizes))], time.perf_counter() - started


def _run_requests(fn: Any, args: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], float]:
    """On the worker thread: ``fn`` on the requests as they came; and how long."""
    started = time.perf_counter()
    outputs = fn(args)
    return outputs, time.perf_counter() - started
