"""Failed spot checks: a trainer re-ran a request and the host's output disagreed.

The report is signed by the trainer (``engine.wire.statements``). One trainer alone decides only about
its own grants: a report withholds and takes back the credit of the receipts the reporter's own account
gave the host in the period; every trainer's receipts only where reports of two trainer accounts or more
cover the same time (``rules.withheld_by``; the host is then ``flagged``). So a trainer that never talked
to a volunteer cannot erase what others granted it.

Refused, counted (``credit_refusals``, kind ``report``) and changing nothing: a bad signature, a reporter
that is not an enabled trainer, an unknown host, a period out of order or longer than 7 days
(``bad_period``), in the future (``future_period``), before the host was bound (``before_host``), a
report seen before (``replayed``: its id, or the same reporter, host and period), and more than
``MAX_REPORTS_PER_DAY`` reports of one reporter account on one host in 24 hours (``too_many_reports``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Account, Host, Receipt, SpotCheckFlag
from . import rules
from .ledger import (
    MAX_SKEW_S,
    MAX_SPOT_PERIOD_S,
    TRAINER_ROLES,
    CreditPlan,
    apply_plan,
    day_of,
    decay,
    in_list,
    lock_hosts,
)
from .receipts import ReceiptError, SpotCheckReport, verify_spot_check

MAX_REPORTS_PER_DAY = 3  # per reporter account and host
BOUND_GRACE_S = 300.0  # clock skew between a trainer's period and the coordinator's bound_at

_RECEIPTS: Table = Receipt.__table__  # type: ignore[assignment]
_HOSTS: Table = Host.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]
_FLAGS: Table = SpotCheckFlag.__table__  # type: ignore[assignment]


@dataclass
class SpotCheckResult:
    flag_id: int
    withheld_receipts: int
    reversed_credit: float
    corroborated: bool = False  # reports of two trainer accounts or more agree: everyone's receipts


class SpotCheckRejected(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


async def report_spot_check(
    sessions: async_sessionmaker[AsyncSession], report: SpotCheckReport, now: float | None = None
) -> SpotCheckResult:
    """Record the flag; withhold and take back what its reporter (or, where two trainer accounts
    agree, every trainer) granted the host in the period.

    Raises SpotCheckRejected (codes: bad_signature, bad_period, future_period, not_a_trainer,
    unknown_host, before_host, replayed, too_many_reports), each counted.
    """
    now = time.time() if now is None else now
    try:
        return await _report(sessions, report, now)
    except SpotCheckRejected as e:
        await rules.record_refusals(sessions, "report", [e.code], now)
        raise


async def _report(
    sessions: async_sessionmaker[AsyncSession], report: SpotCheckReport, now: float
) -> SpotCheckResult:
    try:
        verify_spot_check(report)
    except ReceiptError as e:
        raise SpotCheckRejected("bad_signature", str(e)) from e
    start, end = report.period_start, report.period_end
    if not start <= end or end - start > MAX_SPOT_PERIOD_S:
        raise SpotCheckRejected("bad_period", "the period must be ordered and at most 7 days long")
    if end > now + MAX_SKEW_S:
        raise SpotCheckRejected("future_period", "the period ends in the future")
    async with sessions() as session, session.begin():
        rows = (
            await session.execute(
                select(
                    _HOSTS.c.peer_id,
                    _ACCOUNTS.c.id,
                    _ACCOUNTS.c.role,
                    _ACCOUNTS.c.disabled,
                    _HOSTS.c.bound_at,
                )
                .join(_ACCOUNTS, _ACCOUNTS.c.id == _HOSTS.c.account_id)
                .where(_HOSTS.c.peer_id.in_([report.reporter_peer_id, report.host_peer_id]))
            )
        ).all()
        known = {row[0]: row[1:] for row in rows}
        reporter = known.get(report.reporter_peer_id)
        if reporter is None or reporter[2] or reporter[1] not in TRAINER_ROLES:
            raise SpotCheckRejected("not_a_trainer", "the reporter is not bound to a trainer account")
        host = known.get(report.host_peer_id)
        if host is None:
            raise SpotCheckRejected("unknown_host", "no such host")
        if start < _unix(host[3]) - BOUND_GRACE_S:
            raise SpotCheckRejected("before_host", "the period starts before the host was bound")
        reporter_account = int(reporter[0])

        # First write (SQLite's write lock), then the host row lock (PostgreSQL): concurrent reports
        # and batches for this host wait here, so the checks below see every earlier one.
        await session.execute(
            update(_HOSTS).where(_HOSTS.c.peer_id == report.host_peer_id).values(flagged=_HOSTS.c.flagged)
        )
        host_rows = await lock_hosts(session, [report.host_peer_id])
        await _refuse_repeats(session, report, reporter_account, now)
        flag_id = (
            await session.execute(
                _FLAGS.insert()
                .values(
                    host_peer_id=report.host_peer_id,
                    reporter_peer_id=report.reporter_peer_id,
                    reporter_account_id=reporter_account,
                    report_id=report.report_id,
                    reported_at=now,
                    expert_uid=report.expert_uid,
                    period_start=start,
                    period_end=end,
                    reason=report.reason,
                )
                .returning(_FLAGS.c.id)
            )
        ).scalar_one()
        flags = (await rules.active_flags(session, [report.host_peer_id]))[report.host_peer_id]
        corroborated = rules.corroborated(flags)
        if corroborated:
            await session.execute(
                update(_HOSTS).where(_HOSTS.c.peer_id == report.host_peer_id).values(flagged=True)
            )
        count, reversed_credit = await _withhold(
            session, report.host_peer_id, start, end, flags, now, host_rows
        )
        return SpotCheckResult(flag_id, count, reversed_credit, corroborated)


def _unix(t: datetime) -> float:
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()  # SQLite: naive UTC


async def _refuse_repeats(session: AsyncSession, report: SpotCheckReport, account: int, now: float) -> None:
    """A report seen before (its id, or its reporter, host and period) is ``replayed``; the reporter
    account's fourth report on this host within 24 hours is ``too_many_reports``."""
    seen = (
        await session.execute(
            select(_FLAGS.c.id)
            .where(
                or_(
                    _FLAGS.c.report_id == report.report_id,
                    and_(
                        _FLAGS.c.host_peer_id == report.host_peer_id,
                        _FLAGS.c.reporter_peer_id == report.reporter_peer_id,
                        _FLAGS.c.period_start == report.period_start,
                        _FLAGS.c.period_end == report.period_end,
                    ),
                )
            )
            .limit(1)
        )
    ).scalar()
    if seen is not None:
        raise SpotCheckRejected("replayed", "this report was received before")
    recent = (
        await session.execute(
            select(func.count()).where(
                _FLAGS.c.reporter_account_id == account,
                _FLAGS.c.host_peer_id == report.host_peer_id,
                _FLAGS.c.reported_at > now - 86400.0,
            )
        )
    ).scalar_one()
    if recent >= MAX_REPORTS_PER_DAY:
        raise SpotCheckRejected(
            "too_many_reports", f"at most {MAX_REPORTS_PER_DAY} reports per host per day from one account"
        )


