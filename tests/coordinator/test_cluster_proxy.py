"""Three real ``lah coordinator`` replicas on one PostgreSQL database behind a real HAProxy
(``tests/cluster.py``, configured from ``deploy/haproxy.cfg.template``, the file docs/deploy.md shows).

One cluster serves the whole module (starting three replicas costs seconds); the test that kills a
replica runs last and the proxy is restarted by the one that kills it. The proxy names the replica that
answered in ``X-Lah-Replica``, on plain responses and on a WebSocket's upgrade alike.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from sqlalchemy import text

from coordinator.accounts.accounts import bind_message
from coordinator.db.session import make_engine
from engine.p2p import signaling_protocol as sp
from engine.p2p.descriptions import SignedDescription, new_session_id, sign_description
from engine.p2p.errors import SignalingError
from engine.p2p.identity import Identity
from engine.p2p.signaling import SignalingClient
from tests.cluster import Cluster

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPLICAS = 3
REGISTER_LIMIT = 3  # registrations per client address per minute (the XFF test)
WAIT_S = 30.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    config = {"register_per_ip_per_minute": REGISTER_LIMIT, "max_ws_per_ip": 500}
    async with Cluster(REPLICAS, tmp_path_factory.mktemp("cluster"), config=config) as c:
        yield c


class Peer:
    """An account with a bound host, signalling through the proxy with the engine's real client."""

    def __init__(self, cluster: Cluster, identity: Identity, token: str) -> None:
        self.identity = identity
        self.signals: asyncio.Queue[sp.Signal] = asyncio.Queue()
        self.client = SignalingClient(cluster.signaling_url, identity, self.signals.put_nowait, token=token)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def replica(self) -> str:
        """The replica the proxy sent the current socket to."""
        ws = self.client._ws
        assert ws is not None
        return ws._response.headers["X-Lah-Replica"]

    async def offer(self, to: Peer, sdp: str = "v=0\r\n") -> tuple[int, SignedDescription]:
        description = sign_description(self.identity, "offer", sdp, to.peer_id, new_session_id())
        return await self.client.send(to.peer_id, description), description

    async def next_signal(self, timeout: float = WAIT_S) -> sp.Signal:
        return await asyncio.wait_for(self.signals.get(), timeout)


_names = iter(range(1_000_000))


async def new_peer(cluster: Cluster, session: aiohttp.ClientSession) -> Peer:
    name = f"vol{next(_names)}"
    # Each account from its own loopback address: the registration limit counts per client address.
    connector = aiohttp.TCPConnector(local_addr=(f"127.0.1.{next(_names) % 250 + 1}", 0))
    async with (
        aiohttp.ClientSession(connector=connector) as own,
        own.post(f"{cluster.url}/api/accounts", json={"name": name}) as r,
    ):
        assert r.status == 201, await r.text()
        body = await r.json()
    token, account_id = body["token"], body["account"]["id"]
    identity = Identity.generate()
    bind = {
        "public_key": base64.b64encode(identity.public_key).decode(),
        "signature": base64.b64encode(identity.sign(bind_message(account_id))).decode(),
    }
    headers = {"Authorization": f"Bearer {token}"}
    async with session.post(f"{cluster.url}/api/hosts", json=bind, headers=headers) as r:
        assert r.status in (200, 201), await r.text()
    peer = Peer(cluster, identity, token)
    await peer.client.connect()
    return peer


async def close_all(peers: list[Peer]) -> None:
    await asyncio.gather(*(p.client.close() for p in peers), return_exceptions=True)


async def test_requests_and_sockets_land_on_every_replica(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as session:
        seen = []
        for _ in range(3 * REPLICAS):
            async with session.get(f"{cluster.url}/healthz") as r:
                assert r.status == 200
                seen.append(r.headers["X-Lah-Replica"])
        assert set(seen) == {r.name for r in cluster.replicas}, seen
        # Held sockets: the proxy spreads them, two on each replica, with no affinity to the client.
        sockets = [await session.ws_connect(cluster.signaling_url) for _ in range(2 * REPLICAS)]
        try:
            for ws in sockets:  # each gets the hub's challenge through the tunnel
                assert isinstance(
                    sp.client_decoder.decode(await ws.receive_str(timeout=WAIT_S)), sp.Challenge
                )
            on = [ws._response.headers["X-Lah-Replica"] for ws in sockets]
            assert sorted(on) == sorted(r.name for r in cluster.replicas for _ in range(2)), on
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))


async def test_forwarded_for_is_the_client_address(cluster: Cluster) -> None:
    """Rate limits count the address the proxy saw, not the proxy's: one client reaching its limit
    leaves another untouched, and a forged X-Forwarded-For does not reset it."""

    async def register(source: str, name: str, forged: str | None = None) -> int:
        headers = {"X-Forwarded-For": forged} if forged else {}
        connector = aiohttp.TCPConnector(local_addr=(source, 0))
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(f"{cluster.url}/api/accounts", json={"name": name}, headers=headers) as r,
        ):
            return r.status

    statuses = [await register("127.0.2.1", f"xff{i}") for i in range(REGISTER_LIMIT * REPLICAS + 1)]
    assert statuses[:REGISTER_LIMIT] == [201] * REGISTER_LIMIT, statuses
    assert 429 in statuses, statuses  # per replica or shared, the limit bites for this address
    assert await register("127.0.2.1", "xffforged", forged="203.0.113.9") == 429
    assert await register("127.0.2.2", "xffother") == 201


