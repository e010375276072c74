"""Receipts and spot-check reports on the coordinator's side: batches, and checking signatures fast.

The schema and the signing live in ``engine.wire.statements`` (trainers sign, the coordinator
verifies the same bytes); this module adds the batch limits, signature verification with a key
cache, and a process pool for big batches (Ed25519 checks hold the GIL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from typing import Annotated

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from engine.p2p.identity import peer_id_of
from engine.wire.statements import (
    SignedReceipt,
    SpotCheckReport,
    new_id,
    receipt_signed_bytes,
    sign_receipt,
    sign_spot_check,
    spot_check_signed_bytes,
)

__all__ = [  # the schema and signing are engine.wire.statements', re-exported for the coordinator's use
    "MAX_BATCH",
    "KeyCache",
    "ReceiptBatch",
    "ReceiptError",
    "SignedReceipt",
    "SpotCheckReport",
    "Verifier",
    "new_id",
    "sign_receipt",
    "sign_spot_check",
    "verify_receipt",
    "verify_spot_check",
]

MAX_BATCH = 1000  # receipts per POST
MAX_BODY_BYTES = 1024 * 1024  # a full batch of receipts is ~450 KiB of JSON
MAX_REPORT_BYTES = 16 * 1024


class ReceiptError(ValueError):
    """A receipt or report whose signature or signer does not check out."""


class ReceiptBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    receipts: Annotated[list[SignedReceipt], msgspec.Meta(max_length=MAX_BATCH)]


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
