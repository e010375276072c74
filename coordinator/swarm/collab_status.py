"""Collaborative trainers' status reports: the schema, its checks, storing them, and the swarm's view.

A trainer of a collaborative experiment posts every few seconds what it sees of its collaboration (``POST
/api/collab/status``, ``coordinator.swarm.api_collab``): its epoch, the samples it has accumulated towards the
next step and its rate, how many peers it sees, its last round (epoch, seconds, outcome), and the samples it
processed since its process started (``run_id``), which ``coordinator.credit.training`` turns into the
trainer's training samples. Reports replace the key's previous one; rows older than ``EXPIRE_S`` are deleted
by the next report and by a periodic ``expire``, and the view shows only those of the last ``ONLINE_S``.

The view per experiment (``collab_view``, pure) follows ``engine.collab.progress.derive_progress``: the
collaboration's epoch is the newest one at least half of the online trainers have reached, its progress
the samples the trainers in that epoch have accumulated, its rate theirs summed; so no single trainer's
report moves the panel's epoch. Errors: ``CollabStatusError`` (a ``ValueError`` with an HTTP status).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec
from sqlalchemy import Table, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..config import ExperimentConfig
from ..credit import training
from ..db.models import NAME_MAX, Account, CollabStatus

ONLINE_S = 30.0  # a trainer reporting every few seconds is online; older reports are not shown
EXPIRE_S = 600.0  # rows older than this are deleted (bounded table, whatever trainers come and go)
MAX_BODY_BYTES = 4096
MAX_EPOCH = 2**40
MAX_SAMPLES = 2**50  # a counter far beyond any run, still exact in a float64 and a BIGINT
MAX_RATE = 1e7  # samples per second of one trainer: far above what any machine trains
MAX_PEERS = 10_000
MAX_ROUND_S = 86_400.0
OUTCOMES = ("none", "ok", "partial", "timed_out", "local", "skipped")
OUTCOME_LABELS = {
    "none": "no round yet",
    "ok": "ok",
    "partial": "partly averaged",
    "timed_out": "timed out",
    "local": "stepped locally",
    "skipped": "skipped",
}
_PEER_ID = re.compile(r"[0-9a-f]{40}")
_RUN_ID = re.compile(r"[0-9a-f]{8,32}")
_STATUS: Table = CollabStatus.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]

Outcome = Literal["none", "ok", "partial", "timed_out", "local", "skipped"]


class CollabStatusError(ValueError):
    """A report refused: ``status`` (HTTP) and ``code`` say why; nothing of it was stored."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class StatusReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    experiment: Annotated[str, msgspec.Meta(min_length=1, max_length=NAME_MAX)]
    peer_id: Annotated[str, msgspec.Meta(min_length=40, max_length=40)]
    run_id: Annotated[str, msgspec.Meta(min_length=8, max_length=32)]
    epoch: Annotated[int, msgspec.Meta(ge=0, le=MAX_EPOCH)]
    samples_accumulated: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAMPLES)]
    samples_per_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_RATE)]
    peers: Annotated[int, msgspec.Meta(ge=1, le=MAX_PEERS)]
    samples_processed: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAMPLES)]
    last_round_outcome: Outcome = "none"
    last_round_epoch: Annotated[int, msgspec.Meta(ge=0, le=MAX_EPOCH)] | None = None
    last_round_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_ROUND_S)] | None = None


