"""Receipt verification without a database: the pool worker's verdicts, when the Verifier uses its
process pool, and the statements' bytes (issue 17: the credit/receipt verification, mutation-tested).
"""

import concurrent.futures
import time

import msgspec
import pytest

from coordinator.credit.receipts import (
    KeyCache,
    ReceiptError,
    SignedReceipt,
    Verifier,
    _receipt_bytes,
    _verify_chunk,
    sign_receipt,
    verify_receipt,
)
from engine.p2p.identity import Identity
from engine.wire.statements import ASSIGNMENT_DOMAIN, BIND_DOMAIN, assignment_signed_bytes, bind_message

HOST_KEY = Identity.generate()
HOST = HOST_KEY.peer_id


def receipts(n: int, signer: Identity | None = None) -> list[SignedReceipt]:
    me = signer or Identity.generate()
    return [sign_receipt(me, HOST_KEY, "m.0", i + 1, False, 1.0) for i in range(n)]


def test_bind_message_bytes() -> None:
    assert bind_message(42) == b"lah-bind-host-v1\x0042"
    assert bind_message(42).startswith(BIND_DOMAIN)
    assert bind_message(7) != bind_message(70)


def test_assignment_signed_bytes() -> None:
    # What the coordinator signs and every DHT reader re-builds to check a declared host's proof: the
    # two must agree byte for byte, an int expiry signed as the float the declaration carries.
    key = bytes(range(32))
    data = assignment_signed_bytes(bytearray(key), "ffn.0.3", "ffn", 1_800_000_000)
    assert data.startswith(ASSIGNMENT_DOMAIN)
    fields = msgspec.msgpack.decode(data[len(ASSIGNMENT_DOMAIN) :])
    assert fields == [key, "ffn.0.3", "ffn", 1_800_000_000.0] and type(fields[3]) is float
    assert data == assignment_signed_bytes(key, "ffn.0.3", "ffn", 1_800_000_000.0)


def test_pool_worker_verdicts() -> None:
    me, other = Identity.generate(), Identity.generate()
    good = sign_receipt(me, HOST_KEY, "m.0", 3, True, 5.0)
    item = (good.trainer_public_key, good.trainer_peer_id, _receipt_bytes(good), good.signature)
    tampered = (item[0], item[1], item[2] + b"x", item[3])
    wrong_peer = (item[0], other.peer_id, item[2], item[3])
    assert _verify_chunk([item, tampered, wrong_peer, item]) == [True, False, False, True]
    assert _verify_chunk([]) == []


def test_key_cache_parses_each_key_once_and_refuses_malformed_keys() -> None:
    keys = KeyCache()
    raw = Identity.generate().public_key
    assert keys.get(raw) is keys.get(raw)
    with pytest.raises(ReceiptError, match="malformed public key"):
        keys.get(b"\x01" * 31)


def test_key_cache_is_bounded() -> None:
    keys = KeyCache()
    raws = [Identity.generate().public_key for _ in range(4098)]
    for raw in raws[:4097]:
        keys.get(raw)
    assert len(keys._keys) == 4097
    keys.get(raws[4097])  # over 4096 held: start again rather than grow without bound
    assert list(keys._keys) == [raws[4097]]


def test_verify_receipt_uses_the_given_key_cache() -> None:
    r = receipts(1)[0]
    keys = KeyCache()
    verify_receipt(r, keys)
    parsed = keys.get(r.trainer_public_key)
    verify_receipt(r, keys)
    assert keys.get(r.trainer_public_key) is parsed


async def test_verifier_keeps_its_key_cache_across_batches() -> None:
    me = Identity.generate()
    v = Verifier()
    assert await v.check(receipts(3, me)) == [True] * 3
    assert set(v.keys._keys) == {me.public_key, HOST_KEY.public_key}  # parsed by check() itself, once
    parsed = v.keys.get(me.public_key)
    assert await v.check(receipts(2, me)) == [True, True]
    assert v.keys.get(me.public_key) is parsed


async def test_verifier_stays_in_process_by_default_and_below_min_parallel() -> None:
    batch = receipts(64)
    default = Verifier()
    assert (default.workers, default.min_parallel) == (0, 64)
    assert await default.check(batch) == [True] * 64
    assert default._pool is None
    pooled = Verifier(workers=2, min_parallel=64)
    try:
        assert await pooled.check(batch[:63]) == [True] * 63
        assert pooled._pool is None
    finally:
        pooled.close()


async def test_verifier_uses_its_spawned_pool_from_min_parallel_and_one_worker() -> None:
    batch = receipts(4)
    batch[2] = msgspec.structs.replace(batch[2], samples=99)
    v = Verifier(workers=1, min_parallel=4)
    try:
        assert await v.check(batch) == [True, True, False, True]
        pool = v._pool
        assert isinstance(pool, concurrent.futures.ProcessPoolExecutor)
        assert pool._max_workers == 1
        assert pool._mp_context.get_start_method() == "spawn"
        assert len(pool._processes) == 1  # the chunk ran there, not on a thread
        assert v._get_pool() is pool
    finally:
        v.close()
    assert v._pool is None


def test_verifier_close_waits_for_the_workers_and_cancels_queued_work() -> None:
    v = Verifier(workers=1)
    pool = v._get_pool()
    futures = [pool.submit(time.sleep, 0.3) for _ in range(6)]
    futures[0].result(timeout=60)  # the worker is up
    processes = list(pool._processes.values())
    v.close()
    assert v._pool is None
    assert not any(p.is_alive() for p in processes)
    assert any(f.cancelled() for f in futures)
    v.close()  # twice is fine
