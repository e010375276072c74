"""The credit ledger: signed receipts in, credit on hosts, accounts and teams out.

Credit for a receipt is ``samples x expert cost`` (backward passes count double); the arithmetic of
credit and how a plan of it reaches hosts, accounts, teams and days is :mod:`.credit_plan`'s, and the
rules a receipt must pass beyond its signature (the host held the expert, the hourly caps, spot-check
flags, refusals counted) are :mod:`.rules`'.

Ingestion takes one transaction per batch: receipts go in with INSERT ... ON CONFLICT DO NOTHING
RETURNING (idempotent by receipt id, safe against concurrent batches), then the credit is summed per
host, account, team and day, so a batch of 1000 receipts makes a handful of UPDATEs. The first
statement of the write transaction is a write so that SQLite takes its write lock before reading
anything; on PostgreSQL the hosts' rows are locked before the caps and flags are read, so two batches
for one host cannot both spend the same hour's cap.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..db.models import Account, Host, Receipt
from . import rules, training
from .credit_plan import (
    DAY_S,
    HALF_LIFE_S,
    LN2,
    CreditPlan,
    add_credit,
    apply_plan,
    day_of,
    decay,
    experiment_of,
    in_grid,
    in_list,
    insert_for,
    lock_hosts,
    rac_per_day,
    receipt_credit,
)
from .receipts import ReceiptBatch, SignedReceipt, Verifier

__all__ = [  # the arithmetic is credit_plan's, re-exported where readers have always found it
    "DAY_S",
    "HALF_LIFE_S",
    "LN2",
    "TRAINER_ROLES",
    "CreditPlan",
    "IngestResult",
    "add_credit",
    "apply_plan",
    "day_of",
    "decay",
    "experiment_of",
    "in_grid",
    "in_list",
    "ingest",
    "lock_hosts",
    "rac_per_day",
    "receipt_credit",
]

MAX_SAMPLES = 1_000_000  # per receipt: far above any batch a trainer sends one expert
MAX_SKEW_S = 300.0  # how far in the future served_at may be (clock skew)
MAX_AGE_S = 30 * 86400.0  # older receipts are refused: credit is for recent work
MAX_SPOT_PERIOD_S = 7 * 86400.0
TRAINER_ROLES = frozenset({"trainer", "admin"})
_LOCAL_VERIFIER = Verifier()

_RECEIPTS: Table = Receipt.__table__  # type: ignore[assignment]
_HOSTS: Table = Host.__table__  # type: ignore[assignment]
_ACCOUNTS: Table = Account.__table__  # type: ignore[assignment]


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


def _stateless(
    receipts: Sequence[SignedReceipt],
    now: float,
    expert_costs: Mapping[str, float] | None,
    grids: Mapping[str, Sequence[int]] | None,
    max_credit: float | None,
    result: IngestResult,
) -> list[tuple[SignedReceipt, float]]:
    """Numbers, experts and ceilings, and duplicates inside the batch: each receipt with its credit."""
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
    return checked


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
    caps: rules.CreditCaps | None = None,
) -> IngestResult:
    """Verify, deduplicate and credit one batch of receipts, in one transaction.

    ``expert_costs`` maps experiment names to credit per sample; None: every expert costs 1.0, else an
    expert of an experiment not in it is rejected (``unknown_expert``). ``grids``: an expert outside
    its experiment's grid is ``unknown_expert`` too. ``max_credit``: a receipt worth more is
    ``over_ceiling``. ``account_id``: the authenticated poster; receipts signed by a key that is not
    bound to it are ``not_your_key``, refused before any signature is checked. ``caps``: the hourly
    caps (None: ``CreditCaps()``). Every refusal is counted (``rules.count_refusals``).
    """
    now = time.time() if now is None else now
    receipts = batch.receipts if isinstance(batch, ReceiptBatch) else batch
    caps = caps or rules.CreditCaps()
    result = IngestResult()

    # 1. Stateless checks (numbers, then signatures) and duplicates inside the batch.
    checked = _stateless(receipts, now, expert_costs, grids, max_credit, result)
    if account_id is not None and checked:
        checked = await _own_keys(sessions, checked, account_id, result)
    verifier = verifier or _LOCAL_VERIFIER
    signature_reasons = await verifier.reasons([r for r, _ in checked])
    candidates = []
    for (r, credit), refused in zip(checked, signature_reasons, strict=True):
        if refused is None:
            candidates.append((r, credit))
        else:  # bad_signature, no_countersignature or bad_countersignature (receipts.REASONS)
            result.rejected.append((r.receipt_id, refused))
    if not candidates:
        await rules.record_refusals(sessions, "receipt", [why for _, why in result.rejected], now)
        return result

    async with sessions() as session, session.begin():
        await _credit(session, candidates, now, caps, result)
        await rules.count_refusals(session, "receipt", (why for _, why in result.rejected), now)
    return result


async def _credit(
    session: AsyncSession,
    candidates: list[tuple[SignedReceipt, float]],
    now: float,
    caps: rules.CreditCaps,
    result: IngestResult,
) -> None:
    """Steps 2-5 of ``ingest``, inside its transaction."""
    # 2. Who signed, and for whom, and whether the host held the expert then.
    good, trainer_of, devices = await _parties(session, candidates, result)
    if not good:
        return

    # 3. Store them; the first write takes SQLite's write lock. RETURNING says which were new.
    good.sort(key=lambda rc: rc[0].receipt_id)  # same lock order in concurrent batches
    ins = insert_for(session, _RECEIPTS).on_conflict_do_nothing(index_elements=[_RECEIPTS.c.receipt_id])
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
            "earned": credit,
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
        return

    # 4. Caps and spot-check flags, read under the write lock (SQLite) / after locking the hosts
    # (PostgreSQL, in ``lock_hosts``): a concurrent batch or report is either seen here or sees ours.
    host_ids = sorted({r.host_peer_id for r, _ in new})
    host_rows = await lock_hosts(session, host_ids)
    claims = [
        rules.Claim(
            r.host_peer_id,
            trainer_of[r.trainer_peer_id],
            rules.hour_of(r.served_at),
            credit,
            devices.get(r.host_peer_id, "cpu"),
        )
        for r, credit in new
    ]
    keys = [k for c in claims for k in ((c.host, 0, c.hour), (c.host, c.trainer_account, c.hour))]
    refusals, spent = rules.admit(claims, await rules.hours_used(session, keys), caps)
    over = [r.receipt_id for (r, _), why in zip(new, refusals, strict=True) if why is not None]
    result.rejected += [(r.receipt_id, why) for (r, _), why in zip(new, refusals, strict=True) if why]
    for chunk in _chunks(over, 500):  # refused, so not kept: the id stays free for nothing
        await session.execute(delete(_RECEIPTS).where(in_list(session, _RECEIPTS.c.receipt_id, chunk)))
    new = [rc for rc, why in zip(new, refusals, strict=True) if why is None]
    if not new:
        return
    await rules.add_hours(session, spent)
    flags = await rules.active_flags(session, host_ids)
    withheld_ids: list[str] = []
    plan = CreditPlan()
    for r, credit in new:
        if rules.withheld_by(flags.get(r.host_peer_id, ()), r.served_at, trainer_of[r.trainer_peer_id]):
            withheld_ids.append(r.receipt_id)
            continue
        plan.add(r.host_peer_id, credit, credit, 1, day_of(r.served_at))
        result.credit += credit
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


async def _parties(
    session: AsyncSession, candidates: list[tuple[SignedReceipt, float]], result: IngestResult
) -> tuple[list[tuple[SignedReceipt, float]], dict[str, int], dict[str, str]]:
    """The receipts whose trainer is an enabled trainer account's key and whose host is an enabled
    volunteer's that held the expert when it served; the trainers' accounts; the hosts' devices."""
    peers = {r.trainer_peer_id for r, _ in candidates} | {r.host_peer_id for r, _ in candidates}
    rows = (
        await session.execute(
            select(_HOSTS.c.peer_id, _HOSTS.c.account_id, _ACCOUNTS.c.role, _ACCOUNTS.c.disabled)
            .join(_ACCOUNTS, _ACCOUNTS.c.id == _HOSTS.c.account_id)
            .where(in_list(session, _HOSTS.c.peer_id, sorted(peers)))
        )
    ).all()
    known = {peer_id: (account_id, role, disabled) for peer_id, account_id, role, disabled in rows}
    hosts = sorted({r.host_peer_id for r, _ in candidates if r.host_peer_id in known})
    since = min(r.served_at for r, _ in candidates) - rules.HOLD_GRACE_S
    spans, devices = await rules.holdings(session, hosts, since) if hosts else ({}, {})
    good: list[tuple[SignedReceipt, float]] = []
    trainer_of: dict[str, int] = {}
    for r, credit in candidates:
        trainer, host = known.get(r.trainer_peer_id), known.get(r.host_peer_id)
        if trainer is None or trainer[2] or trainer[1] not in TRAINER_ROLES:
            reason = "not_a_trainer"
        elif host is None:
            reason = "unknown_host"
        elif host[0] == trainer[0]:
            reason = "self_receipt"  # a trainer paying its own account
        elif host[2]:
            reason = "host_disabled"
        elif host[1] in TRAINER_ROLES:
            reason = "host_is_trainer"  # a trainer account does not host: its keys sign receipts
        elif not rules.held_at(spans.get((r.host_peer_id, r.expert_uid), ()), r.served_at):
            reason = "not_assigned"
        else:
            good.append((r, credit))
            trainer_of[r.trainer_peer_id] = trainer[0]
            continue
        result.rejected.append((r.receipt_id, reason))
    return good, trainer_of, devices


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
