"""A trainer's receipts and reports across a coordinator outage, on a real coordinator stopped and
restarted on the same address and database: nothing is lost, nothing is counted twice, and what waited
survives the trainer's own restart too (its outbox is on disk)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy import func, select

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.db.models import Receipt
from coordinator.server.app import start_full
from engine.account.coordinator_api import CoordinatorApi
from engine.p2p.identity import Identity
from engine.trainer.receipts import ReceiptBook, Work, sign_spot_check
from engine.wire.statements import countersign_one, new_id
from tests.coordinator.ledger_support import make_host
from tests.coordinator.test_restart import free_port

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2])


def served(trainer: Identity, host: Identity, n: int) -> list[Work]:
    """``n`` answered requests, countersigned by ``host`` as its replies would be."""
    out = []
    for i in range(n):
        rid, uid, at, backward = new_id(), f"ffn.{i % 2}.{i // 2 % 2}", time.time() - 5, i % 3 == 0
        proof = countersign_one(host, trainer.peer_id, rid, uid, 8, backward, at)
        out.append(Work(host.peer_id, uid, 8, backward, at, rid, proof))
    return out


async def until(condition, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)


async def test_receipts_and_reports_wait_out_an_outage_and_a_trainer_restart(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        port=free_port(),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[EXP],
        verify_workers=0,
    )
    running = await start_full(config)
    sessions = running.services.sessions
    host, _ = await make_host(sessions, "Ada")
    trainer, trainer_account = await make_host(sessions, "Trainer Tom", role="trainer")
    token = running.services.tokens.issue(trainer_account, "trainer")
    api = CoordinatorApi(running.url, timeout=5)

    async def post(batch):  # type: ignore[no-untyped-def]
        return await api.post_receipts(token, batch)

    async def post_report(report):  # type: ignore[no-untyped-def]
        return await api.post_spot_check(token, report)

    def new_book() -> ReceiptBook:
        return ReceiptBook(
            trainer,
            post,
            post_report=post_report,
            outbox_dir=tmp_path / "outbox",
            batch_size=64,
            interval_s=0.2,
        )

    book = new_book()
    book.start()
    try:
        for w in served(trainer, host, 40):
            book.add(w)
        await until(lambda: book.stats.accepted == 40)

        await running.stop()  # the coordinator goes away mid-run
        for w in served(trainer, host, 150):
            book.add(w)
        book.add_report(sign_spot_check(trainer, host.peer_id, "ffn.0.0", time.time() - 60, time.time(), "x"))
        await until(lambda: book.stats.failed_posts >= 2 and book.pending == 151)
        assert book.stats.dropped == 0
        await book.close(timeout=2)  # ...and the trainer stops too
        book = new_book()  # its next run finds the outbox
        assert book.pending == 151
        book.start()

        running = await start_full(config)  # the coordinator is back, same address and database
        sessions = running.services.sessions
        await until(lambda: book.pending == 0)
        assert book.stats.accepted == 150 and book.stats.rejected == 0 and book.stats.reports_sent == 1
        async with sessions() as s:
            stored = (await s.execute(select(func.count()).select_from(Receipt))).scalar_one()
        assert stored == 190  # every receipt once: none lost, none counted twice
    finally:
        await book.close(timeout=2)
        await api.close()
        await running.stop()
