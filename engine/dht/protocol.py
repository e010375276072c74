"""The four DHT RPCs over a ``DHTTransport``: both the serving side and the calling side.

Methods and fields (all scalars or lists of scalars, so they travel in ``engine.wire`` messages)::

    dht.ping        {}                          -> {"ok": true}
    dht.find_node   {"target": 20 bytes}        -> {"peers": [peer id, ...]}
    dht.find_value  {"key": 20 bytes (key id)}  -> {"peers": [...], "records": [record bytes, ...]}
    dht.store       {"records": [record bytes]} -> {"accepted": [bool, ...]}

Every request and every answer teaches the routing table a live contact; the sender's node id comes
from the peer id the transport authenticated, never from the message. A request with ``"client": true``
comes from a DHT client (a trainer: it looks up and publishes, but holds nobody's records): it is
answered and not added, so nobody picks it as a place to store, and a client serves only ``dht.ping``.
The flag can only make its sender less used, so it needs no proof. A failed call counts against
the contact (evicted after ``max_failures`` in a row). When a full bucket meets a newcomer its least
recently seen contact is pinged in the background: it stays if it answers, else the newcomer replaces it.

A store checks, per record: sizes, expiry window, that it is newer than the owner's record in that slot
(before the costly part), then the Ed25519 signature, then the store's quotas (per owner, per sender:
the authenticated peer that sent it, per key). Replies carry at most ``REPLY_RECORD_BYTES`` of records
(the wire caps a header at 64 KiB), picked fairly: one record per owner first (``storage.fair_order``),
so one owner's many records cannot hide another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .errors import BadRequest, CallFailed, RecordRejected
from .ids import id_from_bytes, id_to_bytes, node_id_of
from .records import Record, check_fresh, decode_record, encode_record, verify_record
from .routing import Contact, RoutingTable
from .storage import RecordStore, fair_order
from .transport import DHTTransport, Fields

logger = logging.getLogger(__name__)

PING, STORE, FIND_NODE, FIND_VALUE = "dht.ping", "dht.store", "dht.find_node", "dht.find_value"
REPLY_RECORD_BYTES = 48 * 1024
MAX_PEERS_IN_REPLY = 64
MAX_RECORDS_IN_REQUEST = 512
MAX_BACKGROUND_PINGS = 8


def pack_records(
    records: list[Record], budget: int = REPLY_RECORD_BYTES, *, ordered: bool = False
) -> list[list[bytes]]:
    """Split encoded records into batches of at most ``budget`` bytes each (latest expiration first,
    or in the given order where ``ordered``)."""
    batches: list[list[bytes]] = [[]]
    used = 0
    for record in records if ordered else sorted(records, key=lambda r: -r.expiration):
        raw = encode_record(record)
        if batches[-1] and (used + len(raw) > budget or len(batches[-1]) >= MAX_RECORDS_IN_REQUEST):
            batches.append([])
            used = 0
        batches[-1].append(raw)
        used += len(raw)
    return batches


def parse_peers(fields: Fields, me: int) -> list[Contact]:
    raw = fields.get("peers")
    if not isinstance(raw, list) or len(raw) > MAX_PEERS_IN_REPLY:
        raise BadRequest("peers must be a list of at most 64 peer ids")
    out = []
    for peer_id in raw:
        if not isinstance(peer_id, str):
            raise BadRequest("a peer id is a str")
        node_id = node_id_of(peer_id)
        if node_id != me:
            out.append((node_id, peer_id))
    return out


class DHTProtocol:
    def __init__(
        self,
        transport: DHTTransport,
        table: RoutingTable,
        storage: RecordStore,
        *,
        clock: Callable[[], float],
        rpc_timeout: float,
        max_ttl: float,
        client: bool = False,
    ) -> None:
        self.transport = transport
        self.client = client
        self.table = table
        self.storage = storage
        self.clock = clock
        self.rpc_timeout = rpc_timeout
        self.max_ttl = max_ttl
        self.node_id = table.node_id
        self.rejected = 0
        self._pinging: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        transport.serve(PING, self._serve_ping)
        if not client:
            transport.serve(STORE, self._serve_store)
            transport.serve(FIND_NODE, self._serve_find_node)
            transport.serve(FIND_VALUE, self._serve_find_value)

    # -- routing bookkeeping ---------------------------------------------------------------------

    def seen(self, node_id: int, peer_id: str) -> None:
        lru = self.table.add(node_id, peer_id)
        if lru is not None and lru[0] not in self._pinging and len(self._pinging) < MAX_BACKGROUND_PINGS:
            self._pinging.add(lru[0])
            task = asyncio.ensure_future(self._ping_or_evict(lru))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _ping_or_evict(self, contact: Contact) -> None:
        try:
            await self.transport.call(contact[1], PING, {}, timeout=self.rpc_timeout)
        except CallFailed:
            self.table.remove(contact[0])
        else:
            self.table.add(*contact)
        finally:
            self._pinging.discard(contact[0])

    async def _call(self, contact: Contact, method: str, fields: Fields) -> Fields:
        if self.client:
            fields = {**fields, "client": True}
        try:
            reply = await self.transport.call(contact[1], method, fields, timeout=self.rpc_timeout)
        except CallFailed:
            self.table.record_failure(contact[0])
            raise
        self.seen(*contact)
        return reply

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    # -- calling side ----------------------------------------------------------------------------

    async def ping(self, contact: Contact) -> bool:
        try:
            await self._call(contact, PING, {})
        except CallFailed:
            return False
        return True

    async def find_node(self, contact: Contact, target: int) -> tuple[list[Contact], None]:
        reply = await self._call(contact, FIND_NODE, {"target": id_to_bytes(target)})
        return _checked(lambda: parse_peers(reply, self.node_id)), None

    async def find_value(self, contact: Contact, key_id: int) -> tuple[list[Contact], list[Record]]:
        reply = await self._call(contact, FIND_VALUE, {"key": id_to_bytes(key_id)})

        def parse() -> list[Record]:
            raw = reply.get("records")
            if not isinstance(raw, list):
                raise BadRequest("records must be a list")
            return [decode_record(r) for r in raw]  # signatures are checked by the node, once per record

        return _checked(lambda: parse_peers(reply, self.node_id)), _checked(parse)

    async def store(self, contact: Contact, records: list[Record]) -> int:
        """Send ``records`` to one node; return how many it accepted."""
        accepted = 0
        for batch in pack_records(records):
            reply = await self._call(contact, STORE, {"records": batch})
            flags = reply.get("accepted")
            if not isinstance(flags, list) or len(flags) != len(batch):
                raise CallFailed(f"malformed store reply from {contact[1][:12]}")
            accepted += sum(1 for f in flags if f is True)
        return accepted

    # -- serving side ----------------------------------------------------------------------------

    def _sender(self, peer_id: str, fields: Fields) -> None:
        if fields.get("client") is not True:
            self.seen(node_id_of(peer_id), peer_id)

    async def _serve_ping(self, sender: str, fields: Fields) -> Fields:
        self._sender(sender, fields)
        return {"ok": True}

    def _nearest(self, target: int, sender: str) -> list[str]:
        return [p for _, p in self.table.nearest(target, exclude=node_id_of(sender))]

    async def _serve_find_node(self, sender: str, fields: Fields) -> Fields:
        target = _id_field(fields, "target")
        self._sender(sender, fields)
        return {"peers": self._nearest(target, sender)}

    async def _serve_find_value(self, sender: str, fields: Fields) -> Fields:
        key_id = _id_field(fields, "key")
        self._sender(sender, fields)
        records = self.storage.get(key_id, self.clock())
        batch = pack_records(fair_order(records), ordered=True)[0] if records else []
        return {"peers": self._nearest(key_id, sender), "records": batch}

    async def _serve_store(self, sender: str, fields: Fields) -> Fields:
        raw = fields.get("records")
        if not isinstance(raw, list) or len(raw) > MAX_RECORDS_IN_REQUEST:
            raise BadRequest(f"records must be a list of at most {MAX_RECORDS_IN_REQUEST}")
        self._sender(sender, fields)
        return {"accepted": [self.accept(item, sender) for item in raw]}

    def accept(self, raw: object, sender: str | None = None) -> bool:
        """Check one received record (sent by ``sender``) and keep it; False (and a count) if it is
        refused. Never raises: a malformed record is refused like any other."""
        now = self.clock()
        try:
            record = decode_record(raw)
            check_fresh(record, now, self.max_ttl)
            key_id = record.key_id
            held = {r.slot: r for r in self.storage.get(key_id, now)}.get(record.slot)
            if held is not None and held.expiration >= record.expiration:
                return held == record  # a replica we already hold is not an error
            verify_record(record)
            self.storage.put(key_id, record, now, sender)
        except (RecordRejected, BadRequest) as e:
            self.rejected += 1
            logger.debug("refused a record: %s", e)
            return False
        return True


def _id_field(fields: Fields, name: str) -> int:
    raw = fields.get(name)
    if not isinstance(raw, bytes):
        raise BadRequest(f"{name} must be 20 bytes")
    return id_from_bytes(raw)


def _checked(parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except BadRequest as e:
        raise CallFailed(f"malformed reply: {e}") from e
