"""Experiments' training progress: trainers' evaluation reports, stored bounded, read per trainer.

A trainer of an experiment posts each evaluation of its model (``POST /api/experiments/{name}/progress``,
``coordinator.swarm.api_progress``): the step, the training tokens so far, the validation loss, its speed, and
maybe a short sample of generated text. The experiment's page (``coordinator.site.experiments``) draws one
validation-loss curve per trainer account and shows the newest sample, each named by the account that reported
it: what one trainer claims is shown as that trainer's, never merged into a figure that stands for the
experiment.

What is kept stays bounded per (experiment, account), whatever a trainer posts: its rows always grow in
``train_tokens`` (a report at or below earlier tokens is a restarted or resumed run, and replaces them),
only its newest sample is kept, and past ``MAX_HISTORY`` rows the older part of the curve is thinned to
every other point (the first kept), so a long run is still drawn whole, at a coarser grain. Errors:
``ProgressError`` (a ``ValueError`` with an HTTP status); nothing of a refused report is stored.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec
from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..config import ExperimentConfig
from ..db.models import Account, ExperimentProgress

MAX_BODY_BYTES = 16 * 1024  # a sample of MAX_SAMPLE_BYTES even as JSON's \u escapes, and the numbers
MAX_SAMPLE_BYTES = 4096  # UTF-8: ~200 tokens of any tokenizer, with room to spare
MAX_HISTORY = 400  # rows per (experiment, account); past it the older part is thinned
MAX_CURVES = 6  # trainers drawn on a page: the most recently reporting ones
MAX_STEP = 2**40
MAX_TOKENS = 2**53  # exact in a float64 (the chart) and a BIGINT
MAX_LOSS = 1e4  # nats per token: far above a random model's ln(vocabulary)
MAX_RATE = 1e9  # tokens per second of one trainer
#: C0 controls other than tab and newline, and DEL: a sample is text to read, not a terminal's input.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_PROGRESS: Table = ExperimentProgress.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]


class ProgressError(ValueError):
    """A report refused: ``status`` (HTTP) and ``code`` say why; nothing of it was stored."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ProgressReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    step: Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
    train_tokens: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
    val_loss: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_LOSS)]
    tokens_per_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_RATE)]
    sample: str | None = None


def check(report: ProgressReport, name: str, experiments: Sequence[ExperimentConfig]) -> str | None:
    """What the schema cannot say (404 for an experiment this coordinator does not run, 413 for a
    sample too long, 422 otherwise); returns the sample to store (None for none or an empty one)."""
    if not any(e.name == name for e in experiments):
        raise ProgressError(
            404, "unknown_experiment", f"this coordinator runs no experiment called {name[:64]!r}"
        )
    for value in (report.val_loss, report.tokens_per_s):
        if not math.isfinite(value):
            raise ProgressError(422, "invalid_request", "numbers must be finite")
    if not report.sample:
        return None
    size = len(report.sample.encode("utf-8"))  # msgspec refuses lone surrogates as malformed JSON
    if size > MAX_SAMPLE_BYTES:
        raise ProgressError(
            413,
            "sample_too_large",
            f"a sample is limited to {MAX_SAMPLE_BYTES} bytes of UTF-8; this one has {size}",
        )
    if _CONTROL.search(report.sample):
        raise ProgressError(
            422, "sample_not_text", "a sample may hold no control characters other than tabs and newlines"
        )
    return report.sample


