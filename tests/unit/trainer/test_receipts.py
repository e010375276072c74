"""Receipt signing (the coordinator verifies what trainers sign) and ReceiptBook batching, retries, bounds."""

import asyncio
import base64

import msgspec
import pytest

from coordinator.credit import receipts as coord
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


async def test_failed_posts_are_retried_then_dropped_and_the_queue_is_bounded() -> None:
    fake = FakeCoordinator(fail=1)
    book = ReceiptBook(Identity.generate(), fake.post, batch_size=50, interval_s=60, max_attempts=2)
    for w in _work(20):
        book.add(w)
    assert await book.flush() == 0 and book.stats.failed_posts == 1
    assert await book.flush() == 20  # the same receipts, same ids: idempotent on the coordinator
    fake.fail = 5
    for w in _work(5):
        book.add(w)
    await book.flush()
    await book.flush()  # second failure: max_attempts reached
    assert book.stats.dropped == 5
    small = ReceiptBook(Identity.generate(), fake.post, max_queue=3)
    for w in _work(5):
        small.add(w)
    assert small.stats.dropped == 2
