"""Outbox: what a trainer or a node has for the coordinator and could not yet deliver, kept in order.

The coordinator may be away (restarted, upgraded, its network down) for a minute or an hour; credit and
reports must not be lost meanwhile. Each entry is one batch (a kind and a list of JSON-ready items) in
its own file ``<seq>-<kind>.json`` under the outbox's folder, written atomically (``engine.files``), so a
trainer that crashes or is stopped delivers them when it runs again. Entries are delivered oldest
first and removed only once the coordinator answered, so an answer lost on the way means the entry is
sent again: receipts and reports carry unique ids and the coordinator refuses a second copy, so each is
counted once. The outbox is bounded (``max_items`` items): over it, the oldest entries go (``dropped``
counts their items) and the newest are kept. Without a folder it keeps the same order in memory.

A file that cannot be read back (cut short by a full disk, edited by hand) is set aside as
``<name>.bad`` and counted (``unreadable``), never delivered and never blocking the rest.
"""

from __future__ import annotations

import json
import logging
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.files import atomic_write

__all__ = ["Entry", "Outbox"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{12})-([a-z_]{1,32})\.json$")


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str
    items: list[dict[str, Any]]


class Outbox:
    """Batches waiting for the coordinator, oldest first (see the module docstring)."""

    def __init__(self, directory: Path | None, max_items: int) -> None:
        self.directory = directory
        self.max_items = max(1, max_items)
        self.dropped = 0
        self.unreadable = 0
        self.not_on_disk = 0
        self._entries: deque[Entry] = deque()
        self._seq = 0
        if directory is not None:
            self._load(directory)

    def __len__(self) -> int:
        """Items waiting."""
        return sum(len(e.items) for e in self._entries)

    def put(self, kind: str, items: list[dict[str, Any]]) -> None:
        """Keep one batch, on disk first; a batch the disk refuses (full, read-only) is kept in memory
        only (``not_on_disk``) rather than lost."""
        if not items:
            return
        self._seq += 1
        entry = Entry(self._seq, kind, list(items))
        if self.directory is not None:
            try:
                atomic_write(self._path(entry), json.dumps({"kind": kind, "items": entry.items}).encode())
            except OSError as e:
                self.not_on_disk += len(items)
                logger.warning("outbox: cannot write %d %s to disk (%s): kept in memory", len(items), kind, e)
        self._entries.append(entry)
        while len(self) > self.max_items and len(self._entries) > 1:
            self._forget(self._entries[0], dropped=True)

    def entries(self) -> list[Entry]:
        """Every batch waiting, oldest first."""
        return list(self._entries)

    def done(self, entry: Entry) -> None:
        """The coordinator answered for ``entry``: forget it."""
        if entry in self._entries:
            self._forget(entry, dropped=False)

    def _forget(self, entry: Entry, *, dropped: bool) -> None:
        self._entries.remove(entry)
        if dropped:
            self.dropped += len(entry.items)
            logger.warning(
                "outbox over %d items: %d %s of the oldest dropped",
                self.max_items,
                len(entry.items),
                entry.kind,
            )
        if self.directory is not None:
            self._path(entry).unlink(missing_ok=True)

    def _path(self, entry: Entry) -> Path:
        assert self.directory is not None
        return self.directory / f"{entry.seq:012d}-{entry.kind}.json"

    def _load(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        found = []
        for path in directory.iterdir():
            m = _NAME.match(path.name)
            if m is not None:
                found.append((int(m.group(1)), m.group(2), path))
        for seq, kind, path in sorted(found):
            self._seq = max(self._seq, seq)
            try:
                data = json.loads(path.read_bytes())
                items = data["items"]
                if data.get("kind") != kind or not isinstance(items, list):
                    raise ValueError("not an outbox entry")
                if not all(isinstance(i, dict) for i in items):
                    raise ValueError("items are not objects")
            except (OSError, ValueError, KeyError, TypeError) as e:
                self.unreadable += 1
                logger.warning("outbox entry %s cannot be read (%s): set aside", path.name, e)
                path.replace(path.with_name(path.name + ".bad"))
                continue
            self._entries.append(Entry(seq, kind, items))
        while len(self) > self.max_items and len(self._entries) > 1:
            self._forget(self._entries[0], dropped=True)
