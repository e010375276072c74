"""The outbox keeps batches for the coordinator in order, on disk across restarts, bounded (oldest
dropped and counted), and sets aside a file it cannot read instead of delivering or blocking on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.account import outbox as outbox_module
from engine.account.outbox import Outbox


def _items(start: int, n: int) -> list[dict[str, int]]:
    return [{"n": i} for i in range(start, start + n)]


def test_batches_come_back_in_order_after_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path, 100)
    box.put("receipts", _items(0, 3))
    box.put("report", [{"r": 1}])
    box.put("receipts", _items(3, 2))
    first = box.entries()[0]
    box.done(first)
    again = Outbox(tmp_path, 100)  # a new process on the same folder
    assert [(e.kind, e.items) for e in again.entries()] == [
        ("report", [{"r": 1}]),
        ("receipts", _items(3, 2)),
    ]
    assert len(again) == 3
    again.put("receipts", _items(5, 1))  # numbering goes on after what was found
    assert [e.seq for e in again.entries()] == sorted(e.seq for e in again.entries())
    assert len({e.seq for e in again.entries()}) == 3


def test_the_bound_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    box = Outbox(tmp_path, 5)
    for i in range(4):
        box.put("receipts", _items(i * 2, 2))
    assert box.dropped == 4 and len(box) == 4
    assert [e.items[0]["n"] for e in box.entries()] == [4, 6]  # the newest kept
    assert len(list(tmp_path.glob("*.json"))) == 2
    small = Outbox(tmp_path, 2)  # a smaller bound on the next start applies at once
    assert small.dropped == 2 and len(small) == 2


def test_an_unreadable_file_is_set_aside_and_counted(tmp_path: Path) -> None:
    box = Outbox(tmp_path, 100)
    box.put("receipts", _items(0, 2))
    box.put("receipts", _items(2, 2))
    paths = sorted(tmp_path.glob("*.json"))
    paths[0].write_bytes(b'{"kind": "receipts", "items": [')  # cut short
    (tmp_path / "000000000009-report.json").write_bytes(b'{"kind": "receipts", "items": []}')  # wrong kind
    (tmp_path / "notes.txt").write_text("not ours")
    again = Outbox(tmp_path, 100)
    assert again.unreadable == 2
    assert [e.items for e in again.entries()] == [_items(2, 2)]
    assert (tmp_path / (paths[0].name + ".bad")).exists() and (tmp_path / "notes.txt").exists()


def test_a_disk_that_refuses_keeps_the_batch_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, data: bytes, *, private: bool = False) -> None:
        raise OSError(28, "No space left on device")

    box = Outbox(tmp_path, 100)
    monkeypatch.setattr(outbox_module, "atomic_write", full)
    box.put("receipts", _items(0, 3))
    assert box.not_on_disk == 3 and len(box) == 3
    box.done(box.entries()[0])
    assert len(box) == 0


def test_in_memory_without_a_folder() -> None:
    box = Outbox(None, 3)
    box.put("receipts", _items(0, 2))
    box.put("receipts", [])
    box.put("report", [{"r": 1}])
    assert [e.kind for e in box.entries()] == ["receipts", "report"]
    box.put("receipts", _items(2, 1))
    assert box.dropped == 2 and len(box) == 2
