"""declare_experts / get_experts / first_k_active over the in-memory transport."""

import pytest

from engine.dht import Declarer, declare_experts, first_k_active, get_active_successors, get_experts
from engine.dht.keys import encode_declaration
from tests.unit.dht.conftest import Clock, swarm


async def test_declare_find_and_expire(clock: Clock) -> None:
    _, nodes = await swarm(80, clock)
    host_a, host_b, trainer = nodes[3], nodes[4], nodes[70]
    ok = await declare_experts(host_a, ["ffn.3.7", "ffn.3.9"], host_a.peer_id, clock.now + 30)
    assert ok == {"ffn.3.7": True, "ffn.3.9": True}
    await declare_experts(host_b, ["ffn.3.7", "ffn.5.0"], host_b.peer_id, clock.now + 100)

    infos = await get_experts(trainer, ["ffn.3.7", "ffn.3.9", "ffn.5.0", "ffn.6.6"])
    assert infos[0] is not None and set(infos[0].hosts) == {host_a.peer_id, host_b.peer_id}
    assert infos[0].hosts[0] == host_b.peer_id  # latest-declared first
    assert infos[1] is not None and infos[1].hosts == (host_a.peer_id,)
    assert infos[2] is not None and infos[3] is None
    assert await get_active_successors(trainer, "ffn.3.") == ["7", "9"]
    assert await get_active_successors(trainer, "ffn.") == ["3", "5"]

    found = await first_k_active(trainer, ["ffn.6.", "ffn.5.", "ffn.4.", "ffn.3."], k=2)
    assert list(found) == ["ffn.5.", "ffn.3."] and found["ffn.3."] == ["7", "9"]

    clock.now += 31  # host A stopped refreshing: its declarations lapse
    infos = await get_experts(trainer, ["ffn.3.7", "ffn.3.9"])
    assert infos[0] is not None and infos[0].hosts == (host_b.peer_id,)
    assert infos[1] is None
    assert await get_active_successors(trainer, "ffn.3.") == ["7"]


async def test_nobody_declares_for_another_host(clock: Clock) -> None:
    _, nodes = await swarm(40, clock)
    liar, victim, trainer = nodes[1], nodes[2], nodes[30]
    with pytest.raises(ValueError):
        await declare_experts(liar, ["ffn.1.1"], victim.peer_id, clock.now + 30)
    # a record that names another host, signed by the liar, is ignored by readers
    await liar.store("ffn.1.1", encode_declaration(victim.peer_id, "ffn.1.1"), clock.now + 30)
    assert (await get_experts(trainer, ["ffn.1.1"])) == [None]


async def test_declarer_refreshes_with_a_later_expiration(clock: Clock) -> None:
    _, nodes = await swarm(30, clock)
    declarer = Declarer(nodes[1], ["ffn.0.0"], ttl=60, period=20)
    assert await declarer.declare_now() == {"ffn.0.0": True}
    clock.now += 50
    assert await declarer.declare_now() == {"ffn.0.0": True}
    clock.now += 50  # past the first expiration, inside the second
    assert (await get_experts(nodes[20], ["ffn.0.0"]))[0] is not None
    with pytest.raises(ValueError):
        Declarer(nodes[1], ttl=10, period=10)
