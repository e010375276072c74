"""CollabStatusReporter: a collaborative trainer tells the coordinator, every few seconds, how its
collaboration goes (the swarm page's panel) and how many samples it trained on (its own credit).

It runs as a task on the trainer's loop and reads the :class:`~engine.collab.CollaborativeOptimizer`
there (the optimizer's state changes on that loop only), so the training thread never waits for it. A
coordinator that is down or refuses a report costs a warning (one per ``warn_every_s``), never a step.
``samples_processed`` counts from zero for each ``run_id`` (one per reporter): the coordinator credits
its increases, bounded by the trainer's receipts (``coordinator.credit.training``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from engine.account.coordinator_api import CoordinatorApi
from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.collab import CollaborativeOptimizer, StepReport

logger = logging.getLogger(__name__)


def round_outcome(reports: list[StepReport]) -> tuple[str, int | None, float | None]:
    """(outcome, epoch, seconds) of the last step this trainer took: ``ok`` (a complete all-reduce),
    ``partial`` (some parts stayed local), ``timed_out``, ``local`` (stepped with its own gradients
    only), ``skipped`` (the others stepped without it), ``none`` (no step yet)."""
    for r in reversed(reports):
        if r.group_size == 0:
            continue  # skipped: the round before it says more
        if r.round is None:
            return "local", r.epoch, None
        outcome = "timed_out" if r.round.timed_out else "ok" if r.round.complete else "partial"
        return outcome, r.epoch, r.round.seconds
    return ("skipped" if reports else "none"), None, None


def status_of(collab: CollaborativeOptimizer, experiment: str, peer_id: str, run_id: str) -> dict[str, Any]:
    """The report's body (``coordinator.swarm.collab_status.StatusReport``), from the optimizer's state
    now."""
    outcome, epoch, seconds = round_outcome(collab.reports)
    tracker = collab.tracker
    return {
        "experiment": experiment,
        "peer_id": peer_id,
        "run_id": run_id,
        "epoch": collab.epoch,
        "samples_accumulated": collab.samples,
        "samples_per_s": max(0.0, float(tracker.local.samples_per_second)),
        "peers": max(1, tracker.progress().peers),
        "samples_processed": collab.samples_processed,
        "last_round_outcome": outcome,
        "last_round_epoch": epoch,
        "last_round_s": seconds,
    }


class CollabStatusReporter:
    def __init__(
        self,
        api: CoordinatorApi,
        token: Callable[[], Awaitable[str]],
        collab: CollaborativeOptimizer,
        experiment: str,
        peer_id: str,
        *,
        interval_s: float = 5.0,
        warn_every_s: float = 60.0,
    ) -> None:
        self.api, self.token, self.collab = api, token, collab
        self.experiment, self.peer_id = experiment, peer_id
        self.interval_s, self.warn_every_s = interval_s, warn_every_s
        self.run_id = secrets.token_hex(8)
        self.sent = 0
        self.failed = 0
        self._warned_at = -float("inf")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Report now and every ``interval_s`` (call on the trainer's loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="collab-status")

    async def report(self) -> bool:
        """One report; False (and a warning at most every ``warn_every_s``) when it did not land."""
        body = status_of(self.collab, self.experiment, self.peer_id, self.run_id)
        try:
            await self.api.post_collab_status(await self.token(), body)
        except (CoordinatorUnreachable, CoordinatorError) as e:
            self.failed += 1
            now = time.monotonic()
            if now - self._warned_at >= self.warn_every_s:
                self._warned_at = now
                logger.warning("collaboration status not reported (%d failed so far): %s", self.failed, e)
            return False
        self.sent += 1
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.report()
            except Exception:  # a bug here must not end the reports for the trainer's whole life
                logger.exception("building or sending the collaboration status failed")
            await asyncio.sleep(self.interval_s)

    async def close(self, final_timeout_s: float = 5.0) -> None:
        """Stop reporting; one last report (bounded) so the last samples are claimed too."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        try:
            async with asyncio.timeout(final_timeout_s):
                await self.report()
        except TimeoutError:
            logger.warning("the last collaboration status report timed out")
