"""ProgressTracker: publishes this trainer's progress to the DHT and reads everyone's.

The only I/O around :mod:`progress`: one DHT store per publish (signed by the node's identity, so the
record lands in our own slot) and one DHT get per refresh. Records expire ``ttl_s`` after publishing on
the collaboration's clock as we estimate it (our clock plus :func:`~.progress.clock_offset` when we are
behind), so a trainer whose clock is minutes slow is still seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.dht import DHTError, DHTNode

from .progress import (
    CollabProgress,
    LocalProgress,
    ProgressView,
    Seen,
    clock_offset,
    derive_progress,
    encode_progress,
    progress_key,
)

logger = logging.getLogger(__name__)

MAX_RECORD_AGE_S = 1.0  # the most a new record's age is estimated at (writers publish about every batch)


@dataclass
class LocalCounters:
    epoch: int = 0
    samples: int = 0
    samples_per_second: float = 0.0
    client: bool = False
    due: bool = False  # stopped accumulating, matching for the step


class ProgressTracker:
    def __init__(
        self,
        dht: DHTNode,
        run: str,
        target: int,
        *,
        ttl_s: float = 60.0,
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        local_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` is the wall clock that DHT expirations use (the DHT node's, possibly skewed);
        ``local_clock`` measures intervals on this machine only."""
        self.dht = dht
        self.run = run
        self.target = target
        self.ttl_s = ttl_s
        self.clock = clock
        self.local_clock = local_clock
        self.view = ProgressView(run, stale_after_s=stale_after_s)
        self.local = LocalCounters()
        # Strictly increasing across restarts without storing anything: microseconds of the wall clock.
        self._seq = int(clock() * 1e6)
        self.published = 0
        self._last_read: float | None = None  # when our last successful read began (local clock)

    @property
    def me(self) -> str:
        return self.dht.peer_id

    def mark_gone(self, peer_id: str) -> None:
        """``peer_id`` is gone (its link was lost, or a call to it failed): stop counting it now."""
        if peer_id != self.me:
            self.view.mark_gone(peer_id, self.local_clock())

    def offset(self) -> float:
        return max(0.0, clock_offset(self.view.active(self.local_clock()), self.me))

    def snapshot(self) -> LocalProgress:
        self._seq = max(self._seq + 1, int(self.clock() * 1e6))
        c = self.local
        return LocalProgress(
            self.run,
            c.epoch,
            c.samples,
            float(c.samples_per_second),
            self.clock(),
            self._seq,
            c.client,
            c.due,
        )

    async def publish(self) -> bool:
        p = self.snapshot()
        expiration = self.clock() + self.offset() + self.ttl_s
        self.view.offer(self.me, p, self.local_clock(), self.clock())
        try:
            result = await self.dht.store(progress_key(self.run), encode_progress(p), expiration)
        except DHTError as e:
            logger.warning("publishing progress failed: %s", e)
            return False
        self.published += 1
        return result.ok

    async def refresh(self) -> CollabProgress:
        started = self.local_clock()
        try:
            got = await self.dht.get(progress_key(self.run))
        except DHTError as e:
            logger.warning("reading progress failed: %s", e)
        else:
            if got.rejected:
                logger.warning("%d progress records failed their signature or expiry check", got.rejected)
            now = self.local_clock()
            # A record new in this read was written after our previous read began (or it would have
            # been in that one) and before this one returned: take the middle, at most a second back,
            # so that its writer's progress since is extrapolated rather than missed. Without it,
            # every reader counts the others a read interval late and epochs overshoot the target.
            since = self._last_read if self._last_read is not None else now
            seen_at = max((since + now) / 2, now - MAX_RECORD_AGE_S)
            self.view.update(got.records.values(), now, self.clock(), seen_at=seen_at)
            self._last_read = started
        return self.progress()

    def progress(self) -> CollabProgress:
        now = self.local_clock()
        self.view.forget_stale(now)
        peers = dict(self.view.active(now))
        # our own counters are fresher than our last published record
        peers.pop(self.me, None)
        c = self.local
        mine = LocalProgress(self.run, c.epoch, c.samples, 0.0, 0.0, 0, c.client, due=c.due)
        peers[self.me] = Seen(mine, now)
        return derive_progress(peers, now, self.target)
