"""Training progress: the signed record each trainer publishes, and the collaboration's state derived
from all of them. Pure functions, no I/O (``tracker`` does the DHT work).

Each trainer keeps one DHT record under ``<run>.progress`` (its own slot: the DHT names a record's slot by
the signer's key, so nobody can write another's). The value is a :class:`LocalProgress`: epoch, samples
accumulated in that epoch, samples per second, the writer's clock, a sequence number and whether it is
a client. The record's DHT signature covers all of it; the DHT drops records that are unsigned,
tampered with or expired.

No central clock: a reader never compares a writer's timestamp with its own clock to extrapolate. It
notes, on its own clock, when it first saw each (owner, seq), and extrapolates ``samples + sps * (now -
first_seen)``, capped at ``max_extrapolation_s``. So a writer whose clock is off by minutes is counted
exactly like the others. The writer's timestamp is used for one thing: estimating how far our clock is
behind the collaboration's (median over the others), so that our records' expirations still lie in the
future on everyone else's clock (:func:`clock_offset`, bounded by ``MAX_CLOCK_OFFSET_S``).

A replayed record (an owner's older seq, served by a replica after a newer one was seen) is refused by
:class:`ProgressView`; a record not refreshed for ``stale_after_s`` on our clock is counted as gone.

Progress is claimed, not counted: a signed record says what its writer says. So no writer counts for
more than ``max_share(n)`` of the target (:func:`~.robust.max_share`: ``2 / n`` of it among ``n`` peers
in the epoch; all of it for one or two peers), and a writer's ``due`` closes the epoch only once the
capped samples reach ``DUE_SHARE`` (half) of the target. One peer of five claiming 2^53 samples counts
for 2/5 of the target, so the others must still bring 3/5 of it; claiming ``due`` as well, it closes an
epoch once they bring 1/10. An honest peer stops to step when it counts more than the target less half
a batch (``holds_back``), which is above half the target for any batch up to the target: honest ``due``
flags are counted as before. A claimed rate is not capped (the decoder bounds it at 1e7/s): it sets the
ETA and how often a peer publishes, and what it extrapolates falls under the writer's cap. Verifying
the samples themselves needs replayable batches (not built).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from engine.dht.records import Record

from .errors import BadProgress
from .robust import max_share

__all__ = [
    "MAX_CLOCK_OFFSET_S",
    "CollabProgress",
    "LocalProgress",
    "ProgressView",
    "clock_offset",
    "decode_progress",
    "derive_progress",
    "encode_progress",
    "progress_key",
]

MAX_CLOCK_OFFSET_S = 3600.0
MAX_SAMPLES_PER_SECOND = 1e7
MAX_SAMPLES = 2**53
DUE_SHARE = 0.5  # a due flag closes the epoch once the capped samples reach this share of the target


class LocalProgress(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    run: str
    epoch: int
    samples: int  # accumulated in this epoch, not yet averaged
    samples_per_second: float
    time: float  # the writer's clock, for clock_offset only
    seq: int  # strictly increasing per writer (across restarts: start it from the clock)
    client: bool = False
    due: bool = False  # the writer has stopped accumulating this epoch and is matching for the step


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(LocalProgress)


def progress_key(run: str) -> str:
    return f"{run}.progress"


def encode_progress(progress: LocalProgress) -> bytes:
    return _ENCODER.encode(progress)


def decode_progress(raw: bytes, run: str) -> LocalProgress:
    """Decode and sanity-check one value; BadProgress if it could not have come from an honest peer."""
    try:
        p = _DECODER.decode(raw)
    except msgspec.DecodeError as e:
        raise BadProgress(f"undecodable progress: {e}") from e
    if p.run != run:
        raise BadProgress(f"progress of run {p.run!r} under {run!r}")
    if not 0 <= p.epoch < 2**62 or not 0 <= p.samples <= MAX_SAMPLES or p.seq < 0:
        raise BadProgress("epoch, samples or seq out of range")
    if not math.isfinite(p.samples_per_second) or not 0 <= p.samples_per_second <= MAX_SAMPLES_PER_SECOND:
        raise BadProgress("samples_per_second out of range")
    if not math.isfinite(p.time):
        raise BadProgress("time is not finite")
    return p


@dataclass(frozen=True)
class Seen:
    progress: LocalProgress
    first_seen: float  # our interval clock (monotonic) when this seq was first seen
    wall: float = math.nan  # our wall clock at the same moment (for clock_offset only)


@dataclass
class ProgressView:
    """What one reader knows: each owner's latest progress and when it first saw it (its own clock)."""

    run: str
    stale_after_s: float = 30.0
    peers: dict[str, Seen] = field(default_factory=dict)
    replays: int = 0
    rejected: int = 0
    # Owners known gone (their link lost, an RPC to them failed), with when we learnt it: not counted
    # until a record of theirs we had not seen arrives ``revive_after_s`` later (one written before
    # they went may still be on its way through the DHT), rather than for ``stale_after_s``.
    gone: dict[str, float] = field(default_factory=dict)
    revive_after_s: float = 2.0

    def update(
        self, records: Iterable[Record], now: float, wall: float = math.nan, seen_at: float | None = None
    ) -> None:
        """Take records from a DHT get (signatures and expiry already checked by the DHT node).

        ``seen_at`` (our clock, at most ``now``): when a record new in this read is taken to have been
        written, for extrapolation; the reader's estimate of the records' age (default ``now``). It
        applies only to a writer's later records within one epoch: a writer's first record of an
        epoch was written after its step, which may be more recent than our previous read."""
        for record in records:
            try:
                p = decode_progress(record.value, self.run)
            except BadProgress:
                self.rejected += 1
                continue
            held = self.peers.get(record.owner)
            same_epoch = held is not None and held.progress.epoch == p.epoch
            at = min(seen_at, now) if seen_at is not None and same_epoch else now
            self.offer(record.owner, p, at, wall, received=now)

    def mark_gone(self, owner: str, now: float) -> None:
        self.gone[owner] = now

    def offer(
        self, owner: str, p: LocalProgress, now: float, wall: float = math.nan, received: float | None = None
    ) -> bool:
        """``received``: when it actually arrived (default ``now``), for reviving an owner gone."""
        held = self.peers.get(owner)
        if held is not None:
            if p.seq < held.progress.seq:
                self.replays += 1
                return False
            if p.seq == held.progress.seq:
                if p != held.progress:  # same seq, other content: one of them is not what the owner meant
                    self.rejected += 1
                return False
        self.peers[owner] = Seen(p, now, wall)
        went = self.gone.get(owner)
        if went is not None and (now if received is None else received) - went >= self.revive_after_s:
            del self.gone[owner]
        return True

    def active(self, now: float) -> dict[str, Seen]:
        return {
            o: s
            for o, s in self.peers.items()
            if now - s.first_seen <= self.stale_after_s and o not in self.gone
        }

    def forget_stale(self, now: float) -> None:
        for owner in [o for o, s in self.peers.items() if now - s.first_seen > 4 * self.stale_after_s]:
            del self.peers[owner]
        for owner in [o for o, went in self.gone.items() if now - went > 4 * self.stale_after_s]:
            del self.gone[owner]


