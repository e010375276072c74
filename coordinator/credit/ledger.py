"""The credit ledger: signed receipts in, credit on hosts, accounts and teams out.

Credit for a receipt is ``samples x expert cost`` (backward passes count double). Each subject keeps a
total and a recent credit: an exponentially decayed sum with a 7-day half-life, stored as the value at
``credit_recent_at`` and decayed by readers (``decay``), so rows never need a periodic rewrite. The
BOINC-style "recent average credit" per day is ``recent x ln 2 / half-life in days`` (``rac_per_day``):
a host earning a steady C per day converges to C.

Ingestion takes one transaction per batch: receipts go in with INSERT ... ON CONFLICT DO NOTHING
RETURNING (idempotent by receipt id, safe against concurrent batches), then the credit is summed per
host, account, team and day, so a batch of 1000 receipts makes a handful of UPDATEs. Subject rows are
locked (``FOR NO KEY UPDATE`` on PostgreSQL, in key order; SQLite has one writer at a time) before they are
read, and the first statement of the write transaction is a write so that SQLite takes its write lock
before reading anything.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Table, any_, bindparam, func, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Account, CreditDay, Host, Receipt, SpotCheckFlag, Team
from . import training
from .receipts import (
    ReceiptBatch,
    SignedReceipt,
    Verifier,
)

HALF_LIFE_S = 7 * 86400.0
DAY_S = 86400
MAX_SAMPLES = 1_000_000  # per receipt: far above any batch a trainer sends one expert
MAX_SKEW_S = 300.0  # how far in the future served_at may be (clock skew)
MAX_AGE_S = 30 * 86400.0  # older receipts are refused: credit is for recent work
MAX_SPOT_PERIOD_S = 7 * 86400.0
TRAINER_ROLES = frozenset({"trainer", "admin"})
LN2 = math.log(2.0)
_LOCAL_VERIFIER = Verifier()

_RECEIPTS: Table = Receipt.__table__  # type: ignore[assignment]
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


# ---------------------------------------------------------------- results


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    withheld: int = 0  # accepted, stored, but credited 0 (host under a spot-check flag)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (receipt_id, reason)
    credit: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "withheld": self.withheld,
            "credit": self.credit,
            "rejected": [{"receipt_id": r, "reason": why} for r, why in self.rejected],
        }


# ---------------------------------------------------------------- helpers


def _insert(session: AsyncSession, table: Table) -> Any:
    """The dialect's INSERT (for ON CONFLICT)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def _is_postgres(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def in_list(session: AsyncSession, column: Any, values: Sequence[Any]) -> ColumnElement[bool]:
    """``column IN values`` as ONE bound parameter (a PostgreSQL array; a JSON array unpacked by
    SQLite's json_each), so the statement compiles once and is cached: an expanding IN of a thousand
    values costs more to compile than to run."""
    if _is_postgres(session):
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
    if _is_postgres(session):
        q = q.with_for_update(key_share=True)
    return list((await session.execute(q)).all())


async def apply_plan(session: AsyncSession, plan: CreditPlan, now: float, host_rows: Sequence[Any]) -> None:
    """Add the plan's credit to hosts (``host_rows`` from ``lock_hosts``), their accounts and teams,
    and the day rollups."""
    if not plan.hosts:
        return
    pg = _is_postgres(session)
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
        ins = _insert(session, _DAYS)
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


# ---------------------------------------------------------------- ingestion


def _precheck(receipt: SignedReceipt, now: float) -> str | None:
    if not 0 < receipt.samples <= MAX_SAMPLES:
        return "bad_samples"
    if receipt.served_at > now + MAX_SKEW_S:
        return "future"
    if receipt.served_at < now - MAX_AGE_S:
        return "too_old"
    if receipt.trainer_peer_id == receipt.host_peer_id:
        return "self_receipt"
    return None


