"""DHTExpertFinder: the :class:`~engine.moe.mixture.ExpertFinder` backed by the DHT, by beam search.

Hosts declare each expert ``ffn.i.j`` under its uid and under every prefix keyed by the next
coordinate (``ffn.`` -> ``i``, ``ffn.i.`` -> ``j``; see :mod:`engine.dht.keys`), so one get of a prefix
answers "which children of this prefix are alive, and who hosts them". The gate scores every grid
dimension separately and an expert's score is the sum of its coordinates' scores, which is what makes a
beam search possible (as hivemind's ``beam_search``)::

    beam = [(0, "ffn.")]
    for each grid dimension d:
        children = [(score + s_d[c], prefix + c) for prefix in beam for c in alive_children(prefix)]
        beam = the best ``beam_size`` children        (the last dimension keeps the best ``k`` uids)

Only prefixes with live declarations are ever kept, so a sparse or half-dead grid still yields ``k``
experts when that many are alive. The search is exact when every expert is alive and ``beam_size >= k``
(an expert of the top k cannot lose its prefix to ``k`` better prefixes: each would have a better child)
and exhaustive when ``beam_size`` is the largest grid dimension; otherwise it is the paper's
approximation.

**Cost.** A lookup is one DHT get of one prefix (O(log N) hops). A search costs at most
``1 + beam_size * (dims - 1)`` lookups, i.e. O(k · dims) gets with ``beam_size = k``; the work on the
answers is O(k · dims · dim_size) score comparisons. A training step searches for all its samples at once
(:meth:`DHTExpertFinder.find_batch`): dimension by dimension, the union of the samples' beams is looked
up once per prefix, so a step costs at most ``1 + dim_size * (dims - 1)`` gets however large its batch.

**Cache.** Lookups are cached for ``ttl_s``; an expired entry is still served while one background
refresh runs (stale-while-revalidate), so a step never waits on a refresh, and concurrent lookups of one
prefix share one get. Only the very first lookup of a prefix waits, for at most ``first_timeout`` s: the
first contact with a DHT node over WebRTC includes signaling and a DTLS handshake, which is slow. A failed
or timed-out lookup is cached as empty for ``negative_ttl_s`` so a dead region does not stall every step.

With the coordinator's public key (``coordinator_key``) the finder prefers hosts whose declarations carry
the coordinator's assignment proof (``engine.dht.keys``): anyone may declare any expert, but only
assigned hosts are used where there are some.

Hosts that failed a call recently (:meth:`DHTExpertFinder.report_failure`) are avoided for
``penalty_s`` when an expert has another live host, so trainers route around a dead host before its
declarations expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from engine.dht import DHTError, DHTNode
from engine.dht.experts import declarations

__all__ = ["Children", "DHTExpertFinder", "dht_lookup"]

logger = logging.getLogger(__name__)

#: ``child coordinate -> (uid, hosts)`` under one prefix.
Children = dict[int, tuple[str, tuple[str, ...]]]
Lookup = Callable[[str], Awaitable[Children]]


def dht_lookup(node: DHTNode, coordinator_key: bytes | None = None) -> Lookup:
    """One get of ``prefix`` on ``node``: its live children with their hosts (latest declared first).

    With ``coordinator_key``, a child that has hosts with a valid assignment proof lists only those:
    a peer that declares an expert it was not assigned is used only where nobody assigned serves it.
    """

    async def lookup(prefix: str) -> Children:
        result = await node.get(prefix)
        out: dict[int, tuple[str, list[str], list[str]]] = {}
        for d in declarations(result, coordinator_key, node.clock()):
            if not d.record.subkey.isdigit():
                continue
            _, hosts, assigned = out.setdefault(int(d.record.subkey), (prefix + d.record.subkey, [], []))
            if d.host not in hosts:
                hosts.append(d.host)
            if d.assigned and d.host not in assigned:
                assigned.append(d.host)
        return {c: (uid, tuple(assigned or hosts)) for c, (uid, hosts, assigned) in out.items()}

    return lookup


@dataclass
class _Entry:
    value: Children
    fetched_at: float
    refreshing: bool = False


class DHTExpertFinder:
    """Finds live experts by beam search over DHT prefix lookups, with a TTL cache (see module doc)."""

    def __init__(
        self,
        node_or_lookup: DHTNode | Lookup,
        *,
        coordinator_key: bytes | None = None,
        beam_size: int | None = None,
        ttl_s: float = 10.0,
        negative_ttl_s: float = 2.0,
        first_timeout: float = 15.0,
        penalty_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if isinstance(node_or_lookup, DHTNode):
            self._lookup = dht_lookup(node_or_lookup, coordinator_key)
        else:
            self._lookup = node_or_lookup
        self.beam_size = beam_size
        self.ttl_s, self.negative_ttl_s = ttl_s, negative_ttl_s
        self.first_timeout, self.penalty_s = first_timeout, penalty_s
        self.clock = clock
        self.rng = rng or random.Random()
        self.lookups = 0  # gets actually sent (cache misses and refreshes)
        self.failed_lookups = 0
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Future[Children]] = {}
        self._penalty: dict[str, float] = {}  # host -> avoid until
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the ExpertFinder protocol -----------------------------------------------------------------

    async def find(self, prefix: str, dim_scores: Sequence[Sequence[float]], k: int) -> list[tuple[str, str]]:
        return (await self.find_batch(prefix, [dim_scores], k))[0]

    async def find_batch(
        self, prefix: str, batch_scores: Sequence[Sequence[Sequence[float]]], k: int
    ) -> list[list[tuple[str, str]]]:
        """Per sample ``[dims][dim_size]`` scores -> up to ``k`` ``(uid, host)``, best first.

        One lookup per distinct prefix per dimension for the whole batch (from the cache when fresh).
        """
        if not batch_scores or k <= 0:
            return [[] for _ in batch_scores]
        dims = len(batch_scores[0])
        beam_size = max(k, self.beam_size or k)
        beams: list[list[tuple[float, str]]] = [[(0.0, prefix + ".")] for _ in batch_scores]
        for d in range(dims):
            wanted = sorted({p for beam in beams for _, p in beam})
            found = dict(zip(wanted, await asyncio.gather(*(self.children(p) for p in wanted)), strict=True))
            last = d == dims - 1
            new_beams: list[list[tuple[float, str]]] = []
            for scores, beam in zip(batch_scores, beams, strict=True):
                row = scores[d]
                cands = [
                    (score + row[c], uid if last else uid + ".")
                    for score, p in beam
                    for c, (uid, _) in found[p].items()
                    if 0 <= c < len(row)
                ]
                cands.sort(key=lambda t: -t[0])
                new_beams.append(cands[: k if last else beam_size])
            beams = new_beams
        # The last level's lookups named the hosts of each uid: pick one per uid.
        return [[(uid, self._pick(uid)) for _, uid in beam if self.hosts_of(uid)] for beam in beams]

    # -- hosts ----------------------------------------------------------------------------------------

    def hosts_of(self, uid: str) -> tuple[str, ...]:
        """Hosts of ``uid`` as last looked up (cache only; empty when its prefix was never looked up)."""
        parent, _, coord = uid.rpartition(".")
        entry = self._cache.get(parent + ".")
        if entry is None or not coord.isdigit():
            return ()
        child = entry.value.get(int(coord))
        return child[1] if child is not None and child[0] == uid else ()

    def report_failure(self, uid: str, host: str) -> None:
        """``host`` failed a call: prefer its experts' other hosts for ``penalty_s``."""
        self._penalty[host] = self.clock() + self.penalty_s

    def report_success(self, uid: str, host: str) -> None:
        self._penalty.pop(host, None)

    def _pick(self, uid: str) -> str:
        hosts = self.hosts_of(uid)
        now = self.clock()
        healthy = [h for h in hosts if self._penalty.get(h, 0.0) <= now]
        pool = healthy or list(hosts)
        # Stable per uid for a while (keeps links warm), yet spread over replicas across trainers.
        return pool[hash((uid, id(self))) % len(pool)] if pool else ""

    # -- the cache ------------------------------------------------------------------------------------

    async def children(self, prefix: str) -> Children:
        """Live children of ``prefix``: fresh from the cache, stale while a refresh runs, or looked up."""
        now = self.clock()
        entry = self._cache.get(prefix)
        if entry is not None:
            ttl = self.ttl_s if entry.value else self.negative_ttl_s
            if now - entry.fetched_at > ttl and not entry.refreshing:
                entry.refreshing = True
                task = asyncio.create_task(self._refresh(prefix), name=f"dht-refresh-{prefix}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return entry.value
        return await self._fetch(prefix)

    async def _refresh(self, prefix: str) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._fetch(prefix)

    async def _fetch(self, prefix: str) -> Children:
        pending = self._inflight.get(prefix)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._inflight[prefix] = pending
            value: Children = {}
            try:
                value = await self._get(prefix)
                self._cache[prefix] = _Entry(value, self.clock())
            finally:
                self._inflight.pop(prefix, None)
                if not pending.done():  # also when cancelled: those waiting get "nothing found"
                    pending.set_result(value)
            return value
        return await asyncio.shield(pending)

    async def _get(self, prefix: str) -> Children:
        self.lookups += 1
        try:
            async with asyncio.timeout(self.first_timeout):
                return await self._lookup(prefix)
        except (DHTError, TimeoutError) as e:
            self.failed_lookups += 1
            logger.info("looking up %s failed: %s", prefix, e)
            old = self._cache.get(prefix)
            return old.value if old is not None else {}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
