"""Trainers' own work: training samples, a credit kind of its own, bounded by the trainers' receipts.

Volunteers earn *credit* (``coordinator.credit.ledger``): samples times the expert's cost, proven by
receipts that someone else (a trainer) signed. A trainer's work is the samples it trained the dense model on,
and nobody else signs for those: the trainer says so itself in its status reports
(``coordinator.swarm.collab_status``). Folding that claim into credit would let a trainer account, which
also writes everyone's receipts, rank itself above the volunteers at will; so training samples are a
separate count, shown on the leaderboard's Trainers tab, never added to credit totals, ranks or teams.

The bound: every sample a trainer trains on goes forward through at least one volunteer's expert, and
each such call yields a forward receipt that this trainer's key signed and the ledger accepted. So the
ledger counts, per trainer key and experiment, the forward samples of its accepted receipts
(``receipt_samples``, added at ingestion in the receipts' own transaction), and a trainer is credited
``min(samples_claimed, receipt_samples)`` there. With k experts per sample the receipts prove up to k
times what was trained: the bound caps inflation at k-fold, and at zero for a trainer that calls no
volunteer; receipts themselves are only as honest as the trainer role the coordinator's admins grant.

Claims are a counter per trainer process (``run_id``): each report carries the samples processed since
the process started, and the claim grows by the counter's increase (a new ``run_id`` starts from zero).
A counter that goes backwards within a run is refused (``TrainingClaimError``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, case, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Account, Host, Team, TrainerWork

_WORK: Table = TrainerWork.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]
_TEAMS: Table = Team.__table__  # type: ignore[assignment]
_HOSTS: Table = Host.__table__  # type: ignore[assignment]

#: What one row credits: the claim, bounded by the receipts.
CREDITED = case(
    (_WORK.c.samples_claimed < _WORK.c.receipt_samples, _WORK.c.samples_claimed),
    else_=_WORK.c.receipt_samples,
)


class TrainingClaimError(ValueError):
    """A status report whose processed-samples counter cannot be right (it went backwards)."""


def claim_delta(prev_run: str, prev_samples: int, run_id: str, processed: int) -> int:
    """How much a report adds to the claim: the counter's increase within a run, all of it for a new
    run. Raises TrainingClaimError when the counter of the same run went backwards."""
    if run_id != prev_run:
        return processed
    if processed < prev_samples:
        raise TrainingClaimError(
            f"samples_processed went back from {prev_samples} to {processed} within run {run_id}"
        )
    return processed - prev_samples


def forward_samples(receipts: Iterable[tuple[str, str, int, bool]]) -> dict[tuple[str, str], int]:
    """(trainer peer, experiment) -> forward samples, from (trainer peer, expert uid, samples, backward)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for trainer, uid, samples, backward in receipts:
        if not backward:
            out[(trainer, uid.split(".", 1)[0])] += samples
    return out


def _insert(session: AsyncSession) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(_WORK)
    return sqlite.insert(_WORK)


async def add_receipt_samples(
    session: AsyncSession, receipts: Iterable[tuple[str, str, int, bool]], now: float
) -> None:
    """Inside the ledger's ingestion transaction: add newly accepted receipts' forward samples."""
    sums = forward_samples(receipts)
    if not sums:
        return
    ins = _insert(session)
    stmt = ins.on_conflict_do_update(
        index_elements=[_WORK.c.peer_id, _WORK.c.experiment],
        set_={"receipt_samples": _WORK.c.receipt_samples + ins.excluded.receipt_samples, "updated_at": now},
    )
    rows = [
        {
            "peer_id": peer,
            "experiment": experiment,
            "receipt_samples": n,
            "samples_claimed": 0,
            "run_id": "",
            "run_samples": 0,
            "updated_at": now,
        }
        for (peer, experiment), n in sorted(sums.items())  # one lock order in concurrent batches
    ]
    conn = await session.connection()
    await conn.execute(stmt, rows)