def check(report: StatusReport, experiments: Sequence[ExperimentConfig]) -> ExperimentConfig:
    """What the schema cannot say; returns the report's experiment (422 or 404 otherwise)."""
    if not _PEER_ID.fullmatch(report.peer_id):
        raise CollabStatusError(422, "invalid_request", "peer_id must be 40 lowercase hex digits")
    if not _RUN_ID.fullmatch(report.run_id):
        raise CollabStatusError(422, "invalid_request", "run_id must be 8 to 32 lowercase hex digits")
    for value in (report.samples_per_s, report.last_round_s):
        if value is not None and not math.isfinite(value):
            raise CollabStatusError(422, "invalid_request", "numbers must be finite")
    if report.samples_accumulated > report.samples_processed:
        raise CollabStatusError(422, "invalid_request", "samples_accumulated cannot exceed samples_processed")
    ran = report.last_round_outcome not in ("none", "skipped")
    if ran != (report.last_round_epoch is not None):
        raise CollabStatusError(
            422, "invalid_request", "last_round_epoch is given exactly when a round was taken"
        )
    if (report.last_round_s is not None) and report.last_round_outcome not in ("ok", "partial", "timed_out"):
        raise CollabStatusError(422, "invalid_request", "last_round_s is for an all-reduce round only")
    if report.last_round_epoch is not None and report.last_round_epoch > report.epoch:
        raise CollabStatusError(422, "invalid_request", "last_round_epoch cannot be after epoch")
    experiment = next((e for e in experiments if e.name == report.experiment), None)
    if experiment is None:
        raise CollabStatusError(404, "unknown_experiment", f"no experiment named {report.experiment!r}")
    if experiment.target_batch_size <= 0:
        raise CollabStatusError(
            422, "not_collaborative", f"experiment {experiment.name!r} is not trained collaboratively"
        )
    return experiment


def _insert(session: AsyncSession) -> postgresql.Insert | sqlite.Insert:
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(_STATUS)
    return sqlite.insert(_STATUS)


async def record(
    sessions: async_sessionmaker[AsyncSession],
    account_id: int,
    report: StatusReport,
    now: float | None = None,
) -> int:
    """Store a checked report (the caller made sure its key is the account's); returns the samples it
    added to the trainer's claim. Expired rows go in the same transaction."""
    now = time.time() if now is None else now
    row = {
        "experiment": report.experiment,
        "peer_id": report.peer_id,
        "account_id": account_id,
        "epoch": report.epoch,
        "samples_accumulated": report.samples_accumulated,
        "samples_per_s": report.samples_per_s,
        "peers": report.peers,
        "last_round_epoch": report.last_round_epoch,
        "last_round_s": report.last_round_s,
        "last_round_outcome": report.last_round_outcome,
        "reported_at": now,
    }
    async with sessions() as session, session.begin():
        try:
            added = await training.add_claim(
                session, report.peer_id, report.experiment, report.run_id, report.samples_processed, now
            )
        except training.TrainingClaimError as e:
            raise CollabStatusError(422, "samples_went_backwards", str(e)) from e
        ins = _insert(session)
        keys = [_STATUS.c.experiment, _STATUS.c.peer_id]
        await session.execute(
            ins.values(row).on_conflict_do_update(
                index_elements=keys, set_={k: v for k, v in row.items() if k not in ("experiment", "peer_id")}
            )
        )
        await session.execute(delete(_STATUS).where(_STATUS.c.reported_at < now - EXPIRE_S))
    return added


async def expire(sessions: async_sessionmaker[AsyncSession], now: float | None = None) -> int:
    """Delete reports older than ``EXPIRE_S`` (run every minute by ``api_collab``, so rows go within
    ``EXPIRE_S`` plus a minute even when no trainer reports any more); returns how many went."""
    now = time.time() if now is None else now
    async with sessions() as session, session.begin():
        result = await session.execute(delete(_STATUS).where(_STATUS.c.reported_at < now - EXPIRE_S))
    return int(getattr(result, "rowcount", 0) or 0)


# ---------------------------------------------------------------- the swarm's view


@dataclass(frozen=True)
class TrainerStatus:
    peer_id: str
    account_id: int
    account_name: str
    epoch: int
    samples_accumulated: int
    samples_per_s: float
    peers: int
    last_round_epoch: int | None
    last_round_s: float | None
    last_round_outcome: str
    reported_at: float