async def ingest(
    sessions: async_sessionmaker[AsyncSession],
    batch: ReceiptBatch | Sequence[SignedReceipt],
    now: float | None = None,
    expert_costs: Mapping[str, float] | None = None,
    verifier: Verifier | None = None,
    *,
    grids: Mapping[str, Sequence[int]] | None = None,
    max_credit: float | None = None,
    account_id: int | None = None,
) -> IngestResult:
    """Verify, deduplicate and credit one batch of receipts, in one transaction.

    ``expert_costs`` maps experiment names to credit per sample; None: every expert costs 1.0, else an
    expert of an experiment not in it is rejected (``unknown_expert``). ``grids``: an expert outside
    its experiment's grid is ``unknown_expert`` too. ``max_credit``: a receipt worth more is
    ``over_ceiling``. ``account_id``: the authenticated poster; receipts signed by a key that is not
    bound to it are ``not_your_key``, refused before any signature is checked.
    """
    now = time.time() if now is None else now
    receipts = batch.receipts if isinstance(batch, ReceiptBatch) else batch
    result = IngestResult()

    # 1. Stateless checks (numbers, then signatures) and duplicates inside the batch.
    seen: set[str] = set()
    checked: list[tuple[SignedReceipt, float]] = []
    for r in receipts:
        if r.receipt_id in seen:
            result.duplicates += 1
            continue
        seen.add(r.receipt_id)
        reason = _precheck(r, now)
        experiment = experiment_of(r.expert_uid)
        if reason is None and expert_costs is not None and experiment not in expert_costs:
            reason = "unknown_expert"
        if reason is None and grids is not None and not in_grid(r.expert_uid, grids.get(experiment, ())):
            reason = "unknown_expert"
        cost = 1.0 if expert_costs is None else expert_costs.get(experiment, 0.0)
        credit = receipt_credit(r.samples, r.backward, cost)
        if reason is None and max_credit is not None and credit > max_credit:
            reason = "over_ceiling"
        if reason is not None:
            result.rejected.append((r.receipt_id, reason))
            continue
        checked.append((r, credit))
    if account_id is not None and checked:
        checked = await _own_keys(sessions, checked, account_id, result)
    verifier = verifier or _LOCAL_VERIFIER
    good_signatures = await verifier.check([r for r, _ in checked])
    candidates = []
    for (r, credit), ok in zip(checked, good_signatures, strict=True):
        if ok:
            candidates.append((r, credit))
        else:
            result.rejected.append((r.receipt_id, "bad_signature"))
    if not candidates:
        return result

    async with sessions() as session, session.begin():
        # 2. Who signed, and for whom: trainers must be bound to a trainer (or admin) account.
        peers = {r.trainer_peer_id for r, _ in candidates} | {r.host_peer_id for r, _ in candidates}
        rows = (
            await session.execute(
                select(_HOSTS.c.peer_id, _HOSTS.c.account_id, _ACCOUNTS.c.role, _ACCOUNTS.c.disabled)
                .join(_ACCOUNTS, _ACCOUNTS.c.id == _HOSTS.c.account_id)
                .where(in_list(session, _HOSTS.c.peer_id, sorted(peers)))
            )
        ).all()
        known = {peer_id: (account_id, role, disabled) for peer_id, account_id, role, disabled in rows}
        good: list[tuple[SignedReceipt, float]] = []
        for r, credit in candidates:
            trainer = known.get(r.trainer_peer_id)
            if trainer is None or trainer[2] or trainer[1] not in TRAINER_ROLES:
                result.rejected.append((r.receipt_id, "not_a_trainer"))
            elif r.host_peer_id not in known:
                result.rejected.append((r.receipt_id, "unknown_host"))
            elif known[r.host_peer_id][0] == trainer[0]:
                result.rejected.append((r.receipt_id, "self_receipt"))  # a trainer paying its own account
            else:
                good.append((r, credit))
        if not good:
            return result

        # 3. Store them; the first write takes SQLite's write lock. RETURNING says which were new.
        good.sort(key=lambda rc: rc[0].receipt_id)  # same lock order in concurrent batches
        ins = _insert(session, _RECEIPTS).on_conflict_do_nothing(index_elements=[_RECEIPTS.c.receipt_id])
        values = [
            {
                "receipt_id": r.receipt_id,
                "trainer_peer_id": r.trainer_peer_id,
                "host_peer_id": r.host_peer_id,
                "expert_uid": r.expert_uid,
                "samples": r.samples,
                "backward": r.backward,
                "served_at": r.served_at,
                "credit": credit,
                "withheld": False,
                "credited_at": now,
            }
            for r, credit in good
        ]
        # executemany with RETURNING: SQLAlchemy batches it into multi-row INSERTs ("insertmanyvalues")
        # from one cached compilation.
        conn = await session.connection()
        res = await conn.execute(ins.returning(_RECEIPTS.c.receipt_id), values)
        inserted = set(res.scalars().all())
        result.duplicates += len(good) - len(inserted)
        new = [(r, credit) for r, credit in good if r.receipt_id in inserted]
        if not new:
            return result

        # 4. Spot-check flags, read under the write lock (SQLite) / after locking the hosts (PostgreSQL,
        # in ``lock_hosts``): a report that lands concurrently is either seen here or sees our receipts.
        host_ids = sorted({r.host_peer_id for r, _ in new})
        host_rows = await lock_hosts(session, host_ids)
        flags = await _flags(session, host_ids)
        withheld_ids: list[str] = []
        plan = CreditPlan()
        for r, credit in new:
            if _covered(flags.get(r.host_peer_id, ()), r.served_at):
                withheld_ids.append(r.receipt_id)
                continue
            plan.add(r.host_peer_id, credit, credit, 1, day_of(r.served_at))
            result.credit += credit
        if withheld_ids:
            for chunk in _chunks(withheld_ids, 500):
                await session.execute(
                    update(_RECEIPTS)
                    .where(in_list(session, _RECEIPTS.c.receipt_id, chunk))
                    .values(withheld=True, credit=0.0)
                )
        result.withheld = len(withheld_ids)
        result.accepted = len(new)
        # The bound on the trainers' own training samples (coordinator.credit.training).
        await training.add_receipt_samples(
            session, ((r.trainer_peer_id, r.expert_uid, r.samples, r.backward) for r, _ in new), now
        )

        # 5. Credit, summed per subject.
        await apply_plan(session, plan, now, host_rows)
    return result