async def add_claim(
    session: AsyncSession, peer_id: str, experiment: str, run_id: str, processed: int, now: float
) -> int:
    """Inside a write transaction: take a report's counter; returns what it added to the claim."""
    ins = _insert(session)
    # Written first (SQLite's write lock; PostgreSQL's row lock), so that two concurrent reports of one
    # run cannot both add the same increase.
    await session.execute(
        ins.values(
            peer_id=peer_id,
            experiment=experiment,
            receipt_samples=0,
            samples_claimed=0,
            run_id="",
            run_samples=0,
            updated_at=now,
        ).on_conflict_do_update(
            index_elements=[_WORK.c.peer_id, _WORK.c.experiment], set_={"updated_at": now}
        )
    )
    where = (_WORK.c.peer_id == peer_id) & (_WORK.c.experiment == experiment)
    row = (await session.execute(select(_WORK.c.run_id, _WORK.c.run_samples).where(where))).one()
    delta = claim_delta(row[0], row[1], run_id, processed)
    await session.execute(
        update(_WORK)
        .where(where)
        .values(samples_claimed=_WORK.c.samples_claimed + delta, run_id=run_id, run_samples=processed)
    )
    return delta


@dataclass(frozen=True)
class TrainerRow:
    rank: int
    account_id: int
    account_name: str
    team_id: int | None
    team_name: str | None
    samples: int  # credited: claims bounded by receipts
    claimed: int
    receipt_samples: int


@dataclass(frozen=True)
class TrainerBoard:
    page: int
    per_page: int
    count: int
    rows: list[TrainerRow]

    @property
    def pages(self) -> int:
        return max(1, -(-self.count // self.per_page))

    @property
    def has_more(self) -> bool:
        return self.page < self.pages


async def trainer_board(
    sessions: async_sessionmaker[AsyncSession], page: int = 1, per_page: int = 25
) -> TrainerBoard:
    """Trainer accounts by credited training samples (enabled accounts with any work), best first.

    Trainers are the few accounts the admins gave the role, so this sums their rows per view."""
    per_account = (
        select(
            _WORK.c.peer_id.label("peer_id"),
            CREDITED.label("credited"),
            _WORK.c.samples_claimed.label("claimed"),
            _WORK.c.receipt_samples.label("receipts"),
        )
    ).subquery()
    hosts = _HOSTS
    totals = (
        select(
            hosts.c.account_id.label("account_id"),
            func.sum(per_account.c.credited).label("credited"),
            func.sum(per_account.c.claimed).label("claimed"),
            func.sum(per_account.c.receipts).label("receipts"),
        )
        .join(hosts, hosts.c.peer_id == per_account.c.peer_id)
        .group_by(hosts.c.account_id)
    ).subquery()
    listed = _ACCOUNTS.c.disabled == False  # noqa: E712
    base = (
        select(totals)
        .join(_ACCOUNTS, _ACCOUNTS.c.id == totals.c.account_id)
        .where(listed, totals.c.claimed > 0)
    )
    async with sessions() as session:
        count = (await session.execute(select(func.count()).select_from(base.subquery()))).scalar_one()
        q = (
            select(
                _ACCOUNTS.c.id,
                _ACCOUNTS.c.name,
                _TEAMS.c.id,
                _TEAMS.c.name,
                totals.c.credited,
                totals.c.claimed,
                totals.c.receipts,
            )
            .select_from(totals)
            .join(_ACCOUNTS, _ACCOUNTS.c.id == totals.c.account_id)
            .outerjoin(_TEAMS, _TEAMS.c.id == _ACCOUNTS.c.team_id)
            .where(listed, totals.c.claimed > 0)
            .order_by(totals.c.credited.desc(), _ACCOUNTS.c.id.desc())
            .offset((page - 1) * per_page)
            .limit(per_page)
        )
        rows = (await session.execute(q)).all()
    offset = (page - 1) * per_page
    return TrainerBoard(
        page,
        per_page,
        int(count),
        [
            TrainerRow(offset + i + 1, r[0], r[1], r[2], r[3], int(r[4] or 0), int(r[5] or 0), int(r[6] or 0))
            for i, r in enumerate(rows)
        ],
    )


async def account_training_samples(session: AsyncSession, account_id: int) -> int:
    """An account's credited training samples, over its keys and experiments."""
    hosts = _HOSTS
    q = (
        select(func.coalesce(func.sum(CREDITED), 0))
        .select_from(_WORK.join(hosts, hosts.c.peer_id == _WORK.c.peer_id))
        .where(hosts.c.account_id == account_id)
    )
    return int((await session.execute(q)).scalar_one())