async def test_offer_and_answer_between_replicas(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as session:
        a = await new_peer(cluster, session)
        b = await new_peer(cluster, session)  # leastconn: not where a's socket is
        try:
            assert a.replica != b.replica
            msg_id, offer = await a.offer(b)
            got = await b.next_signal()
            assert got.sender == a.peer_id and got.description == offer
            answer = sign_description(b.identity, "answer", "v=0\r\n", a.peer_id, offer.session)
            await b.client.send(a.peer_id, answer)
            back = await a.next_signal()
            assert back.sender == b.peer_id and back.description == answer
            assert msg_id > 0
        finally:
            await close_all([a, b])


async def test_proxy_drops_sockets_mid_offer(cluster: Cluster) -> None:
    """Offers streamed while the proxy is killed: the sender gets a clear SignalingError, the
    recipient has only whole offers, each once; both reconnect through the restarted proxy."""
    async with aiohttp.ClientSession() as session:
        a = await new_peer(cluster, session)
        b = await new_peer(cluster, session)
        try:
            big = "v=0\r\n" + "a=candidate:1 1 udp 2130706431 10.0.0.1 50000 typ host\r\n" * 600
            sent: dict[str, SignedDescription] = {}
            error: SignalingError | None = None

            async def stream() -> None:
                nonlocal error
                try:
                    for _ in range(10_000):
                        _, d = await a.offer(b, big)
                        sent[d.session] = d
                        await asyncio.sleep(0.05)  # within the hub's offer burst for a few seconds
                except SignalingError as e:
                    error = e

            streaming = asyncio.create_task(stream())
            await wait_for(lambda: b.signals.qsize() >= 3)  # relayed across replicas, and still going
            cluster.kill_proxy()
            await asyncio.wait_for(streaming, WAIT_S)
            assert error is not None and "signaling" in str(error)
            await cluster.start_proxy()
            for p in (a, b):  # the engine's client reconnects by itself (backoff from 1 s)
                await wait_for(lambda p=p: p.client.joins >= 2 and p.client.connected.is_set())
            received: list[sp.Signal] = []
            while not b.signals.empty():
                received.append(b.signals.get_nowait())
            assert received, "nothing arrived before the proxy died"
            sessions = [s.description.session for s in received]
            assert len(sessions) == len(set(sessions))  # each once
            for s in received:  # and whole: exactly what was signed
                assert s.description == sent[s.description.session]
            _, again = await a.offer(b)
            assert (await b.next_signal()).description == again
        finally:
            await close_all([a, b])


async def test_sigterm_stops_a_replica_cleanly(cluster: Cluster) -> None:
    """SIGTERM (systemd, Docker, an operator's kill): the replica closes its sockets and takes its row
    out of the group before it exits, so nobody waits for the dead-replica bound."""
    async with aiohttp.ClientSession() as session:
        peers = [await new_peer(cluster, session) for _ in range(REPLICAS)]
        try:
            index = next(i for i, r in enumerate(cluster.replicas) if r.name == peers[0].replica)
            replica = cluster.replicas[index]
            assert replica.proc is not None
            replica.proc.terminate()
            assert await asyncio.to_thread(replica.proc.wait, 30) == 0
            assert "coordinator: stopped" in replica.log.read_text()
            engine = make_engine(cluster.database_url)
            try:
                async with engine.connect() as conn:
                    rows = (await conn.execute(text("SELECT count(*) FROM replicas"))).scalar_one()
            finally:
                await engine.dispose()
            assert rows == REPLICAS - 1  # a killed replica's row would stay until the others sweep it
            await wait_for(lambda: peers[0].client.joins >= 2 and peers[0].client.connected.is_set())
            assert peers[0].replica != replica.name
            await cluster.restart(index)
            await cluster.wait_servers(lambda up: replica.name in up)
        finally:
            await close_all(peers)


async def test_killed_replica_peers_reconnect_and_are_reachable(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as session:
        peers = [await new_peer(cluster, session) for _ in range(2 * REPLICAS)]
        try:
            victim = next(i for i, r in enumerate(cluster.replicas) if r.name == peers[0].replica)
            name = cluster.replicas[victim].name
            orphans = [p for p in peers if p.replica == name]
            others = [p for p in peers if p.replica != name]
            assert orphans and others
            cluster.kill(victim)
            await cluster.wait_servers(lambda up: name not in up)  # the active check took it out
            for p in orphans:
                await wait_for(lambda p=p: p.client.joins >= 2 and p.client.connected.is_set())
                assert p.replica != name
            for p in others:
                assert p.client.joins == 1  # nobody else was disturbed
            # Reachable again, from peers on the surviving replicas (and listed as online).
            for p in orphans:
                sender = next(o for o in others if o.replica != p.replica)
                _, offer = await sender.offer(p)
                assert (await p.next_signal()).description == offer
            await cluster.restart(victim)
            await cluster.wait_servers(lambda up: name in up)
        finally:
            await close_all(peers)


async def wait_for(condition: Any, timeout: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)
