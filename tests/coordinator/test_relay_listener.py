"""The relay's listener when its link to PostgreSQL breaks: a real PostgreSQL behind a real TCP
forwarder that the test cuts and restores. While the listener is away the replica says so (its row,
``healthy()``), and once back it hears notifications again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from coordinator.db.session import make_engine
from coordinator.hub.presence import ReplicaGroup
from coordinator.hub.signaling import SignalingHub
from tests.dbs import POSTGRES_URL

from .signal_cluster import Cluster, cluster

__all__ = ["cluster"]  # the fixture

WAIT_S = 30.0


async def until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not predicate():
            await asyncio.sleep(0.05)


class Forwarder:
    """127.0.0.1:<port> -> PostgreSQL; ``cut`` drops every connection and refuses new ones."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def serve(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()
        await self._server.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))


@pytest.fixture
async def forwarder() -> AsyncIterator[Forwarder]:
    url = make_url(POSTGRES_URL)
    f = Forwarder(url.host or "127.0.0.1", url.port or 5432)
    await f.serve()
    yield f
    with contextlib.suppress(Exception):
        await f.cut()


async def test_listener_away_means_unhealthy_and_not_listening(
    cluster: Cluster,
    forwarder: Forwarder,
) -> None:
    engine = make_engine(POSTGRES_URL, search_path=cluster.schema)
    group = ReplicaGroup(engine)
    url = make_url(POSTGRES_URL)
    group.listener.dsn = (
        f"postgresql://{url.username}:{url.password}@127.0.0.1:{forwarder.port}/{url.database}"
    )
    hub = SignalingHub(group=group)
    await group.start(hub)

    async def listening_row() -> bool:
        async with engine.connect() as c:
            row = await c.execute(
                text("SELECT listening FROM replicas WHERE id = :me"), {"me": group.replica_id}
            )
            return bool(row.scalar_one())

    try:
        assert group.healthy() and await listening_row()
        await forwarder.cut()
        await until(lambda: not group.healthy())
        assert not await listening_row()  # others answer unknown_peer for its peers meanwhile
        await asyncio.sleep(1.0)  # a few failed reconnects
        assert not group.healthy() and group.listener.reconnects == 0
        await forwarder.serve()
        await until(group.healthy)
        assert await listening_row() and group.listener.reconnects == 1
        # And it hears its channel again: a signal forwarded by another replica to a peer that this
        # one is named for (but no longer holds) reaches it, and it answers with a bounce.
        ghost = "c" * 40
        async with engine.begin() as c:
            await c.execute(
                text("INSERT INTO presence (peer_id, replica_id, conn) VALUES (:p, :r, 'gone')"),
                {"p": ghost, "r": group.replica_id},
            )
        other = ReplicaGroup(engine)
        await other.start(SignalingHub(group=other))
        try:
            assert await other.forward(ghost, "{}", sender="d" * 40, ref=1)
            await until(lambda: group.stats["bounced"] == 1)
        finally:
            await other.stop()
    finally:
        await group.stop()
        await engine.dispose()


async def test_database_out_of_reach_means_clear_errors_not_silence(
    cluster: Cluster,
    forwarder: Forwarder,
) -> None:
    """The replica's whole link to PostgreSQL (pool and listener) goes through the forwarder: cut, a
    signal for a peer elsewhere gets Error(unavailable), and a new socket is refused with it."""
    from aiohttp.test_utils import TestServer

    from coordinator.server.app import create_app
    from engine.p2p import signaling_protocol as sp
    from engine.p2p.descriptions import new_session_id, sign_description
    from engine.p2p.identity import Identity
    from engine.p2p.signaling import SignalingClient, SignalingRefused

    engine = make_engine(POSTGRES_URL, search_path=cluster.schema)
    url = make_url(POSTGRES_URL)
    group = ReplicaGroup(engine)
    group.dsn = group.listener.dsn = (
        f"postgresql://{url.username}:{url.password}@127.0.0.1:{forwarder.port}/{url.database}"
    )
    hub = SignalingHub(group=group)
    await group.start(hub)
    server = TestServer(create_app(hub=hub))
    await server.start_server()
    signal_url = str(server.make_url("/ws/signal"))
    ada = Identity.generate()
    errors: list[sp.Error] = []
    client = SignalingClient(signal_url, ada, lambda _: None, connect_timeout=10.0)
    try:
        await client.connect()
        await forwarder.cut()
        elsewhere = Identity.generate().peer_id
        desc = sign_description(ada, "offer", "v=0", elsewhere, new_session_id())
        ref = await client.send(elsewhere, desc, on_error=errors.append)
        await until(lambda: len(errors) == 1)
        assert (errors[0].code, errors[0].ref) == ("unavailable", ref)
        late = SignalingClient(signal_url, Identity.generate(), lambda _: None, connect_timeout=10.0)
        with pytest.raises(SignalingRefused) as refused:
            await late.connect()
        await late.close()
        assert refused.value.code == "unavailable"
        await until(lambda: not hub.healthy())
    finally:
        await client.close()
        await server.close()
        await forwarder.serve()  # let the group leave cleanly
        await group.stop()
        await engine.dispose()
