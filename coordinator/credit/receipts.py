"""Receipts and spot-check reports on the coordinator's side: batches, and checking signatures fast.

The schema and the signing live in ``engine.wire.statements`` (trainers sign, the coordinator
verifies the same bytes); this module adds the batch limits, signature verification with a key
cache, and a process pool for big batches (Ed25519 checks hold the GIL).

A receipt needs two signatures: the trainer's, and the host's countersignature (its leaf of the
served statement the host signed in its reply), by the key of the receipt's ``host_peer_id``. Each
refusal has its reason code (:data:`REASONS`). A host signs once per reply, so the receipts of one
reply share one statement: the Verifier checks each distinct statement once and remembers the good
ones (bounded), which keeps the second signature from doubling ingestion's cost.
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

from engine.p2p.identity import peer_id_of
from engine.wire.statements import (
    MAX_SERVED_LEAVES,
    SignedReceipt,
    SpotCheckReport,
    new_id,
    receipt_signed_bytes,
    root_from_path,
    served_leaf,
    served_signed_bytes,
    sign_receipt,
    sign_spot_check,
    spot_check_signed_bytes,
)

from .pool_guard import watch_parent

__all__ = [  # the schema and signing are engine.wire.statements', re-exported for the coordinator's use
    "MAX_BATCH",
    "REASONS",
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
#: A full batch of receipts is ~620 KiB of JSON, ~990 KiB when each came from a 256-expert reply (a
#: countersignature's path grows with log2 of the reply's experts; trainers post 256 at a time).
MAX_BODY_BYTES = 1024 * 1024
MAX_REPORT_BYTES = 16 * 1024
SERVED_CACHE = 16_384  # good served statements remembered (one per host reply)

#: Why a receipt's signatures are refused.
REASONS = {
    "bad_signature": "the trainer's signature does not verify by the key of its peer id",
    "no_countersignature": "the host's countersignature is missing",
    "bad_countersignature": "the host's countersignature is malformed or does not verify by the host's key",
}


class ReceiptError(ValueError):
    """A receipt or report whose signature or signer does not check out; ``reason`` is its code."""

    def __init__(self, message: str, reason: str = "bad_signature") -> None:
        super().__init__(message)
        self.reason = reason


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


#: One signature to check: (public key, signer's peer id, signed bytes, signature).
Item = tuple[bytes, str, bytes, bytes]


def served_item(r: SignedReceipt) -> Item:
    """The host's statement this receipt's countersignature stands for; ReceiptError with
    ``no_countersignature`` or ``bad_countersignature`` when there is none that could verify."""
    if not r.host_signature and not r.host_public_key:
        raise ReceiptError("the receipt carries no countersignature of its host", "no_countersignature")
    if len(r.host_public_key) != 32 or len(r.host_signature) != 64 or r.host_leaves > MAX_SERVED_LEAVES:
        raise ReceiptError("malformed countersignature", "bad_countersignature")
    leaf = served_leaf(r.receipt_id, r.expert_uid, r.samples)
    root = root_from_path(leaf, r.host_leaf, r.host_leaves, tuple(r.host_path))
    if root is None:
        raise ReceiptError("the countersignature's path does not fit its leaf", "bad_countersignature")
    data = served_signed_bytes(
        r.host_peer_id, r.trainer_peer_id, r.backward, r.served_at, r.host_leaves, root
    )
    return (r.host_public_key, r.host_peer_id, data, r.host_signature)


def verify_receipt(receipt: SignedReceipt, keys: KeyCache | None = None) -> None:
    """Raise ReceiptError (with its ``reason``) unless the receipt is signed by the key of its
    ``trainer_peer_id`` and countersigned by the key of its ``host_peer_id``."""
    keys = keys or KeyCache()
    _check(
        keys,
        receipt.trainer_public_key,
        receipt.trainer_peer_id,
        _receipt_bytes(receipt),
        receipt.signature,
    )
    try:
        _check(keys, *served_item(receipt))
    except ReceiptError as e:
        if e.reason == "bad_signature":
            e.reason = "bad_countersignature"
        raise


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


def _verify_chunk(items: list[Item]) -> list[bool]:
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
    process pool is what lets it use more than one core). Batches below ``min_parallel`` stay here.
    Each distinct served statement is checked once per batch, and a good one is remembered."""

    def __init__(self, workers: int = 0, min_parallel: int = 64) -> None:
        self.workers = workers
        self.min_parallel = min_parallel
        self.keys = KeyCache()
        self._served: dict[Item, None] = {}  # good statements, oldest first
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # never fork: the product runs on Windows and macOS
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=watch_parent, initargs=(os.getpid(),)
            )  # workers end with the coordinator, even a killed one
        return self._pool

    async def check(self, receipts: list[SignedReceipt]) -> list[bool]:
        return [reason is None for reason in await self.reasons(receipts)]

    async def reasons(self, receipts: list[SignedReceipt]) -> list[str | None]:
        """Per receipt: None when both signatures verify, else the reason code (:data:`REASONS`)."""
        out: list[str | None] = [None] * len(receipts)
        served: list[Item | None] = []
        for i, r in enumerate(receipts):
            try:
                served.append(served_item(r))
            except ReceiptError as e:
                served.append(None)
                out[i] = e.reason
        fresh = list(dict.fromkeys(s for s in served if s is not None and s not in self._served))
        trainer = [
            (r.trainer_public_key, r.trainer_peer_id, _receipt_bytes(r), r.signature) for r in receipts
        ]
        parallel = self.workers > 0 and len(receipts) >= self.min_parallel
        verdicts = await self._verify(trainer + fresh, parallel)
        good_served = {item for item, ok in zip(fresh, verdicts[len(trainer) :], strict=True) if ok}
        for item in good_served:
            self._served[item] = None
        while len(self._served) > SERVED_CACHE:
            del self._served[next(iter(self._served))]
        for i, ok in enumerate(verdicts[: len(trainer)]):
            if out[i] is not None:
                continue
            if not ok:
                out[i] = "bad_signature"
            elif served[i] not in good_served and served[i] not in self._served:
                out[i] = "bad_countersignature"
        return out

    async def _verify(self, items: list[Item], parallel: bool) -> list[bool]:
        if not parallel:
            out = []
            for item in items:
                try:
                    _check(self.keys, *item)
                    out.append(True)
                except ReceiptError:
                    out.append(False)
            return out
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
