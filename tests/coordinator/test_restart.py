"""A coordinator restart loses no committed receipt, and signaling clients come back by themselves."""

import asyncio
import socket
import time
from pathlib import Path

import aiohttp
import msgspec

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.credit.receipts import sign_receipt
from coordinator.server.app import start_full
from engine.p2p.signaling import SignalingClient
from tests.coordinator.accounts_helpers import volunteer_with_host
from tests.coordinator.ledger_support import hold, make_host

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_restart_keeps_receipts_and_clients_rejoin(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        port=free_port(),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[EXP],
        verify_workers=0,
    )
    running = await start_full(config)
    services = running.services
    _, token, host = await volunteer_with_host(services, "Ada")
    await hold(services.sessions, host.peer_id, ["ffn.0.1"])  # its assignment: what its receipts earn for
    trainer, trainer_account = await make_host(services.sessions, "Trainer Tom", role="trainer")
    auth = {"Authorization": f"Bearer {services.tokens.issue(trainer_account, 'trainer')}"}
    client = SignalingClient(running.signaling_url, host, lambda _: None, token=token, max_backoff=1.0)
    await client.connect()
    now = time.time()
    receipts = [sign_receipt(trainer, host, "ffn.0.1", 32, False, now - i) for i in range(10)]
    body = {"receipts": msgspec.to_builtins(receipts)}
    async with aiohttp.ClientSession(running.url) as http:
        r = await http.post("/api/receipts", json=body, headers=auth)
        assert r.status == 200, await r.text()
        assert (await r.json())["accepted"] == 10
    joins = client.joins
    await running.stop()  # the process goes away...

    running = await start_full(config)  # ...and comes back on the same address and database
    try:
        async with asyncio.timeout(20):
            while client.joins == joins or not client.connected.is_set():
                await asyncio.sleep(0.1)
        assert host.peer_id in running.hub.online()
        async with aiohttp.ClientSession(running.url) as http:
            r = await http.post(
                "/api/receipts", json=body, headers=auth
            )  # the same receipts again: all duplicates
            assert (await r.json())["duplicates"] == 10
            r = await http.get("/api/leaderboard", params={"kind": "hosts"})
            entries = (await r.json())["entries"]
            assert entries and entries[0]["credit_total"] > 0
    finally:
        await client.close()
        await running.stop()
