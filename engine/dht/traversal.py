"""Iterative Kademlia lookup with ``alpha`` requests in flight. Knows nothing of routing or messages.

Start from the seed contacts (our own k closest). Keep the k closest contacts not known to have
failed; ask each that has not answered yet, at most ``alpha`` at a time, for the contacts it knows
closest to the target (and, for find_value, the records it holds); stop when the k closest have all
answered. A reply is taken as soon as it arrives (no lock-step rounds), so one slow or dead node holds
one of the ``alpha`` slots for at most its call timeout while the others go on.

Cost: O(log n) sequential hops (each hop at least halves the XOR distance to the target, and a full
bucket of k contacts near it usually saves a few more), O(k + alpha · log n) requests in all.

Hops: seeds are known without asking, so asking one is hop 1; a contact first learned from a hop-h
reply is asked at hop h + 1. ``LookupResult.hops`` is the hop of the first *hit* (a reply that
``is_hit`` accepts, e.g. one holding records) or, without hits, the deepest hop among the k closest.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .errors import CallFailed
from .routing import Contact

T = TypeVar("T")
Query = Callable[[Contact], Awaitable[tuple[list[Contact], T]]]


@dataclass
class LookupResult(Generic[T]):
    closest: list[Contact]  # the k closest contacts that answered, closest first
    replies: dict[int, T] = field(default_factory=dict)  # node id -> what it answered
    hops: int = 0
    rpcs: int = 0
    failed: list[Contact] = field(default_factory=list)


async def traverse(
    target: int,
    seeds: Iterable[Contact],
    query: Query[T],
    *,
    k: int,
    alpha: int,
    exclude: int | None = None,
    is_hit: Callable[[T], bool] | None = None,
) -> LookupResult[T]:
    known: dict[int, str] = {}
    hop_of: dict[int, int] = {}
    order: list[tuple[int, int]] = []  # (distance, node id), sorted; failed ones are dropped
    answered: set[int] = set()
    failed: dict[int, str] = {}
    in_flight: dict[asyncio.Task[tuple[list[Contact], T]], Contact] = {}
    result: LookupResult[T] = LookupResult(closest=[])
    first_hit: int | None = None

    def learn(contact: Contact, hop: int) -> None:
        node_id, peer_id = contact
        if node_id in known or node_id == exclude:
            return
        known[node_id] = peer_id
        hop_of[node_id] = hop
        bisect.insort(order, (node_id ^ target, node_id))

    for contact in seeds:
        learn(contact, 1)
    try:
        while True:
            top = order[:k]
            busy = {c[0] for c in in_flight.values()}
            waiting = [nid for _, nid in top if nid not in answered and nid not in busy]
            for node_id in waiting[: max(0, alpha - len(in_flight))]:
                contact = (node_id, known[node_id])
                in_flight[asyncio.ensure_future(query(contact))] = contact
                result.rpcs += 1
            if not in_flight:
                break
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node_id, peer_id = in_flight.pop(task)
                error = task.exception()
                if error is not None:
                    if not isinstance(error, CallFailed):
                        raise error
                    failed[node_id] = peer_id
                    order.remove((node_id ^ target, node_id))
                    continue
                peers, payload = task.result()
                answered.add(node_id)
                result.replies[node_id] = payload
                if first_hit is None and is_hit is not None and is_hit(payload):
                    first_hit = hop_of[node_id]
                for contact in peers:
                    learn(contact, hop_of[node_id] + 1)
    finally:
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
    result.closest = [(nid, known[nid]) for _, nid in order if nid in answered][:k]
    result.failed = list(failed.items())
    if first_hit is not None:
        result.hops = first_hit
    else:
        result.hops = max((hop_of[nid] for nid, _ in result.closest), default=0)
    return result