@dataclass(frozen=True)
class CollabView:
    """One experiment's collaboration as the swarm page shows it."""

    experiment: str
    target: int
    trainers: list[TrainerStatus]  # online, fastest first
    epoch: int
    samples: int  # accumulated towards the next step by the trainers in ``epoch``
    samples_per_s: float
    last_round_epoch: int | None
    last_round_s: float | None  # the slowest trainer's time for that round: the round's time
    last_round_outcome: str  # "ok" only when every trainer reporting that round says so
    last_round_counts: dict[str, int]  # outcome -> trainers reporting it for that round, best first

    @property
    def progress(self) -> float:
        return min(1.0, self.samples / self.target) if self.target > 0 else 0.0


_SEVERITY = {o: i for i, o in enumerate(("ok", "partial", "local", "timed_out"))}


def collab_view(experiment: str, target: int, trainers: Sequence[TrainerStatus]) -> CollabView:
    """The collaboration derived from its trainers' reports (see the module docstring): pure."""
    ordered = sorted(trainers, key=lambda t: (-t.samples_per_s, t.peer_id))
    if not ordered:
        return CollabView(experiment, target, [], 0, 0, 0.0, None, None, "none", {})
    epochs = sorted((t.epoch for t in ordered), reverse=True)
    epoch = epochs[(len(epochs) + 1) // 2 - 1]
    current = [t for t in ordered if t.epoch == epoch]
    # rounds up to the collaboration's epoch: a trainer claiming to be ahead names no round either
    rounds = [t for t in ordered if t.last_round_epoch is not None and t.last_round_epoch <= epoch]
    last_epoch = max((t.last_round_epoch for t in rounds if t.last_round_epoch is not None), default=None)
    last = [t for t in rounds if t.last_round_epoch == last_epoch]
    times = [t.last_round_s for t in last if t.last_round_s is not None]
    outcome = max((t.last_round_outcome for t in last), key=lambda o: _SEVERITY.get(o, 0), default="none")
    counts: dict[str, int] = {}
    for o in sorted((t.last_round_outcome for t in last), key=lambda o: _SEVERITY.get(o, 0)):
        counts[o] = counts.get(o, 0) + 1
    return CollabView(
        experiment,
        target,
        ordered,
        epoch,
        sum(t.samples_accumulated for t in current),
        sum(t.samples_per_s for t in current),
        last_epoch,
        max(times) if times else None,
        outcome,
        counts,
    )


async def collaborations(
    sessions: async_sessionmaker[AsyncSession],
    experiments: Sequence[ExperimentConfig],
    now: float | None = None,
    max_trainers: int = 200,
) -> list[CollabView]:
    """Every collaborative experiment's view, from the reports of the last ``ONLINE_S`` seconds."""
    now = time.time() if now is None else now
    collaborative = [e for e in experiments if e.target_batch_size > 0]
    if not collaborative:
        return []
    by_experiment: Mapping[str, list[TrainerStatus]] = {e.name: [] for e in collaborative}
    async with sessions() as session:
        rows = (
            await session.execute(
                select(
                    _STATUS.c.experiment,
                    _STATUS.c.peer_id,
                    _STATUS.c.account_id,
                    _ACCOUNTS.c.name,
                    _STATUS.c.epoch,
                    _STATUS.c.samples_accumulated,
                    _STATUS.c.samples_per_s,
                    _STATUS.c.peers,
                    _STATUS.c.last_round_epoch,
                    _STATUS.c.last_round_s,
                    _STATUS.c.last_round_outcome,
                    _STATUS.c.reported_at,
                )
                .join(_ACCOUNTS, _ACCOUNTS.c.id == _STATUS.c.account_id)
                .where(_STATUS.c.reported_at >= now - ONLINE_S, _ACCOUNTS.c.disabled == False)  # noqa: E712
                .order_by(_STATUS.c.reported_at.desc())
                .limit(max_trainers * len(collaborative))
            )
        ).all()
    for r in rows:
        if r[0] in by_experiment and len(by_experiment[r[0]]) < max_trainers:
            by_experiment[r[0]].append(
                TrainerStatus(r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11])
            )
    return [collab_view(e.name, e.target_batch_size, by_experiment[e.name]) for e in collaborative]
