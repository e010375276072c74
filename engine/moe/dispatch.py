"""One hand-over to a device's worker thread for every batch that is ready, not one per batch.

A language model's step sends a host one request per layer that holds the rows of dozens of its
experts. Each expert's :class:`~.batching.TaskPool` still merges its requests from every trainer into
a batch, but when each pool then handed its batch to the worker thread on its own, a request of 64
experts cost 64 thread hand-overs and 64 wake-ups of the event loop, and the worker ran 64 separate
optimizer steps: on two CPU cores the experts' Python overhead, not their arithmetic, set the pace.

:class:`Dispatcher` collects the batches that become ready within the same turn of the event loop (and
those that arrive while the worker is busy) and runs them in one call on the worker thread. Batches
whose pool names the same ``together`` function (every expert's backward: :mod:`.fused`) run as one
group through it (one autograd call and one optimizer pass for all of them); the rest run one after
another, each as before. A group that fails is run again batch by batch, so one bad expert still
fails alone. The node's CPU share (:class:`~.batching.DutyCycle`) rests after each call, by the time
the whole call kept the worker busy.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Dispatcher", "GroupFn", "Job", "dispatcher_for"]

#: Runs several pools' batches as one: ``[(owner, requests)]`` -> each batch's outputs, in order.
GroupFn = Callable[[list[tuple[Any, list[tuple[Any, ...]]]]], list[list[tuple[Any, ...]]]]
#: How long the drain lets other pools that became ready this turn add their batches.
GATHER_TURNS = 3


class Duty(Protocol):
    async def wait(self) -> None: ...

    def ran(self, busy_s: float) -> None: ...


@dataclass
class Job:
    """One pool's batch: ``run(fn, args)`` alone, or through ``together`` with other pools' batches."""

    run: Callable[[Any, list[tuple[Any, ...]]], tuple[list[tuple[Any, ...]], float]]
    fn: Any
    args: list[tuple[Any, ...]]
    together: GroupFn | None = None
    owner: Any = None
    duty: Duty | None = None
    future: asyncio.Future[list[tuple[Any, ...]]] | None = field(default=None, repr=False)


class Dispatcher:
    """Feeds one executor (a device's single worker thread) from one event loop."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._queue: list[Job] = []
        self._draining = False
        self._task: asyncio.Task[None] | None = None
        self.calls = 0  # worker hand-overs, for stats and tests
        self.jobs = 0

    async def run(self, job: Job) -> list[tuple[Any, ...]]:
        """The batch's outputs, one tuple per request (the job's exception if it failed)."""
        loop = asyncio.get_running_loop()
        job.future = loop.create_future()
        self._queue.append(job)
        if not self._draining:
            self._draining = True
            self._task = loop.create_task(self._drain(), name="moe-dispatch")
        return await job.future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                for _ in range(GATHER_TURNS):  # pools whose batch is due this turn join this call
                    seen = len(self._queue)
                    await asyncio.sleep(0)
                    if len(self._queue) == seen:
                        break
                jobs, self._queue = self._queue, []
                duties = list({id(j.duty): j.duty for j in jobs if j.duty is not None}.values())
                for duty in duties:
                    await duty.wait()
                try:
                    outcomes, busy_s = await loop.run_in_executor(self.executor, run_all, jobs)
                except BaseException as e:  # the executor is gone (shutdown): fail these jobs, stop
                    for job in jobs:
                        _settle(job, e)
                    raise
                self.calls += 1
                self.jobs += len(jobs)
                for duty in duties:
                    duty.ran(busy_s)
                for job, outcome in zip(jobs, outcomes, strict=True):
                    _settle(job, outcome)
        finally:
            self._draining = False


def _settle(job: Job, outcome: Any) -> None:
    if job.future is None or job.future.done():
        return  # its caller gave up
    if isinstance(outcome, BaseException):
        job.future.set_exception(outcome)
    else:
        job.future.set_result(outcome)


def run_all(jobs: list[Job]) -> tuple[list[Any], float]:
    """On the worker thread: every job's outputs (or exception), and the seconds it all took."""
    started = time.perf_counter()
    outcomes: list[Any] = [None] * len(jobs)
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        if job.together is None:
            outcomes[i] = _alone(job)
        else:
            groups.setdefault(id(job.together), []).append(i)
    for members in groups.values():
        together = jobs[members[0]].together
        assert together is not None
        try:
            results = together([(jobs[i].owner, jobs[i].args) for i in members])
        except Exception:
            for i in members:  # find the one that fails; the others still get their answers
                outcomes[i] = _alone(jobs[i])
        else:
            for i, result in zip(members, results, strict=True):
                outcomes[i] = result
    return outcomes, time.perf_counter() - started


def _alone(job: Job) -> Any:
    try:
        return job.run(job.fn, job.args)[0]
    except Exception as e:
        return e


_dispatchers: weakref.WeakKeyDictionary[Executor, dict[asyncio.AbstractEventLoop, Dispatcher]] = (
    weakref.WeakKeyDictionary()
)


def dispatcher_for(executor: Executor) -> Dispatcher:
    """The running loop's dispatcher for ``executor`` (one per worker thread and loop)."""
    loop = asyncio.get_running_loop()
    per_loop = _dispatchers.setdefault(executor, {})
    dispatcher = per_loop.get(loop)
    if dispatcher is None:
        for stale in [lp for lp in per_loop if lp.is_closed()]:
            del per_loop[stale]
        dispatcher = per_loop[loop] = Dispatcher(executor)
    return dispatcher