@dataclass(frozen=True)
class CollabProgress:
    epoch: int  # the newest epoch at least half of the active peers have reached
    samples: float  # accumulated towards the next step by peers in that epoch (extrapolated)
    target: int
    samples_per_second: float  # of the peers in that epoch
    peers: int  # active peers in that epoch
    eta_s: float  # seconds until samples reaches target at the current rate (0 when ready; inf if idle)
    due: int = 0  # peers in that epoch that stopped to step, counted once the samples reach DUE_SHARE
    capped: int = 0  # peers whose claimed samples were cut to their share of the target

    @property
    def ready(self) -> bool:
        """Time to step: the target is reached, or a peer has already stopped to step (whoever goes on
        accumulating only adds samples that the others will not wait for)."""
        return self.samples >= self.target or self.due > 0


def derive_progress(
    peers: Mapping[str, Seen], now: float, target: int, max_extrapolation_s: float = 30.0
) -> CollabProgress:
    """The collaboration's epoch, progress towards ``target`` and the next step's ETA (our clock)."""
    if target <= 0:
        raise ValueError("target batch size must be positive")
    if not peers:
        return CollabProgress(0, 0.0, target, 0.0, 0, math.inf)
    # The newest epoch at least half the peers have reached: one peer (honest but alone, or lying in
    # its own signed record) cannot drag everyone to an epoch nobody else is in.
    epochs = sorted((s.progress.epoch for s in peers.values()), reverse=True)
    epoch = epochs[(len(epochs) + 1) // 2 - 1]
    current = [s for s in peers.values() if s.progress.epoch == epoch]
    cap = max_share(len(current)) * target  # what one writer's claims may count for
    samples = 0.0
    rate = 0.0
    capped = 0
    for s in current:
        elapsed = min(max(0.0, now - s.first_seen), max_extrapolation_s)
        claimed = s.progress.samples + s.progress.samples_per_second * elapsed
        capped += claimed > cap
        samples += min(claimed, cap)
        rate += s.progress.samples_per_second
    if samples >= target:
        eta = 0.0
    elif rate > 0:
        eta = (target - samples) / rate
    else:
        eta = math.inf
    due = sum(1 for s in current if s.progress.due) if samples >= DUE_SHARE * target else 0
    return CollabProgress(epoch, samples, target, rate, len(current), eta, due, capped)


def clock_offset(peers: Mapping[str, Seen], me: str) -> float:
    """How far our wall clock seems behind the others' (median of their ``time - wall``), bounded.

    Writers' times include their publish-to-read delay, so this errs towards "we are behind" by about
    the DHT's latency: harmless, it only lengthens our records' expirations a little.
    """
    diffs = [s.progress.time - s.wall for o, s in peers.items() if o != me and math.isfinite(s.wall)]
    if not diffs:
        return 0.0
    return max(-MAX_CLOCK_OFFSET_S, min(MAX_CLOCK_OFFSET_S, statistics.median(diffs)))
