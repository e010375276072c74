"""Work receipts and spot-check reports, signed by the trainer and sent to the coordinator in batches.

For every answered expert request the trainer signs a receipt ("host H served expert E for N samples,
forward or backward, at time T") that carries the host's countersignature from its reply (the request's
``receipt_id`` and ``proof``, :class:`~engine.moe.layer_calls.CallRecord`); the coordinator credits H
only when both verify (``POST /api/receipts``). The signed bytes are a domain prefix and a msgpack array
of the fields in a fixed order: the same bytes as ``coordinator/credit/receipts.py`` (a test checks they
agree byte for byte; the engine does not import the coordinator).

:class:`ReceiptBook` never blocks training: :meth:`ReceiptBook.add` only appends to a bounded queue; a
task on the trainer's event loop signs (in a worker thread) and, every ``interval_s`` or sooner when a
full batch is waiting, puts batches of at most ``batch_size`` in the trainer's outbox
(:class:`engine.account.outbox.Outbox`: on disk in the trainer's data dir, in order, bounded) and
delivers the outbox oldest first. Spot-check reports (:meth:`ReceiptBook.add_report`) go through the
same outbox. While the coordinator is away nothing is dropped: delivery stops at the first failure and
resumes, in order, when it answers again, also after the trainer restarts; a batch is removed only once
answered, and receipt and report ids are unique, so a batch re-sent after a lost answer is credited
once. Only the bounds drop anything (the queue's and the outbox's ``max_queue`` items, oldest first,
counted), and a batch the coordinator refuses outright (a 4xx answer other than 429) is dropped, counted
as ``refused``, rather than blocking the rest forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from engine.account.errors import CoordinatorError
from engine.account.outbox import Entry, Outbox
from engine.p2p.identity import Identity
from engine.wire import statements
from engine.wire.statements import (
    RECEIPT_DOMAIN,
    SPOT_CHECK_DOMAIN,
    HostProof,
    receipt_signed_bytes,
    spot_check_signed_bytes,
)

__all__ = [
    "RECEIPT_DOMAIN",
    "SPOT_CHECK_DOMAIN",
    "ReceiptBook",
    "ReceiptStats",
    "Work",
    "receipt_signed_bytes",
    "sign_receipt",
    "sign_spot_check",
    "spot_check_signed_bytes",
]

logger = logging.getLogger(__name__)

MAX_BATCH = 1000  # the coordinator's limit per POST


#: Sends one batch (JSON-ready dicts) and returns the coordinator's answer; raises on failure.
Poster = Callable[[list[dict[str, Any]]], Awaitable[dict[str, Any]]]
#: Sends one spot-check report (a JSON-ready dict); raises on failure.
ReportPoster = Callable[[dict[str, Any]], Awaitable[Any]]


def sign_receipt(
    identity: Identity,
    host: str | statements.Signer,
    expert_uid: str,
    samples: int,
    backward: bool,
    served_at: float,
    receipt_id: str | None = None,
    proof: HostProof | None = None,
) -> dict[str, Any]:
    """One receipt as the JSON object ``POST /api/receipts`` takes (bytes fields base64), with the
    host's ``proof`` (``host`` a Signer: it countersigns here, as in tests)."""
    receipt = statements.sign_receipt(
        identity, host, expert_uid, samples, backward, served_at, receipt_id, proof
    )
    return msgspec.to_builtins(receipt)  # type: ignore[no-any-return]


def sign_spot_check(
    identity: Identity,
    host_peer_id: str,
    expert_uid: str,
    period_start: float,
    period_end: float,
    reason: str,
) -> dict[str, Any]:
    """A spot-check report as the JSON object ``POST /api/spot-checks`` takes."""
    report = statements.sign_spot_check(
        identity, host_peer_id, expert_uid, period_start, period_end, reason[: statements.MAX_REASON]
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Work:
    """One answered request, not yet signed: with the request's ``receipt_id`` and the host's
    countersignature (``proof``; None: the host gave none, and the coordinator will refuse it)."""

    host: str
    uid: str
    samples: int
    backward: bool
    served_at: float
    receipt_id: str | None = None
    proof: HostProof | None = None


@dataclass
class ReceiptStats:
    queued: int = 0
    submitted: int = 0  # receipts in batches the coordinator answered
    accepted: int = 0
    rejected: int = 0
    dropped: int = 0  # over the queue's or the outbox's bound (oldest first)
    withheld: int = 0  # work of a step whose loss or gradients were not finite: never sent
    refused: int = 0  # in batches the coordinator refused outright (4xx): dropped, never retried
    failed_posts: int = 0  # deliveries that found the coordinator away (kept, retried in order)
    batches: int = 0
    reports_sent: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)


