"""What the team, host and contributor pages read beyond ``queries``: team members and history, a
host's record, join dates and credit milestones (pure ``milestones`` over a daily series)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..credit.ledger import DAY_S, decay, rac_per_day
from ..db.models import Account, CreditDay, Host, Team
from .queries import MAX_CHART_DAYS, MIN_CHART_DAYS, CreditPoint

MILESTONES = (100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9)
MAX_MEMBERS_PAGE = 100


@dataclass(frozen=True)
class Milestone:
    credit: float
    day: int | None  # the UTC day it was passed; None: passed before the daily history starts
    reached: bool


def milestones(total: float, history: Sequence[CreditPoint]) -> list[Milestone]:
    """Every milestone passed (with the day the running sum of ``history`` crossed it) and the next one.

    Credit earned before the oldest rollup counts as earned before it: the sum starts at
    ``total - sum(history)``, so a milestone passed earlier has no day."""
    before = max(0.0, total - sum(p.credit for p in history))
    out: list[Milestone] = []
    running = before
    days = iter(sorted(history, key=lambda p: p.day))
    current: int | None = None
    for m in MILESTONES:
        if total < m:
            out.append(Milestone(m, None, False))
            break
        while running < m:
            p = next(days, None)
            if p is None:
                break
            running += p.credit
            current = p.day
        out.append(Milestone(m, None if m <= before else current, True))
    return out


def series(rows: Sequence[tuple[int, float]], today: int) -> list[CreditPoint]:
    """One point per day from the first day with credit (at least ``MIN_CHART_DAYS``) to today."""
    by_day = {int(d): float(c) for d, c in rows if int(d) <= today}
    start = min(min(by_day, default=today), today - MIN_CHART_DAYS + 1)
    start = max(start, today - MAX_CHART_DAYS + 1)
    return [CreditPoint(d, by_day.get(d, 0.0)) for d in range(start, today + 1)]


async def daily(session: AsyncSession, kind: str, subject_id: str) -> list[tuple[int, float]]:
    q = (
        select(CreditDay.day, CreditDay.credit)
        .where(CreditDay.subject_kind == kind, CreditDay.subject_id == subject_id)
        .order_by(CreditDay.day)
    )
    return [(int(d), float(c)) for d, c in (await session.execute(q)).all()]


@dataclass(frozen=True)
class Member:
    id: int
    name: str
    total: float
    recent: float
    joined: datetime | None


@dataclass(frozen=True)
class TeamInfo:
    id: int
    name: str
    created: datetime | None
    total: float
    recent: float
    rank_total: int
    member_count: int
    members: list[Member]  # this page of them, by total credit
    page: int
    per_page: int
    days: list[CreditPoint]
    milestones: list[Milestone]

    @property
    def pages(self) -> int:
        return max(1, -(-self.member_count // self.per_page))


async def team(
    sessions: async_sessionmaker[AsyncSession], team_id: int, now: float, page: int = 1, per_page: int = 25
) -> TeamInfo | None:
    async with sessions() as session:
        t = await session.get(Team, team_id)
        if t is None:
            return None
        above = (
            await session.execute(
                select(func.count())
                .select_from(Team)
                .where(
                    (Team.credit_total > t.credit_total)
                    | ((Team.credit_total == t.credit_total) & (Team.id > t.id))
                )
            )
        ).scalar_one()
        active = (Account.team_id == team_id) & Account.disabled.is_(False)
        count = (await session.execute(select(func.count()).select_from(Account).where(active))).scalar_one()
        mq = (
            select(Account.id, Account.name, Account.credit_total, Account.credit_recent,
                   Account.credit_recent_at, Account.created_at)
            .where(active)
            .order_by(Account.credit_total.desc(), Account.id.desc())
            .offset((page - 1) * per_page)
            .limit(per_page)
        )  # fmt: skip
        members = [
            Member(i, n, float(tot), rac_per_day(decay(r, at, now)), c)
            for i, n, tot, r, at, c in (await session.execute(mq)).all()
        ]
        rows = await daily(session, "team", str(team_id))
    days = series(rows, int(now // DAY_S))
    return TeamInfo(
        t.id,
        t.name,
        t.created_at,
        t.credit_total,
        rac_per_day(decay(t.credit_recent, t.credit_recent_at, now)),
        int(above) + 1,
        int(count),
        members,
        page,
        per_page,
        days,
        milestones(t.credit_total, [CreditPoint(d, c) for d, c in rows]),
    )


@dataclass(frozen=True)
class HostPage:
    peer_id: str
    account_id: int
    account_name: str
    account_disabled: bool
    team_id: int | None
    team_name: str | None
    bound: datetime | None
    total: float
    recent: float
    requests_served: int
    last_seen: float
    flagged: bool
    energy_kwh: float
    days: list[CreditPoint]


async def host(sessions: async_sessionmaker[AsyncSession], peer_id: str, now: float) -> HostPage | None:
    async with sessions() as session:
        row = (
            await session.execute(
                select(Host, Account.name, Account.disabled, Account.team_id, Team.name)
                .join(Account, Account.id == Host.account_id)
                .outerjoin(Team, Team.id == Account.team_id)
                .where(Host.peer_id == peer_id)
            )
        ).first()
        if row is None:
            return None
        h, aname, disabled, tid, tname = row
        rows = await daily(session, "host", peer_id)
    return HostPage(
        h.peer_id,
        h.account_id,
        aname,
        bool(disabled),
        tid,
        tname,
        h.bound_at,
        h.credit_total,
        rac_per_day(decay(h.credit_recent, h.credit_recent_at, now)),
        int(h.requests_served),
        float(h.last_seen),
        bool(h.flagged),
        float(h.energy_kwh),
        series(rows, int(now // DAY_S)),
    )


@dataclass(frozen=True)
class AccountExtras:
    joined: datetime | None
    team_id: int | None
    milestones: list[Milestone]


async def account_extras(
    sessions: async_sessionmaker[AsyncSession], account_id: int, total: float
) -> AccountExtras:
    async with sessions() as session:
        row = (
            await session.execute(select(Account.created_at, Account.team_id).where(Account.id == account_id))
        ).first()
        rows = await daily(session, "account", str(account_id))
    joined, team_id = (row[0], row[1]) if row is not None else (None, None)
    return AccountExtras(joined, team_id, milestones(total, [CreditPoint(d, c) for d, c in rows]))