async def receipts_in_period(
    session: AsyncSession, host: str, start: float, end: float, *, withheld: bool
) -> list[Any]:
    """The host's receipts served in [start, end] that are (or are not) withheld, each with the account
    of the trainer that sent it (None where its key is bound to no account): what a report withholds
    and what an operator's undo gives back are read alike."""
    query = (
        select(
            _RECEIPTS.c.receipt_id,
            _RECEIPTS.c.served_at,
            _RECEIPTS.c.credit,
            _RECEIPTS.c.earned,
            _RECEIPTS.c.credited_at,
            _HOSTS.c.account_id,
        )
        .join(_HOSTS, _HOSTS.c.peer_id == _RECEIPTS.c.trainer_peer_id, isouter=True)
        .where(
            _RECEIPTS.c.host_peer_id == host,
            _RECEIPTS.c.served_at >= start,
            _RECEIPTS.c.served_at <= end,
            _RECEIPTS.c.withheld == withheld,
        )
    )
    return list((await session.execute(query)).all())


async def _withhold(
    session: AsyncSession,
    host: str,
    start: float,
    end: float,
    flags: list[tuple[float, float, int]],
    now: float,
    host_rows: list[object],
) -> tuple[int, float]:
    """Withhold and take back the credit of the host's receipts in [start, end] that the active
    ``flags`` now withhold; returns how many, and how much credit."""
    granted = await receipts_in_period(session, host, start, end, withheld=False)
    hit = [
        g
        for g in granted
        if rules.withheld_by(flags, g.served_at, -2 if g.account_id is None else g.account_id)
    ]
    if not hit:
        return 0, 0.0
    for i in range(0, len(hit), 500):
        ids = [g.receipt_id for g in hit[i : i + 500]]
        await session.execute(
            update(_RECEIPTS)
            .where(in_list(session, _RECEIPTS.c.receipt_id, ids))
            .values(withheld=True, credit=0.0)
        )
    # Take back the total, and what is left of each grant in the recent credit: it was added in full
    # when the receipt was ingested (credited_at) and has decayed since. Receipts stored before
    # credited_at existed fall back to served_at, the closest time known.
    plan = CreditPlan()
    reversed_credit = 0.0
    for g in hit:
        granted_at = g.served_at if g.credited_at is None else g.credited_at
        plan.add(host, -g.credit, -decay(g.credit, granted_at, now), -1, day_of(g.served_at))
        reversed_credit += g.credit
    await apply_plan(session, plan, now, host_rows)
    return len(hit), reversed_credit
