"""Which experts a node should host: every expert covered by at least ``replication`` hosts.

Pure planning first (:func:`plan`): given the grid, how many live hosts each expert has and how many
experts this node can hold, pick the least covered experts; ties are broken by a hash of (host,
uid) so that hosts arriving together spread over the grid instead of all taking the same "first"
experts. Then the database side (:func:`assign_host`): coverage is counted from unexpired
assignments, this host's existing assignments are kept and renewed (a node that reconnects keeps
its experts and their learned weights), and new ones are added up to its capacity.

Every holding is also kept in ``assignment_spans`` (a renewal extends the open span, a new expert opens
one, an expert given back closes its span now), with the capacity the node declared: the ledger credits a
receipt only for a host that held the expert when it served, and caps a host's credit per hour by that
capacity (:mod:`coordinator.credit.rules`). A trainer account's key signs receipts and never hosts
(``TrainerCannotHost`` for any memory offered; with none, as a trainer asks for the DHT's peers, it gets
no experts): a trainer could otherwise pay its own hosts.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import Table, bindparam, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..config import ExperimentConfig
from ..credit.ledger import TRAINER_ROLES
from ..db.models import Account, Assignment, AssignmentSpan, Host

#: Bytes an expert takes on a host per parameter: weights, gradients and Adam's two moments in float32.
BYTES_PER_PARAM = 16
DEFAULT_EXPERT_BYTES = 64 << 20


class TrainerCannotHost(PermissionError):
    """The host's account is a trainer's (or an admin's): its keys sign receipts and do not host."""


@dataclass(frozen=True)
class Capacity:
    """What a node reports: where it computes and how much of it the user allows."""

    device: str  # "cuda" or "cpu"
    memory_bytes: int
    upload_bytes_per_s: int = 0  # 0: unknown; reserved for bandwidth-aware placement


def expert_uids(experiment: ExperimentConfig) -> list[str]:
    return [
        ".".join([experiment.name, *map(str, cell)])
        for cell in itertools.product(*(range(n) for n in experiment.grid))
    ]


def expert_bytes(experiment: ExperimentConfig) -> int:
    """Memory one expert needs on a host, from its hyperparameters (FFN-shaped estimate)."""
    hp = experiment.hyperparams
    d, hidden = hp.get("d_model"), hp.get("hidden")
    if isinstance(d, int) and isinstance(hidden, int):
        return BYTES_PER_PARAM * (2 * d * hidden + hidden + 3 * d)
    return DEFAULT_EXPERT_BYTES


def slots(experiment: ExperimentConfig, capacity: Capacity) -> int:
    return max(0, capacity.memory_bytes // max(1, expert_bytes(experiment)))


def _spread(host: str, uid: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{host}|{uid}".encode(), digest_size=8).digest(), "big")


def plan(
    uids: Iterable[str], coverage: Mapping[str, int], host: str, count: int, already: Iterable[str] = ()
) -> list[str]:
    """Up to ``count`` new experts for ``host``: least covered first, spread across hosts."""
    have = set(already)
    candidates = [u for u in uids if u not in have]
    candidates.sort(key=lambda u: (coverage.get(u, 0), _spread(host, u)))
    return candidates[: max(0, count)]


async def coverage(session: AsyncSession, experiment: str, now: float) -> dict[str, int]:
    rows = await session.execute(
        select(Assignment.expert_uid, func.count())
        .where(Assignment.experiment == experiment, Assignment.expires_at > now)
        .group_by(Assignment.expert_uid)
    )
    return {uid: int(n) for uid, n in rows.all()}


async def assign_host(
    sessions: async_sessionmaker[AsyncSession],
    experiments: Iterable[ExperimentConfig],
    host: str,
    capacity: Capacity,
    now: float,
    ttl_s: float,
) -> list[tuple[str, str]]:
    """(experiment, uid) pairs ``host`` should serve until ``now + ttl_s``; renews what it had.

    New experts are planned from an equal share of what memory is left per remaining grid (what one
    grid leaves unused passes on to the next), so a host of a language model's several layers serves
    each of them instead of filling the first."""
    result: list[tuple[str, str]] = []
    budget = capacity.memory_bytes
    grids = list(experiments)
    given_back: list[str] = []
    async with sessions() as session, session.begin():
        await session.execute(delete(Assignment).where(Assignment.expires_at <= now))
        role = (
            await session.execute(
                select(Account.role).join(Host, Host.account_id == Account.id).where(Host.peer_id == host)
            )
        ).scalar()
        if role in TRAINER_ROLES:  # a trainer asks with no memory for the DHT's peers and the proofs' key
            if capacity.memory_bytes > 0:
                raise TrainerCannotHost(f"a {role} account does not host: bind another account's key to host")
            return []
        for index, experiment in enumerate(grids):
            mine = (
                await session.execute(
                    select(Assignment).where(
                        Assignment.host_peer_id == host, Assignment.experiment == experiment.name
                    )
                )
            ).scalars()
            kept = []
            size = expert_bytes(experiment)
            for row in mine:
                if budget >= size:
                    row.expires_at = now + ttl_s
                    budget -= size
                    kept.append(row.expert_uid)
                else:  # the node's budget shrank: give experts back
                    given_back.append(row.expert_uid)
                    await session.delete(row)
            cover = await coverage(session, experiment.name, now)
            share = budget // (len(grids) - index)
            fresh = plan(expert_uids(experiment), cover, host, share // max(1, size), already=kept)
            for uid in fresh:
                session.add(
                    Assignment(
                        host_peer_id=host,
                        experiment=experiment.name,
                        expert_uid=uid,
                        assigned_at=now,
                        expires_at=now + ttl_s,
                    )
                )
            budget -= size * len(fresh)
            result += [(experiment.name, uid) for uid in [*kept, *fresh]]
        await record_spans(session, host, [uid for _, uid in result], given_back, capacity, now, now + ttl_s)
    return result


async def record_spans(
    session: AsyncSession,
    host: str,
    held: list[str],
    given_back: list[str],
    capacity: Capacity,
    now: float,
    until: float,
) -> None:
    """Extend the open span of each expert ``host`` keeps (or open one), and close those it gave back."""
    spans: Table = AssignmentSpan.__table__  # type: ignore[assignment]
    open_rows = (
        await session.execute(
            select(spans.c.id, spans.c.expert_uid).where(
                spans.c.host_peer_id == host, spans.c.held_until >= now
            )
        )
    ).all()
    open_by_uid = {uid: span_id for span_id, uid in open_rows}
    extend = [{"k": open_by_uid[uid], "u": until} for uid in held if uid in open_by_uid]
    if extend:
        await (await session.connection()).execute(
            update(spans).where(spans.c.id == bindparam("k")).values(held_until=bindparam("u")), extend
        )
    fresh = [
        {
            "host_peer_id": host,
            "expert_uid": uid,
            "held_from": now,
            "held_until": until,
            "device": capacity.device,
            "memory_bytes": capacity.memory_bytes,
        }
        for uid in held
        if uid not in open_by_uid
    ]
    if fresh:
        await session.execute(spans.insert(), fresh)
    closed = [open_by_uid[uid] for uid in given_back if uid in open_by_uid]
    if closed:
        await session.execute(update(spans).where(spans.c.id.in_(closed)).values(held_until=now))