class ReceiptBook:
    """Queues work, signs it, keeps it in the outbox and delivers it from a background task (see the
    module doc)."""

    def __init__(
        self,
        identity: Identity,
        post: Poster,
        *,
        post_report: ReportPoster | None = None,
        outbox_dir: Path | None = None,
        batch_size: int = 256,
        interval_s: float = 2.0,
        max_queue: int = 100_000,
    ) -> None:
        """``outbox_dir``: where undelivered batches wait (None: in memory only, lost with the process)."""
        self.identity = identity
        self.post, self.post_report = post, post_report
        self.batch_size = max(1, min(batch_size, MAX_BATCH))
        self.interval_s = interval_s
        self.stats = ReceiptStats()
        self.outbox = Outbox(outbox_dir, max_queue)
        self._queue: deque[Work] = deque(maxlen=max_queue)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def pending(self) -> int:
        """Receipts and reports not yet delivered (queued, or waiting in the outbox)."""
        return len(self._queue) + len(self.outbox)

    def add(self, work: Work) -> None:
        """Queue one answered request (on the event loop; never blocks, never raises)."""
        if len(self._queue) == self._queue.maxlen:
            self.stats.dropped += 1
        self._queue.append(work)
        self.stats.queued += 1
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    def add_report(self, report: dict[str, Any]) -> None:
        """Keep one signed spot-check report for delivery, in order with the receipts."""
        self._keep("report", [report])
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="receipts")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> int:
        """Sign what is queued, keep it in the outbox and deliver the outbox in order, until the
        coordinator fails to answer; returns how many receipts were delivered."""
        async with self._lock:
            await self._stash()
            return await self._deliver()

    async def _stash(self) -> None:
        """Sign what is queued and put it in the outbox; the queue lets go of it only then, so a
        cancellation while signing loses nothing."""
        work = list(self._queue)
        if not work:
            return
        signed = await asyncio.to_thread(self._sign, work)
        for _ in range(min(len(work), len(self._queue))):
            self._queue.popleft()
        for start in range(0, len(signed), self.batch_size):
            self._keep("receipts", signed[start : start + self.batch_size])

    def _keep(self, kind: str, items: list[dict[str, Any]]) -> None:
        before = self.outbox.dropped
        self.outbox.put(kind, items)
        self.stats.dropped += self.outbox.dropped - before

    async def _deliver(self) -> int:
        sent = 0
        for entry in self.outbox.entries():
            try:
                answer = await self._send(entry)
            except CoordinatorError as e:
                if e.status == 429 or e.status >= 500:
                    self.stats.failed_posts += 1
                    logger.info("the coordinator is busy (%s): %d items wait", e, self.pending)
                    break
                self.outbox.done(entry)
                self.stats.refused += len(entry.items)
                logger.warning("the coordinator refused %d %s: %s", len(entry.items), entry.kind, e)
                continue
            except Exception as e:  # the coordinator being away must never stop training
                self.stats.failed_posts += 1
                logger.info("the coordinator is away (%s): %d items wait, in order", e, self.pending)
                break
            self.outbox.done(entry)
            if entry.kind == "receipts":
                sent += len(entry.items)
                self._count(entry, answer)
            else:
                self.stats.reports_sent += len(entry.items)
        return sent

    async def _send(self, entry: Entry) -> dict[str, Any]:
        if entry.kind == "receipts":
            return await self.post(entry.items)
        if self.post_report is None:
            raise CoordinatorError(0, "no_poster", "this book sends no reports")
        for report in entry.items:  # one report per entry (add_report)
            await self.post_report(report)
        return {}

    def _sign(self, work: list[Work]) -> list[dict[str, Any]]:
        return [
            sign_receipt(
                self.identity, w.host, w.uid, w.samples, w.backward, w.served_at, w.receipt_id, w.proof
            )
            for w in work
        ]

    def _count(self, entry: Entry, answer: dict[str, Any]) -> None:
        self.stats.batches += 1
        self.stats.submitted += len(entry.items)
        self.stats.accepted += int(answer.get("accepted", 0))
        for item in answer.get("rejected", []):
            self.stats.rejected += 1
            reason = str(item.get("reason", "?")) if isinstance(item, dict) else "?"
            self.stats.rejected_reasons[reason] = self.stats.rejected_reasons.get(reason, 0) + 1

    async def close(self, timeout: float = 10.0) -> None:
        """Stop the timer, keep everything queued in the outbox and make one last, bounded delivery
        (what is left waits in the outbox for the next run)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        async with self._lock:
            await self._stash()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._deliver()
