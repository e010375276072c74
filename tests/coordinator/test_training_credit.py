"""Trainers' training samples against the ledger (SQLite and PostgreSQL): receipts bound the claim,
duplicates and refused receipts prove nothing, volunteers' credit and ranks are untouched."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.credit.ledger import ingest
from coordinator.credit.receipts import sign_receipt
from coordinator.credit.training import (
    TrainingClaimError,
    account_training_samples,
    claim_delta,
    forward_samples,
    trainer_board,
)
from coordinator.db.models import Account
from coordinator.db.session import session_factory
from coordinator.swarm.collab_status import StatusReport, record

from .ledger_support import make_host


def test_claim_delta_counts_increases_within_a_run_and_all_of_a_new_run() -> None:
    assert claim_delta("", 0, "aa", 10) == 10
    assert claim_delta("aa", 10, "aa", 25) == 15
    assert claim_delta("aa", 25, "bb", 4) == 4
    assert claim_delta("aa", 25, "aa", 25) == 0
    with pytest.raises(TrainingClaimError):
        claim_delta("aa", 25, "aa", 24)


def test_forward_samples_per_trainer_and_experiment() -> None:
    got = forward_samples(
        [
            ("t1", "ffn.0.1", 5, False),
            ("t1", "ffn.1.1", 7, False),
            ("t1", "ffn.0.1", 9, True),
            ("t1", "big.0", 3, False),
        ]
    )
    assert got == {("t1", "ffn"): 12, ("t1", "big"): 3}


async def test_receipts_bound_the_claim_and_credit_stays_apart(db: AsyncEngine) -> None:
    sessions = session_factory(db)
    trainer, trainer_account = await make_host(sessions, "tess", role="trainer")
    host, host_account = await make_host(sessions, "vera")
    now = time.time()

    def status(processed: int) -> StatusReport:
        return StatusReport(
            experiment="ffn",
            peer_id=trainer.peer_id,
            run_id="0123456789abcdef",
            epoch=1,
            samples_accumulated=0,
            samples_per_s=1.0,
            peers=1,
            samples_processed=processed,
        )

    assert await record(sessions, trainer_account, status(1000), now) == 1000
    async with sessions() as s:
        assert await account_training_samples(s, trainer_account) == 0  # no receipt proves any of it

    fwd = sign_receipt(trainer, host, "ffn.0.0", 64, False, now)
    back = sign_receipt(trainer, host, "ffn.0.0", 64, True, now)
    other_exp = sign_receipt(trainer, host, "big.0.0", 500, False, now)
    future = sign_receipt(trainer, host, "ffn.0.1", 900, False, now + 10_000)  # refused
    result = await ingest(sessions, [fwd, back, other_exp, future], now=now)
    assert result.accepted == 3 and [r for _, r in result.rejected] == ["future"]
    again = await ingest(sessions, [fwd], now=now)  # a duplicate proves nothing more
    assert again.duplicates == 1
    async with sessions() as s:
        assert await account_training_samples(s, trainer_account) == 64  # ffn's forward samples only
        credit = (
            await s.execute(select(Account.credit_total).where(Account.id == trainer_account))
        ).scalar_one()
        assert credit == 0.0  # training samples are not credit
        assert (
            await s.execute(select(Account.credit_total).where(Account.id == host_account))
        ).scalar_one() == 64 * 3 + 500

    board = await trainer_board(sessions)
    assert [(r.account_name, r.samples, r.claimed, r.receipt_samples) for r in board.rows] == [
        ("tess", 64, 1000, 564)
    ]
    # receipts of an experiment the trainer never claimed for credit nothing there
    assert board.count == 1

    many = [sign_receipt(trainer, host, "ffn.1.1", 100, False, now) for _ in range(20)]
    await ingest(sessions, many, now=now)
    async with sessions() as s:
        assert await account_training_samples(s, trainer_account) == 1000  # capped by the claim now
