"""What a signaling hello costs a replica, and what the cheaper admission still guarantees: the list
of revocations held in memory (revoked on one replica: refused on another at once; its listener away:
the database answers again), host lookups and presence claims in batches (the latest socket wins)."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from coordinator.hub.presence import ReplicaGroup
from engine.p2p import signaling_protocol as sp
from engine.p2p.errors import SignalingError
from engine.p2p.signaling import SignalingRefused

from .signal_cluster import Cluster, cluster, until

__all__ = ["cluster"]  # the fixture


async def _refusal(peer_join: asyncio.Future[None] | object) -> str:
    """The hub's refusal code for a join, or "" if it was admitted."""
    try:
        await peer_join  # type: ignore[misc]
    except SignalingRefused as e:
        return e.code
    except SignalingError as e:
        return f"error: {e}"
    return ""


async def test_a_revocation_on_one_replica_refuses_the_hello_on_another_at_once(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    await until(lambda: a.services.tokens.revocations_complete() and b.services.tokens.revocations_complete())
    ada, bob = await cluster.peer("ada"), await cluster.peer("bob")
    await bob.join(b.signaling_url)  # admitted by B from its list in memory: bob's token is not on it
    await bob.leave()
    jti = a.services.tokens.decode(bob.token).jti
    await a.services.tokens.revoke(jti)
    await until(lambda: jti in b.services.tokens._all_revoked)  # told by NOTIFY, no timeout involved
    assert await _refusal(bob.join(b.signaling_url)) == sp.TOKEN_REVOKED
    await ada.join(b.signaling_url)  # a token nobody revoked still gets in
    assert b.services.tokens.revocations_complete()


async def test_a_revocation_made_before_a_replica_starts_is_in_its_list(cluster: Cluster) -> None:
    a = await cluster.start()
    bob = await cluster.peer("bob")
    await a.services.tokens.revoke(a.services.tokens.decode(bob.token).jti)
    b = await cluster.start()
    await until(b.services.tokens.revocations_complete)
    assert await _refusal(bob.join(b.signaling_url)) == sp.TOKEN_REVOKED


async def test_with_its_listener_away_a_replica_asks_the_database_again(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    tokens = b.services.tokens
    await until(tokens.revocations_complete)
    bob = await cluster.peer("bob")
    jti = tokens.decode(bob.token).jti
    listener = b.services.listener
    assert listener is not None and listener.conn is not None
    # Hold B's listener away (its reconnects refused) and revoke behind its back, with no NOTIFY:
    # only the database knows. B must not trust its list now; it must read the database.
    listener.retry_s = 3600.0
    pid = listener.conn.get_server_pid()
    async with a.services.engine.begin() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    await until(lambda: not listener.healthy)
    assert not tokens.revocations_complete()
    async with a.services.engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO revoked_tokens (jti, expires_at) VALUES (:j, :e)"),
            {"j": jti, "e": tokens.clock() + 3600},
        )
    assert await _refusal(bob.join(b.signaling_url)) == sp.TOKEN_REVOKED


async def test_a_burst_of_hellos_shares_batched_lookups_and_claims(cluster: Cluster) -> None:
    a = await cluster.start()
    peers = [await cluster.peer(f"p{i}") for i in range(30)]
    group = a.hub.group
    assert group is not None
    claims_before = group._claims.batches
    lookups_before = a.services.host_owners.batches
    await asyncio.gather(*(p.join(a.signaling_url) for p in peers))
    assert sorted(await a.hub.online_all()) == sorted(p.id for p in peers)
    # Fewer statements than hellos (how many fewer depends on timing; never one each for all 30).
    assert group._claims.batches - claims_before < len(peers)
    assert a.services.host_owners.batches - lookups_before < len(peers)


async def _presence(group: ReplicaGroup, peer: str) -> list[tuple[str, str]]:
    rows = await group._relay_pool().fetch("SELECT replica_id, conn FROM presence WHERE peer_id = $1", peer)
    return [(r[0], r[1]) for r in rows]


async def test_in_one_batch_the_latest_claim_of_a_peer_wins(cluster: Cluster) -> None:
    a, b = await cluster.start(), await cluster.start()
    ga, gb = a.hub.group, b.hub.group
    assert ga is not None and gb is not None
    peer, other = "a" * 40, "b" * 40
    await gb.claim(peer, "on-b")  # held by B first: A's batch must evict it there
    evicted_before = gb.stats["evicted"]
    before = ga._claims.batches
    await asyncio.gather(*(ga.claim(peer, f"conn{i}") for i in range(10)), ga.claim(other, "x"))
    assert ga._claims.batches - before <= 2  # 11 claims, made at once
    assert await _presence(ga, peer) == [(ga.replica_id, "conn9")]
    assert await _presence(ga, other) == [(ga.replica_id, "x")]
    await until(lambda: gb.stats["evicted"] == evicted_before + 1)  # one Evict, for B's socket
