"""Receipt signing (the coordinator verifies what trainers sign) and ReceiptBook batching, retries, bounds."""

import asyncio
import base64

import msgspec
import pytest

from coordinator.credit import receipts as coord
from engine.account.errors import CoordinatorError
from engine.p2p import Identity
from engine.trainer.receipts import (
    ReceiptBook,
    Work,
    sign_receipt,
    sign_spot_check,
)

HOST = "ab" * 20


def test_the_coordinator_verifies_our_receipts_and_reports() -> None:
    me = Identity.generate()
    raw = sign_receipt(me, Identity.generate(), "ffn.0.3", 64, False, 1.7e9)  # the host countersigns
    receipt = msgspec.json.decode(msgspec.json.encode(raw), type=coord.SignedReceipt)
    coord.verify_receipt(receipt)
    tampered = msgspec.structs.replace(receipt, samples=65)
    with pytest.raises(coord.ReceiptError):
        coord.verify_receipt(tampered)
    report = msgspec.json.decode(
        msgspec.json.encode(sign_spot_check(me, HOST, "ffn.0.3", 1.0, 2.0, "x" * 300)),
        type=coord.SpotCheckReport,
    )
    coord.verify_spot_check(report)
    assert base64.b64decode(raw["trainer_public_key"]) == me.public_key


class FakeCoordinator:
    def __init__(self, fail: int = 0) -> None:
        self.batches: list[list[dict]] = []
        self.fail = fail

    async def post(self, batch: list[dict]) -> dict:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("coordinator away")
        self.batches.append(batch)
        return {"accepted": len(batch), "rejected": []}


def _work(n: int) -> list[Work]:
    return [Work(HOST, f"ffn.{i % 4}.0", 8, i % 2 == 0, 1.7e9 + i) for i in range(n)]


async def test_batches_are_bounded_and_every_receipt_is_sent_once() -> None:
    fake = FakeCoordinator()
    book = ReceiptBook(Identity.generate(), fake.post, batch_size=100, interval_s=60)
    for w in _work(250):
        book.add(w)
    assert await book.flush() == 250
    assert [len(b) for b in fake.batches] == [100, 100, 50]
    ids = [r["receipt_id"] for b in fake.batches for r in b]
    assert len(set(ids)) == 250
    assert book.stats.accepted == 250 and book.stats.batches == 3


async def test_a_full_batch_wakes_the_sender_without_waiting_for_the_timer() -> None:
    fake = FakeCoordinator()
    book = ReceiptBook(Identity.generate(), fake.post, batch_size=10, interval_s=60)
    book.start()
    try:
        for w in _work(10):
            book.add(w)  # add() never waits
        async with asyncio.timeout(5):
            while not fake.batches:
                await asyncio.sleep(0.01)
        assert len(fake.batches[0]) == 10
    finally:
        await book.close(timeout=5)


async def test_nothing_is_dropped_while_the_coordinator_is_away_and_each_is_sent_once() -> None:
    fake = FakeCoordinator(fail=3)
    book = ReceiptBook(Identity.generate(), fake.post, batch_size=50, interval_s=60)
    for w in _work(20):
        book.add(w)
    for _ in range(3):
        assert await book.flush() == 0  # away: kept, in order
    assert book.stats.failed_posts == 3 and book.pending == 20 and book.stats.dropped == 0
    for w in _work(5):
        book.add(w)
    assert await book.flush() == 25  # back: everything, oldest first, each once
    ids = [r["receipt_id"] for b in fake.batches for r in b]
    assert len(ids) == len(set(ids)) == 25 and book.pending == 0


async def test_the_queue_and_the_outbox_are_bounded() -> None:
    fake = FakeCoordinator(fail=100)
    small = ReceiptBook(Identity.generate(), fake.post, max_queue=3)
    for w in _work(5):
        small.add(w)
    assert small.stats.dropped == 2
    await small.flush()
    for w in _work(3):
        small.add(w)
    await small.flush()
    assert small.pending == 3 and small.stats.dropped == 5  # the outbox keeps the newest 3


class Refusing(FakeCoordinator):
    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status
        self.tries = 0

    async def post(self, batch: list[dict]) -> dict:
        self.tries += 1
        if self.tries == 1:
            raise CoordinatorError(self.status, "nope", "refused")
        return await super().post(batch)


async def test_a_refused_batch_is_dropped_and_counted_a_busy_coordinator_is_retried() -> None:
    refusing = Refusing(422)
    book = ReceiptBook(Identity.generate(), refusing.post, batch_size=4, interval_s=60)
    for w in _work(8):
        book.add(w)
    assert await book.flush() == 4  # the first batch refused outright, the second delivered
    assert book.stats.refused == 4 and book.pending == 0
    for status in (429, 503):
        busy = Refusing(status)
        book = ReceiptBook(Identity.generate(), busy.post, batch_size=4, interval_s=60)
        for w in _work(8):
            book.add(w)
        assert await book.flush() == 0 and book.pending == 8  # kept: it will answer later
        assert await book.flush() == 8 and book.stats.refused == 0


async def test_reports_wait_in_the_outbox_in_order_and_survive_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake = FakeCoordinator(fail=100)
    reports: list[dict] = []

    async def post_report(report: dict) -> None:
        if fake.fail:
            raise ConnectionError("away")
        reports.append(report)

    me = Identity.generate()
    book = ReceiptBook(me, fake.post, post_report=post_report, outbox_dir=tmp_path, interval_s=60)
    for w in _work(3):
        book.add(w)
    await book.flush()
    book.add_report(sign_spot_check(me, HOST, "ffn.0.3", 1.0, 2.0, "differs"))
    for w in _work(2):
        book.add(w)
    await book.close(timeout=1)  # the trainer stops while the coordinator is away
    assert book.pending == 6
    fake.fail = 0
    again = ReceiptBook(me, fake.post, post_report=post_report, outbox_dir=tmp_path, interval_s=60)
    assert again.pending == 6
    assert await again.flush() == 5
    assert [len(b) for b in fake.batches] == [3, 2] and len(reports) == 1
    assert again.stats.reports_sent == 1 and again.pending == 0
    assert list(tmp_path.glob("*.json")) == []
