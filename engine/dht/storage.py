"""A node's local records: key → {(owner, subkey) → record}, with expiry. No I/O.

A store replaces a slot only with a newer record (later expiration) for the same owner and subkey;
the slot is named by the record's own public key, so a record can only ever land in its signer's
slot. Signatures are checked by the caller (``protocol``) before ``put``: the store trusts its input.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import RecordRejected, StaleRecord
from .records import Record


class RecordStore:
    def __init__(self, max_records: int = 100_000) -> None:
        self.max_records = max_records
        self._keys: dict[int, dict[tuple[str, str], Record]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def put(self, key_id: int, record: Record, now: float) -> None:
        """Keep ``record`` unless a record at least as new holds its slot; raise StaleRecord if so."""
        slots = self._keys.setdefault(key_id, {})
        slot = record.slot
        held = slots.get(slot)
        if held is not None and held.expiration > now and held.expiration >= record.expiration:
            raise StaleRecord(f"a record as new is held for {record.key!r} by {slot[0][:12]}")
        if held is None:
            if self._count >= self.max_records:
                self.purge(now)
                if self._count >= self.max_records:
                    raise RecordRejected("store is full")
            self._count += 1
        slots[slot] = record

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


def merge_latest(records: list[Record]) -> dict[tuple[str, str], Record]:
    """Latest record per (owner, subkey): the union of what several nodes returned."""
    out: dict[tuple[str, str], Record] = {}
    for record in records:
        held = out.get(record.slot)
        if held is None or record.expiration > held.expiration:
            out[record.slot] = record
    return out
