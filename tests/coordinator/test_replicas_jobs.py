"""Replicas on one PostgreSQL: receipts credited exactly once however often a batch reaches them,
periodic jobs on exactly one replica (and on another when it dies), migrations run once, and a
database that goes away under load (503 meanwhile, nothing half-written, recovery after)."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from coordinator.credit.receipts import ReceiptBatch, sign_receipt
from coordinator.db.migrations import alembic_config, migrate
from coordinator.db.models import Account, Host, Receipt
from coordinator.db.session import make_engine
from coordinator.replicas.leader import Leader
from coordinator.replicas.pg_link import Link
from coordinator.replicas.shared_limits import DatabaseBuckets
from coordinator.server.app import RunningCoordinator
from engine.p2p.identity import Identity
from tests.dbs import POSTGRES_URL

from .ledger_support import make_host
from .replicas_helpers import PgProxy, fresh_schema, start_replica, wait_for

COST = 2.0  # replicas_helpers.EXP's expert_cost


def _batch(trainer: Identity, host: Identity, n: int, samples: int) -> bytes:
    now = time.time()
    receipts = [
        sign_receipt(trainer, host, f"mnist.{i % 4}.{i // 4 % 4}", samples, False, now - 5)
        for i in range(n)
    ]
    return msgspec.json.encode(ReceiptBatch(receipts))


async def _credit(replica: RunningCoordinator, account_id: int) -> tuple[float, int]:
    async with replica.services.sessions() as s:
        total = (await s.execute(select(Account.credit_total).where(Account.id == account_id))).scalar_one()
        count = (await s.execute(select(func.count()).select_from(Receipt))).scalar_one()
    return float(total), int(count)


async def test_a_batch_posted_to_two_replicas_at_once_is_credited_once(tmp_path: Path) -> None:
    async with fresh_schema() as schema:
        a = await start_replica(tmp_path, schema)
        b = await start_replica(tmp_path, schema)
        try:
            assert isinstance(b.services.receipt_limiter, DatabaseBuckets)  # counted across replicas
            trainer, trainer_account = await make_host(a.services.sessions, "trainer", role="trainer")
            host, account_id = await make_host(a.services.sessions, "alice", team="red")
            auth = {"Authorization": f"Bearer {a.services.tokens.issue(trainer_account, 'trainer')}"}
            rounds, size, samples = 25, 20, 3
            async with aiohttp.ClientSession(headers=auth) as http:

                async def post(replica: RunningCoordinator, data: bytes) -> dict[str, int]:
                    async with http.post(f"{replica.url}/api/receipts", data=data) as r:
                        assert r.status == 200, await r.text()
                        return await r.json()  # type: ignore[no-any-return]

                for _ in range(rounds):
                    data = _batch(trainer, host, size, samples)
                    # The client's retry after a replica died mid-request: the same batch, both
                    # replicas, several times, all at once.
                    replies = await asyncio.gather(*(post((a, b)[i % 2], data) for i in range(4)))
                    assert sum(r["accepted"] for r in replies) == size
                    assert sum(r["duplicates"] for r in replies) == 3 * size
            total, count = await _credit(a, account_id)
            assert count == rounds * size
            assert total == rounds * size * samples * COST
            async with a.services.sessions() as s:
                served = (
                    await s.execute(select(Host.requests_served).where(Host.peer_id == host.peer_id))
                ).scalar_one()
            assert served == rounds * size
        finally:
            await a.stop()
            await b.stop()


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    async with fresh_schema() as schema:
        engine = make_engine(POSTGRES_URL, search_path=schema)
        try:
            yield await Link.of(engine)
        finally:
            await engine.dispose()


async def test_periodic_jobs_run_on_one_replica_and_move_when_it_dies(link: Link) -> None:
    running: list[str] = []
    runs: list[tuple[str, float, float]] = []  # (replica, started, ended)

    def job(name: str):  # type: ignore[no-untyped-def]
        async def work() -> None:
            running.append(name)
            try:
                assert len(running) == 1, f"two leaders at once: {running}"
                started = time.monotonic()
                await asyncio.sleep(0.05)
                runs.append((name, started, time.monotonic()))
            finally:
                running.remove(name)

        return work

    leaders = {name: Leader(link, retry_s=0.3, check_s=0.5) for name in ("a", "b", "c")}
    for name, leader in leaders.items():
        leader.add_job("tick", 0.05, job(name))
    tasks = {name: asyncio.create_task(leader.run()) for name, leader in leaders.items()}
    try:
        await wait_for(lambda: sum(lead.is_leader for lead in leaders.values()) == 1 and len(runs) >= 3)
        first = next(n for n, lead in leaders.items() if lead.is_leader)

        # Its lock connection is cut (as when its machine or its network dies): a new term begins,
        # on whichever replica takes the lock first (perhaps the same one, reconnected).
        async with asyncio.timeout(10):
            admin = await link.connect()
        try:
            conn = leaders[first].conn
            assert conn is not None
            await admin.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        finally:
            await admin.close()
        cut = time.monotonic()
        await wait_for(lambda: any(s > cut for _, s, _ in runs), timeout=30)
        took_over = min(s for _, s, _ in runs if s > cut) - cut
        assert took_over < 20  # retry_s + handover_s, with room for a loaded machine
        assert sum(lead.terms for lead in leaders.values()) >= 2
        second = next(n for n, lead in leaders.items() if lead.is_leader)

        # That leader stops (its process ends): another one leads.
        tasks[second].cancel()
        await asyncio.gather(tasks[second], return_exceptions=True)
        stopped = time.monotonic()
        await wait_for(lambda: any(n != second and s > stopped for n, s, _ in runs), timeout=30)
        assert sum(lead.terms for lead in leaders.values()) >= 3

        # No two runs ever overlapped in time.
        ordered = sorted(runs, key=lambda r: r[1])
        for (_, _, end), (_, start, _) in itertools.pairwise(ordered):
            assert start >= end
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_two_replicas_starting_at_once_migrate_once() -> None:
    async with fresh_schema() as schema:
        # Two replicas' startups, each with its own engine, on an empty schema, at once.
        await asyncio.gather(*(migrate(POSTGRES_URL, search_path=schema) for _ in range(3)))
        engine = make_engine(POSTGRES_URL, search_path=schema)
        try:
            async with engine.connect() as conn:
                versions = (
                    (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
                )
                tables = (
                    await conn.execute(
                        text("SELECT count(*) FROM information_schema.tables WHERE table_schema = :s"),
                        {"s": schema},
                    )
                ).scalar_one()
            head = ScriptDirectory.from_config(alembic_config(POSTGRES_URL)).get_current_head()
            assert versions == [head]  # the newest revision, once
            assert tables > 5
        finally:
            await engine.dispose()


class ServerRestart:
    """The real thing: this machine's PostgreSQL server stopped (fast shutdown: every session is
    terminated, new ones are refused) and started again, as an operator's restart or a crash does.
    Tests run one at a time, so nobody else's connections are in the way; those that pooled a
    connection before find it dead and reconnect (``pool_pre_ping``)."""

    def __init__(self) -> None:
        versions = sorted(os.listdir("/etc/postgresql"), key=float)
        assert versions and shutil.which("pg_ctlcluster"), "needs the local server that scripts/services runs"
        assert make_url(POSTGRES_URL).host in ("127.0.0.1", "localhost"), "the test database must be local"
        self.version = versions[-1]

    def url(self) -> str:
        return POSTGRES_URL

    async def _ctl(self, *args: str) -> int:
        proc = await asyncio.create_subprocess_exec(
            "pg_ctlcluster", self.version, "main", *args, stdout=asyncio.subprocess.DEVNULL
        )
        async with asyncio.timeout(60):
            return await proc.wait()

    async def cut(self) -> None:
        assert await self._ctl("stop", "-m", "fast") == 0

    async def restore(self) -> None:
        assert await self._ctl("start") == 0

    async def close(self) -> None:
        if await self._ctl("status") != 0:  # whatever happened, the test ends with the server up
            assert await self._ctl("start") == 0
        async with asyncio.timeout(30):
            while True:
                try:
                    engine = make_engine(POSTGRES_URL)
                    async with engine.connect() as conn:
                        await conn.execute(text("SELECT 1"))
                    await engine.dispose()
                    return
                except Exception:
                    await asyncio.sleep(0.2)


@pytest.mark.parametrize("outage", ["connections_cut", "server_restarted"])
async def test_the_database_going_away_under_load(tmp_path: Path, outage: str) -> None:
    """Its connections cut and refused for a while (a TCP proxy in front of PostgreSQL closes them),
    or the server itself stopped and started again: requests get a 503 JSON error, /healthz says 503,
    nothing is half-written; then the replica recovers, and retried batches are credited once."""
    proxy: PgProxy | ServerRestart = await PgProxy.start() if outage == "connections_cut" else ServerRestart()
    async with fresh_schema() as schema:
        a = await start_replica(tmp_path, schema, url=proxy.url())
        try:
            sessions = a.services.sessions
            trainer, trainer_account = await make_host(sessions, "trainer", role="trainer")
            host, account_id = await make_host(sessions, "alice")
            auth = {"Authorization": f"Bearer {a.services.tokens.issue(trainer_account, 'trainer')}"}
            batches = [_batch(trainer, host, 50, 1) for _ in range(30)]
            async with aiohttp.ClientSession(headers=auth, timeout=aiohttp.ClientTimeout(total=60)) as http:
                async with http.get(f"{a.url}/healthz") as r:
                    assert r.status == 200 and (await r.json())["checks"] == {"database": True, "relay": True}

                async def post(data: bytes) -> int:
                    async with http.post(f"{a.url}/api/receipts", data=data) as r:
                        if r.status == 503:
                            body = await r.json()
                            assert body["error"] == "database_unavailable" and "Retry-After" in r.headers
                        return r.status

                statuses: list[int] = []

                async def load() -> None:  # batches, one after another, until the outage is felt
                    for i in itertools.count():
                        statuses.append(await post(batches[i % len(batches)]))
                        if statuses[-1] == 503 and statuses.count(503) >= 3:
                            return

                loading = asyncio.create_task(load())
                await wait_for(lambda: len(statuses) >= 3)  # under load: a cut mid-stream
                await proxy.cut()
                async with asyncio.timeout(60):
                    await loading
                assert set(statuses) <= {200, 503}, statuses
                assert statuses[0] == 200
                async with http.get(f"{a.url}/healthz") as r:
                    assert r.status == 503 and (await r.json())["checks"]["database"] is False
                async with http.get(f"{a.url}/api/me") as r:
                    assert r.status == 503

                await proxy.restore()

                async def healthy() -> bool:
                    async with http.get(f"{a.url}/healthz") as r:
                        return r.status == 200

                await wait_for(healthy, timeout=30)
                # The client retries every batch; each receipt is credited exactly once.
                assert [await post(data) for data in batches] == [200] * len(batches)
            total, count = await _credit(a, account_id)
            assert count == 50 * len(batches) and total == 50 * len(batches) * COST
            # The replica's own connections came back too: the listener hears, the leader leads.
            listener = a.services.listener
            await wait_for(lambda: listener is not None and listener.healthy, timeout=30)
            await wait_for(lambda: a.services.leader.is_leader, timeout=30)
        finally:
            await a.stop()
            await proxy.close()


async def test_two_full_replicas_starting_at_once_on_an_empty_schema(tmp_path: Path) -> None:
    """As ``lah coordinator`` starts them: migrations (once), the clock, the links, then serving."""
    async with fresh_schema() as schema:
        a, b = await asyncio.gather(start_replica(tmp_path, schema), start_replica(tmp_path, schema))
        try:
            async with aiohttp.ClientSession() as http:
                for replica in (a, b):
                    async with http.get(f"{replica.url}/healthz") as r:
                        assert r.status == 200, await r.text()
                r = await http.post(f"{a.url}/api/accounts", json={"name": "Ada"})
                assert r.status == 201
                r = await http.post(f"{b.url}/api/accounts", json={"name": "ada"})
                assert r.status == 409  # one schema: B sees A's account
            await wait_for(lambda: a.services.leader.is_leader != b.services.leader.is_leader, timeout=30)
        finally:
            await a.stop()
            await b.stop()
