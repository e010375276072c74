"""A DHT client (a trainer) looks up and publishes, but holds no records and is nobody's contact."""

from engine.dht import declare_experts, get_experts
from engine.dht.swarm import make_node
from tests.unit.dht.conftest import Clock, swarm


async def test_a_client_finds_and_publishes_without_becoming_a_storage_node(clock: Clock) -> None:
    network, nodes = await swarm(30, clock)
    client = make_node(network, rpc_timeout=0.05, clock=clock, client=True)
    assert await client.bootstrap([n.peer_id for n in nodes[:3]]) > 0
    # It publishes: the records land on servers, none on the client itself.
    assert (await client.store("collab.round", b"hello", clock.now + 60)).replicas >= 10
    assert len(client.storage) == 0
    # It finds what servers declared.
    host = nodes[7]
    await declare_experts(host, ["ffn.0.1"], host.peer_id, clock.now + 60)
    infos = await get_experts(client, ["ffn.0.1"])
    assert infos[0] is not None and infos[0].hosts == (host.peer_id,)
    got = await nodes[12].get("collab.round")
    assert [r.value for r in got.records.values()] == [b"hello"]
    # No server learned it as a contact, so no server ever sends it a store.
    assert all(client.node_id not in {c[0] for c in n.table.nearest(client.node_id, 100)} for n in nodes)
    await declare_experts(nodes[3], ["ffn.1.1"], nodes[3].peer_id, clock.now + 60)
    assert len(client.storage) == 0  # declarations elsewhere never reach it


async def test_servers_still_learn_ordinary_senders(clock: Clock) -> None:
    network, nodes = await swarm(10, clock)
    server = make_node(network, rpc_timeout=0.05, clock=clock)
    assert await server.bootstrap([nodes[0].peer_id]) > 0
    assert server.node_id in {c[0] for c in nodes[0].table.nearest(server.node_id, 100)}
