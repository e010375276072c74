"""Butterfly all-reduce over the project's RPC: every member sends each reducer its slice, in chunks,
and gets the slice's average back in the reply.

Wire (``engine.p2p`` unary calls, one per chunk; the sender is the link's authenticated peer id)::

    collab.reduce  {"round": str, "chunk": int, "weight": float} [float32 chunk]  ->  [float32 average]

Back-pressure: at most ``window`` chunk calls are in flight per reducer (counted in uncompressed chunks:
a compressed round keeps as many bytes in flight, ``window * 4 / bytes per element`` chunks, so that its
smaller messages do not leave the links idle waiting for replies), and each call's reply comes only
when the chunk is averaged, so a member can never run ahead of the slowest live member by more than
that many chunks, and the transport's credit window bounds the bytes queued on each link. The vector is
averaged in place (each reply overwrites the chunk it answers), so a member holds its vector once, plus
its own slice's accumulator, plus residuals (bfloat16, half the vector) when compression is lossy.

Faults: a reducer that fails (call timeout, lost link, refused chunk, a reply of the wrong size or with
non-finite values) is named in the log; the rest of its slice keeps this member's local values. The
reducer side excludes stalled or misbehaving senders (:mod:`reducer`). The whole round is bounded by
``round_timeout``; what has not been averaged by then stays local and the report says how much.

Byzantine members: each reducer combines its part with CenteredClip (``robust``, :mod:`.robust`: radius,
iterations, the bound it gives) rather than the mean, and refuses a weight above ``max_weight``
(:class:`~.errors.WeightRefused`; this member never sends more than it, so honest members are never
refused); refusals are counted in ``refusals``. ``robust=None`` is the plain weighted mean, undefended.
Not checked here: that a reducer answers with what it computed (BTARD's verification by a second
member, and accusations, are not built), nor the leader's group beyond its share cap (:mod:`matchmaking`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.p2p import CallContext, P2PError, Peer, RemoteError
from engine.wire import Compression, Kind, Message, WireError, all_finite

from .codec import ErrorFeedback, bytes_per_element
from .errors import PartRejected, Refusals
from .group import Group
from .memory import pin_mmap_threshold, trim
from .reducer import MAX_WEIGHT, PartReducer
from .robust import CenteredClipConfig

logger = logging.getLogger(__name__)

REDUCE = "collab.reduce"
DEFAULT_CHUNK = 1 << 16
FINISHED_ROUNDS_KEPT = 256  # ids of rounds reduced here and over, so a late chunk is told at once


@dataclass
class RoundReport:
    round_id: str
    group_size: int
    seconds: float = 0.0
    excluded: dict[str, str] = field(default_factory=dict)  # senders my reducer dropped, with why
    clipped: dict[str, int] = field(default_factory=dict)  # chunks of each sender my reducer clipped
    outliers: dict[str, int] = field(default_factory=dict)  # ... that lay 10 radii away or more
    failed_reducers: dict[str, str] = field(default_factory=dict)  # reducers whose slice stayed local
    local_elements: int = 0  # elements that kept their local values
    bytes_sent: int = 0
    bytes_received: int = 0
    timed_out: bool = False

    @property
    def complete(self) -> bool:
        return not self.failed_reducers and not self.excluded and not self.timed_out


@dataclass
class AllReduceConfig:
    chunk: int = DEFAULT_CHUNK
    window: int = 4
    stall_timeout: float = 10.0
    round_timeout: float = 120.0
    register_wait: float = 10.0  # how long a chunk waits for its round to start here
    # A member's weight above this is refused (the optimizer sets 2 x its target batch size).
    max_weight: float = MAX_WEIGHT
    # CenteredClip on every part; None: the plain weighted mean (undefended).
    robust: CenteredClipConfig | None = field(default_factory=CenteredClipConfig)


class AllReduceService:
    """Serves ``collab.reduce`` on ``peer`` and runs rounds. One per peer."""

    def __init__(self, peer: Peer, config: AllReduceConfig | None = None) -> None:
        self.peer = peer
        self.config = config or AllReduceConfig()
        self._rounds: dict[str, PartReducer] = {}
        self._finished: deque[str] = deque(maxlen=FINISHED_ROUNDS_KEPT)
        self._registered = asyncio.Event()
        self.refusals = Refusals()  # chunks refused by this peer's reducers, by kind and sender
        peer.handlers.add_unary(REDUCE, self._serve_reduce)
        pin_mmap_threshold()  # freed vectors and accumulators go back to the OS (see .memory)

    @property
    def me(self) -> str:
        return self.peer.peer_id

    def member_lost(self, peer_id: str) -> None:
        """``peer_id``'s link is lost: the slices reduced here stop waiting for it at once (rather
        than after ``stall_timeout``); what it delivered before stays in."""
        for reducer in list(self._rounds.values()):
            if peer_id in reducer.replies and not reducer.complete.is_set():
                reducer.exclude(peer_id, "its link was lost")

    # -- serving ---------------------------------------------------------------------------------

    async def _round(self, round_id: str) -> PartReducer | None:
        deadline = time.monotonic() + self.config.register_wait
        while round_id not in self._rounds:
            if round_id in self._finished:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            event = self._registered
            try:
                await asyncio.wait_for(event.wait(), timeout=left)
            except TimeoutError:
                return None
        return self._rounds[round_id]

    async def _serve_reduce(self, msg: Message, ctx: CallContext) -> Message:
        round_id = msg.fields.get("round")
        chunk = msg.fields.get("chunk")
        weight = msg.fields.get("weight")
        if not isinstance(round_id, str) or not isinstance(chunk, int) or len(msg.tensors) != 1:
            why = "collab.reduce takes round, chunk, weight and one tensor"
            self.refusals.note(PartRejected(why), ctx.peer_id, logger)
            raise RemoteError("bad_request", why)
        reducer = await self._round(round_id)
        if reducer is None:
            raise RemoteError("unknown_round", f"no round {round_id!r} here (not started, or over)")
        try:
            reducer.add(ctx.peer_id, chunk, msg.tensors[0], weight)  # type: ignore[arg-type]
            result = await reducer.result(ctx.peer_id, chunk)
        except PartRejected as e:
            raise RemoteError("rejected", str(e)) from e
        except TimeoutError as e:
            raise RemoteError("timeout", f"chunk {chunk} of {round_id} was not averaged in time") from e
        return Message(Kind.RESPONSE, 0, tensors=[result], compression=reducer.sent_as[chunk])

    # -- running a round -------------------------------------------------------------------------

    async def all_reduce(
        self,
        group: Group,
        vector: torch.Tensor,
        weight: float,
        feedback: ErrorFeedback | None = None,
    ) -> RoundReport:
        """Average ``vector`` (flat, float32, contiguous) in place with ``group``, weighted by ``weight``
        (sent as :meth:`claimed_weight`)."""
        weight = self.claimed_weight(weight)
        if vector.dtype != torch.float32 or vector.dim() != 1 or vector.numel() != group.vector_size:
            raise ValueError(f"vector must be flat float32 of {group.vector_size} elements")
        me = group.index(self.me)
        report = RoundReport(group.round_id, len(group.members))
        if len(group.members) == 1:
            return report
        if feedback is None or feedback.size != vector.numel() or feedback.compression != group.compression:
            feedback = ErrorFeedback(vector.numel(), group.compression)
        reducer = None
        if group.parts[me] > 0:
            reducer = PartReducer(
                group,
                self.me,
                self.config.chunk,
                self.config.stall_timeout,
                max_weight=self.config.max_weight,
                robust=self.config.robust,
                refusals=self.refusals,
            )
            self._rounds[group.round_id] = reducer
            self._registered.set()
            self._registered = asyncio.Event()
            reducer.start()
        started = time.monotonic()
        pending = {j: self._count_chunks(group, j) for j in range(len(group.members)) if group.parts[j] > 0}
        try:
            async with asyncio.timeout(self.config.round_timeout):
                await asyncio.gather(
                    *(self._send_part(group, j, vector, weight, feedback, report, pending) for j in pending)
                )
                if reducer is not None:
                    await reducer.complete.wait()
        except TimeoutError:
            report.timed_out = True
            logger.warning(
                "round %s: not done within %.0f s; unaveraged chunks keep local values",
                group.round_id,
                self.config.round_timeout,
            )
        finally:
            if reducer is not None:
                reducer.stop()
                report.excluded = dict(reducer.excluded)
                report.clipped = dict(reducer.clipped)
                report.outliers = dict(reducer.outliers)
                if reducer.complete.is_set():
                    # Every live member's chunks are in and every average is handed out (replies
                    # still being sent hold views of theirs): the accumulator goes now, not after
                    # a delay during which the next round's would be allocated beside it.
                    self._rounds.pop(group.round_id, None)
                    self._finished.append(group.round_id)
                else:  # members may still be sending: they get what was finished, or time out
                    asyncio.get_running_loop().call_later(
                        self.config.stall_timeout, self._forget, group.round_id
                    )
                del reducer
            trim()
        for j, left in pending.items():
            if left:
                lo, hi = group.part_range(j)
                report.local_elements += min(hi - lo, left * self.config.chunk)
        report.seconds = time.monotonic() - started
        return report

    def claimed_weight(self, weight: float) -> float:
        """The weight this member sends: at most ``max_weight``, the bound every reducer refuses
        above (so an honest member is never refused; a test or benchmark's attacker overrides it)."""
        return min(float(weight), self.config.max_weight)

    def _forget(self, round_id: str) -> None:
        if self._rounds.pop(round_id, None) is not None:
            self._finished.append(round_id)

    def window_for(self, compression: Compression) -> int:
        """Chunk calls in flight per reducer: the same bytes in flight whatever the compression."""
        return max(1, round(self.config.window * 4 / bytes_per_element(compression)))

    def _count_chunks(self, group: Group, j: int) -> int:
        return -(-group.parts[j] // self.config.chunk)

    async def _send_part(
        self,
        group: Group,
        j: int,
        vector: torch.Tensor,
        weight: float,
        feedback: ErrorFeedback,
        report: RoundReport,
        pending: dict[int, int],
    ) -> None:
        lo, hi = group.part_range(j)
        reducer_id = group.members[j]
        n = pending[j]
        chunk = self.config.chunk
        if reducer_id == self.me:
            local = self._rounds[group.round_id]
            try:
                for c in range(n):
                    local.add(self.me, c, vector[lo + c * chunk : min(hi, lo + (c + 1) * chunk)], weight)
            except PartRejected as e:  # our own values refused (non-finite): the others go on without us
                report.failed_reducers[self.me] = f"our own part was refused: {e}"
                return
            for c in range(n):
                a, b = lo + c * chunk, min(hi, lo + (c + 1) * chunk)
                try:
                    vector[a:b].copy_(await local.result(self.me, c))
                except TimeoutError:  # the watchdog should have excluded whoever held it up
                    report.failed_reducers[self.me] = f"chunk {c} of our own slice was never finished"
                    return
                pending[j] -= 1
            return

        failed: list[str] = []
        window = asyncio.Semaphore(self.window_for(group.compression))
        call_timeout = 3 * self.config.stall_timeout + 10

        async def one(c: int) -> None:
            try:
                a, b = lo + c * chunk, min(hi, lo + (c + 1) * chunk)
                values, comp = feedback.apply(a, vector[a:b])
                report.bytes_sent += int((b - a) * bytes_per_element(comp))
                try:
                    reply = await self.peer.call(
                        reducer_id,
                        REDUCE,
                        {"round": group.round_id, "chunk": c, "weight": float(weight)},
                        [values],
                        timeout=call_timeout,
                        compression=comp,
                    )
                except (P2PError, WireError, TimeoutError) as e:
                    raise PartRejected(f"{type(e).__name__}: {e}") from e
                if len(reply.tensors) != 1:
                    raise PartRejected("reply without exactly one tensor")
                got = reply.tensors[0]
                if got.dtype != torch.float32 or got.numel() != b - a:
                    raise PartRejected(f"reply of {got.numel()} {got.dtype} values, expected {b - a} float32")
                if not all_finite(got):
                    raise PartRejected("reply holds non-finite values")
                report.bytes_received += int((b - a) * bytes_per_element(group.compression))
                if not failed:
                    vector[a:b].copy_(got.reshape(-1))
                    pending[j] -= 1
            except PartRejected as e:
                if not failed:
                    failed.append(str(e))
            finally:
                window.release()

        tasks = []
        try:
            for c in range(n):
                await window.acquire()
                if failed:
                    window.release()
                    break
                tasks.append(asyncio.create_task(one(c)))
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        if failed:
            report.failed_reducers[reducer_id] = failed[0]
            logger.warning(
                "round %s: reducer %s failed (%s); %d of its %d chunks keep local values",
                group.round_id,
                reducer_id,
                failed[0],
                pending[j],
                n,
            )
