"""Find-my-rank: where a name stands in a leaderboard order, so the site can jump to its page.

Positions follow the leaderboard's own order exactly (``coordinator.credit.leaderboard``: credit descending,
ties by key descending). By total, and over a range, that is one indexed count of the rows above. By
recent credit the stored values decay, so the rows that can beat a value are those whose *stored*
value is at least its decayed one (decay only shrinks); they are read through the index and decayed
here, as the leaderboard does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from ..credit.leaderboard import MAX_DEPTH, MAX_SCAN
from ..credit.ledger import decay
from ..db.models import Account, Host, Team
from . import ranges
from .search import fold, normalise


@dataclass(frozen=True)
class Found:
    key: str
    name: str
    rank: int | None  # None: no credit in that range; MAX_DEPTH + 1: below the listed pages


def _table(kind: str) -> tuple[Any, Any, Any]:
    if kind == "users":
        return Account, Account.id, Account.disabled.is_(False)
    if kind == "teams":
        return Team, Team.id, None
    return Host, Host.peer_id, None


async def resolve(session: AsyncSession, kind: str, raw: str) -> tuple[str, str] | None:
    """(key, display name) of the subject called ``raw`` (any case); hosts: a unique peer-id prefix."""
    query = normalise(raw)
    if not query:
        return None
    dialect = session.get_bind().dialect.name
    if kind == "hosts":
        prefix = query.lower()
        rows = (
            await session.execute(
                select(Host.peer_id).where(Host.peer_id >= prefix, Host.peer_id < prefix + "g").limit(2)
            )
        ).all()
        return (rows[0][0], rows[0][0]) if len(rows) == 1 else None
    table, key, where = _table(kind)
    q: Any = select(key, table.name).where(func.lower(table.name) == fold(query, dialect))
    if where is not None:
        q = q.where(where)
    named: list[Any] = list((await session.execute(q.order_by(key).limit(2))).all())
    exact = [r for r in named if r[1] == query]
    row = exact[0] if exact else named[0] if len(named) == 1 else None
    return None if row is None else (str(row[0]), str(row[1]))


async def position(session: AsyncSession, kind: str, order: str, key: str, now: float) -> int | None:
    """1-based position of ``key`` in ``order`` ('total', 'recent' or a range name); ``MAX_DEPTH + 1``
    (or None, by recent credit) when it is below the listed pages."""
    if order in ranges.RANGE_DAYS:
        return await ranges.range_rank(session, kind, order, key)
    table, col, where = _table(kind)
    typed: Any = int(key) if kind != "hosts" else key
    mine = (
        await session.execute(
            select(table.credit_total, table.credit_recent, table.credit_recent_at).where(col == typed)
        )
    ).first()
    if mine is None:
        return None
    if order == "total":
        above = await count_upto(
            session,
            [table.credit_total > mine[0], and_(table.credit_total == mine[0], col > typed)],
            where,
            col,
        )
        return min(above, MAX_DEPTH) + 1  # MAX_DEPTH + 1: somewhere below the listed pages
    value = decay(mine[1], mine[2], now)
    q2 = select(col, table.credit_recent, table.credit_recent_at).where(table.credit_recent >= value)
    if where is not None:
        q2 = q2.where(where)
    rows = (await session.execute(q2.order_by(table.credit_recent.desc()).limit(MAX_SCAN))).all()
    if len(rows) >= MAX_SCAN:
        return None
    above = 0
    for k, r, at in rows:
        v = decay(r, at, now)
        if v > value or (v == value and k > typed):
            above += 1
    return min(above, MAX_DEPTH) + 1  # MAX_DEPTH + 1: somewhere below the listed pages


async def count_upto(session: AsyncSession, parts: list[Any], where: Any, key: Any) -> int:
    """Rows matching any of ``parts`` (disjoint conditions) and ``where``, counted up to ``MAX_DEPTH``.

    The leaderboard shows no row deeper than ``MAX_DEPTH``, so counting further buys nothing; each part
    is its own bounded index range scan (an OR of them would make the database read every row)."""
    total = 0
    for cond in parts:
        inner = select(key).where(cond)
        if where is not None:
            inner = inner.where(where)
        sub = inner.limit(MAX_DEPTH - total).subquery()
        total += int((await session.execute(select(func.count()).select_from(sub))).scalar_one())
        if total >= MAX_DEPTH:
            break
    return total
