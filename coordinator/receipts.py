"""Signed work receipts and spot-check reports: the wire schema, and how trainers sign them.

A trainer signs one receipt per answered request ("host H served expert E for N samples, forward or
backward, at time T") and sends them to the coordinator in batches (``POST /api/receipts``). The signed
bytes are a domain prefix and a msgpack array of the fields in a fixed order, so a receipt can never be
confused with any other signed message (signaling hellos, descriptions, spot-check reports).

Importable without the database: the engine uses ``sign_receipt`` and ``sign_spot_check``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
from typing import Annotated

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from engine.p2p.identity import Identity, peer_id_of
from engine.wire.statements import (
    receipt_signed_bytes,
    spot_check_signed_bytes,
)

MAX_BATCH = 1000  # receipts per POST
MAX_BODY_BYTES = 1024 * 1024  # a full batch of receipts is ~450 KiB of JSON
MAX_REPORT_BYTES = 16 * 1024

Hex32 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}$")]
PeerId = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{40}$")]
PublicKey = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
Signature = Annotated[bytes, msgspec.Meta(min_length=64, max_length=64)]
ExpertUid = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# Sanity of the numbers (samples > 0, time not in the future) is checked per receipt by the ledger, so
# one bad receipt is rejected with a reason instead of failing its whole batch; here only the range
# that fits the database columns.
Samples = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Time = Annotated[float, msgspec.Meta(ge=0, le=1e11)]


class ReceiptError(ValueError):
    """A receipt or report whose signature or signer does not check out."""


class SignedReceipt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    receipt_id: Hex32  # random; the idempotency key: re-sending a receipt never credits twice
    trainer_peer_id: PeerId
    trainer_public_key: PublicKey
    host_peer_id: PeerId
    expert_uid: ExpertUid
    samples: Samples
    backward: bool
    served_at: Time  # unix time
    signature: Signature


class ReceiptBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    receipts: Annotated[list[SignedReceipt], msgspec.Meta(max_length=MAX_BATCH)]


class SpotCheckReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A trainer re-ran a request of ``host_peer_id`` on another host and the outputs disagreed."""

    report_id: Hex32
    reporter_peer_id: PeerId
    reporter_public_key: PublicKey
    host_peer_id: PeerId
    expert_uid: ExpertUid
    period_start: Time
    period_end: Time
    reason: Annotated[str, msgspec.Meta(max_length=256)]
    signature: Signature


def _receipt_bytes(r: SignedReceipt) -> bytes:
    return receipt_signed_bytes(
        r.receipt_id,
        r.trainer_peer_id,
        r.trainer_public_key,
        r.host_peer_id,
        r.expert_uid,
        r.samples,
        r.backward,
        r.served_at,
    )


def new_id() -> str:
    return os.urandom(16).hex()


def sign_receipt(
    identity: Identity,
    host_peer_id: str,
    expert_uid: str,
    samples: int,
    backward: bool,
    served_at: float,
    receipt_id: str | None = None,
) -> SignedReceipt:
    """What a trainer sends for one answered request (a fresh random ``receipt_id`` unless given)."""
    rid = receipt_id or new_id()
    public_key = identity.public_key
    peer_id = peer_id_of(public_key)
    data = receipt_signed_bytes(
        rid, peer_id, public_key, host_peer_id, expert_uid, samples, backward, float(served_at)
    )
    return SignedReceipt(
        receipt_id=rid,
        trainer_peer_id=peer_id,
        trainer_public_key=public_key,
        host_peer_id=host_peer_id,
        expert_uid=expert_uid,
        samples=samples,
        backward=backward,
        served_at=float(served_at),
        signature=identity.sign(data),
    )


class KeyCache:
    """Parsed public keys by raw bytes: a batch usually comes from one trainer."""

    def __init__(self) -> None:
        self._keys: dict[bytes, Ed25519PublicKey] = {}

    def get(self, raw: bytes) -> Ed25519PublicKey:
        key = self._keys.get(raw)
        if key is None:
            try:
                key = Ed25519PublicKey.from_public_bytes(raw)
            except ValueError as e:
                raise ReceiptError("malformed public key") from e
            if len(self._keys) > 4096:
                self._keys.clear()
            self._keys[raw] = key
        return key


