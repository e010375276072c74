"""The host's countersignature on receipts: one statement per reply (a Merkle root over its experts),
every flaw refused alone with its reason code, never crediting anyone."""

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.credit.ledger import ingest
from coordinator.credit.receipts import (
    MAX_BODY_BYTES,
    ReceiptBatch,
    ReceiptError,
    SignedReceipt,
    Verifier,
    verify_receipt,
)
from coordinator.db.models import Host
from coordinator.db.session import session_factory
from engine.p2p.identity import Identity
from engine.wire.statements import (
    countersign,
    host_proofs,
    merkle_levels,
    merkle_path,
    receipt_id_of,
    root_from_path,
    served_leaf,
    sign_receipt,
)

from .ledger_support import make_host

NOW = 1_800_000_000.0


def reply_receipts(
    trainer: Identity, host: Identity, n: int, backward: bool = False, at: float = NOW - 5
) -> list[SignedReceipt]:
    """What a trainer sends for one host reply of ``n`` experts: the host signed once."""
    rids = [receipt_id_of(trainer.peer_id, f"aid{i}", backward) for i in range(n)]
    leaves = [served_leaf(rid, f"m.{i}", 8 + i) for i, rid in enumerate(rids)]
    signature = countersign(host, trainer.peer_id, backward, at, leaves)
    proofs = host_proofs(host.public_key, at, signature, leaves)
    return [
        sign_receipt(trainer, host.peer_id, f"m.{i}", 8 + i, backward, at, rid, proof)
        for i, (rid, proof) in enumerate(zip(rids, proofs, strict=True))
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64])
def test_every_leaf_of_a_reply_leads_to_its_root(n: int) -> None:
    leaves = [served_leaf(f"{i:032x}", "m.0", i + 1) for i in range(n)]
    levels = merkle_levels(leaves)
    root = levels[-1][0]
    for i, leaf in enumerate(leaves):
        path = merkle_path(levels, i)
        assert root_from_path(leaf, i, n, path) == root
        assert root_from_path(leaf, (i + 1) % n, n, path) != root or n == 1
        assert root_from_path(leaf, i, n, (*path, b"\0" * 32)) is None  # a path too long
    assert root_from_path(leaves[0], n, n, ()) is None  # an index out of range


async def test_the_receipts_of_one_reply_verify_and_its_statement_is_checked_once() -> None:
    trainer, host = Identity.generate(), Identity.generate()
    batch = reply_receipts(trainer, host, 9)
    for r in batch:
        verify_receipt(r)
    v = Verifier()
    checked: list[bytes] = []
    real = v._verify

    async def counting(items, parallel):  # type: ignore[no-untyped-def]
        checked.extend(item[3] for item in items)
        return await real(items, parallel)

    v._verify = counting  # type: ignore[method-assign]
    assert await v.reasons(batch) == [None] * 9
    assert len(checked) == 9 + 1  # nine trainer signatures, one host statement
    checked.clear()
    assert await v.reasons(reply_receipts(trainer, host, 1)[:1] + batch[:2]) == [None] * 3
    assert len(checked) == 3 + 1  # the nine's statement is remembered


def _refusal(r: SignedReceipt) -> str:
    with pytest.raises(ReceiptError) as e:
        verify_receipt(r)
    return e.value.reason


async def test_each_bad_countersignature_is_refused_with_its_reason() -> None:
    trainer, host, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    good = reply_receipts(trainer, host, 3)[1]
    unsigned = sign_receipt(trainer, host.peer_id, "m.1", 9, False, NOW - 5)
    by_another = reply_receipts(trainer, mallory, 3)[1]
    cases = {
        "unsigned": (unsigned, "no_countersignature"),
        "short key": (msgspec.structs.replace(good, host_public_key=b"k" * 31), "bad_countersignature"),
        "short signature": (msgspec.structs.replace(good, host_signature=b"s" * 63), "bad_countersignature"),
        "key only": (msgspec.structs.replace(good, host_signature=b""), "bad_countersignature"),
        "wrong leaf": (msgspec.structs.replace(good, host_leaf=0), "bad_countersignature"),
        "leaf past the count": (msgspec.structs.replace(good, host_leaf=7), "bad_countersignature"),
        "other count": (msgspec.structs.replace(good, host_leaves=4), "bad_countersignature"),
        "path cut": (msgspec.structs.replace(good, host_path=good.host_path[:1]), "bad_countersignature"),
        "path of junk": (msgspec.structs.replace(good, host_path=(b"x" * 5,) * 2), "bad_countersignature"),
        # someone else's key: countersigned for the right host's peer id, by a key that is not its own
        "not the host's key": (
            msgspec.structs.replace(by_another, host_peer_id=host.peer_id),
            "bad_signature",  # the trainer signed the other host: the trainer's signature fails first
        ),
        "the host's key, another's signature": (
            msgspec.structs.replace(good, host_signature=by_another.host_signature),
            "bad_countersignature",
        ),
        "claimed by another key": (
            msgspec.structs.replace(good, host_public_key=mallory.public_key),
            "bad_countersignature",
        ),
    }
    for name, (receipt, reason) in cases.items():
        assert _refusal(receipt) == reason, name
        assert await Verifier().reasons([receipt]) == [reason], name
    assert await Verifier(workers=1, min_parallel=1).reasons([good, unsigned]) == [
        None,
        "no_countersignature",
    ]


def test_a_host_cannot_claim_work_without_the_trainers_signature() -> None:
    trainer, host = Identity.generate(), Identity.generate()
    good = reply_receipts(trainer, host, 2)[0]
    more = msgspec.structs.replace(good, samples=good.samples * 10)
    assert _refusal(more) == "bad_signature"


def test_a_receipt_of_the_old_format_decodes_and_is_refused() -> None:
    trainer, host = Identity.generate(), Identity.generate()
    raw = msgspec.to_builtins(sign_receipt(trainer, host.peer_id, "m.0", 8, False, NOW))
    for field in ("host_public_key", "host_leaf", "host_leaves", "host_path", "host_signature"):
        raw.pop(field)
    r = msgspec.convert(raw, SignedReceipt)
    assert _refusal(r) == "no_countersignature"


def test_a_full_batch_of_wide_replies_fits_the_body_limit() -> None:
    trainer, host = Identity.generate(), Identity.generate()
    wide = reply_receipts(trainer, host, 256)
    body = msgspec.json.encode(ReceiptBatch((wide * 4)[:1000]))
    assert len(body) < MAX_BODY_BYTES


async def test_refused_countersignatures_never_change_credit(db: AsyncEngine) -> None:
    sessions = session_factory(db)
    trainer, _ = await make_host(sessions, "trainer", role="trainer")
    host, _ = await make_host(sessions, "alice")
    good = reply_receipts(trainer, host, 2)
    bad = [
        sign_receipt(trainer, host.peer_id, "m.0", 8, False, NOW - 5),
        msgspec.structs.replace(reply_receipts(trainer, host, 3)[2], host_leaf=0),
    ]
    result = await ingest(sessions, bad + good, now=NOW)
    assert result.accepted == 2
    assert sorted(reason for _, reason in result.rejected) == ["bad_countersignature", "no_countersignature"]
    async with sessions() as s:
        h = await s.get(Host, host.peer_id)
        assert h is not None and h.credit_total == 8 + 9 and h.requests_served == 2
