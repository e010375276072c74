"""Credit on subjects: the arithmetic of credit (pure), and adding a plan of credit to hosts, their
accounts, teams and days in one pass.

Each subject keeps a total and a recent credit: an exponentially decayed sum with a 7-day half-life,
stored as the value at ``credit_recent_at`` and decayed by readers (``decay``), so rows never need a
periodic rewrite. The BOINC-style "recent average credit" per day is ``recent x ln 2 / half-life in
days`` (``rac_per_day``): a host earning a steady C per day converges to C.

Subject rows are locked (``FOR NO KEY UPDATE`` on PostgreSQL, in key order; SQLite has one writer at a
time) before they are read; the ledger (ingestion) and spot checks (reversals) both go through
``lock_hosts`` and ``apply_plan``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Table, any_, bindparam, func, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from ..db.models import Account, CreditDay, Host, Team

HALF_LIFE_S = 7 * 86400.0
DAY_S = 86400
LN2 = math.log(2.0)

_HOSTS: Table = Host.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]
_TEAMS: Table = Team.__table__  # type: ignore[assignment]
_DAYS: Table = CreditDay.__table__  # type: ignore[assignment]


# ---------------------------------------------------------------- pure functions


def decay(value: float, since: float, now: float, half_life: float = HALF_LIFE_S) -> float:
    """``value`` as of ``since``, decayed to ``now`` (never grown: a time in the past is a no-op)."""
    if now <= since or value == 0.0:
        return value
    return value * math.pow(2.0, -(now - since) / half_life)


def add_credit(
    recent: float, recent_at: float, amount: float, now: float, half_life: float = HALF_LIFE_S
) -> tuple[float, float]:
    """Recent credit after adding ``amount`` at ``now``: returns (value, as-of time)."""
    at = max(now, recent_at)
    return decay(recent, recent_at, at, half_life) + amount, at


def rac_per_day(recent: float, half_life: float = HALF_LIFE_S) -> float:
    """The decayed sum as an average per day (BOINC's RAC): steady C/day converges to C."""
    return recent * LN2 / (half_life / DAY_S)


def receipt_credit(samples: int, backward: bool, expert_cost: float) -> float:
    return samples * expert_cost * (2.0 if backward else 1.0)


def day_of(t: float) -> int:
    return int(t // DAY_S)


def experiment_of(expert_uid: str) -> str:
    """Expert uids are "<experiment>.<i>.<j>..."."""
    return expert_uid.split(".", 1)[0]


def in_grid(expert_uid: str, grid: Sequence[int]) -> bool:
    """Whether ``expert_uid`` names a cell of the experiment's grid ("<name>.i.j", 0 <= i < grid[0] ...)."""
    parts = expert_uid.split(".")[1:]
    if len(parts) != len(grid):
        return False
    for part, size in zip(parts, grid, strict=True):
        if not (part.isascii() and part.isdigit()) or (len(part) > 1 and part[0] == "0") or int(part) >= size:
            return False
    return True


# ---------------------------------------------------------------- subjects


def insert_for(session: AsyncSession, table: Table) -> Any:
    """The dialect's INSERT (for ON CONFLICT)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def is_postgres(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def in_list(session: AsyncSession, column: Any, values: Sequence[Any]) -> ColumnElement[bool]:
    """``column IN values`` as ONE bound parameter (a PostgreSQL array; a JSON array unpacked by
    SQLite's json_each), so the statement compiles once and is cached: an expanding IN of a thousand
    values costs more to compile than to run."""
    if is_postgres(session):
        return column == any_(bindparam(None, list(values), type_=postgresql.ARRAY(column.type)))  # type: ignore[no-any-return]
    unpacked: Any = select(literal_column("value")).select_from(
        func.json_each(bindparam(None, json.dumps(list(values))))
    )
    return column.in_(unpacked)  # type: ignore[no-any-return]


@dataclass
class _Delta:
    total: float = 0.0
    recent: float = 0.0  # as of the ``now`` of the change
    requests: int = 0

    def add(self, other: _Delta) -> None:
        self.total += other.total
        self.recent += other.recent
        self.requests += other.requests


@dataclass
class CreditPlan:
    """Credit to add (or, negative, to take back) per host, and per host per day."""

    hosts: dict[str, _Delta] = field(default_factory=lambda: defaultdict(_Delta))
    days: dict[tuple[str, int], float] = field(default_factory=lambda: defaultdict(float))

    def add(self, host: str, total: float, recent: float, requests: int, day: int) -> None:
        d = self.hosts[host]
        d.total += total
        d.recent += recent
        d.requests += requests
        self.days[(host, day)] += total


async def lock_hosts(session: AsyncSession, host_ids: Sequence[str]) -> list[Any]:
    """The hosts' credit rows, locked (PostgreSQL: FOR NO KEY UPDATE, in key order; SQLite: the caller
    has written already, so it holds the database's write lock).

    Not FOR UPDATE: inserting the batch's receipts took FOR KEY SHARE on these very rows (the receipts'
    foreign key), in every concurrent batch alike, and FOR UPDATE conflicts with another transaction's
    KEY SHARE: two overlapping batches then each wait for the other (a deadlock PostgreSQL reported).
    NO KEY UPDATE is what an UPDATE of non-key columns takes anyway, and it does not conflict with it."""
    q = (
        select(_HOSTS.c.peer_id, _HOSTS.c.account_id, _HOSTS.c.credit_recent, _HOSTS.c.credit_recent_at)
        .where(in_list(session, _HOSTS.c.peer_id, sorted(host_ids)))
        .order_by(_HOSTS.c.peer_id)
    )
    if is_postgres(session):
        q = q.with_for_update(key_share=True)
    return list((await session.execute(q)).all())


async def apply_plan(session: AsyncSession, plan: CreditPlan, now: float, host_rows: Sequence[Any]) -> None:
    """Add the plan's credit to hosts (``host_rows`` from ``lock_hosts``), their accounts and teams,
    and the day rollups."""
    if not plan.hosts:
        return
    pg = is_postgres(session)
    accounts: dict[int, _Delta] = defaultdict(_Delta)
    host_account: dict[str, int] = {}
    host_params = []
    for peer_id, account_id, recent, recent_at in host_rows:
        if peer_id not in plan.hosts:
            continue
        delta = plan.hosts[peer_id]
        accounts[account_id].add(delta)
        host_account[peer_id] = account_id
        host_params.append(
            {"k": peer_id, "n": delta.requests, **_recent_params(recent, recent_at, delta, now)}
        )
    await _update(session, _HOSTS, _HOSTS.c.peer_id, host_params, requests=True)

    aq = (
        select(_ACCOUNTS.c.id, _ACCOUNTS.c.team_id, _ACCOUNTS.c.credit_recent, _ACCOUNTS.c.credit_recent_at)
        .where(in_list(session, _ACCOUNTS.c.id, sorted(accounts)))
        .order_by(_ACCOUNTS.c.id)
    )
    if pg:
        aq = aq.with_for_update(key_share=True)  # credit columns only; hosts' FKs keep their KEY SHARE
    teams: dict[int, _Delta] = defaultdict(_Delta)
    account_team: dict[int, int | None] = {}
    account_params = []
    for account_id, team_id, recent, recent_at in (await session.execute(aq)).all():
        delta = accounts[account_id]
        account_team[account_id] = team_id
        if team_id is not None:
            teams[team_id].add(delta)
        account_params.append({"k": account_id, **_recent_params(recent, recent_at, delta, now)})
    await _update(session, _ACCOUNTS, _ACCOUNTS.c.id, account_params)

    if teams:
        tq = (
            select(_TEAMS.c.id, _TEAMS.c.credit_recent, _TEAMS.c.credit_recent_at)
            .where(in_list(session, _TEAMS.c.id, sorted(teams)))
            .order_by(_TEAMS.c.id)
        )
        if pg:
            tq = tq.with_for_update(key_share=True)
        team_params = [
            {"k": team_id, **_recent_params(recent, recent_at, teams[team_id], now)}
            for team_id, recent, recent_at in (await session.execute(tq)).all()
        ]
        await _update(session, _TEAMS, _TEAMS.c.id, team_params)

    # Day rollups: the hosts' days, summed into their accounts' and teams' days.
    days: dict[tuple[str, str, int], float] = defaultdict(float)
    for (host, day), amount in plan.days.items():
        days[("host", host, day)] += amount
        account_id = host_account.get(host)
        if account_id is None:
            continue
        days[("account", str(account_id), day)] += amount
        team_id = account_team.get(account_id)
        if team_id is not None:
            days[("team", str(team_id), day)] += amount
    rows = [
        {"subject_kind": k, "subject_id": s, "day": d, "credit": c}
        for (k, s, d), c in sorted(days.items())
        if c != 0.0
    ]
    if rows:
        ins = insert_for(session, _DAYS)
        stmt = ins.on_conflict_do_update(
            index_elements=[_DAYS.c.subject_kind, _DAYS.c.subject_id, _DAYS.c.day],
            set_={"credit": _DAYS.c.credit + ins.excluded.credit},
        )
        conn = await session.connection()
        await conn.execute(stmt, rows)


def _recent_params(recent: float, recent_at: float, delta: _Delta, now: float) -> dict[str, float]:
    value, at = add_credit(recent, recent_at, delta.recent, now)
    return {"amt": delta.total, "rec": max(0.0, value), "rat": at}


async def _update(
    session: AsyncSession, table: Table, key: Any, params: list[dict[str, Any]], requests: bool = False
) -> None:
    """One executemany UPDATE for all subjects of a kind."""
    if not params:
        return
    values: dict[str, Any] = {
        "credit_total": table.c.credit_total + bindparam("amt"),
        "credit_recent": bindparam("rec"),
        "credit_recent_at": bindparam("rat"),
    }
    if requests:
        values["requests_served"] = table.c.requests_served + bindparam("n")
    stmt = update(table).where(key == bindparam("k")).values(values)
    conn = await session.connection()
    await conn.execute(stmt, params)
