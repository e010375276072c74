"""Leaderboard queries: top users, teams and hosts by total or recent credit; contributor history;
swarm totals.

Totals are ordered by the indexed ``credit_total`` column (offset pagination; pages are capped at
``MAX_DEPTH`` rows deep, so an offset never scans far).

Recent credit is stored as of each row's ``credit_recent_at`` and decays at the same rate everywhere,
so the order of the *decayed* values can differ from the order of the stored ones. The exact top K is
still found through the ``credit_recent`` index: the K largest stored values give a bound (the K-th
largest of their decayed values); decay only shrinks values, so every row of the true top K has a
stored value at or above that bound, and one index range scan reads them all (``_top_recent``). With
rows updated within a few half-lives of each other that is little more than K rows. (A column holding
the value in log space relative to a fixed epoch, ``log2(credit_recent) + (credit_recent_at - EPOCH)
/ half_life``, would make the order exact and directly indexable; see ``recent_key``.)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import ColumnElement, Table, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Account, CreditDay, Host, Team
from .ledger import DAY_S, HALF_LIFE_S, decay, in_list, rac_per_day

Kind = Literal["users", "teams", "hosts"]
Sort = Literal["total", "recent"]
KINDS: tuple[Kind, ...] = ("users", "teams", "hosts")
SORTS: tuple[Sort, ...] = ("total", "recent")
MAX_PER_PAGE = 100
MAX_DEPTH = 10_000  # rows: page x per_page may not go deeper
MAX_HISTORY_DAYS = 3 * 366
MAX_SCAN = 50_000  # rows read to order recent credit in Python before the database does it
EPOCH = 1_767_225_600.0  # 2026-01-01 UTC, for recent_key

_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]
_TEAMS: Table = Team.__table__  # type: ignore[assignment]
_HOSTS: Table = Host.__table__  # type: ignore[assignment]
_DAYS: Table = CreditDay.__table__  # type: ignore[assignment]


class LeaderboardError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def recent_key(recent: float, recent_at: float, half_life: float = HALF_LIFE_S) -> float:
    """A time-independent sort key for recent credit: decay multiplies every row by the same factor,
    so ``log2(recent at EPOCH)`` orders rows as their decayed values at any time do."""
    if recent <= 0.0:
        return -math.inf
    return math.log2(recent) + (recent_at - EPOCH) / half_life


@dataclass(frozen=True)
class Entry:
    rank: int
    id: str
    name: str
    credit_total: float
    credit_recent: float  # decayed to now
    rac_per_day: float
    team: str | None = None  # users: their team; hosts: their account's team
    account: str | None = None  # hosts: the owning account's name
    requests_served: int | None = None  # hosts
    flagged: bool | None = None  # hosts

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank,
            "id": self.id,
            "name": self.name,
            "credit_total": self.credit_total,
            "credit_recent": self.credit_recent,
            "rac_per_day": self.rac_per_day,
        }
        for key in ("team", "account", "requests_served", "flagged"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class Page:
    kind: Kind
    sort: Sort
    page: int
    per_page: int
    has_more: bool
    entries: list[Entry]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sort": self.sort,
            "page": self.page,
            "per_page": self.per_page,
            "has_more": self.has_more,
            "entries": [e.to_json() for e in self.entries],
        }


def _table(kind: Kind) -> tuple[Table, Any, ColumnElement[bool] | None]:
    """(table, key column, filter) for a kind of subject."""
    if kind == "users":  # contributors: enabled volunteers' accounts (trainers pay credit, never earn it)
        listed = (_ACCOUNTS.c.disabled == False) & (_ACCOUNTS.c.role == "volunteer")  # noqa: E712
        return _ACCOUNTS, _ACCOUNTS.c.id, listed
    if kind == "teams":
        return _TEAMS, _TEAMS.c.id, None
    return _HOSTS, _HOSTS.c.peer_id, None


async def leaderboard(
    sessions: async_sessionmaker[AsyncSession],
    kind: Kind,
    sort: Sort = "total",
    page: int = 1,
    per_page: int = 50,
    now: float | None = None,
) -> Page:
    if kind not in KINDS:
        raise LeaderboardError("bad_kind", f"kind must be one of {', '.join(KINDS)}")
    if sort not in SORTS:
        raise LeaderboardError("bad_sort", f"sort must be one of {', '.join(SORTS)}")
    if not 1 <= per_page <= MAX_PER_PAGE:
        raise LeaderboardError("bad_per_page", f"per_page must be 1..{MAX_PER_PAGE}")
    if page < 1 or page * per_page > MAX_DEPTH:
        raise LeaderboardError("bad_page", f"page must be 1..{MAX_DEPTH // per_page}")
    now = time.time() if now is None else now
    offset = (page - 1) * per_page
    table, key, where = _table(kind)
    cols = [key, table.c.credit_total, table.c.credit_recent, table.c.credit_recent_at]
    async with sessions() as session:
        if sort == "total":
            q = select(*cols).order_by(table.c.credit_total.desc(), key.desc())
            if where is not None:
                q = q.where(where)
            rows = [tuple(r) for r in (await session.execute(q.offset(offset).limit(per_page + 1))).all()]
        else:
            rows = await _top_recent(session, table, key, where, offset + per_page + 1, now)
            rows = rows[offset:]
        has_more = len(rows) > per_page
        rows = rows[:per_page]
        entries = await _entries(session, kind, rows, offset, now)
    return Page(kind, sort, page, per_page, has_more, entries)


async def _top_recent(
    session: AsyncSession,
    table: Table,
    key: Any,
    where: ColumnElement[bool] | None,
    k: int,
    now: float,
) -> list[tuple[Any, ...]]:
    """The k rows with the largest recent credit decayed to ``now``, best first (see the module doc).

    Two index range scans: the k largest stored values give a bound ``v`` (the k-th largest of their
    decayed values); every row of the true top k has a stored value >= v, so the second query reads
    exactly those rows.
    """
    cols = (key, table.c.credit_total, table.c.credit_recent, table.c.credit_recent_at)

    def query() -> Any:
        q = select(*cols)
        return q if where is None else q.where(where)

    first = (await session.execute(query().order_by(table.c.credit_recent.desc()).limit(k))).all()
    if len(first) < k:
        return _by_decayed(first, now, k)
    bound = sorted((decay(r[2], r[3], now) for r in first), reverse=True)[k - 1]
    if bound > 0.0:
        rows = (
            await session.execute(
                query()
                .where(table.c.credit_recent >= bound)
                .order_by(table.c.credit_recent.desc())
                .limit(MAX_SCAN)
            )
        ).all()
        if len(rows) < MAX_SCAN:
            return _by_decayed(rows, now, k)
        # Stored values far apart in time: let the database decay them all (math functions needed).
        age = (table.c.credit_recent_at - now) / HALF_LIFE_S
        decayed = case(
            (age < -1000.0, 0.0),  # 2^-1000: PostgreSQL reports underflow instead of rounding to 0
            (age > 0.0, table.c.credit_recent),
            else_=table.c.credit_recent * func.power(2.0, age),
        )
        scan = query().where(table.c.credit_recent >= bound)
        rows = (await session.execute(scan.order_by(decayed.desc(), key.desc()).limit(k))).all()
        return [tuple(r) for r in rows]
    # The page reaches rows without recent credit: those with some, then the rest by key.
    positive = (await session.execute(query().where(table.c.credit_recent > 0.0))).all()
    out = _by_decayed(positive, now, k)
    if len(out) < k:
        rest = query().where(table.c.credit_recent <= 0.0).order_by(key.desc()).limit(k - len(out))
        out += [tuple(r) for r in (await session.execute(rest)).all()]
    return out


def _by_decayed(rows: Any, now: float, k: int | None = None) -> list[tuple[Any, ...]]:
    best = sorted(rows, key=lambda r: (-decay(r[2], r[3], now), _desc_key(r[0])))
    return [tuple(r) for r in best[:k]]


def _desc_key(key: Any) -> Any:
    """Ties broken by key, descending (as the SQL orders them)."""
    if isinstance(key, int):
        return -key
    return tuple(-ord(c) for c in key)


async def _entries(
    session: AsyncSession, kind: Kind, rows: list[tuple[Any, ...]], offset: int, now: float
) -> list[Entry]:
    """Names (and teams, owners) for one page of rows, with two small lookups by key."""
    ids = [r[0] for r in rows]
    names: dict[Any, tuple[Any, ...]] = {}
    if kind == "users" and ids:
        q = (
            select(_ACCOUNTS.c.id, _ACCOUNTS.c.name, _TEAMS.c.name)
            .outerjoin(_TEAMS, _TEAMS.c.id == _ACCOUNTS.c.team_id)
            .where(in_list(session, _ACCOUNTS.c.id, ids))
        )
        names = {r[0]: tuple(r[1:]) for r in (await session.execute(q)).all()}
    elif kind == "teams" and ids:
        q = select(_TEAMS.c.id, _TEAMS.c.name).where(in_list(session, _TEAMS.c.id, ids))
        names = {r[0]: (r[1], None) for r in (await session.execute(q)).all()}
    elif ids:
        q = (
            select(
                _HOSTS.c.peer_id, _ACCOUNTS.c.name, _TEAMS.c.name, _HOSTS.c.requests_served, _HOSTS.c.flagged
            )
            .join(_ACCOUNTS, _ACCOUNTS.c.id == _HOSTS.c.account_id)
            .outerjoin(_TEAMS, _TEAMS.c.id == _ACCOUNTS.c.team_id)
            .where(in_list(session, _HOSTS.c.peer_id, ids))
        )
        names = {r[0]: tuple(r[1:]) for r in (await session.execute(q)).all()}
    entries = []
    for i, (key, total, recent, recent_at) in enumerate(rows):
        info = names.get(key, ("?", None, None, None))
        now_recent = decay(recent, recent_at, now)
        common: dict[str, Any] = {
            "rank": offset + i + 1,
            "id": str(key),
            "credit_total": total,
            "credit_recent": now_recent,
            "rac_per_day": rac_per_day(now_recent),
        }
        if kind == "hosts":
            entries.append(
                Entry(
                    name=str(key)[:12],
                    account=info[0],
                    team=info[1],
                    requests_served=int(info[2] or 0),
                    flagged=bool(info[3]),
                    **common,
                )
            )
        else:
            entries.append(Entry(name=info[0], team=info[1], **common))
    return entries


async def contributor(
    sessions: async_sessionmaker[AsyncSession], account_id: int, days: int = 90, now: float | None = None
) -> dict[str, Any] | None:
    """An account's credit, its hosts, and its credit per day over the last ``days`` days (None: no such
    account, or a disabled one)."""
    now = time.time() if now is None else now
    days = max(1, min(days, MAX_HISTORY_DAYS))
    first_day = int(now // DAY_S) - days + 1
    async with sessions() as session:
        row = (
            await session.execute(
                select(
                    _ACCOUNTS.c.id,
                    _ACCOUNTS.c.name,
                    _TEAMS.c.name,
                    _ACCOUNTS.c.credit_total,
                    _ACCOUNTS.c.credit_recent,
                    _ACCOUNTS.c.credit_recent_at,
                    _ACCOUNTS.c.disabled,
                )
                .outerjoin(_TEAMS, _TEAMS.c.id == _ACCOUNTS.c.team_id)
                .where(_ACCOUNTS.c.id == account_id)
            )
        ).first()
        if row is None or row[6]:
            return None
        hosts = (
            await session.execute(
                select(
                    _HOSTS.c.peer_id,
                    _HOSTS.c.credit_total,
                    _HOSTS.c.credit_recent,
                    _HOSTS.c.credit_recent_at,
                    _HOSTS.c.requests_served,
                    _HOSTS.c.flagged,
                )
                .where(_HOSTS.c.account_id == account_id)
                .order_by(_HOSTS.c.credit_total.desc())
                .limit(1000)
            )
        ).all()
        history = (
            await session.execute(
                select(_DAYS.c.day, _DAYS.c.credit)
                .where(
                    _DAYS.c.subject_kind == "account",
                    _DAYS.c.subject_id == str(account_id),
                    _DAYS.c.day >= first_day,
                )
                .order_by(_DAYS.c.day)
            )
        ).all()
    recent = decay(row[4], row[5], now)
    return {
        "account": {
            "id": row[0],
            "name": row[1],
            "team": row[2],
            "credit_total": row[3],
            "credit_recent": recent,
            "rac_per_day": rac_per_day(recent),
        },
        "hosts": [
            {
                "peer_id": h[0],
                "credit_total": h[1],
                "credit_recent": decay(h[2], h[3], now),
                "requests_served": h[4],
                "flagged": h[5],
            }
            for h in hosts
        ],
        "history": [{"day": d, "date": _date(d), "credit": c} for d, c in history],
    }


def _date(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * DAY_S))


async def swarm_stats(sessions: async_sessionmaker[AsyncSession]) -> dict[str, Any]:
    """Totals over the swarm: hosts, requests served, credit granted."""
    async with sessions() as session:
        hosts = (
            await session.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(_HOSTS.c.requests_served), 0),
                    func.coalesce(func.sum(_HOSTS.c.credit_total), 0.0),
                    func.coalesce(func.sum(case((_HOSTS.c.flagged, 1), else_=0)), 0),
                ).select_from(_HOSTS)
            )
        ).one()
        accounts = (await session.execute(select(func.count()).select_from(_ACCOUNTS))).scalar_one()
        teams = (await session.execute(select(func.count()).select_from(_TEAMS))).scalar_one()
    return {
        "hosts": int(hosts[0]),
        "requests_served": int(hosts[1]),
        "credit_total": float(hosts[2]),
        "flagged_hosts": int(hosts[3]),
        "accounts": int(accounts),
        "teams": int(teams),
    }
