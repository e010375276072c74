"""What the site's pages read, as plain frozen dataclasses.

The leaderboard and contributor data come from ``coordinator.credit.leaderboard`` (which owns ordering, recent
credit decay and paging limits); this module adds only what the pages show beside them (row counts,
team sizes, owners' ids, hosts' last contact, rank) and the swarm view: grid coverage from unexpired
assignments and the hosts that served the most requests. "Recent" on the site is the per-day recent
average credit (``ledger.rac_per_day``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..config import ExperimentConfig
from ..credit import leaderboard as lb
from ..credit.ledger import DAY_S, decay, rac_per_day
from ..db.models import Account, Host, Team
from ..swarm.assignment import coverage, expert_uids
from . import ranges

Kind = lb.Kind
Sort = lb.Sort
KINDS = lb.KINDS
SORTS = lb.SORTS

ACTIVE_WINDOW_S = 600.0  # a host seen this recently counts as active


def recent_per_day(value: float, at: float, now: float) -> float:
    """Recent average credit per day as of ``now`` (the ledger stores a decayed sum as of ``at``)."""
    return rac_per_day(decay(value, at, now))


@dataclass(frozen=True)
class LeaderRow:
    rank: int
    key: str  # account id, team id or host peer id
    name: str  # account name, team name or host peer id
    account_id: int | None  # whose contributor page the row links to (None for teams)
    account_name: str | None
    team_name: str | None
    members: int | None  # teams only
    total: float
    recent: float  # recent average credit per day; on a range page, the credit in the range
    team_id: int | None = None  # the team page the row links to


@dataclass(frozen=True)
class LeaderboardPage:
    kind: Kind
    sort: Sort
    page: int
    per_page: int
    count: int  # rows on all pages
    has_more: bool
    rows: list[LeaderRow]
    range: str = "all"  # coordinator.site.ranges.RANGES
    computed_at: float | None = None  # ranges: when they were summed

    @property
    def pages(self) -> int:
        return max(1, -(-self.count // self.per_page))


async def leaderboard_page(
    sessions: async_sessionmaker[AsyncSession], kind: Kind, sort: Sort, page: int, per_page: int, now: float
) -> LeaderboardPage:
    """``coordinator.credit.leaderboard.leaderboard``, plus what the page shows beside it: the row count,
    owners' account ids (host rows link to them) and team sizes. Raises ``LeaderboardError`` on bad
    arguments."""
    board = await lb.leaderboard(sessions, kind, sort, page=page, per_page=per_page, now=now)
    keys = [e.id for e in board.entries]
    async with sessions() as session:
        if kind == "users":
            where: Any = Account.disabled.is_(False)
            count = await _count(session, select(func.count()).select_from(Account).where(where))
        elif kind == "teams":
            count = await _count(session, select(func.count()).select_from(Team))
        else:
            count = await _count(session, select(func.count()).select_from(Host))
        owners: dict[str, int] = {}
        members: dict[str, int] = {}
        teams: dict[str, int | None] = {}
        if kind == "hosts" and keys:
            q = (
                select(Host.peer_id, Host.account_id, Account.team_id)
                .join(Account, Account.id == Host.account_id)
                .where(Host.peer_id.in_(keys))
            )
            for pid, aid, tid in (await session.execute(q)).all():
                owners[pid], teams[pid] = aid, tid
        if kind == "users" and keys:
            uq = select(Account.id, Account.team_id).where(Account.id.in_([int(k) for k in keys]))
            teams = {str(aid): tid for aid, tid in (await session.execute(uq)).all()}
        if kind == "teams" and keys:
            tq = (
                select(Account.team_id, func.count())
                .where(Account.team_id.in_([int(k) for k in keys]), Account.disabled.is_(False))
                .group_by(Account.team_id)
            )
            members = {str(tid): int(n) for tid, n in (await session.execute(tq)).all()}
    rows = []
    for e in board.entries:
        if kind == "users":
            aid = int(e.id)
            row = LeaderRow(
                e.rank,
                e.id,
                e.name,
                aid,
                e.name,
                e.team,
                None,
                e.credit_total,
                e.rac_per_day,
                teams.get(e.id),
            )
        elif kind == "teams":
            row = LeaderRow(
                e.rank,
                e.id,
                e.name,
                None,
                None,
                e.name,
                members.get(e.id, 0),
                e.credit_total,
                e.rac_per_day,
                int(e.id),
            )
        else:
            row = LeaderRow(
                e.rank,
                e.id,
                e.id,
                owners.get(e.id),
                e.account,
                e.team,
                None,
                e.credit_total,
                e.rac_per_day,
                teams.get(e.id),
            )
        rows.append(row)
    return LeaderboardPage(kind, sort, page, per_page, count, board.has_more, rows)


async def range_leaderboard_page(
    sessions: async_sessionmaker[AsyncSession], kind: Kind, rng: str, page: int, per_page: int
) -> LeaderboardPage:
    """Subjects by credit over a range of days, from ``credit_ranges`` (see ``ranges``); ``recent`` of
    each row is its credit in the range."""
    async with sessions() as session:
        got = await ranges.range_page(session, kind, rng, page, per_page)
        info = await ranges.names(session, kind, [r.key for r in got.rows])
        members: dict[str, int] = {}
        if kind == "teams" and info:
            tq = (
                select(Account.team_id, func.count())
                .where(Account.team_id.in_([int(k) for k in info]), Account.disabled.is_(False))
                .group_by(Account.team_id)
            )
            members = {str(tid): int(n) for tid, n in (await session.execute(tq)).all()}
    rows = []
    for r in got.rows:
        i = info.get(r.key)
        if i is None:  # disabled (or deleted) since the last refresh
            continue
        rows.append(
            LeaderRow(
                r.rank,
                r.key,
                i["name"],
                i["account_id"],
                i["account_name"],
                i["team_name"],
                members.get(r.key, 0) if kind == "teams" else None,
                float(i["total"]),
                r.credit,
                i["team_id"],
            )
        )
    return LeaderboardPage(kind, "total", page, per_page, got.count, got.has_more, rows, rng, got.computed_at)


async def _count(session: AsyncSession, q: Select[Any]) -> int:
    return int((await session.execute(q)).scalar_one())


@dataclass(frozen=True)
class HostInfo:
    peer_id: str
    total: float
    recent: float
    requests_served: int
    last_seen: float
    flagged: bool
    account_id: int | None = None
    account_name: str | None = None


@dataclass(frozen=True)
class CreditPoint:
    day: int  # days since the epoch (UTC)
    credit: float


@dataclass(frozen=True)
class Contributor:
    id: int
    name: str
    team_id: int | None
    team_name: str | None
    total: float
    recent: float
    rank_total: int
    hosts: list[HostInfo]
    days: list[CreditPoint]  # one point per day, zeros filled in, oldest first


#: The chart shows at least this many days, and at most the last ``MAX_CHART_DAYS``.
MIN_CHART_DAYS = 30
MAX_CHART_DAYS = 180


async def contributor(
    sessions: async_sessionmaker[AsyncSession], account_id: int, now: float
) -> Contributor | None:
    """``coordinator.credit.leaderboard.contributor``, plus the rank, hosts' last contact, and the daily
    series with the days without credit filled in (the chart needs every day)."""
    info = await lb.contributor(sessions, account_id, days=MAX_CHART_DAYS, now=now)
    if info is None:
        return None
    account = info["account"]
    async with sessions() as session:
        above = await _count(
            session,
            select(func.count())
            .select_from(Account)
            .where(
                Account.disabled.is_(False),
                (Account.credit_total > account["credit_total"])
                | ((Account.credit_total == account["credit_total"]) & (Account.id > account_id)),
            ),
        )
        team_id = (await session.execute(select(Account.team_id).where(Account.id == account_id))).scalar()
        seen_q = select(Host.peer_id, Host.last_seen).where(Host.account_id == account_id)
        seen = {pid: float(t) for pid, t in (await session.execute(seen_q)).all()}
    hosts = [
        HostInfo(
            h["peer_id"],
            h["credit_total"],
            rac_per_day(h["credit_recent"]),
            int(h["requests_served"]),
            seen.get(h["peer_id"], 0.0),
            bool(h["flagged"]),
        )
        for h in info["hosts"]
    ]
    today = int(now // DAY_S)
    by_day = {int(p["day"]): float(p["credit"]) for p in info["history"] if int(p["day"]) <= today}
    start = min(min(by_day, default=today), today - MIN_CHART_DAYS + 1)
    days = [CreditPoint(d, by_day.get(d, 0.0)) for d in range(start, today + 1)]
    return Contributor(
        account_id,
        account["name"],
        team_id,
        account["team"],
        account["credit_total"],
        account["rac_per_day"],
        above + 1,
        hosts,
        days,
    )


@dataclass(frozen=True)
class ExperimentCoverage:
    name: str
    expert_type: str
    grid: list[int]
    replication: int
    hosts_per_expert: dict[str, int]  # every uid of the grid, 0 where nobody hosts it

    @property
    def experts(self) -> int:
        return len(self.hosts_per_expert)

    @property
    def covered(self) -> int:
        """Experts with at least one live host."""
        return sum(1 for n in self.hosts_per_expert.values() if n > 0)

    @property
    def replicated(self) -> int:
        """Experts with at least ``replication`` live hosts."""
        return sum(1 for n in self.hosts_per_expert.values() if n >= self.replication)


@dataclass(frozen=True)
class Swarm:
    peers_online: int
    accounts: int
    teams: int
    hosts: int
    active_hosts: int  # seen within ACTIVE_WINDOW_S
    credit_total: float
    requests_served: int
    experiments: list[ExperimentCoverage]
    top_hosts: list[HostInfo]


async def swarm(
    session: AsyncSession,
    experiments: Sequence[ExperimentConfig],
    peers_online: int,
    now: float,
    top: int = 20,
) -> Swarm:
    accounts = await _count(
        session, select(func.count()).select_from(Account).where(Account.disabled.is_(False))
    )
    teams = await _count(session, select(func.count()).select_from(Team))
    hosts, served, credit = (
        await session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(Host.requests_served), 0),
                func.coalesce(func.sum(Host.credit_total), 0.0),
            ).select_from(Host)
        )
    ).one()
    active = await _count(
        session, select(func.count()).select_from(Host).where(Host.last_seen >= now - ACTIVE_WINDOW_S)
    )
    coverages = []
    for exp in experiments:
        live = await coverage(session, exp.name, now)
        coverages.append(
            ExperimentCoverage(
                exp.name,
                exp.expert_type,
                list(exp.grid),
                exp.replication,
                {uid: live.get(uid, 0) for uid in expert_uids(exp)},
            )
        )
    top_rows = (
        await session.execute(
            select(Host, Account.name)
            .join(Account, Host.account_id == Account.id)
            .order_by(Host.requests_served.desc(), Host.peer_id)
            .limit(top)
        )
    ).all()
    top_hosts = [
        HostInfo(
            h.peer_id,
            h.credit_total,
            recent_per_day(h.credit_recent, h.credit_recent_at, now),
            h.requests_served,
            h.last_seen,
            h.flagged,
            h.account_id,
            name,
        )
        for h, name in top_rows
    ]
    return Swarm(
        peers_online,
        accounts,
        teams,
        int(hosts),
        active,
        float(credit),
        int(served),
        coverages,
        top_hosts,
    )
