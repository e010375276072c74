"""Work receipts and spot-check reports, signed by the trainer and sent to the coordinator in batches.

For every answered expert request the trainer signs a receipt ("host H served expert E for N samples,
forward or backward, at time T") that carries the host's countersignature from its reply (the request's
``receipt_id`` and ``proof``, :class:`~engine.moe.layer_calls.CallRecord`); the coordinator credits H
only when both verify (``POST /api/receipts``). The signed bytes
are a domain prefix and a msgpack array of the fields in a fixed order: the same bytes as
``coordinator/credit/receipts.py`` (a test checks they agree byte for byte; the engine does not import the
coordinator).

:class:`ReceiptBook` never blocks training: :meth:`ReceiptBook.add` only appends to a bounded queue; a
task on the trainer's event loop signs (in a worker thread) and posts batches of at most ``batch_size``
every ``interval_s``, or sooner when a full batch is waiting. A failed post is retried with the next
flush, at most ``max_attempts`` times per receipt; a receipt is idempotent by its random id, so a retry
after a lost answer never credits twice. When the queue is full, the oldest receipts are dropped (and
counted) rather than the trainer's memory growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

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
    dropped: int = 0  # queue overflow or too many failed attempts
    withheld: int = 0  # work of a step whose loss or gradients were not finite: never sent
    failed_posts: int = 0
    batches: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)


class ReceiptBook:
    """Queues work, signs it and posts batches from a background task (see the module doc)."""

    def __init__(
        self,
        identity: Identity,
        post: Poster,
        *,
        batch_size: int = 256,
        interval_s: float = 2.0,
        max_queue: int = 100_000,
        max_attempts: int = 3,
    ) -> None:
        self.identity = identity
        self.post = post
        self.batch_size = max(1, min(batch_size, MAX_BATCH))
        self.interval_s = interval_s
        self.max_attempts = max_attempts
        self.stats = ReceiptStats()
        self._queue: deque[Work] = deque(maxlen=max_queue)
        self._retry: deque[tuple[dict[str, Any], int]] = deque(maxlen=max_queue)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def add(self, work: Work) -> None:
        """Queue one answered request (on the event loop; never blocks, never raises)."""
        if len(self._queue) == self._queue.maxlen:
            self.stats.dropped += 1
        self._queue.append(work)
        self.stats.queued += 1
        if len(self._queue) >= self.batch_size:
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
        """Sign what is queued and post it in batches; returns how many were submitted."""
        async with self._lock:
            work = list(self._queue)
            self._queue.clear()
            signed = await asyncio.to_thread(self._sign, work) if work else []
            pending = list(self._retry) + [(r, 0) for r in signed]
            self._retry.clear()
            sent = 0
            for start in range(0, len(pending), self.batch_size):
                chunk = pending[start : start + self.batch_size]
                if await self._post([r for r, _ in chunk]):
                    sent += len(chunk)
                    continue
                for receipt, attempts in chunk:
                    if attempts + 1 < self.max_attempts:
                        self._retry.append((receipt, attempts + 1))
                    else:
                        self.stats.dropped += 1
            return sent

    def _sign(self, work: list[Work]) -> list[dict[str, Any]]:
        return [
            sign_receipt(
                self.identity, w.host, w.uid, w.samples, w.backward, w.served_at, w.receipt_id, w.proof
            )
            for w in work
        ]

    async def _post(self, batch: list[dict[str, Any]]) -> bool:
        try:
            answer = await self.post(batch)
        except Exception as e:  # the coordinator being away must never stop training
            self.stats.failed_posts += 1
            logger.info("posting %d receipts failed: %s", len(batch), e)
            return False
        self.stats.batches += 1
        self.stats.submitted += len(batch)
        self.stats.accepted += int(answer.get("accepted", 0))
        for item in answer.get("rejected", []):
            self.stats.rejected += 1
            reason = str(item.get("reason", "?")) if isinstance(item, dict) else "?"
            self.stats.rejected_reasons[reason] = self.stats.rejected_reasons.get(reason, 0) + 1
        return True

    async def close(self, timeout: float = 10.0) -> None:
        """Stop the timer and make one last, bounded flush."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.flush()
