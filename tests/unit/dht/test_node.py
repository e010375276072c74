"""DHT nodes over the in-memory transport: lookups, replication, expiry, signatures, faults, churn."""

import asyncio
import random

from engine.dht import DHTNode, sign_record
from engine.dht.ids import id_to_bytes, key_id_of
from engine.dht.protocol import FIND_VALUE, STORE
from engine.dht.records import Record, encode_record
from engine.dht.swarm import join, make_node
from engine.p2p import Identity
from tests.unit.dht.conftest import Clock, swarm


def brute_closest(nodes: list[DHTNode], target: int, k: int, exclude: int | None = None) -> list[int]:
    return sorted((n.node_id for n in nodes if n.node_id != exclude), key=lambda i: i ^ target)[:k]


async def test_lookup_finds_the_k_closest(clock: Clock) -> None:
    _, nodes = await swarm(300, clock)
    rng = random.Random(3)
    for _ in range(20):
        me = rng.choice(nodes)
        target = rng.getrandbits(160)
        result = await me.find_node(target)
        assert [c[0] for c in result.closest] == brute_closest(nodes, target, 20, exclude=me.node_id)
        assert 1 <= result.hops <= 8


async def test_store_replicates_to_the_k_closest_and_any_node_gets(clock: Clock) -> None:
    _, nodes = await swarm(200, clock)
    owner, reader = nodes[5], nodes[150]
    stored = await owner.store("ffn.3.7", b"hi", clock.now + 60)
    assert stored.ok and stored.replicas == 20
    holders = [n.node_id for n in nodes if n.storage.get(key_id_of("ffn.3.7"), clock.now)]
    assert sorted(holders) == sorted(brute_closest(nodes, key_id_of("ffn.3.7"), 20))
    got = await reader.get("ffn.3.7")
    record = got.records[(owner.peer_id, "")]
    assert record.value == b"hi" and got.rejected == 0
    assert (await reader.get("nothing")).records == {}


async def test_many_owners_share_a_key_and_none_overwrites_another(clock: Clock) -> None:
    _, nodes = await swarm(100, clock)
    alice, bob, reader = nodes[1], nodes[2], nodes[90]
    await alice.store("ffn.3.", b"alice", clock.now + 60, subkey="7")
    await bob.store("ffn.3.", b"bob", clock.now + 60, subkey="7")
    got = await reader.get("ffn.3.")
    assert {k: r.value for k, r in got.records.items()} == {
        (alice.peer_id, "7"): b"alice",
        (bob.peer_id, "7"): b"bob",
    }
    # Bob tries to overwrite Alice's slot with a record naming her key: every holder refuses it.
    assert alice.signer is not None and bob.signer is not None
    mine = sign_record(bob.signer, "ffn.3.", b"evil", clock.now + 90, subkey="7")
    forged = Record(mine.key, "7", b"evil", mine.expiration, alice.signer.public_key, mine.signature)
    holders = [n for n in nodes if n.storage.get(key_id_of("ffn.3."), clock.now) and n is not bob]
    for holder in holders[:5]:
        reply = await bob.transport.call(
            holder.peer_id, STORE, {"records": [encode_record(forged)]}, timeout=1
        )
        assert reply == {"accepted": [False]}
        assert holder.protocol.rejected >= 1
    # a replay of Alice's older record is refused too (not newer)
    old = sign_record(alice.signer, "ffn.3.", b"old", clock.now + 30, subkey="7")
    reply = await bob.transport.call(holders[0].peer_id, STORE, {"records": [encode_record(old)]}, timeout=1)
    assert reply == {"accepted": [False]}
    # a newer record by Alice herself replaces hers
    await alice.store("ffn.3.", b"alice2", clock.now + 120, subkey="7")
    got = await reader.get("ffn.3.")
    assert got.records[(alice.peer_id, "7")].value == b"alice2"
    assert got.records[(bob.peer_id, "7")].value == b"bob"


async def test_a_lying_holder_cannot_forge_records(clock: Clock) -> None:
    _, nodes = await swarm(60, clock)
    alice, reader = nodes[1], nodes[40]
    await alice.store("k", b"true", clock.now + 60)
    holders = [n for n in nodes if n.storage.get(key_id_of("k"), clock.now) and n not in (alice, reader)]
    liar = holders[0]  # a holder the reader's lookup will ask
    assert alice.signer is not None
    real = sign_record(alice.signer, "k", b"true", clock.now + 100)
    fake = Record("k", "", b"lie", real.expiration + 1, real.public_key, real.signature)
    liar.storage.put(key_id_of("k"), fake, clock.now)  # bypasses the checks a store would make
    reply = await reader.transport.call(
        liar.peer_id, FIND_VALUE, {"key": id_to_bytes(key_id_of("k"))}, timeout=1
    )
    assert encode_record(fake) in reply["records"]
    got = await reader.get("k")
    assert got.records[(alice.peer_id, "")].value == b"true"
    assert got.rejected >= 1