async def record(
    sessions: async_sessionmaker[AsyncSession],
    experiment: str,
    account_id: int,
    report: ProgressReport,
    sample: str | None,
    now: float | None = None,
    *,
    max_history: int = MAX_HISTORY,
) -> int:
    """Store a checked report (``sample``: what :func:`check` returned); returns how many rows the
    account now keeps for the experiment. The bounds of the module docstring apply in the same
    transaction."""
    now = time.time() if now is None else now
    mine = (_PROGRESS.c.experiment == experiment) & (_PROGRESS.c.account_id == account_id)
    async with sessions() as session, session.begin():
        # A run restarted (or resumed from an earlier checkpoint): its new curve replaces the old one
        # from here on, so a trainer's line never runs backwards.
        await session.execute(delete(_PROGRESS).where(mine, _PROGRESS.c.train_tokens >= report.train_tokens))
        if sample is not None:
            await session.execute(
                update(_PROGRESS).where(mine, _PROGRESS.c.sample.is_not(None)).values(sample=None)
            )
        await session.execute(
            _PROGRESS.insert().values(
                experiment=experiment,
                account_id=account_id,
                step=report.step,
                train_tokens=report.train_tokens,
                val_loss=report.val_loss,
                tokens_per_s=report.tokens_per_s,
                sample=sample,
                reported_at=now,
            )
        )
        ids = (
            await session.execute(
                select(_PROGRESS.c.id, _PROGRESS.c.sample.is_not(None))
                .where(mine)
                .order_by(_PROGRESS.c.train_tokens)
            )
        ).all()
        if len(ids) <= max_history:
            return len(ids)
        older = ids[: len(ids) - max(1, max_history // 4)]  # the newest quarter is never thinned
        # every other one of the older rows, the first (the run's start) and the sample's row spared
        drop = [row_id for i, (row_id, has_sample) in enumerate(older) if i % 2 == 1 and not has_sample]
        await session.execute(delete(_PROGRESS).where(_PROGRESS.c.id.in_(drop)))
        return len(ids) - len(drop)


# ---------------------------------------------------------------- what the pages read


@dataclass(frozen=True)
class ProgressPoint:
    step: int
    train_tokens: int
    val_loss: float
    tokens_per_s: float
    reported_at: float


@dataclass(frozen=True)
class TrainerCurve:
    """One trainer account's reports for an experiment, fewest training tokens first."""

    account_id: int
    account_name: str
    points: list[ProgressPoint]

    @property
    def latest(self) -> ProgressPoint:
        return self.points[-1]


@dataclass(frozen=True)
class Sample:
    text: str
    step: int
    train_tokens: int
    val_loss: float
    account_id: int
    account_name: str
    reported_at: float


@dataclass(frozen=True)
class Progress:
    """An experiment's curves (the ``MAX_CURVES`` trainers that reported last, newest first) and the
    newest sample among them (None before any)."""

    curves: list[TrainerCurve]
    sample: Sample | None
    trainers: int  # enabled accounts that ever reported, shown or not


async def experiment_progress(
    session: AsyncSession, experiment: str, max_curves: int = MAX_CURVES
) -> Progress:
    """What the experiment's page shows: disabled accounts' reports are left out."""
    enabled = _ACCOUNTS.c.disabled == False  # noqa: E712
    last = func.max(_PROGRESS.c.reported_at)
    latest = (
        await session.execute(
            select(_PROGRESS.c.account_id, _ACCOUNTS.c.name, last)
            .join(_ACCOUNTS, _ACCOUNTS.c.id == _PROGRESS.c.account_id)
            .where(_PROGRESS.c.experiment == experiment, enabled)
            .group_by(_PROGRESS.c.account_id, _ACCOUNTS.c.name)
            .order_by(last.desc(), _PROGRESS.c.account_id)
        )
    ).all()
    shown = latest[:max_curves]
    names = {int(r[0]): str(r[1]) for r in shown}
    if not names:
        return Progress([], None, len(latest))
    rows = (
        await session.execute(
            select(
                _PROGRESS.c.account_id,
                _PROGRESS.c.step,
                _PROGRESS.c.train_tokens,
                _PROGRESS.c.val_loss,
                _PROGRESS.c.tokens_per_s,
                _PROGRESS.c.reported_at,
                _PROGRESS.c.sample,
            )
            .where(_PROGRESS.c.experiment == experiment, _PROGRESS.c.account_id.in_(list(names)))
            .order_by(_PROGRESS.c.account_id, _PROGRESS.c.train_tokens)
        )
    ).all()
    points: dict[int, list[ProgressPoint]] = {a: [] for a in names}
    sample: Sample | None = None
    for account, step, tokens, loss, rate, at, text in rows:
        points[account].append(ProgressPoint(int(step), int(tokens), float(loss), float(rate), float(at)))
        if text is not None and (sample is None or at > sample.reported_at):
            sample = Sample(
                str(text), int(step), int(tokens), float(loss), int(account), names[account], float(at)
            )
    curves = [TrainerCurve(a, names[a], points[a]) for a in names if points[a]]
    return Progress(curves, sample, len(latest))


@dataclass(frozen=True)
class LatestReport:
    """The newest report of an experiment, for the list of experiments."""

    val_loss: float
    step: int
    train_tokens: int
    account_name: str
    reported_at: float
    trainers: int


async def latest_reports(session: AsyncSession, experiments: Sequence[str]) -> dict[str, LatestReport]:
    """Each named experiment's newest report by an enabled account (absent where none)."""
    if not experiments:
        return {}
    enabled = _ACCOUNTS.c.disabled == False  # noqa: E712
    counted = await session.execute(
        select(_PROGRESS.c.experiment, func.count(func.distinct(_PROGRESS.c.account_id)))
        .join(_ACCOUNTS, _ACCOUNTS.c.id == _PROGRESS.c.account_id)
        .where(_PROGRESS.c.experiment.in_(list(experiments)), enabled)
        .group_by(_PROGRESS.c.experiment)
    )
    counts = {str(e): int(n) for e, n in counted.all()}
    newest = (
        select(_PROGRESS.c.experiment, func.max(_PROGRESS.c.id).label("id"))
        .join(_ACCOUNTS, _ACCOUNTS.c.id == _PROGRESS.c.account_id)
        .where(_PROGRESS.c.experiment.in_(list(experiments)), enabled)
        .group_by(_PROGRESS.c.experiment)
        .subquery()
    )
    rows = (
        await session.execute(
            select(
                _PROGRESS.c.experiment,
                _PROGRESS.c.val_loss,
                _PROGRESS.c.step,
                _PROGRESS.c.train_tokens,
                _ACCOUNTS.c.name,
                _PROGRESS.c.reported_at,
            )
            .join(newest, newest.c.id == _PROGRESS.c.id)
            .join(_ACCOUNTS, _ACCOUNTS.c.id == _PROGRESS.c.account_id)
        )
    ).all()
    return {
        str(e): LatestReport(float(loss), int(step), int(tokens), str(name), float(at), int(counts.get(e, 0)))
        for e, loss, step, tokens, name, at in rows
    }
