"""Signaling across coordinator replicas sharing one PostgreSQL: real coordinators (aiohttp servers on
loopback, each with its own services), real signaling clients, real LISTEN/NOTIFY, and a replica in
its own process killed with SIGKILL."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from sqlalchemy import text

from coordinator.hub.presence import DEAD_AFTER_S
from coordinator.hub.relay import MAX_NOTIFY_BYTES
from coordinator.server.app import start_full
from engine.p2p.descriptions import sign_description
from engine.p2p.identity import Identity

from .accounts_helpers import volunteer_with_host
from .replica_process import replica_config
from .signal_cluster import WAIT_S, Cluster, Peer, cluster, until

__all__ = ["cluster"]  # the fixture


async def test_offer_to_a_peer_on_another_replica_gets_the_answer(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    assert a.hub.group is not None and b.hub.group is not None  # PostgreSQL: a group without a flag
    assert a.hub.group.replica_id != b.hub.group.replica_id
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(a.signaling_url)
    await bob.join(b.signaling_url)
    await ada.offer(bob)
    await until(lambda: len(bob.got_from(ada)) == 1)
    offer = bob.got_from(ada)[0]
    assert offer.description.type == "offer" and offer.to == bob.id
    assert bob.client is not None
    answer = sign_description(bob.identity, "answer", "v=0", ada.id, offer.description.session)
    await bob.client.send(ada.id, answer, on_error=bob.errors.append)
    await until(lambda: len(ada.got_from(bob)) == 1)
    assert ada.got_from(bob)[0].description == answer
    assert not ada.errors and not bob.errors
    # The same signed offer again is still suppressed, and a peer online nowhere is still an error.
    assert ada.client is not None
    replay = offer.description
    await ada.client.send(bob.id, replay, on_error=ada.errors.append)
    nobody = Peer(Identity.generate(), "")
    ref = await ada.offer(nobody)
    await until(lambda: len(ada.errors) == 1)
    assert ada.errors[0].code == "unknown_peer" and ada.errors[0].ref == ref
    assert len(bob.got_from(ada)) == 1


async def test_every_replica_lists_the_peers_of_all(cluster: Cluster) -> None:
    replicas = [await cluster.start() for _ in range(3)]
    peers = [await cluster.peer(name) for name in ("ada", "bob", "cyd")]
    for peer, replica in zip(peers, replicas, strict=True):
        await peer.join(replica.signaling_url)
    everyone = sorted(p.id for p in peers)
    for replica in replicas:
        assert await cluster.listed(replica, peers[0].token) == everyone
        assert await replica.hub.online_all() == everyone
        assert len(replica.hub.online()) == 1  # each holds one socket itself
    await peers[1].leave()
    await until(lambda: peers[1].id not in replicas[0].hub.peers)
    for replica in replicas:
        async with asyncio.timeout(WAIT_S):
            while peers[1].id in await replica.hub.online_all():
                await asyncio.sleep(0.05)


async def test_a_killed_replica_stops_being_listed_and_its_peers_come_back_elsewhere(
    cluster: Cluster,
) -> None:
    survivor = await cluster.start()
    proc, doomed_url = await cluster.spawn()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(survivor.signaling_url)
    await bob.join(doomed_url)
    assert sorted(await cluster.listed(survivor, ada.token)) == sorted([ada.id, bob.id])
    await ada.offer(bob)  # relayed into the child process...
    await until(lambda: len(bob.got_from(ada)) == 1)

    proc.send_signal(signal.SIGKILL)  # ...which dies without a word to anyone
    await proc.wait()
    await bob.leave()  # its client would retry the dead address; this one goes elsewhere below
    loop = asyncio.get_running_loop()
    killed_at = loop.time()
    async with asyncio.timeout(WAIT_S):
        while bob.id in await cluster.listed(survivor, ada.token):
            await asyncio.sleep(0.1)
    gone_after = loop.time() - killed_at
    # Unlisted by the heartbeat's age, not by any cleanup: the dead replica's row is still there.
    async with survivor.services.sessions() as s:
        rows = (
            await s.execute(text("SELECT count(*) FROM presence WHERE peer_id = :p"), {"p": bob.id})
        ).scalar()
    assert rows == 1
    print(f"unlisted {gone_after:.1f} s after the kill (bound {DEAD_AFTER_S} s after the last heartbeat)")
    # Meanwhile an offer to it is refused at once, not lost.
    await ada.offer(bob)
    await until(lambda: len(ada.errors) == 1)
    assert ada.errors[0].code == "unknown_peer"

    await bob.join(survivor.signaling_url)  # through the proxy, it would land on a live replica
    assert bob.id in await cluster.listed(survivor, ada.token)
    await ada.offer(bob)
    await until(lambda: len(bob.got_from(ada)) == 2)


async def test_reconnecting_to_another_replica_replaces_the_old_socket(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(a.signaling_url)
    await bob.join(a.signaling_url)
    old = bob.client
    assert old is not None
    bob.client = None
    await bob.join(b.signaling_url)  # the same key, a newer socket, another replica
    await until(lambda: bob.id not in a.hub.peers)  # replica a closed its stale socket
    assert bob.id in b.hub.peers
    await old.close()
    await asyncio.sleep(0.5)  # the old socket's goodbye must not remove the new presence
    assert bob.id in await a.hub.online_all()
    await ada.offer(bob)
    await until(lambda: len(bob.got_from(ada)) == 1)
    assert a.hub.group is not None and a.hub.group.stats["forwarded"] == 1


async def test_a_frame_over_the_notify_limit_arrives_whole(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(a.signaling_url)
    await bob.join(b.signaling_url)
    sdp = "v=0\r\n" + "".join(f"a=x-filler:{i:05d}{'z' * 40}\r\n" for i in range(250))
    assert len(sdp) > MAX_NOTIFY_BYTES
    await ada.offer(bob, sdp)
    await until(lambda: len(bob.got_from(ada)) == 1)
    assert bob.got_from(ada)[0].description.sdp == sdp
    assert a.hub.group is not None and a.hub.group.stats["stored"] == 1
    async with a.services.sessions() as s:  # read once, then gone
        assert (await s.execute(text("SELECT count(*) FROM signal_frames"))).scalar() == 0


async def test_a_lost_listener_reconnects_and_relaying_resumes(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(a.signaling_url)
    await bob.join(b.signaling_url)
    group = b.hub.group
    assert group is not None and b.hub.healthy()
    pid = group.listener.backend_pid
    async with a.services.sessions() as s, s.begin():
        assert (await s.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})).scalar()
    await until(lambda: group.listener.reconnects == 1 and b.hub.healthy())
    assert group.listener.backend_pid != pid
    await ada.offer(bob)
    await until(lambda: len(bob.got_from(ada)) + len(ada.errors) >= 1)
    assert len(bob.got_from(ada)) == 1, ada.errors


async def test_real_webrtc_connection_signaled_through_two_replicas(cluster: Cluster) -> None:
    from engine.p2p import CallContext, Handlers, LinkConfig
    from engine.p2p import Peer as Node
    from engine.p2p.patches import pin_host_addresses
    from engine.wire import Kind, Message

    pin_host_addresses(["127.0.0.1"])
    a, b = await cluster.start(), await cluster.start()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    handlers = Handlers()

    async def echo(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields={"from": ctx.peer_id, **msg.fields})

    handlers.add_unary("echo", echo)
    config = LinkConfig(connect_timeout=20)
    server = Node(bob.identity, b.signaling_url, handlers=handlers, config=config, token=bob.token)
    client = Node(ada.identity, a.signaling_url, config=config, token=ada.token)
    await server.start()
    await client.start()
    try:
        reply = await client.call(bob.id, "echo", {"k": "v"}, timeout=30)
        assert reply.fields == {"from": ada.id, "k": "v"}
    finally:
        await client.stop()
        await server.stop()
    ga, gb = a.hub.group, b.hub.group
    assert ga is not None and gb is not None
    assert ga.stats["forwarded"] >= 1 and gb.stats["forwarded"] >= 1  # the offer one way, the answer back
    print(f"largest relayed notification: {max(ga.stats['largest'], gb.stats['largest'])} bytes")


async def test_offer_limits_and_errors_hold_across_replicas(cluster: Cluster) -> None:
    a = await cluster.start(offer_burst=3, offers_per_minute=1)
    b = await cluster.start()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(a.signaling_url)
    await bob.join(b.signaling_url)
    refs = [await ada.offer(bob) for _ in range(5)]
    await until(lambda: len(bob.got_from(ada)) == 3 and len(ada.errors) == 2)
    assert [e.code for e in ada.errors] == ["rate_limited"] * 2
    assert {e.ref for e in ada.errors} == set(refs[3:])
    # A presence row whose socket is gone (its release never reached the database): the replica
    # named in it answers the sender, through the sender's replica, instead of dropping the offer.
    ghost = Peer(Identity.generate(), "")
    assert b.hub.group is not None
    async with a.services.sessions() as s, s.begin():
        await s.execute(
            text("INSERT INTO presence (peer_id, replica_id, conn) VALUES (:p, :r, 'gone')"),
            {"p": ghost.id, "r": b.hub.group.replica_id},
        )
    assert ghost.id in await a.hub.online_all()
    b_only = await cluster.start()  # a sender whose bucket is not spent
    cyd = await cluster.peer("cyd")
    await cyd.join(b_only.signaling_url)
    ref = await cyd.offer(ghost)
    await until(lambda: len(cyd.errors) == 1)
    assert (cyd.errors[0].code, cyd.errors[0].ref) == ("unknown_peer", ref)
    assert b.hub.group.stats["bounced"] == 1


async def test_disabling_on_one_replica_closes_the_socket_on_another_at_once(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    b.hub.recheck_s = 3600.0  # so only the request from a can close it within the test
    bob = await cluster.peer("bob")
    await bob.join(b.signaling_url)
    await until(lambda: bob.id in b.hub.peers)
    await a.services.accounts.set_disabled("bob", True, by=None)
    await a.hub.sweep_everywhere()
    await until(lambda: bob.id not in b.hub.peers)
    assert bob.id not in await a.hub.online_all()


async def test_concurrent_claims_of_one_peer_leave_exactly_one_row(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    groups = [a.hub.group, b.hub.group]
    assert groups[0] is not None and groups[1] is not None
    peer, conns = "e" * 40, [f"conn{i}" for i in range(40)]
    await asyncio.gather(*(groups[i % 2].claim(peer, conn) for i, conn in enumerate(conns)))  # type: ignore[union-attr]
    async with a.services.sessions() as s:
        rows = (
            await s.execute(text("SELECT replica_id, conn FROM presence WHERE peer_id = :p"), {"p": peer})
        ).all()
    assert len(rows) == 1 and rows[0][1] in conns
    assert rows[0][0] == groups[conns.index(rows[0][1]) % 2].replica_id  # type: ignore[union-attr]


async def test_on_sqlite_the_coordinator_stays_one_process(tmp_path: Path) -> None:
    config = replica_config(
        f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}", str(tmp_path / "token.key"), str(tmp_path / "e")
    )
    running = await start_full(config)
    try:
        assert running.hub.group is None and running.hub.healthy()
        _, token, identity = await volunteer_with_host(running.services, "ada")
        peer = Peer(identity, token)
        await peer.join(running.signaling_url)
        try:
            assert await running.hub.online_all() == [peer.id]
            async with running.services.sessions() as s:  # nothing written for presence
                assert (await s.execute(text("SELECT count(*) FROM presence"))).scalar() == 0
                assert (await s.execute(text("SELECT count(*) FROM replicas"))).scalar() == 0
        finally:
            await peer.leave()
    finally:
        await running.stop()


async def test_a_replica_taken_for_dead_rejoins_and_claims_its_peers_again(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await ada.join(a.signaling_url)
    await bob.join(b.signaling_url)
    assert a.hub.group is not None
    # As another replica reaps a row whose heartbeat is too old (a stalled process): its peers' rows go.
    async with b.services.sessions() as s, s.begin():
        await s.execute(text("DELETE FROM replicas WHERE id = :r"), {"r": a.hub.group.replica_id})
    assert ada.id not in await b.hub.online_all()
    async with asyncio.timeout(WAIT_S):  # its next heartbeat writes the row and the claims again
        while ada.id not in await b.hub.online_all():
            await asyncio.sleep(0.1)
    await bob.offer(ada)
    await until(lambda: len(ada.got_from(bob)) == 1)


async def test_a_replica_that_stops_cleanly_takes_its_peers_off_the_list_at_once(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    ada = await cluster.peer("ada")
    await ada.join(a.signaling_url)
    assert a.hub.group is not None
    gone = a.hub.group.replica_id
    assert ada.id in await b.hub.online_all()
    cluster.replicas.remove(a)
    await a.stop()  # a restart or a scale-down: no waiting out the heartbeat bound
    assert ada.id not in await b.hub.online_all()
    async with b.services.sessions() as s:
        assert (
            await s.execute(text("SELECT count(*) FROM replicas WHERE id = :r"), {"r": gone})
        ).scalar() == 0