async def test_records_expire(clock: Clock) -> None:
    _, nodes = await swarm(50, clock)
    await nodes[3].store("short", b"v", clock.now + 10)
    assert (await nodes[30].get("short")).records
    clock.now += 11
    assert (await nodes[30].get("short")).records == {}
    assert sum(n.storage.purge(clock.now) for n in nodes) == 20


async def test_lossy_network_still_succeeds(clock: Clock) -> None:
    network, nodes = await swarm(120, clock, loss=0.10, seed=7)
    rng = random.Random(1)
    for i in range(30):
        stored = await rng.choice(nodes).store(f"key{i}", b"%d" % i, clock.now + 60)
        assert stored.ok
    for i in range(30):
        got = await rng.choice(nodes).get(f"key{i}")
        assert [r.value for r in got.records.values()] == [b"%d" % i]
    assert network.stats.lost > 100  # the loss really happened


async def test_dead_nodes_are_evicted_and_skipped(clock: Clock) -> None:
    network, nodes = await swarm(200, clock, seed=2)
    rng = random.Random(2)
    dead = set(rng.sample(range(1, 200), 60))
    for i in dead:
        network.kill(nodes[i].peer_id)
    dead_ids = {nodes[i].node_id for i in dead}
    me = nodes[0]
    before = sum(1 for nid, _ in me.table.contacts() if nid in dead_ids)
    assert before > 0
    for _ in range(15):
        result = await me.find_node(rng.getrandbits(160))
        assert not {c[0] for c in result.closest} & dead_ids
    assert network.stats.to_dead > 0
    after = sum(1 for nid, _ in me.table.contacts() if nid in dead_ids)
    assert after < before, (before, after)
    for nid, peer_id in [c for c in me.table.contacts() if c[0] in dead_ids]:
        for _ in range(me.table.max_failures):
            assert not await me.protocol.ping((nid, peer_id))
    assert not {nid for nid, _ in me.table.contacts()} & dead_ids


async def test_full_bucket_pings_its_oldest_before_evicting(clock: Clock) -> None:
    network, nodes = await swarm(120, clock, seed=4)
    me = nodes[0]
    far = me.table.bucket_of(me.node_id ^ (1 << 159))  # the half of the space without us
    for n in nodes:
        if far.covers(n.node_id) and len(far.contacts) < me.k:
            me.table.add(n.node_id, n.peer_id)
    assert len(far.contacts) == me.k
    oldest = next(iter(far.contacts))
    network.kill(far.contacts[oldest])
    newcomer = next(
        n for n in nodes if far.covers(n.node_id) and n.node_id not in far.contacts and n is not me
    )
    await newcomer.protocol.ping((me.node_id, me.peer_id))  # me learns of newcomer from its request
    for _ in range(5):
        if oldest not in me.table:
            break
        await asyncio.sleep(0.06)
    assert oldest not in me.table and newcomer.node_id in me.table


async def test_churn_keeps_records_reachable(clock: Clock) -> None:
    network, nodes = await swarm(200, clock, seed=5)
    rng = random.Random(5)
    for i in range(40):
        assert (await rng.choice(nodes).store(f"c{i}", b"%d" % i, clock.now + 600)).ok
    live = list(nodes)
    for _ in range(4):  # replace 40 of 200 nodes, 10 at a time
        for node in rng.sample(live, 10):
            network.kill(node.peer_id)
            live.remove(node)
        newcomers = [make_node(network, rpc_timeout=0.05, clock=clock) for _ in range(10)]
        await join(live, newcomers, rng)
    for i in range(40):
        got = await rng.choice(live).get(f"c{i}")
        assert [r.value for r in got.records.values()] == [b"%d" % i]
    assert network.stats.to_dead > 0


async def test_fields_survive_the_real_wire_codec(clock: Clock) -> None:
    network, nodes = await swarm(30, clock, validate=True)
    await nodes[1].store("w", b"\x00\xff", clock.now + 60, subkey="s")
    got = await nodes[20].get("w")
    assert got.records[(nodes[1].peer_id, "s")].value == b"\x00\xff"
    assert network.stats.remote_errors == 0


async def test_handlers_learn_the_caller_from_the_transport(clock: Clock) -> None:
    _, nodes = await swarm(2, clock)
    a = DHTNode(nodes[0].transport.network.add(Identity.generate().peer_id), clock=clock)  # type: ignore[attr-defined]
    assert a.node_id not in nodes[1].table
    await a.bootstrap([nodes[1].peer_id])
    assert a.node_id in nodes[1].table
