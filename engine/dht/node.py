"""DHTNode: one participant of the DHT. Joins, finds nodes, stores and gets signed records.

Replication: a record goes to the k nodes closest to its key id (ourselves included when we are one
of them); ``store`` reports how many accepted it. ``get`` runs the same lookup with find_value, takes
the union of what the k closest hold, checks every distinct record's signature once, and keeps the
latest record per (owner, subkey). Records expire; owners keep them alive by storing again (see
``experts.Declarer``); holders drop expired ones. ``run_maintenance`` refreshes buckets nobody looked
up lately and purges expired records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .errors import DHTError, RecordRejected
from .ids import key_id_of, node_id_of
from .protocol import DHTProtocol
from .records import Record, Signer, check_fresh, sign_record, verify_record
from .routing import Contact, RoutingTable
from .storage import RecordStore, merge_latest
from .transport import DHTTransport
from .traversal import LookupResult, traverse

logger = logging.getLogger(__name__)


@dataclass
class StoreResult:
    key: str
    replicas: int  # nodes (ourselves included) that hold the records now
    hops: int = 0
    rpcs: int = 0

    @property
    def ok(self) -> bool:
        return self.replicas > 0


@dataclass
class GetResult:
    key: str
    records: dict[tuple[str, str], Record] = field(default_factory=dict)  # (owner, subkey) -> latest
    hops: int = 0
    rpcs: int = 0
    rejected: int = 0  # records that failed their signature check (someone lied to us)


class DHTNode:
    def __init__(
        self,
        transport: DHTTransport,
        *,
        signer: Signer | None = None,
        k: int = 20,
        alpha: int = 3,
        rpc_timeout: float = 5.0,
        max_failures: int = 2,
        max_ttl: float = 24 * 3600.0,
        clock: Callable[[], float] = time.time,
        client: bool = False,
    ) -> None:
        """``client``: look up and publish without holding others' records or being anyone's contact
        (see :mod:`.protocol`): what a trainer wants, whose event loop is busy with expert calls."""
        self.transport = transport
        self.client = client
        self.signer = signer
        self.k = k
        self.alpha = alpha
        self.clock = clock
        self.node_id = node_id_of(transport.peer_id)
        self.table = RoutingTable(self.node_id, k=k, max_failures=max_failures)
        self.storage = RecordStore()
        self.protocol = DHTProtocol(
            transport,
            self.table,
            self.storage,
            clock=clock,
            rpc_timeout=rpc_timeout,
            max_ttl=max_ttl,
            client=client,
        )
        self._maintenance: asyncio.Task[None] | None = None

    @property
    def peer_id(self) -> str:
        return self.transport.peer_id

    # -- joining ---------------------------------------------------------------------------------

    async def bootstrap(self, peer_ids: Sequence[str], *, refresh: bool = True) -> int:
        """Join through ``peer_ids``; return how many of them answered. Raise DHTError if none did."""
        contacts = [(node_id_of(p), p) for p in peer_ids if p != self.peer_id]
        reached = 0
        for _ in range(3):  # a lost packet should not cost a join
            alive = await asyncio.gather(*(self.protocol.ping(c) for c in contacts))
            reached += sum(alive)
            contacts = [c for c, ok in zip(contacts, alive, strict=True) if not ok]
            if reached:
                break
        if contacts and not reached:
            raise DHTError(f"none of {len(contacts)} bootstrap peers answered")
        await self.find_node(self.node_id)
        if refresh:  # buckets farther than our closest neighbour: one lookup each (Kademlia's join)
            await self.refresh_buckets(interval=0.0)
        return reached

    async def refresh_buckets(self, interval: float) -> int:
        """Look up a random id in each bucket not looked up for ``interval`` s; return how many."""
        stale = self.table.stale_buckets(self.clock(), interval)
        targets = [random.randrange(b.lo, b.hi) for b in stale if not b.covers(self.node_id)]
        await asyncio.gather(*(self.find_node(t) for t in targets))
        return len(targets)

    # -- lookups ---------------------------------------------------------------------------------

    async def find_node(self, target: int, *, alpha: int | None = None) -> LookupResult[None]:
        self.table.mark_lookup(target, self.clock())
        return await traverse(
            target,
            self.table.nearest(target, self.k),
            lambda c: self.protocol.find_node(c, target),
            k=self.k,
            alpha=alpha or self.alpha,
            exclude=self.node_id,
        )

    def _we_are_close(self, key_id: int, closest: list[Contact]) -> bool:
        return len(closest) < self.k or key_id ^ self.node_id < key_id ^ closest[-1][0]

    # -- store -----------------------------------------------------------------------------------

    async def store(self, key: str, value: bytes, expiration: float, subkey: str = "") -> StoreResult:
        """Sign with our own identity and store on the k closest nodes."""
        if self.signer is None:
            raise DHTError("this node has no signer; use store_records with signed records")
        return await self.store_records([sign_record(self.signer, key, value, expiration, subkey)])

    async def store_records(self, records: Sequence[Record]) -> StoreResult:
        """Store records that share one key (signed by anyone) on the k nodes closest to it."""
        if not records:
            raise ValueError("nothing to store")
        key = records[0].key
        if any(r.key != key for r in records):
            raise ValueError("store_records takes records of one key; group them first")
        now = self.clock()
        for record in records:
            check_fresh(record, now, self.protocol.max_ttl)
            verify_record(record)  # fail here, loudly, rather than on every replica
        key_id = key_id_of(key)
        lookup = await self.find_node(key_id)
        replicas = 0
        if not self.client and self._we_are_close(key_id, lookup.closest):
            for record in records:
                with contextlib.suppress(RecordRejected):
                    self.storage.put(key_id, record, now)
            replicas += 1
        targets = lookup.closest[: self.k - replicas] if replicas else lookup.closest
        acks = await asyncio.gather(*(self._store_one(c, list(records)) for c in targets))
        replicas += sum(1 for a in acks if a)
        return StoreResult(key, replicas, hops=lookup.hops, rpcs=lookup.rpcs + len(targets))

    async def _store_one(self, contact: Contact, records: list[Record]) -> bool:
        try:
            return await self.protocol.store(contact, records) > 0
        except DHTError:
            return False

    # -- get -------------------------------------------------------------------------------------

    async def get(self, key: str, *, alpha: int | None = None) -> GetResult:
        key_id = key_id_of(key)
        self.table.mark_lookup(key_id, self.clock())
        lookup = await traverse(
            key_id,
            self.table.nearest(key_id, self.k),
            lambda c: self.protocol.find_value(c, key_id),
            k=self.k,
            alpha=alpha or self.alpha,
            exclude=self.node_id,
            is_hit=bool,
        )
        now = self.clock()
        distinct = set(self.storage.get(key_id, now))  # whole records: a liar may reuse a signature
        for records in lookup.replies.values():
            distinct.update(records)
        good, rejected = [], 0
        for record in distinct:
            try:
                if record.key != key:
                    raise RecordRejected("a record of another key")
                check_fresh(record, now, float("inf"))
                verify_record(record)
            except RecordRejected:
                rejected += 1
                continue
            good.append(record)
        return GetResult(key, merge_latest(good), hops=lookup.hops, rpcs=lookup.rpcs, rejected=rejected)

    # -- upkeep ----------------------------------------------------------------------------------

    def start(self, period: float = 60.0, bucket_refresh: float = 3600.0) -> None:
        if self._maintenance is None:
            self._maintenance = asyncio.create_task(self.run_maintenance(period, bucket_refresh))

    async def run_maintenance(self, period: float, bucket_refresh: float) -> None:
        while True:
            await asyncio.sleep(period)
            try:
                self.storage.purge(self.clock())
                await self.refresh_buckets(bucket_refresh)
            except DHTError as e:
                logger.warning("dht maintenance: %s", e)

    async def stop(self) -> None:
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
            self._maintenance = None
        self.protocol.close()
