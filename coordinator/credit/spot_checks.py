"""Failed spot checks: a trainer re-ran a request on another host and the outputs disagreed.

The report is signed by the trainer (``engine.wire.statements``); the host is flagged, and the credit of
its receipts in the reported period is withheld and taken back, in one transaction with the flag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Table, and_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Account, Host, Receipt, SpotCheckFlag
from .ledger import (
    MAX_SKEW_S,
    MAX_SPOT_PERIOD_S,
    TRAINER_ROLES,
    CreditPlan,
    apply_plan,
    day_of,
    decay,
    lock_hosts,
)
from .receipts import ReceiptError, SpotCheckReport, verify_spot_check

_RECEIPTS: Table = Receipt.__table__  # type: ignore[assignment]
_HOSTS: Table = Host.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]


@dataclass
class SpotCheckResult:
    flag_id: int
    withheld_receipts: int
    reversed_credit: float
    duplicate: bool = False


class SpotCheckRejected(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


async def report_spot_check(
    sessions: async_sessionmaker[AsyncSession], report: SpotCheckReport, now: float | None = None
) -> SpotCheckResult:
    """Flag the host, withhold the credit of its receipts in the period and take back what was granted.

    Raises SpotCheckRejected (codes: bad_signature, not_a_trainer, unknown_host, bad_period).
    A report sent twice (same reporter, host and period) changes nothing the second time.
    """
    now = time.time() if now is None else now
    try:
        verify_spot_check(report)
    except ReceiptError as e:
        raise SpotCheckRejected("bad_signature", str(e)) from e
    if not (report.period_start <= report.period_end <= now + MAX_SKEW_S) or (
        report.period_end - report.period_start > MAX_SPOT_PERIOD_S
    ):
        raise SpotCheckRejected("bad_period", "the period must be ordered, past and at most 7 days long")
    flags: Table = SpotCheckFlag.__table__  # type: ignore[assignment]
    async with sessions() as session, session.begin():
        rows = (
            await session.execute(
                select(_HOSTS.c.peer_id, _ACCOUNTS.c.role, _ACCOUNTS.c.disabled)
                .join(_ACCOUNTS, _ACCOUNTS.c.id == _HOSTS.c.account_id)
                .where(_HOSTS.c.peer_id.in_([report.reporter_peer_id, report.host_peer_id]))
            )
        ).all()
        known = {peer_id: (role, disabled) for peer_id, role, disabled in rows}
        reporter = known.get(report.reporter_peer_id)
        if reporter is None or reporter[1] or reporter[0] not in TRAINER_ROLES:
            raise SpotCheckRejected("not_a_trainer", "the reporter is not bound to a trainer account")
        if report.host_peer_id not in known:
            raise SpotCheckRejected("unknown_host", "no such host")

        # First write (SQLite's write lock), then the host row lock (PostgreSQL).
        await session.execute(
            update(_HOSTS).where(_HOSTS.c.peer_id == report.host_peer_id).values(flagged=True)
        )
        host_rows = await lock_hosts(session, [report.host_peer_id])
        existing = (
            await session.execute(
                select(flags.c.id).where(
                    and_(
                        flags.c.host_peer_id == report.host_peer_id,
                        flags.c.reporter_peer_id == report.reporter_peer_id,
                        flags.c.period_start == report.period_start,
                        flags.c.period_end == report.period_end,
                    )
                )
            )
        ).scalar()
        if existing is not None:
            return SpotCheckResult(flag_id=existing, withheld_receipts=0, reversed_credit=0.0, duplicate=True)
        flag_id = (
            await session.execute(
                flags.insert()
                .values(
                    host_peer_id=report.host_peer_id,
                    reporter_peer_id=report.reporter_peer_id,
                    expert_uid=report.expert_uid,
                    period_start=report.period_start,
                    period_end=report.period_end,
                    reason=report.reason,
                )
                .returning(flags.c.id)
            )
        ).scalar_one()

        in_period = and_(
            _RECEIPTS.c.host_peer_id == report.host_peer_id,
            _RECEIPTS.c.served_at >= report.period_start,
            _RECEIPTS.c.served_at <= report.period_end,
            _RECEIPTS.c.withheld == False,  # noqa: E712
        )
        granted = (
            await session.execute(
                select(_RECEIPTS.c.served_at, _RECEIPTS.c.credit, _RECEIPTS.c.credited_at).where(in_period)
            )
        ).all()
        if not granted:
            return SpotCheckResult(flag_id=flag_id, withheld_receipts=0, reversed_credit=0.0)
        await session.execute(update(_RECEIPTS).where(in_period).values(withheld=True, credit=0.0))
        # Take back the total, and what is left of each grant in the recent credit: it was added in
        # full when the receipt was ingested (credited_at) and has decayed since. Receipts stored
        # before credited_at existed fall back to served_at, the closest time known.
        plan = CreditPlan()
        reversed_credit = 0.0
        for served_at, credit, credited_at in granted:
            granted_at = served_at if credited_at is None else credited_at
            plan.add(report.host_peer_id, -credit, -decay(credit, granted_at, now), -1, day_of(served_at))
            reversed_credit += credit
        await apply_plan(session, plan, now, host_rows)
        return SpotCheckResult(
            flag_id=flag_id, withheld_receipts=len(granted), reversed_credit=reversed_credit
        )
