"""The operator's review of credit: spot-check flags listed, a reversal undone, refusals by reason.

Undoing a flag marks it undone (it is kept, for the record) and gives back, to the host and its
account, team and days, the credit of every receipt of the flag's period that the remaining flags no
longer withhold: what it earned (``receipts.earned``), its recent part decayed from when it was first
credited, as if it had never been taken. Receipts stored before ``earned`` existed stay withheld
(nothing says what they earned). ``lah coordinator flags``, ``undo-flag ID`` and ``refusals`` call these.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Host, Receipt, SpotCheckFlag
from . import rules
from .ledger import CreditPlan, apply_plan, day_of, decay, lock_hosts
from .spot_checks import receipts_in_period

_RECEIPTS: Table = Receipt.__table__  # type: ignore[assignment]
_HOSTS: Table = Host.__table__  # type: ignore[assignment]
_FLAGS: Table = SpotCheckFlag.__table__  # type: ignore[assignment]


class ReviewError(LookupError):
    """No such flag, or one undone already."""


@dataclass(frozen=True)
class UndoResult:
    flag_id: int
    host_peer_id: str
    restored_receipts: int
    restored_credit: float


async def list_flags(
    sessions: async_sessionmaker[AsyncSession], host_peer_id: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The newest flags first (maybe of one host), with whether each was undone."""
    q = select(
        _FLAGS.c.id,
        _FLAGS.c.host_peer_id,
        _FLAGS.c.reporter_peer_id,
        _FLAGS.c.reporter_account_id,
        _FLAGS.c.expert_uid,
        _FLAGS.c.period_start,
        _FLAGS.c.period_end,
        _FLAGS.c.reason,
        _FLAGS.c.reported_at,
        _FLAGS.c.undone_at,
    ).order_by(_FLAGS.c.id.desc())
    if host_peer_id is not None:
        q = q.where(_FLAGS.c.host_peer_id == host_peer_id)
    async with sessions() as session:
        rows = (await session.execute(q.limit(limit))).all()
    return [dict(row._mapping) for row in rows]


async def undo_flag(
    sessions: async_sessionmaker[AsyncSession], flag_id: int, now: float | None = None
) -> UndoResult:
    """Undo flag ``flag_id`` and give back what no remaining flag withholds. ReviewError if there is
    no such flag or it was undone already."""
    now = time.time() if now is None else now
    async with sessions() as session, session.begin():
        marked = (
            await session.execute(
                update(_FLAGS)
                .where(_FLAGS.c.id == flag_id, _FLAGS.c.undone_at.is_(None))
                .values(undone_at=now)
                .returning(_FLAGS.c.host_peer_id, _FLAGS.c.period_start, _FLAGS.c.period_end)
            )
        ).one_or_none()
        if marked is None:
            raise ReviewError(f"no flag {flag_id} that is not undone already")
        host, start, end = marked
        host_rows = await lock_hosts(session, [host])
        flags = (await rules.active_flags(session, [host])).get(host, [])
        count, credit = await _restore(session, host, start, end, flags, now, host_rows)
        if not rules.corroborated(flags):
            await session.execute(update(_HOSTS).where(_HOSTS.c.peer_id == host).values(flagged=False))
    return UndoResult(flag_id, host, count, credit)


async def _restore(
    session: AsyncSession,
    host: str,
    start: float,
    end: float,
    flags: list[tuple[float, float, int]],
    now: float,
    host_rows: list[Any],
) -> tuple[int, float]:
    withheld = [
        w
        for w in await receipts_in_period(session, host, start, end, withheld=True)
        if w.earned is not None
    ]
    back = [
        w
        for w in withheld
        if not rules.withheld_by(flags, w.served_at, -2 if w.account_id is None else w.account_id)
    ]
    if not back:
        return 0, 0.0
    plan = CreditPlan()
    total = 0.0
    for w in back:
        granted_at = w.served_at if w.credited_at is None else w.credited_at
        plan.add(host, w.earned, decay(w.earned, granted_at, now), 1, day_of(w.served_at))
        total += w.earned
    stmt = (
        update(_RECEIPTS)
        .where(_RECEIPTS.c.receipt_id == bindparam("k"))
        .values(withheld=False, credit=bindparam("c"))
    )
    await (await session.connection()).execute(stmt, [{"k": w.receipt_id, "c": w.earned} for w in back])
    await apply_plan(session, plan, now, host_rows)
    return len(back), total


async def refusals(sessions: async_sessionmaker[AsyncSession], days: int = 7) -> list[dict[str, Any]]:
    """Refusals of receipts and reports over the last ``days`` UTC days, by kind and reason."""
    return await rules.refusals(sessions, days, time.time())
