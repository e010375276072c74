"""Coordinator replicas on one PostgreSQL for tests: real full coordinators (aiohttp servers on
loopback, each with its own services) in a fresh schema, a replica in a child process, and peers
with real signaling clients."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text

from coordinator.db.migrations import migrate
from coordinator.db.session import make_engine
from coordinator.server.app import RunningCoordinator, start_full
from coordinator.services import open_services
from engine.p2p import signaling_protocol as sp
from engine.p2p.descriptions import new_session_id, sign_description
from engine.p2p.identity import Identity
from engine.p2p.signaling import SignalingClient
from tests.dbs import POSTGRES_URL

from .accounts_helpers import volunteer_with_host
from .replica_process import replica_config

WAIT_S = 30.0


async def until(predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


class Peer:
    def __init__(self, identity: Identity, token: str) -> None:
        self.identity = identity
        self.token = token
        self.inbox: list[sp.Signal] = []
        self.errors: list[sp.Error] = []
        self.client: SignalingClient | None = None

    @property
    def id(self) -> str:
        return self.identity.peer_id

    async def join(self, url: str) -> None:
        self.client = SignalingClient(
            url, self.identity, self.inbox.append, connect_timeout=10.0, max_backoff=1.0, token=self.token
        )
        await self.client.connect()

    async def leave(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def offer(self, to: Peer, sdp: str = "v=0") -> int:
        assert self.client is not None
        desc = sign_description(self.identity, "offer", sdp, to.id, new_session_id())
        return await self.client.send(to.id, desc, on_error=self.errors.append)

    def got_from(self, sender: Peer) -> list[sp.Signal]:
        return [s for s in self.inbox if s.sender == sender.id]


class Cluster:
    def __init__(self, schema: str, tmp_path: Path) -> None:
        self.schema = schema
        self.key_path = str(tmp_path / "token.key")
        self.exports = str(tmp_path / "exports")
        self.replicas: list[RunningCoordinator] = []
        self.processes: list[asyncio.subprocess.Process] = []
        self.peers: list[Peer] = []

    async def start(self, **overrides: Any) -> RunningCoordinator:
        config = replica_config(POSTGRES_URL, self.key_path, self.exports, **overrides)
        services = await open_services(config, search_path=self.schema, run_migrations=False)
        running = await start_full(config, services)
        self.replicas.append(running)
        return running

    async def spawn(self) -> tuple[asyncio.subprocess.Process, str]:
        """A replica in a child process; returns it and its signaling URL."""
        args = [POSTGRES_URL, self.schema, self.key_path, self.exports]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.coordinator.replica_process", *args, stdout=asyncio.subprocess.PIPE
        )
        self.processes.append(proc)
        assert proc.stdout is not None
        async with asyncio.timeout(120):
            line = (await proc.stdout.readline()).decode()
        assert line.startswith("port "), line
        return proc, f"ws://127.0.0.1:{int(line.split()[1])}/ws/signal"

    async def peer(self, name: str) -> Peer:
        _, token, identity = await volunteer_with_host(self.replicas[0].services, name)
        peer = Peer(identity, token)
        self.peers.append(peer)
        return peer

    async def listed(self, replica: RunningCoordinator, token: str) -> list[str]:
        """``GET /api/peers`` on ``replica``: what every client of it sees."""
        async with aiohttp.ClientSession() as http:
            r = await http.get(f"{replica.url}/api/peers", headers={"Authorization": f"Bearer {token}"})
            assert r.status == 200, await r.text()
            online: list[str] = (await r.json())["online"]
            return online

    async def close(self) -> None:
        for peer in self.peers:
            await peer.leave()
        for running in self.replicas:
            await running.stop()
        for proc in self.processes:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    schema = f"r_{uuid.uuid4().hex[:12]}"
    admin = make_engine(POSTGRES_URL)
    async with admin.begin() as conn:
        await conn.execute(text(f"CREATE SCHEMA {schema}"))
    await migrate(POSTGRES_URL, search_path=schema)
    c = Cluster(schema, tmp_path)
    try:
        yield c
    finally:
        await c.close()
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        await admin.dispose()
