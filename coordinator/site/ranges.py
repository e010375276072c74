"""Leaderboards over a time range (today, 7 days, 30 days), from the daily rollups.

A range is whole UTC days ending today: ``day`` is the current UTC day, ``week`` the last 7, ``month``
the last 30 ("all time" is the leaderboard's own ``credit_total`` order). ``refresh`` sums
``credit_days`` over each window into ``credit_ranges``; pages then read one index range of
``credit_ranges`` instead of summing rollups per view, and receipts are never scanned. The periodic
job (``coordinator.site.jobs``) refreshes every few minutes, so a range is at most that stale; the
page says when it was computed.

A refresh never holds the database's write lock for long (SQLite has one lock for all writers, and
receipt ingestion must not wait seconds for it): the sums are read first (a read, streamed), then
written as a new *generation* (``computed_at``) in transactions of ``CHUNK`` rows, published by one
tiny update of ``credit_range_runs``, and the old generation is deleted in chunks. Readers read the
published generation only, so they see the old sums or the new ones, never a mix; a refresh killed
half-way leaves an unpublished generation that the next one deletes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import String, and_, cast, delete, func, insert, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..credit.leaderboard import MAX_DEPTH
from ..credit.ledger import DAY_S
from ..db.models import Account, CreditDay, CreditRange, CreditRangeRun, Host, Team

Range = Literal["day", "week", "month", "all"]
RANGES: tuple[Range, ...] = ("all", "month", "week", "day")
RANGE_DAYS: dict[str, int] = {"day": 1, "week": 7, "month": 30}
RANGE_LABELS: dict[str, str] = {"all": "All time", "month": "30 days", "week": "7 days", "day": "Today"}
SUBJECT = {"users": "account", "teams": "team", "hosts": "host"}
CHUNK = 5000  # rows per write transaction


async def refresh(sessions: async_sessionmaker[AsyncSession], now: float) -> int:
    """Recompute every range from the rollups; returns the rows written."""
    written = 0
    for days in sorted(set(RANGE_DAYS.values())):
        written += await _refresh_window(sessions, days, now)
    return written


async def _refresh_window(sessions: async_sessionmaker[AsyncSession], days: int, now: float) -> int:
    today = int(now // DAY_S)
    # Disabled accounts are left out here, so ranks count only who the pages show (few rows: a subquery).
    disabled = select(cast(Account.id, String)).where(Account.disabled.is_(True))
    summed = (
        select(CreditDay.subject_kind, CreditDay.subject_id, func.sum(CreditDay.credit))
        .where(CreditDay.day > today - days, CreditDay.day <= today)
        .where(~and_(CreditDay.subject_kind == "account", CreditDay.subject_id.in_(disabled)))
        .group_by(CreditDay.subject_kind, CreditDay.subject_id)
        .having(func.sum(CreditDay.credit) > 0)
    )
    written = 0
    counts: dict[str, int] = {}
    async with sessions() as reader:
        result = await reader.stream(summed)
        async for part in result.partitions(CHUNK):
            rows = [
                {"subject_kind": k, "days": days, "computed_at": now, "subject_id": sid, "credit": float(c)}
                for k, sid, c in part
            ]
            async with sessions() as writer, writer.begin():
                await writer.execute(insert(CreditRange), rows)
            written += len(rows)
            for k, _, _ in part:
                counts[k] = counts.get(k, 0) + 1
            await asyncio.sleep(0)  # let pages run between chunks
    async with sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            # Statistics that know the new generation, before anyone reads it: without them the
            # planner guesses one row and sorts the whole range instead of reading a page of the index.
            await session.execute(text("ANALYZE credit_ranges"))
            await session.commit()
    async with sessions() as session, session.begin():  # publish: one row
        await session.execute(delete(CreditRangeRun).where(CreditRangeRun.days == days))
        session.add(
            CreditRangeRun(
                days=days,
                computed_at=now,
                accounts=counts.get("account", 0),
                teams=counts.get("team", 0),
                hosts=counts.get("host", 0),
            )
        )
    await _drop_old(sessions, days, now)
    return written


async def _drop_old(sessions: async_sessionmaker[AsyncSession], days: int, keep: float) -> None:
    """Delete every generation of the window but ``keep``, ``CHUNK`` rows per transaction."""
    key = tuple_(CreditRange.subject_kind, CreditRange.computed_at, CreditRange.subject_id)
    while True:
        old = (
            select(CreditRange.subject_kind, CreditRange.computed_at, CreditRange.subject_id)
            .where(CreditRange.days == days, CreditRange.computed_at != keep)
            .limit(CHUNK)
        )
        async with sessions() as session, session.begin():
            doomed = (await session.execute(old)).all()
            if not doomed:
                return
            await session.execute(
                delete(CreditRange).where(CreditRange.days == days, key.in_([tuple(r) for r in doomed]))
            )
        await asyncio.sleep(0)


async def published(session: AsyncSession, days: int) -> float | None:
    """The generation pages read for a window (None: never refreshed)."""
    run = await session.get(CreditRangeRun, days)
    return None if run is None else run.computed_at


@dataclass(frozen=True)
class RangeRow:
    rank: int
    key: str
    credit: float


@dataclass(frozen=True)
class RangePage:
    rows: list[RangeRow]
    count: int
    has_more: bool
    computed_at: float | None  # None: never refreshed


def _where(kind: str, days: int, generation: float | None) -> Any:
    return and_(
        CreditRange.subject_kind == SUBJECT[kind],
        CreditRange.days == days,
        CreditRange.computed_at == (generation if generation is not None else -1.0),
    )


async def range_page(session: AsyncSession, kind: str, rng: str, page: int, per_page: int) -> RangePage:
    """One page of subjects by credit in the range, best first (ties: higher id first, as 'total')."""
    days = RANGE_DAYS[rng]
    offset = (page - 1) * per_page
    run = await session.get(CreditRangeRun, days)
    computed = None if run is None else run.computed_at
    q = (
        select(CreditRange.subject_id, CreditRange.credit)
        .where(_where(kind, days, computed))
        .order_by(CreditRange.credit.desc(), CreditRange.subject_id.desc())
        .offset(offset)
        .limit(per_page + 1)
    )
    rows = (await session.execute(q)).all()
    # Counted as the refresh wrote them: no page scans the range to count it.
    count = 0 if run is None else int(getattr(run, SUBJECT[kind] + "s"))
    out = [RangeRow(offset + i + 1, sid, float(c)) for i, (sid, c) in enumerate(rows[:per_page])]
    return RangePage(out, count, len(rows) > per_page, computed)


async def range_rank(session: AsyncSession, kind: str, rng: str, key: str) -> int | None:
    """1-based position of ``key`` in the range's order; None when it has no credit in the range,
    ``MAX_DEPTH + 1`` when it is below the listed pages (counting stops there: the cost is bounded)."""
    days = RANGE_DAYS[rng]
    generation = await published(session, days)
    mine = (
        await session.execute(
            select(CreditRange.credit).where(_where(kind, days, generation), CreditRange.subject_id == key)
        )
    ).scalar()
    if mine is None:
        return None
    above = 0
    for cond in (
        CreditRange.credit > mine,
        and_(CreditRange.credit == mine, CreditRange.subject_id > key),
    ):  # two bounded index range scans (an OR of them reads every row of the range)
        sub = select(CreditRange.subject_id).where(_where(kind, days, generation), cond).limit(MAX_DEPTH)
        above += int((await session.execute(select(func.count()).select_from(sub.subquery()))).scalar_one())
    return min(above, MAX_DEPTH) + 1  # MAX_DEPTH + 1: somewhere below the listed pages


async def names(session: AsyncSession, kind: str, keys: list[str]) -> dict[str, dict[str, Any]]:
    """What a range page shows beside each key: name, links, total credit (disabled accounts left out)."""
    if not keys:
        return {}
    out: dict[str, dict[str, Any]] = {}
    if kind == "users":
        ids = [int(k) for k in keys if k.isdigit()]
        q = (
            select(Account.id, Account.name, Team.name, Account.credit_total, Account.team_id)
            .outerjoin(Team, Team.id == Account.team_id)
            .where(Account.id.in_(ids), Account.disabled.is_(False))
        )
        for aid, name, team, total, tid in (await session.execute(q)).all():
            out[str(aid)] = {"name": name, "account_id": aid, "account_name": name, "team_name": team,
                             "team_id": tid, "total": total}  # fmt: skip
    elif kind == "teams":
        tq = select(Team.id, Team.name, Team.credit_total).where(
            Team.id.in_([int(k) for k in keys if k.isdigit()])
        )
        for tid, name, total in (await session.execute(tq)).all():
            out[str(tid)] = {"name": name, "account_id": None, "account_name": None, "team_name": name,
                             "team_id": tid, "total": total}  # fmt: skip
    else:
        hq = (
            select(Host.peer_id, Account.id, Account.name, Team.name, Host.credit_total, Account.team_id)
            .join(Account, Account.id == Host.account_id)
            .outerjoin(Team, Team.id == Account.team_id)
            .where(Host.peer_id.in_(keys))
        )
        for pid, aid, aname, team, total, tid in (await session.execute(hq)).all():
            out[pid] = {"name": pid, "account_id": aid, "account_name": aname, "team_name": team,
                        "team_id": tid, "total": total}  # fmt: skip
    return out
