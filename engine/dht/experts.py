"""The facade the MoE layer uses: declare experts, find their hosts, find live grid prefixes.

``declare_experts`` writes every record of ``keys.group_slots`` (one store per key, a bounded number
at a time) signed by the node's identity. Readers accept a declaration only when its host is its
owner (the signer), so nobody can point trainers at a host that did not declare itself. ``Declarer``
re-declares on a timer with a fresh expiration, so declarations vanish soon after a host does.

A host puts the coordinator's assignment proofs (``AssignmentProof`` per uid) in its declarations;
readers given the coordinator's public key (``coordinator_key``) mark declarations whose proof holds
(``keys.proof_holds``) as assigned and list assigned hosts first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import BadRequest, DHTError
from .keys import (
    decode_declaration,
    encode_declaration,
    expert_slot,
    group_slots,
    is_valid_prefix,
    is_valid_uid,
    proof_holds,
)
from .node import DHTNode, GetResult
from .records import Record, sign_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpertInfo:
    uid: str
    hosts: tuple[str, ...]  # peer ids: assigned hosts first, then latest-declared first
    assigned: tuple[str, ...] = ()  # those whose declaration carries a valid assignment proof


@dataclass(frozen=True)
class AssignmentProof:
    """The coordinator's signature of "this host serves this uid until ``expires_at``"."""

    expires_at: float
    signature: bytes


@dataclass(frozen=True)
class Declared:
    record: Record
    host: str
    uid: str
    assigned: bool


def declarations(
    result: GetResult, coordinator_key: bytes | None = None, now: float | None = None
) -> list[Declared]:
    """Each declaration whose host is its signer, latest first; ``assigned`` where a proof holds
    (only checked with ``coordinator_key``; ``now``: wall-clock time, as record expirations)."""
    now = time.time() if now is None else now
    out = []
    for record in sorted(result.records.values(), key=lambda r: -r.expiration):
        try:
            declaration = decode_declaration(record.value)
        except BadRequest:
            continue
        if declaration.host != record.owner:
            continue
        assigned = coordinator_key is not None and proof_holds(
            declaration, record.key, record.subkey, record.public_key, coordinator_key, now
        )
        out.append(Declared(record, declaration.host, declaration.uid, assigned))
    return out


async def declare_experts(
    node: DHTNode,
    uids: Sequence[str],
    host_peer_id: str,
    expiration: float,
    *,
    parallel: int = 16,
    proofs: Mapping[str, AssignmentProof] | None = None,
) -> dict[str, bool]:
    """Declare ``uids`` hosted by ``host_peer_id`` (our own peer id) until ``expiration``, each with
    its assignment proof where ``proofs`` has one.

    Returns uid -> whether its own record reached at least one node.
    """
    proofs = proofs or {}
    if node.signer is None or host_peer_id != node.peer_id:
        raise ValueError("a host declares its own experts: host_peer_id must be this node's peer id")
    signer = node.signer
    gate = asyncio.Semaphore(parallel)
    groups = group_slots(list(uids))

    async def put(key: str, slots: dict[str, str]) -> bool:
        records = []
        for subkey, uid in slots.items():
            proof = proofs.get(uid)
            value = (
                encode_declaration(host_peer_id, uid)
                if proof is None
                else encode_declaration(host_peer_id, uid, proof.expires_at, proof.signature)
            )
            records.append(sign_record(signer, key, value, expiration, subkey))
        async with gate:
            try:
                return (await node.store_records(records)).ok
            except DHTError as e:
                logger.warning("declaring %s failed: %s", key, e)
                return False

    keys = list(groups)
    stored = await asyncio.gather(*(put(key, groups[key]) for key in keys))
    ok = dict(zip(keys, stored, strict=True))
    return {uid: ok[expert_slot(uid)[0]] for uid in uids}  # its own record: under its parent prefix


async def get_experts(
    node: DHTNode, uids: Sequence[str], *, parallel: int = 16, coordinator_key: bytes | None = None
) -> list[ExpertInfo | None]:
    """Hosts of each uid (None where no live host declared it), aligned with ``uids``; with
    ``coordinator_key``, hosts the coordinator assigned come first and are named in ``assigned``."""
    gate = asyncio.Semaphore(parallel)

    async def one(uid: str) -> ExpertInfo | None:
        if not is_valid_uid(uid):
            raise ValueError(f"not a grid uid: {uid!r}")
        key, subkey = expert_slot(uid)
        async with gate:
            result = await node.get(key)
        found = [
            d
            for d in declarations(result, coordinator_key, node.clock())
            if d.record.subkey == subkey and d.uid == uid
        ]
        assigned = tuple(d.host for d in found if d.assigned)
        hosts = assigned + tuple(d.host for d in found if not d.assigned)
        return ExpertInfo(uid, hosts, assigned) if hosts else None

    return list(await asyncio.gather(*(one(uid) for uid in uids)))


async def get_active_successors(node: DHTNode, prefix: str) -> list[str]:
    """Child coordinates under ``prefix`` (``"ffn.3."``) that some live host declared, sorted."""
    if not is_valid_prefix(prefix):
        raise ValueError(f"not a grid prefix: {prefix!r}")
    result = await node.get(prefix)
    return sorted({d.record.subkey for d in declarations(result)})


async def first_k_active(node: DHTNode, prefixes: Sequence[str], k: int) -> dict[str, list[str]]:
    """The first ``k`` of ``prefixes`` (in the given order) with live experts under them.

    Maps each to its active child coordinates. Looks up ``k`` prefixes at a time, in order, and stops
    as soon as ``k`` are found, so a good ordering (best-scored first) costs about k gets.
    """
    found: dict[str, list[str]] = {}
    for start in range(0, len(prefixes), max(1, k)):
        window = prefixes[start : start + max(1, k)]
        children = await asyncio.gather(*(get_active_successors(node, p) for p in window))
        for prefix, coords in zip(window, children, strict=True):
            if coords and len(found) < k:
                found[prefix] = coords
        if len(found) >= k:
            break
    return found


class Declarer:
    """Keeps a host's experts declared: every ``period`` s, with expiration ``ttl`` s ahead."""

    def __init__(
        self,
        node: DHTNode,
        uids: Sequence[str] = (),
        *,
        ttl: float = 60.0,
        period: float = 20.0,
        proofs: Mapping[str, AssignmentProof] | None = None,
    ):
        if period >= ttl:
            raise ValueError("refresh period must be shorter than the ttl, or declarations lapse")
        self.node = node
        self.uids = list(uids)
        self.proofs: dict[str, AssignmentProof] = dict(proofs or {})  # renewed with each assignment
        self.ttl = ttl
        self.period = period
        self._task: asyncio.Task[None] | None = None

    async def declare_now(self) -> dict[str, bool]:
        if not self.uids:
            return {}
        expiration = self.node.clock() + self.ttl
        return await declare_experts(self.node, self.uids, self.node.peer_id, expiration, proofs=self.proofs)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dht-declarer")

    async def _run(self) -> None:
        while True:
            try:
                await self.declare_now()
            except DHTError as e:
                logger.warning("re-declaring experts failed: %s", e)
            await asyncio.sleep(self.period)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
