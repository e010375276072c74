"""What a receipt must pass beyond its signature before it earns anything: no single party decides
credit.

- **Held:** the host held a current assignment of the expert when it served (``assignment_spans``,
  written by :mod:`coordinator.swarm.assignment`); else ``not_assigned``. A trainer that signs receipts
  for a friend's host that never held the expert mints nothing.
- **Capped:** credit per host per hour of serving, and per (trainer account, host) pair per hour, is
  bounded by what the host's declared device can do (``CreditCaps``); the excess is ``over_host_cap`` /
  ``over_pair_cap``. A colluding trainer with a real assignment mints at most the pair's cap.
- **Flags:** a spot-check flag withholds the credit of its reporter's own receipts; every trainer's
  only where flags of two trainer accounts or more cover the same time (``withheld_by``), so one trainer
  cannot erase what others granted.
- **Counted:** every refusal (receipts and reports) is counted per UTC day, kind and reason code in
  ``credit_refusals``, which the operator reads (``lah coordinator refusals``).

Pure rules first (``held_at``, ``withheld_by``, ``admit``), then their reads and writes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, and_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import AssignmentSpan, CreditHour, CreditRefusal, SpotCheckFlag
from .credit_plan import day_of, in_list, insert_for

HOUR_S = 3600
HOLD_GRACE_S = 300.0  # clock skew between a trainer's served_at and the coordinator's assignment times
LEGACY_REPORTER = -1  # flags stored before reporters' accounts were: one unknown party

_SPANS: Table = AssignmentSpan.__table__  # type: ignore[assignment]
_HOURS: Table = CreditHour.__table__  # type: ignore[assignment]
_REFUSALS: Table = CreditRefusal.__table__  # type: ignore[assignment]
_FLAGS: Table = SpotCheckFlag.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class CreditCaps:
    """Credit a host may earn per hour of serving, by the device it declared when it took its
    assignment; a single trainer account may grant a host at most ``pair_share`` of that. The
    defaults sit far above an honest node's rate (a CPU expert of the digits experiment serves a few
    thousand samples a second), so they bound fraud, not work."""

    per_hour: Mapping[str, float] = field(default_factory=lambda: {"cpu": 2.0e7, "cuda": 2.0e8, "mps": 5.0e7})
    pair_share: float = 0.5

    def host_cap(self, device: str) -> float:
        return self.per_hour.get(device, self.per_hour.get("cpu", 0.0))

    def pair_cap(self, device: str) -> float:
        return self.host_cap(device) * self.pair_share


def hour_of(t: float) -> int:
    return int(t // HOUR_S)


# ---------------------------------------------------------------- pure rules


def held_at(spans: Iterable[tuple[float, float]], t: float, grace: float = HOLD_GRACE_S) -> bool:
    """Whether one of the (held_from, held_until) spans covers ``t``, give or take ``grace``."""
    return any(start - grace <= t <= end + grace for start, end in spans)


def withheld_by(flags: Iterable[tuple[float, float, int]], t: float, trainer_account: int) -> bool:
    """Whether active flags (start, end, reporter account) withhold a receipt served at ``t`` that
    ``trainer_account`` granted: its own account reported the host then, or two accounts or more did."""
    reporters = {who for start, end, who in flags if start <= t <= end}
    return trainer_account in reporters or len(reporters) >= 2


@dataclass(frozen=True)
class Claim:
    """One receipt as the caps see it."""

    host: str
    trainer_account: int
    hour: int
    credit: float
    device: str


def admit(
    claims: Sequence[Claim], used: Mapping[tuple[str, int, int], float], caps: CreditCaps
) -> tuple[list[str | None], dict[tuple[str, int, int], float]]:
    """Each claim's refusal (None: admitted) in order, and the credit to add per (host, trainer
    account or 0 for the host's total, hour). ``used``: what those keys hold already."""
    spent: dict[tuple[str, int, int], float] = defaultdict(float)
    reasons: list[str | None] = []
    for c in claims:
        host_key, pair_key = (c.host, 0, c.hour), (c.host, c.trainer_account, c.hour)
        if used.get(host_key, 0.0) + spent[host_key] + c.credit > caps.host_cap(c.device):
            reasons.append("over_host_cap")
        elif used.get(pair_key, 0.0) + spent[pair_key] + c.credit > caps.pair_cap(c.device):
            reasons.append("over_pair_cap")
        else:
            spent[host_key] += c.credit
            spent[pair_key] += c.credit
            reasons.append(None)
    return reasons, {k: v for k, v in spent.items() if v}


# ---------------------------------------------------------------- reads and writes


async def holdings(
    session: AsyncSession, host_ids: Sequence[str], since: float
) -> tuple[dict[tuple[str, str], list[tuple[float, float]]], dict[str, str]]:
    """The hosts' spans per (host, expert) that end at ``since`` or later, and each host's device as
    of its latest span (what its caps are by)."""
    rows = (
        await session.execute(
            select(
                _SPANS.c.host_peer_id,
                _SPANS.c.expert_uid,
                _SPANS.c.held_from,
                _SPANS.c.held_until,
                _SPANS.c.device,
            )
            .where(in_list(session, _SPANS.c.host_peer_id, sorted(host_ids)), _SPANS.c.held_until >= since)
            .order_by(_SPANS.c.held_until)
        )
    ).all()
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    devices: dict[str, str] = {}
    for host, uid, start, end, device in rows:
        spans[(host, uid)].append((start, end))
        devices[host] = device  # ordered by held_until: the latest wins
    return spans, devices


