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

With the coordinator's public key (``coordinator_key``) the finder uses only hosts whose declarations
carry the coordinator's unexpired assignment proof (``engine.dht.keys``): anyone may declare any expert,
and a host the coordinator never assigned is refused even when no assigned host answers, since it would be
used exactly when the honest hosts are slow or away. Refusals are counted per host
(:attr:`DHTLookup.refused`) and logged once per host, so a researcher sees why a declared peer was never
called. Without the key (a swarm with no coordinator) every declaring host is used.

Hosts that failed a call recently (:meth:`DHTExpertFinder.report_failure`) are avoided for
``penalty_s`` when an expert has another live host, so trainers route around a dead host before its
declarations expire.

**Which replica.** Of an expert's healthy hosts every trainer calls the same one, the host ranked first by
a hash of (uid, host) (rendezvous hashing): the same after every refresh and in every trainer, while the
experts of a grid still spread over all hosts; a host that leaves moves only its own experts. Replicas
are not averaged, so the one called is the one trained. Picking by position in the DHT's answer (latest
declared first, an order each re-declaration changes) alternated between replicas, each took about half
the updates, and a 2,000-step language-model run stalled 0.18 nats above the in-process model
(docs/measurements/lm-quality-2026-12-04.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import torch

from engine.dht import DHTError, DHTNode
from engine.dht.experts import declarations

from .beam import Children, beam_search, distinct_coords, uid_of

__all__ = ["Children", "DHTExpertFinder", "DHTLookup", "dht_lookup", "replica_rank"]

logger = logging.getLogger(__name__)

Lookup = Callable[[str], Awaitable[Children]]


class DHTLookup:
    """One get of a prefix on a DHT node: its live children with their hosts (latest declared first).

    With ``coordinator_key``, hosts without a valid assignment proof are refused, and a child that only
    they declare is not alive; :attr:`refused` counts refusals per host.
    """

    def __init__(self, node: DHTNode, coordinator_key: bytes | None = None) -> None:
        self.node, self.coordinator_key = node, coordinator_key
        self.refused: dict[str, int] = {}

    async def __call__(self, prefix: str) -> Children:
        result = await self.node.get(prefix)
        out: dict[int, tuple[str, list[str]]] = {}
        for d in declarations(result, self.coordinator_key, self.node.clock()):
            if not d.record.subkey.isdigit() or str(int(d.record.subkey)) != d.record.subkey:
                continue  # "07" would name a second uid for cell 7
            if self.coordinator_key is not None and not d.assigned:
                self._refuse(d.host, prefix + d.record.subkey)
                continue
            _, hosts = out.setdefault(int(d.record.subkey), (prefix + d.record.subkey, []))
            if d.host not in hosts:
                hosts.append(d.host)
        return {c: (uid, tuple(hosts)) for c, (uid, hosts) in out.items()}

    def _refuse(self, host: str, uid: str) -> None:
        if host not in self.refused:
            logger.warning(
                "not using host %s for %s: it declares experts without the coordinator's assignment",
                host[:16],
                uid,
            )
        self.refused[host] = self.refused.get(host, 0) + 1


@functools.lru_cache(maxsize=1 << 16)
def replica_rank(uid: str, host: str) -> bytes:
    """``host``'s rank for ``uid``: the highest is the replica every trainer calls (module doc)."""
    return hashlib.blake2b(f"{uid}\n{host}".encode(), digest_size=8).digest()


def dht_lookup(node: DHTNode, coordinator_key: bytes | None = None) -> DHTLookup:
    """The finder's lookup on ``node`` (see :class:`DHTLookup`)."""
    return DHTLookup(node, coordinator_key)


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
    ) -> None:
        self._lookup: Lookup
        if isinstance(node_or_lookup, DHTNode):
            self._lookup = dht_lookup(node_or_lookup, coordinator_key)
        else:
            self._lookup = node_or_lookup
        self.beam_size = beam_size
        self.ttl_s, self.negative_ttl_s = ttl_s, negative_ttl_s
        self.first_timeout, self.penalty_s = first_timeout, penalty_s
        self.clock = clock
        self.lookups = 0  # gets actually sent (cache misses and refreshes)
        self.failed_lookups = 0
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Future[Children]] = {}
        self._penalty: dict[str, float] = {}  # host -> avoid until
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def refused_hosts(self) -> dict[str, int]:
        """Hosts refused for want of an assignment, with how many declarations of theirs were seen."""
        return dict(self._lookup.refused) if isinstance(self._lookup, DHTLookup) else {}

    # -- the ExpertFinder protocol -----------------------------------------------------------------

    async def find(self, prefix: str, dim_scores: Sequence[Sequence[float]], k: int) -> list[tuple[str, str]]:
        return (await self.find_batch(prefix, [dim_scores], k))[0]

    async def find_batch(
        self, prefix: str, batch_scores: Sequence[Sequence[Sequence[float]]], k: int
    ) -> list[list[tuple[str, str]]]:
        """Per sample ``[dims][dim_size]`` scores -> up to ``k`` ``(uid, host)``, best first."""
        if not batch_scores or k <= 0:
            return [[] for _ in batch_scores]
        dims = len(batch_scores[0])
        scores = [
            torch.tensor([sample[d] for sample in batch_scores], dtype=torch.float32) for d in range(dims)
        ]
        coords, named = await self.find_coords(prefix, scores, k)
        return [[named[tuple(c)] for c in row if c[0] >= 0] for row in coords.tolist()]

    async def find_coords(
        self, prefix: str, scores: Sequence[torch.Tensor], k: int
    ) -> tuple[torch.Tensor, dict[tuple[int, ...], tuple[str, str]]]:
        """The batch form the mixture uses: ``scores[d]`` is ``[batch, size_d]``; returns ``[batch, k',
        dims]`` coordinates best first (``-1``: none) and the ``(uid, host)`` of each chosen one.

        One lookup per distinct prefix per dimension for the whole batch (from the cache when fresh).
        """
        coords = await beam_search(
            prefix, scores, k, self.beam_size or k, self.children, lambda aws: asyncio.gather(*aws)
        )
        named = {}
        for where in distinct_coords(coords):
            uid = uid_of(prefix, where)
            if host := self._pick(uid):
                named[where] = (uid, host)
            else:  # its declarations lapsed between levels: not a choice
                coords = coords.masked_fill((coords == torch.tensor(where)).all(2, keepdim=True), -1)
        return coords, named

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
        return max(pool, key=lambda host: replica_rank(uid, host)) if pool else ""

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

    async def wait_for_hosts(self, uids: Sequence[str], timeout: float, poll_s: float = 0.5) -> int:
        """Look ``uids`` up afresh every ``poll_s`` until each has a host or ``timeout`` passes; how many
        have one. For a trainer that starts while its swarm is still declaring: the cache would keep
        the first, partial answer for ``ttl_s``."""
        prefixes = sorted({u.rpartition(".")[0] + "." for u in uids})
        deadline = self.clock() + timeout
        while True:
            for prefix in prefixes:
                await self._fetch(prefix)
            seen = sum(1 for u in uids if self.hosts_of(u))
            if seen == len(uids) or self.clock() >= deadline:
                return seen
            await asyncio.sleep(poll_s)

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