def _check(keys: KeyCache, public_key: bytes, peer_id: str, data: bytes, signature: bytes) -> None:
    if peer_id_of(public_key) != peer_id:
        raise ReceiptError("the public key does not belong to the signer's peer id")
    try:
        keys.get(public_key).verify(signature, data)
    except InvalidSignature as e:
        raise ReceiptError("signature does not verify") from e


def verify_receipt(receipt: SignedReceipt, keys: KeyCache | None = None) -> None:
    """Raise ReceiptError unless the receipt is signed by the key of its ``trainer_peer_id``."""
    _check(
        keys or KeyCache(),
        receipt.trainer_public_key,
        receipt.trainer_peer_id,
        _receipt_bytes(receipt),
        receipt.signature,
    )


def sign_spot_check(
    identity: Identity,
    host_peer_id: str,
    expert_uid: str,
    period_start: float,
    period_end: float,
    reason: str,
    report_id: str | None = None,
) -> SpotCheckReport:
    rid = report_id or new_id()
    public_key = identity.public_key
    peer_id = peer_id_of(public_key)
    data = spot_check_signed_bytes(
        rid, peer_id, public_key, host_peer_id, expert_uid, period_start, period_end, reason
    )
    return SpotCheckReport(
        report_id=rid,
        reporter_peer_id=peer_id,
        reporter_public_key=public_key,
        host_peer_id=host_peer_id,
        expert_uid=expert_uid,
        period_start=float(period_start),
        period_end=float(period_end),
        reason=reason,
        signature=identity.sign(data),
    )


def verify_spot_check(report: SpotCheckReport) -> None:
    data = spot_check_signed_bytes(
        report.report_id,
        report.reporter_peer_id,
        report.reporter_public_key,
        report.host_peer_id,
        report.expert_uid,
        report.period_start,
        report.period_end,
        report.reason,
    )
    _check(KeyCache(), report.reporter_public_key, report.reporter_peer_id, data, report.signature)


def _verify_chunk(items: list[tuple[bytes, str, bytes, bytes]]) -> list[bool]:
    """Process-pool worker: (public key, peer id, signed bytes, signature) -> signature is good."""
    keys = KeyCache()
    out = []
    for public_key, peer_id, data, signature in items:
        try:
            _check(keys, public_key, peer_id, data, signature)
            out.append(True)
        except ReceiptError:
            out.append(False)
    return out


class Verifier:
    """Checks receipt signatures, in this process or, with ``workers`` > 0, in a pool of spawned
    processes (Ed25519 verification holds the GIL and is the most expensive step of ingestion: a
    process pool is what lets it use more than one core). Batches below ``min_parallel`` stay here."""

    def __init__(self, workers: int = 0, min_parallel: int = 64) -> None:
        self.workers = workers
        self.min_parallel = min_parallel
        self.keys = KeyCache()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # never fork: the product runs on Windows and macOS
            self._pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=ctx)
        return self._pool

    async def check(self, receipts: list[SignedReceipt]) -> list[bool]:
        if self.workers <= 0 or len(receipts) < self.min_parallel:
            out = []
            for r in receipts:
                try:
                    verify_receipt(r, self.keys)
                    out.append(True)
                except ReceiptError:
                    out.append(False)
            return out
        items = [(r.trainer_public_key, r.trainer_peer_id, _receipt_bytes(r), r.signature) for r in receipts]
        size = -(-len(items) // self.workers)
        loop = asyncio.get_running_loop()
        pool = self._get_pool()
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(pool, _verify_chunk, items[i : i + size])
                for i in range(0, len(items), size)
            )
        )
        return [ok for part in parts for ok in part]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


batch_decoder = msgspec.json.Decoder(ReceiptBatch)
report_decoder = msgspec.json.Decoder(SpotCheckReport)
