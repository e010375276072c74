import msgspec
import pytest

from coordinator.credit.receipts import (
    MAX_BATCH,
    ReceiptBatch,
    ReceiptError,
    SignedReceipt,
    Verifier,
    batch_decoder,
    report_decoder,
    sign_receipt,
    sign_spot_check,
    verify_receipt,
    verify_spot_check,
)
from engine.p2p.identity import Identity, verify
from engine.wire.statements import RECEIPT_DOMAIN, receipt_signed_bytes

HOST_KEY = Identity.generate()
HOST = HOST_KEY.peer_id


def test_sign_verify_and_json_roundtrip() -> None:
    me = Identity.generate()
    r = sign_receipt(me, HOST_KEY, "mnist.1.2", 32, True, 1_800_000_000.5)
    assert len(r.receipt_id) == 32 and r.trainer_peer_id == me.peer_id
    verify_receipt(r)
    wire = msgspec.json.encode(ReceiptBatch([r]))
    (back,) = batch_decoder.decode(wire).receipts
    assert back == r
    verify_receipt(back)
    # The signature covers the domain: it is no signature of the bare fields (or any other message).
    data = receipt_signed_bytes(
        r.receipt_id, r.trainer_peer_id, r.trainer_public_key, HOST, "mnist.1.2", 32, True, r.served_at
    )
    assert data.startswith(RECEIPT_DOMAIN)
    verify(me.public_key, data, r.signature)


@pytest.mark.parametrize(
    "change",
    [
        {"samples": 33},
        {"backward": False},
        {"host_peer_id": "cd" * 20},
        {"expert_uid": "mnist.1.3"},
        {"served_at": 1_800_000_001.0},
        {"receipt_id": "0" * 32},
    ],
)
def test_any_change_breaks_the_signature(change: dict[str, object]) -> None:
    r = sign_receipt(Identity.generate(), HOST_KEY, "mnist.1.2", 32, True, 1_800_000_000.5)
    with pytest.raises(ReceiptError):
        verify_receipt(msgspec.structs.replace(r, **change))


def test_key_must_belong_to_the_claimed_trainer() -> None:
    real, other = Identity.generate(), Identity.generate()
    r = sign_receipt(real, HOST_KEY, "m.0", 1, False, 1.0)
    with pytest.raises(ReceiptError, match="peer id"):
        verify_receipt(msgspec.structs.replace(r, trainer_peer_id=other.peer_id))


def test_schema_limits() -> None:
    r = sign_receipt(Identity.generate(), HOST_KEY, "m.0", 1, False, 1.0)
    good = msgspec.to_builtins(r)
    for field, bad in [
        ("receipt_id", "XYZ"),
        ("host_peer_id", "ab"),
        ("expert_uid", "x" * 129),
        ("samples", 2**40),
        ("served_at", -1.0),
        ("signature", "AAAA"),
    ]:
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert({**good, field: bad}, SignedReceipt)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**good, "extra": 1}, SignedReceipt)
    with pytest.raises(msgspec.ValidationError):
        batch_decoder.decode(msgspec.json.encode({"receipts": [good] * (MAX_BATCH + 1)}))


def test_spot_check_reports_are_signed_separately() -> None:
    me = Identity.generate()
    report = sign_spot_check(me, HOST, "m.0", 10.0, 20.0, "mismatch")
    verify_spot_check(report)
    assert report_decoder.decode(msgspec.json.encode(report)) == report
    with pytest.raises(ReceiptError):
        verify_spot_check(msgspec.structs.replace(report, period_end=30.0))


async def test_verifier_in_process_and_in_a_pool() -> None:
    me = Identity.generate()
    receipts = [sign_receipt(me, HOST_KEY, "m.0", i + 1, False, 1.0) for i in range(100)]
    receipts[7] = msgspec.structs.replace(receipts[7], samples=1000)
    expected = [i != 7 for i in range(100)]
    assert await Verifier().check(receipts) == expected
    pool = Verifier(workers=2, min_parallel=10)
    try:
        assert await pool.check(receipts) == expected
        assert await pool.check(receipts[:5]) == expected[:5]  # small batches stay in-process
    finally:
        pool.close()
