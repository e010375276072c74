"""Gathering experts' weights from their hosts: every replica that answers in time, checked, one chosen.

A trainer (``lah export``) asks each host of an expert for ``moe.state`` (:mod:`.server`) and trusts
nothing in the reply: the names, dtypes and shapes must be those of the module the registry builds from
the experiment's spec (:func:`~.weights.state_layout`, built here), the values finite, and the digest it
recomputes over the bytes equal to the host's. Any failure is a :class:`~.errors.BadExpertState`; a
host that does not answer in ``timeout`` fails with ``ExpertCallFailed("timeout")``, and only that
replica is lost.

Replicas of one expert train apart (each trainer's call goes to one of them), so they differ. The rule
(:func:`choose_replica`): the replica with the most update steps (it has learned from the most
gradients); on a tie, the state most of the tied replicas agree on (by digest); then the smallest host
id, so the choice is reproducible. :class:`Gathered` says which host's state was taken and how many
replicas answered.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.p2p import P2PError, RemoteError, RpcTimeout
from engine.wire import all_finite

from .beam import Children
from .errors import BadExpertState, ExpertCallFailed
from .registry import ExpertSpec
from .weights import ExpertState, dtype_name, state_layout, weights_digest

__all__ = ["Gathered", "choose_replica", "expert_hosts", "fetch_state", "gather_experts"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
FETCHES_AT_ONCE = 8  # state replies in flight at once: each may be megabytes on one link


@dataclass
class Gathered:
    """One expert: the replica taken (``None``: no host answered with a usable state), every usable
    replica, and why each other host was not used (host -> reason)."""

    uid: str
    hosts: tuple[str, ...]
    taken: ExpertState | None = None
    answered: list[ExpertState] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def agree(self) -> bool:
        """Whether every replica that answered holds the same state."""
        return len({s.digest for s in self.answered}) <= 1


def choose_replica(states: Sequence[ExpertState]) -> ExpertState:
    """Most update steps; then the digest most of those share; then the smallest host id."""
    if not states:
        raise ValueError("no replica to choose from")
    top = max(s.steps for s in states)
    tied = [s for s in states if s.steps == top]
    votes = Counter(s.digest for s in tied)
    return min(tied, key=lambda s: (-votes[s.digest], s.host))


async def fetch_state(peer: Any, host: str, uid: str, spec: ExpertSpec, *, timeout: float) -> ExpertState:
    """``uid``'s weights from ``host``, checked (module docstring); ``peer`` has ``Peer.call``'s contract."""
    where = f"moe.state {uid} on {host[:12]}"
    try:
        reply = await peer.call(host, "moe.state", {"uid": uid}, timeout=timeout)
    except RemoteError as e:
        raise ExpertCallFailed(f"{where}: {e}", e.code) from e
    except (RpcTimeout, TimeoutError) as e:
        raise ExpertCallFailed(f"{where}: no answer in {timeout:.3g} s", "timeout") from e
    except P2PError as e:
        raise ExpertCallFailed(f"{where}: {type(e).__name__}: {e}", "connection") from e
    names, steps, digest = (reply.fields.get(k) for k in ("names", "steps", "sha256"))
    tensors: list[torch.Tensor] = list(reply.tensors)
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise BadExpertState(f"{where}: the reply's names are not a list of strs", "malformed")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise BadExpertState(f"{where}: the reply's steps are not a non-negative int", "malformed")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise BadExpertState(f"{where}: the reply's sha256 is not 64 hex digits", "malformed")
    if len(names) != len(tensors):
        raise BadExpertState(f"{where}: {len(names)} names for {len(tensors)} tensors", "malformed")
    want = state_layout(spec)
    if tuple(names) != tuple(n for n, _, _ in want):
        raise BadExpertState(
            f"{where}: tensors {names[:8]} are not the registry's {[n for n, _, _ in want][:8]} for "
            f"{spec.arch} (dim {spec.dim})",
            "names",
        )
    for (name, dtype, shape), t in zip(want, tensors, strict=True):
        if dtype_name(t) != dtype or tuple(t.shape) != shape:
            raise BadExpertState(
                f"{where}: {name} is {dtype_name(t)} {tuple(t.shape)}, the spec's is {dtype} {shape}",
                "shapes",
            )
    if not all(all_finite(t) for t in tensors if t.numel()):
        raise BadExpertState(f"{where}: the weights hold NaN or infinite values", "non_finite")
    mine = await asyncio.to_thread(weights_digest, names, tensors)
    if mine != digest:
        raise BadExpertState(
            f"{where}: the bytes hash to {mine[:12]}, the host says {digest[:12]}: not the state it sent",
            "digest",
        )
    return ExpertState(uid, host, tuple(names), tuple(tensors), steps, digest)


async def gather_experts(
    peer: Any,
    hosts: Mapping[str, Sequence[str]],
    spec: ExpertSpec,
    *,
    timeout: float,
    at_once: int = FETCHES_AT_ONCE,
) -> dict[str, Gathered]:
    """Every expert's replicas (``uid -> its hosts``), each fetched within ``timeout`` (at most
    ``at_once`` at a time); one replica taken per expert by :func:`choose_replica`."""
    gate = asyncio.Semaphore(at_once)
    out = {uid: Gathered(uid, tuple(dict.fromkeys(hs))) for uid, hs in hosts.items()}

    async def one(g: Gathered, host: str) -> None:
        async with gate:
            try:
                g.answered.append(await fetch_state(peer, host, g.uid, spec, timeout=timeout))
            except ExpertCallFailed as e:
                g.failed[host] = f"{e.code}: {e}"

    await asyncio.gather(*(one(g, h) for g in out.values() for h in g.hosts))
    for g in out.values():
        g.answered.sort(key=lambda s: s.host)
        if g.answered:
            g.taken = choose_replica(g.answered)
    return out


async def expert_hosts(
    children: Callable[[str], Awaitable[Children]], prefix: str, grid: Sequence[int]
) -> dict[str, tuple[str, ...]]:
    """``uid -> hosts`` for every cell of ``prefix``'s grid (no hosts: an empty tuple), from the DHT
    lookups of the last dimension's parents (the finder's ``children``: assigned hosts only)."""
    parents = [
        ".".join([prefix, *map(str, coords)]) + "."
        for coords in itertools.product(*(range(n) for n in grid[:-1]))
    ]
    found = await asyncio.gather(*(children(p) for p in parents))
    out: dict[str, tuple[str, ...]] = {}
    for parent, kids in zip(parents, found, strict=True):
        for c in range(grid[-1]):
            uid = f"{parent}{c}"
            child = kids.get(c)
            out[uid] = tuple(child[1]) if child is not None and child[0] == uid else ()
    return out