async def hours_used(
    session: AsyncSession, keys: Iterable[tuple[str, int, int]]
) -> dict[tuple[str, int, int], float]:
    """Credit already granted per (host, trainer account or 0 for every trainer, hour), of the keys
    asked; read after the hosts are locked."""
    wanted = set(keys)
    if not wanted:
        return {}
    hosts = sorted({h for h, _, _ in wanted})
    hours = sorted({hour for _, _, hour in wanted})
    rows = (
        await session.execute(
            select(_HOURS.c.host_peer_id, _HOURS.c.trainer_account_id, _HOURS.c.hour, _HOURS.c.credit).where(
                in_list(session, _HOURS.c.host_peer_id, hosts),
                _HOURS.c.hour >= hours[0],
                _HOURS.c.hour <= hours[-1],
            )
        )
    ).all()
    used: dict[tuple[str, int, int], float] = defaultdict(float)
    for h, a, hour, c in rows:  # only pairs are stored: a host's total is the sum of its pairs
        used[(h, a, hour)] += c
        used[(h, 0, hour)] += c
    return {k: v for k, v in used.items() if k in wanted}


async def add_hours(session: AsyncSession, spent: Mapping[tuple[str, int, int], float]) -> None:
    """Store the pairs' part of ``admit``'s spending (the hosts' totals are their sums)."""
    spent = {k: v for k, v in spent.items() if k[1] != 0}
    if not spent:
        return
    ins = insert_for(session, _HOURS)
    stmt = ins.on_conflict_do_update(
        index_elements=[_HOURS.c.host_peer_id, _HOURS.c.trainer_account_id, _HOURS.c.hour],
        set_={"credit": _HOURS.c.credit + ins.excluded.credit},
    )
    rows = [
        {"host_peer_id": h, "trainer_account_id": a, "hour": hour, "credit": c}
        for (h, a, hour), c in sorted(spent.items())
    ]
    conn = await session.connection()
    await conn.execute(stmt, rows)


async def count_refusals(session: AsyncSession, kind: str, reasons: Iterable[str], now: float) -> None:
    """Add refusals to the day's counters, in key order (concurrent batches lock rows in one order)."""
    counts = Counter(reasons)
    if not counts:
        return
    day = day_of(now)
    ins = insert_for(session, _REFUSALS)
    stmt = ins.on_conflict_do_update(
        index_elements=[_REFUSALS.c.day, _REFUSALS.c.kind, _REFUSALS.c.reason],
        set_={"count": _REFUSALS.c.count + ins.excluded.count},
    )
    rows = [{"day": day, "kind": kind, "reason": r, "count": n} for r, n in sorted(counts.items())]
    conn = await session.connection()
    await conn.execute(stmt, rows)


async def record_refusals(
    sessions: async_sessionmaker[AsyncSession], kind: str, reasons: Sequence[str], now: float
) -> None:
    """``count_refusals`` in a transaction of its own (refusals found before any other write)."""
    if reasons:
        async with sessions() as session, session.begin():
            await count_refusals(session, kind, reasons, now)


async def refusals(sessions: async_sessionmaker[AsyncSession], days: int, now: float) -> list[dict[str, Any]]:
    """Refusals of the last ``days`` UTC days, summed per kind and reason, most first."""
    since = day_of(now) - max(0, days - 1)
    async with sessions() as session:
        rows = (
            await session.execute(
                select(_REFUSALS.c.kind, _REFUSALS.c.reason, _REFUSALS.c.count).where(
                    _REFUSALS.c.day >= since
                )
            )
        ).all()
    totals: Counter[tuple[str, str]] = Counter()
    for kind, reason, n in rows:
        totals[(kind, reason)] += int(n)
    return [
        {"kind": k, "reason": r, "count": n}
        for (k, r), n in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


async def active_flags(
    session: AsyncSession, host_ids: Sequence[str], start: float | None = None, end: float | None = None
) -> dict[str, list[tuple[float, float, int]]]:
    """Flags not undone on these hosts, as (start, end, reporter account), maybe only those that
    overlap [start, end]."""
    q = select(
        _FLAGS.c.host_peer_id, _FLAGS.c.period_start, _FLAGS.c.period_end, _FLAGS.c.reporter_account_id
    ).where(in_list(session, _FLAGS.c.host_peer_id, sorted(host_ids)), _FLAGS.c.undone_at.is_(None))
    if start is not None and end is not None:
        q = q.where(and_(_FLAGS.c.period_start <= end, _FLAGS.c.period_end >= start))
    flags: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for host, s, e, who in (await session.execute(q)).all():
        flags[host].append((s, e, LEGACY_REPORTER if who is None else int(who)))
    return flags


def corroborated(flags: Sequence[tuple[float, float, int]]) -> bool:
    """Whether flags of two accounts or more overlap somewhere: the host is flagged for everyone."""
    for i, (s1, e1, a1) in enumerate(flags):
        for s2, e2, a2 in flags[i + 1 :]:
            if a1 != a2 and s1 <= e2 and s2 <= e1:
                return True
    return False
