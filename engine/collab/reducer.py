"""PartReducer: one reducer's slice of one round. Accumulates every member's chunks, hands back averages.

State machine per chunk: open (contributions arriving) → finished (every member not excluded has
contributed; the weighted average, compressed once, replaces the accumulator's slice and is handed to
every member alike). A member is excluded, named in the log, when it sends a chunk of the wrong size or
dtype, non-finite values or a bad weight, or when nothing has come from it for ``stall_timeout`` seconds
before it delivered all its chunks. Contributions that arrived before an exclusion were valid and
stay in; nothing more is waited for from that member. So each chunk finishes within ``stall_timeout`` of
its last live contribution: a round never waits forever on anyone.

Memory: one float32 accumulator per chunk, allocated when the chunk's first contribution arrives,
reused in place for its result, and dropped once every member whose contribution it holds has been
handed the result (replies still being sent keep their own reference). Members send in order and run
at most a window ahead of the slowest, so a reducer holds a few chunks at a time, not its whole slice
(no residual either: the slice a reducer holds moves between rounds, so there is nothing to feed back
into).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import torch

from engine.wire import Compression, EncodeError, all_finite

from .codec import roundtrip
from .errors import PartRejected
from .group import Group

logger = logging.getLogger(__name__)

MAX_WEIGHT = 1e9


class PartReducer:
    def __init__(
        self,
        group: Group,
        me: str,
        chunk: int,
        stall_timeout: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.me = me
        self.chunk = chunk
        self.stall_timeout = stall_timeout
        self.clock = clock
        lo, hi = group.part_range(group.index(me))
        self.offset = lo
        self.size = hi - lo
        self.n_chunks = -(-self.size // chunk)
        self.acc: dict[int, torch.Tensor] = {}  # chunk -> its accumulator, then its result
        self.served: list[set[str]] = [set() for _ in range(self.n_chunks)]
        self.peak_held = 0  # most chunk accumulators held at once
        # This peer's own chunks, kept as given (views of its vector, which nothing writes until the
        # chunk is finished) and summed in when the chunk's accumulator is made: its member adds its
        # whole slice at the start, which must not allocate the whole slice.
        self._own: dict[int, tuple[torch.Tensor, float]] = {}
        self.weight = [0.0] * self.n_chunks
        self.arrived: list[set[str]] = [set() for _ in range(self.n_chunks)]
        self.done = [asyncio.Event() for _ in range(self.n_chunks)]
        self.finished = [False] * self.n_chunks
        self.replies: dict[str, int] = dict.fromkeys(group.members, 0)
        self.delivered: dict[str, int] = dict.fromkeys(group.members, 0)
        self.excluded: dict[str, str] = {}
        now = clock()
        self.last_seen = dict.fromkeys(group.members, now)
        self.complete = asyncio.Event()  # every chunk finished
        self.sent_as = [group.compression] * self.n_chunks  # NONE where the average could not compress
        self._watchdog: asyncio.Task[None] | None = None
        self._check_complete()

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.chunk, min(self.size, (c + 1) * self.chunk)

    def start(self) -> None:
        if self._watchdog is None and not self.complete.is_set():
            self._watchdog = asyncio.create_task(self._watch(), name=f"reduce-watch-{self.group.round_id}")

    def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    # -- contributions ---------------------------------------------------------------------------

    def add(self, sender: str, c: int, values: torch.Tensor, weight: float) -> None:
        """Take ``sender``'s chunk ``c``; PartRejected (and exclusion, for bad data) if it is refused."""
        if sender not in self.replies:
            raise PartRejected(f"{sender[:12]} is not a member of round {self.group.round_id}")
        if sender in self.excluded:
            raise PartRejected(f"{sender[:12]} was excluded: {self.excluded[sender]}")
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < self.n_chunks:
            self.exclude(sender, f"chunk index {c!r} out of range")
            raise PartRejected(f"chunk index {c!r} out of range")
        if sender in self.arrived[c]:
            raise PartRejected(f"chunk {c} sent twice by {sender[:12]}")
        a, b = self.chunk_range(c)
        reason = None
        if values.dtype != torch.float32 or values.numel() != b - a:
            reason = f"chunk {c} has {values.numel()} {values.dtype} values, expected {b - a} float32"
        elif (
            not isinstance(weight, int | float) or not math.isfinite(weight) or not 0 <= weight <= MAX_WEIGHT
        ):
            reason = f"weight {weight!r} is not in [0, {MAX_WEIGHT:g}]"
        elif not all_finite(values):
            reason = f"chunk {c} holds non-finite values"
        if reason is not None:
            self.exclude(sender, reason)
            raise PartRejected(reason)
        if sender == self.me and c not in self.acc:
            self._own[c] = (values.reshape(-1), float(weight))
        else:
            self._acc(c).add_(values.reshape(-1), alpha=float(weight))
        self.weight[c] += float(weight)
        self.arrived[c].add(sender)
        self.delivered[sender] += 1
        self.last_seen[sender] = self.clock()
        self._try_finish(c)

    async def result(self, sender: str, c: int) -> torch.Tensor:
        """The average of chunk ``c`` once finished (bounded by the watchdog)."""
        await asyncio.wait_for(self.done[c].wait(), timeout=3 * self.stall_timeout + 5)
        if sender in self.excluded and sender != self.me:
            raise PartRejected(f"{sender[:12]} was excluded: {self.excluded[sender]}")
        if sender in self.served[c] or c not in self.acc:
            raise PartRejected(f"the result of chunk {c} was already handed to {sender[:12]}")
        result = self.acc[c]
        self.replies[sender] += 1
        self.served[c].add(sender)
        readers = (m for m in self.arrived[c] if m not in self.excluded or m == self.me)
        if all(m in self.served[c] for m in readers):
            del self.acc[c]  # everyone who contributed has it: the memory goes with the last reply
        return result

    def _acc(self, c: int) -> torch.Tensor:
        found = self.acc.get(c)
        if found is None:
            a, b = self.chunk_range(c)
            found = self.acc[c] = torch.zeros(b - a, dtype=torch.float32)
            own = self._own.pop(c, None)
            if own is not None:
                found.add_(own[0], alpha=own[1])
            self.peak_held = max(self.peak_held, len(self.acc))
        return found

    # -- finishing and exclusion -----------------------------------------------------------------

    def _live(self) -> list[str]:
        return [m for m in self.group.members if m not in self.excluded]

    def _try_finish(self, c: int) -> None:
        if self.finished[c] or any(m not in self.arrived[c] for m in self._live()):
            return
        part = self._acc(c)
        if self.weight[c] > 0:
            part.div_(self.weight[c])
        try:
            sent = roundtrip(part, self.group.compression)  # every member decodes exactly this
        except EncodeError:  # float16 overflow: this chunk's average goes uncompressed
            self.sent_as[c] = Compression.NONE
        else:
            if sent is not part:
                part.copy_(sent)
        self.finished[c] = True
        self.done[c].set()
        self._check_complete()

    def exclude(self, member: str, reason: str) -> None:
        if member in self.excluded or member not in self.replies:
            return
        self.excluded[member] = reason
        logger.warning(
            "round %s: excluded %s from the part reduced here: %s", self.group.round_id, member, reason
        )
        for c in range(self.n_chunks):
            self._try_finish(c)
        self._check_complete()

    def _check_complete(self) -> None:
        if all(self.finished):
            self.complete.set()

    async def _watch(self) -> None:
        period = max(0.05, self.stall_timeout / 4)
        while not self.complete.is_set():
            await asyncio.sleep(period)
            first = next((c for c in range(self.n_chunks) if not self.finished[c]), None)
            if first is None:
                return
            now = self.clock()
            # Members send their chunks in order, so whoever lacks the earliest open chunk is the one
            # holding the round up (the others are only waiting for it).
            for m in self._live():
                if m not in self.arrived[first] and now - self.last_seen[m] > self.stall_timeout:
                    self.exclude(m, f"stalled: no chunk for {now - self.last_seen[m]:.1f} s")

    @property
    def compression(self) -> Compression:
        return self.group.compression
