"""A node's local records: key → {(owner, subkey) → record}, with expiry and quotas. No I/O.

A store replaces a slot only with a newer record (later expiration) for the same owner and subkey;
the slot is named by the record's own public key, so a record can only ever land in its signer's
slot. Signatures are checked by the caller (``protocol``) before ``put``: the store trusts its input.

Quotas keep one party from filling a node: at most ``max_per_owner`` live records signed by one key,
at most ``max_per_sender`` sent by one peer (the authenticated sender of the store; ``None`` for the
node's own puts, which only the owner quota counts), at most ``max_per_key`` under one key, and
``max_records`` in all. Over a quota the store first drops expired records, then refuses
(:class:`~engine.dht.errors.QuotaExceeded`). An honest host writes about ``dims + 1`` records per
expert it hosts, so the defaults leave it hundreds of experts.

``fair_order`` is how a reply that cannot carry every record of a key picks: one record per owner
first (each owner's latest), owners in order of their latest expiration, then a second round, and so
on; forty records of one owner cannot push another owner's record out of a reply.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator

from .errors import QuotaExceeded, StaleRecord
from .records import Record

Slot = tuple[str, str]


class RecordStore:
    def __init__(
        self,
        max_records: int = 100_000,
        *,
        max_per_owner: int = 2048,
        max_per_sender: int = 4096,
        max_per_key: int = 1024,
    ) -> None:
        self.max_records = max_records
        self.max_per_owner = max_per_owner
        self.max_per_sender = max_per_sender
        self.max_per_key = max_per_key
        self._keys: dict[int, dict[Slot, Record]] = {}
        self._senders: dict[tuple[int, Slot], str] = {}
        self._by_owner: Counter[str] = Counter()
        self._by_sender: Counter[str] = Counter()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def put(self, key_id: int, record: Record, now: float, sender: str | None = None) -> None:
        """Keep ``record`` unless a record at least as new holds its slot (StaleRecord) or a quota is
        full (QuotaExceeded). ``sender``: the peer that sent it (None: this node itself)."""
        slot = record.slot
        held = self._keys.get(key_id, {}).get(slot)
        if held is not None and held.expiration > now and held.expiration >= record.expiration:
            raise StaleRecord(f"a record as new is held for {record.key!r} by {slot[0][:12]}")
        previous = self._senders.get((key_id, slot))
        new_sender = sender is not None and sender != previous
        why = self._over_quota(key_id, slot[0], sender if new_sender else None, held is None)
        if why is not None:
            self.purge(now)  # expired records free room first
            held = self._keys.get(key_id, {}).get(slot)
            why = self._over_quota(key_id, slot[0], sender if new_sender else None, held is None)
            if why is not None:
                raise QuotaExceeded(why)
        if held is None:
            self._count += 1
            self._by_owner[slot[0]] += 1
        if sender != previous:
            self._forget_sender(key_id, slot)
            if sender is not None:
                self._senders[(key_id, slot)] = sender
                self._by_sender[sender] += 1
        self._keys.setdefault(key_id, {})[slot] = record

    def _over_quota(self, key_id: int, owner: str, sender: str | None, new_slot: bool) -> str | None:
        """Why one more record (in a new slot, or from a new sender) would be too many, or None."""
        if sender is not None and self._by_sender[sender] >= self.max_per_sender:
            return f"peer {sender[:12]} has {self.max_per_sender} records here"
        if not new_slot:
            return None
        if self._count >= self.max_records:
            return "store is full"
        if len(self._keys.get(key_id, ())) >= self.max_per_key:
            return f"key holds {self.max_per_key} records"
        if self._by_owner[owner] >= self.max_per_owner:
            return f"owner {owner[:12]} has {self.max_per_owner} records here"
        return None

    def _forget_sender(self, key_id: int, slot: Slot) -> None:
        sender = self._senders.pop((key_id, slot), None)
        if sender is not None:
            self._by_sender[sender] -= 1
            if self._by_sender[sender] <= 0:
                del self._by_sender[sender]

    def get(self, key_id: int, now: float) -> list[Record]:
        slots = self._keys.get(key_id)
        if not slots:
            return []
        return [r for r in slots.values() if r.expiration > now]

    def purge(self, now: float) -> int:
        """Drop expired records; return how many went."""
        dropped = 0
        for key_id in list(self._keys):
            slots = self._keys[key_id]
            for slot in [s for s, r in slots.items() if r.expiration <= now]:
                self._by_owner[slot[0]] -= 1
                if self._by_owner[slot[0]] <= 0:
                    del self._by_owner[slot[0]]
                self._forget_sender(key_id, slot)
                del slots[slot]
                dropped += 1
            if not slots:
                del self._keys[key_id]
        self._count -= dropped
        return dropped

    def items(self, now: float) -> Iterator[tuple[int, Record]]:
        for key_id, slots in self._keys.items():
            for record in slots.values():
                if record.expiration > now:
                    yield key_id, record


def fair_order(records: list[Record]) -> list[Record]:
    """Round robin over owners (see the module doc): each owner's latest first, then their next."""
    by_owner: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_owner[record.owner].append(record)
    queues = sorted(
        (sorted(rs, key=lambda r: -r.expiration) for rs in by_owner.values()),
        key=lambda rs: (-rs[0].expiration, rs[0].owner),
    )
    out: list[Record] = []
    depth = 0
    while len(out) < len(records):
        out.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return out


def merge_latest(records: list[Record]) -> dict[Slot, Record]:
    """Latest record per (owner, subkey): the union of what several nodes returned."""
    out: dict[Slot, Record] = {}
    for record in records:
        held = out.get(record.slot)
        if held is None or record.expiration > held.expiration:
            out[record.slot] = record
    return out
