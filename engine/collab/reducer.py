"""PartReducer: one reducer's slice of one round. Takes every member's chunks, hands back one result.

State machine per chunk: open (contributions arriving) → finished (every member not excluded has
contributed; the result, compressed once, is handed to every member alike). A member is excluded,
named in the log, when it sends a chunk of the wrong size or dtype, non-finite values or a weight that
is not a number in ``[0, max_weight]`` (:class:`~.errors.WeightRefused`), or when nothing has come from
it for ``stall_timeout`` seconds before it delivered all its chunks. Contributions that arrived before
an exclusion were valid and stay in; nothing more is waited for from that member. So each chunk
finishes within ``stall_timeout`` of its last live contribution: a round never waits forever on anyone.
Every refusal is counted in ``refusals`` (by kind and sender) as well as logged.

The result of a chunk is, with ``robust`` set (the default of :class:`~.allreduce.AllReduceConfig`),
CenteredClip over the members' contributions with their weights bounded by the group's median
(:mod:`.robust`: its radius, iterations and bound); without it, the plain weighted mean (the
undefended aggregation, kept for comparison: one member's values can then move the mean anywhere).

Memory, robust: every member's contribution to a chunk is kept (the decoded tensors, by reference;
this peer's own as views of its vector, which nothing writes until the chunk is finished) until the
chunk finishes, then dropped for the result: ``members x chunk`` float32 per open chunk, plus, while
one chunk is being finished, CenteredClip's stacked copy of them (as much again) and ``members x 4096``
temporaries. Members send in order and run at most a window ahead of the slowest, so a reducer holds a
few open chunks at a time, not its whole slice: ``64 x chunk x 4`` bytes (16 MiB for the default 64 Ki
chunk) per open chunk in the largest group, twice that for the one being finished. Plain mean: one
float32 accumulator per chunk instead, allocated when the chunk's first contribution arrives and
reused in place for its result. Either way a result is dropped once every
member whose contribution it holds has been handed it (replies still being sent keep their own
reference), and nothing is fed back across rounds (the slice a reducer holds moves between rounds).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable

import torch

from engine.wire import Compression, EncodeError, all_finite

from .codec import roundtrip
from .errors import PartRejected, Refusals, WeightRefused
from .group import Group
from .robust import CenteredClipConfig, bounded_weights, centered_clip

logger = logging.getLogger(__name__)

MAX_WEIGHT = 1e9
DEFAULT_ROBUST = CenteredClipConfig()


class PartReducer:
    def __init__(
        self,
        group: Group,
        me: str,
        chunk: int,
        stall_timeout: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_weight: float = MAX_WEIGHT,
        robust: CenteredClipConfig | None = DEFAULT_ROBUST,
        refusals: Refusals | None = None,
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
        self.peak_held = 0  # most chunks holding memory at once (accumulators, contributions, results)
        self.max_weight = max_weight
        self.robust = robust
        self.refusals = refusals if refusals is not None else Refusals()
        # robust: each open chunk's contributions, by member, until it finishes
        self.held: dict[int, dict[str, tuple[torch.Tensor, float]]] = {}
        self.clipped: Counter[str] = Counter()  # chunks where a member's contribution lay beyond tau
        self.outliers: Counter[str] = Counter()  # ... and OUTLIER radii or more away (robust.py)
        self.taus: list[float] = []  # each finished chunk's radius
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
            stranger = PartRejected(f"{sender[:12]} is not a member of round {self.group.round_id}")
            raise self._refused(stranger, sender)
        if sender in self.excluded:
            raise PartRejected(f"{sender[:12]} was excluded: {self.excluded[sender]}")
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < self.n_chunks:
            self.exclude(sender, f"chunk index {c!r} out of range")
            raise self._refused(PartRejected(f"chunk index {c!r} out of range"), sender)
        if sender in self.arrived[c]:
            raise self._refused(PartRejected(f"chunk {c} sent twice by {sender[:12]}"), sender)
        a, b = self.chunk_range(c)
        error: PartRejected | None = None
        if values.dtype != torch.float32 or values.numel() != b - a:
            error = PartRejected(
                f"chunk {c} has {values.numel()} {values.dtype} values, expected {b - a} float32"
            )
        elif (
            not isinstance(weight, int | float)
            or isinstance(weight, bool)
            or not math.isfinite(weight)
            or not 0 <= weight <= self.max_weight
        ):
            error = WeightRefused(f"weight {weight!r} is not in [0, {self.max_weight:g}]")
        elif not all_finite(values):
            error = PartRejected(f"chunk {c} holds non-finite values")
        if error is not None:
            self.exclude(sender, str(error))
            raise self._refused(error, sender)
        if self.robust is not None:
            self.held.setdefault(c, {})[sender] = (values.reshape(-1), float(weight))
            if sender != self.me:
                self._note_held()
        elif sender == self.me and c not in self.acc:
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

    def _refused(self, error: PartRejected, sender: str) -> PartRejected:
        self.refusals.note(error, sender, None)  # exclusions log themselves; the rest are told here
        if sender not in self.excluded:
            logger.warning("round %s: refused a chunk from %s: %s", self.group.round_id, sender, error)
        return error

    def _note_held(self) -> None:
        """Chunks holding memory of their own: results, and contributions other than this peer's
        (its own are views of its vector)."""
        others = {c for c, by in self.held.items() if any(m != self.me for m in by)}
        self.peak_held = max(self.peak_held, len(others | set(self.acc)))

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
        if self.robust is not None:
            part = self._robust_result(c)
        else:
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

    def _robust_result(self, c: int) -> torch.Tensor:
        """CenteredClip over the chunk's contributions (members in the group's order), weights bounded."""
        assert self.robust is not None
        by = self.held.pop(c, {})
        names = [m for m in self.group.members if m in by]
        if not names:
            a, b = self.chunk_range(c)
            part = self.acc[c] = torch.zeros(b - a, dtype=torch.float32)
            return part
        weights = bounded_weights([by[m][1] for m in names], self.robust.weight_to_median)
        part, report = centered_clip([by[m][0] for m in names], weights, self.robust)
        del by
        self.acc[c] = part
        self.taus.append(report.tau)
        for m, clipped, outlier in zip(names, report.clipped, report.outliers, strict=True):
            if clipped:
                self.clipped[m] += 1
            if outlier:
                self.outliers[m] += 1
        self._note_held()
        return part

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
