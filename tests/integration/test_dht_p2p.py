"""Real aiortc peers on loopback as a DHT through PeerTransport: store on one, get on another."""

import time

from engine.dht import DHTNode, declare_experts, get_experts
from engine.dht.ids import key_id_of
from engine.dht.p2p_transport import PeerTransport
from engine.dht.protocol import STORE
from engine.dht.records import Record, encode_record, sign_record
from tests.integration.conftest import MakePeer


async def test_store_on_one_get_on_another(make_peer: MakePeer) -> None:
    peers = [await make_peer() for _ in range(4)]
    nodes = [DHTNode(PeerTransport(p), signer=p.identity, rpc_timeout=15) for p in peers]
    for node in nodes[1:]:
        assert await node.bootstrap([nodes[0].peer_id]) == 1
    # every node learned the caller's id from the authenticated link, not from the message
    assert all(n.node_id in nodes[0].table for n in nodes[1:])

    stored = await nodes[1].store("ffn.3.7", b"hello", time.time() + 60)
    assert stored.replicas == 4  # fewer nodes than k: all of them hold it
    got = await nodes[3].get("ffn.3.7")
    assert got.records[(nodes[1].peer_id, "")].value == b"hello"

    # a record naming node 1's key but signed by node 2 is refused by a real remote
    mine = sign_record(peers[2].identity, "ffn.3.7", b"evil", time.time() + 90)
    forged = Record(mine.key, "", b"evil", mine.expiration, peers[1].identity.public_key, mine.signature)
    reply = await nodes[2].transport.call(
        nodes[0].peer_id, STORE, {"records": [encode_record(forged)]}, timeout=15
    )
    assert reply == {"accepted": [False]}
    held = nodes[0].storage.get(key_id_of("ffn.3.7"), time.time())
    assert [r.value for r in held] == [b"hello"]

    assert (await declare_experts(nodes[2], ["ffn.4.1"], nodes[2].peer_id, time.time() + 60)) == {
        "ffn.4.1": True
    }
    [info] = await get_experts(nodes[0], ["ffn.4.1"])
    assert info is not None and info.hosts == (nodes[2].peer_id,)