async def _own_keys(
    sessions: async_sessionmaker[AsyncSession],
    checked: list[tuple[SignedReceipt, float]],
    account_id: int,
    result: IngestResult,
) -> list[tuple[SignedReceipt, float]]:
    """Those receipts whose signer is a host of ``account_id`` (one indexed read, no signature checked)."""
    signers = sorted({r.trainer_peer_id for r, _ in checked})
    async with sessions() as session:
        rows = await session.execute(
            select(_HOSTS.c.peer_id).where(
                in_list(session, _HOSTS.c.peer_id, signers), _HOSTS.c.account_id == account_id
            )
        )
        mine = {row[0] for row in rows}
    kept = []
    for r, credit in checked:
        if r.trainer_peer_id in mine:
            kept.append((r, credit))
        else:
            result.rejected.append((r.receipt_id, "not_your_key"))
    return kept


def _chunks(items: Sequence[Any], n: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


async def _flags(session: AsyncSession, host_ids: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    t: Table = SpotCheckFlag.__table__  # type: ignore[assignment]
    rows = (
        await session.execute(
            select(t.c.host_peer_id, t.c.period_start, t.c.period_end).where(
                in_list(session, t.c.host_peer_id, host_ids)
            )
        )
    ).all()
    flags: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for host, start, end in rows:
        flags[host].append((start, end))
    return flags


def _covered(periods: Iterable[tuple[float, float]], t: float) -> bool:
    return any(start <= t <= end for start, end in periods)
