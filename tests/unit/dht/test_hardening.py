"""Hostile peers on the DHT, over the in-memory network: malformed keys are typed errors, stores have
quotas per owner and per sender, replies pick records fairly, and the coordinator's assignment proofs
let readers prefer assigned hosts over squatters."""

from __future__ import annotations

import pytest

from engine.dht import (
    AssignmentProof,
    BadRequest,
    Declarer,
    DHTError,
    QuotaExceeded,
    declare_experts,
    get_experts,
    sign_record,
)
from engine.dht.ids import key_id_of
from engine.dht.keys import encode_declaration
from engine.dht.protocol import STORE
from engine.dht.records import Record, decode_record, encode_record
from engine.dht.storage import RecordStore, fair_order
from engine.moe.dht_finder import DHTExpertFinder, dht_lookup
from engine.p2p import Identity
from engine.wire.statements import assignment_signed_bytes
from tests.unit.dht.conftest import Clock, swarm

# -- malformed keys ---------------------------------------------------------------------------------


def _malformed(clock: Clock) -> Record:
    good = sign_record(Identity.generate(), "ffn.0.0", b"x", clock.now + 60)
    return Record(good.key, good.subkey, good.value, good.expiration, good.public_key[:31], good.signature)


def test_a_31_byte_key_is_a_typed_error(clock: Clock) -> None:
    raw = encode_record(_malformed(clock))
    with pytest.raises(BadRequest, match="31-byte public key"):
        decode_record(raw)
    with pytest.raises(DHTError):
        _ = _malformed(clock).owner  # not engine.p2p's IdentityError escaping the DHT's tree


async def test_a_store_with_a_malformed_record_refuses_that_record_only(clock: Clock) -> None:
    _, nodes = await swarm(5, clock)
    sender, holder = nodes[1], nodes[2]
    good = sign_record(sender.signer, "ffn.0.0", b"ok", clock.now + 60)  # type: ignore[arg-type]
    records = [encode_record(good), encode_record(_malformed(clock))]
    reply = await sender.transport.call(holder.peer_id, STORE, {"records": records}, timeout=5)
    assert reply == {"accepted": [True, False]}
    assert holder.protocol.accept(encode_record(_malformed(clock))) is False
    assert holder.storage.get(key_id_of("ffn.0.0"), clock.now) == [good]


# -- quotas -----------------------------------------------------------------------------------------


def test_store_quotas_per_owner_sender_and_key(clock: Clock) -> None:
    store = RecordStore(max_per_owner=10, max_per_sender=15, max_per_key=12)
    spammer, honest = Identity.generate(), Identity.generate()
    for i in range(10):
        store.put(key_id_of(f"k{i}"), sign_record(spammer, f"k{i}", b"", clock.now + 60), clock.now, "s1")
    with pytest.raises(QuotaExceeded, match="owner"):
        store.put(key_id_of("k10"), sign_record(spammer, "k10", b"", clock.now + 60), clock.now, "s2")
    # A newer record of a slot the owner holds is still fine (no new slot).
    store.put(key_id_of("k0"), sign_record(spammer, "k0", b"", clock.now + 90), clock.now, "s1")
    # One sender relaying many owners' records.
    owners = [Identity.generate() for _ in range(6)]
    for owner in owners[:5]:
        store.put(key_id_of("r"), sign_record(owner, "r", b"", clock.now + 60), clock.now, "s1")
    with pytest.raises(QuotaExceeded, match="peer"):
        store.put(key_id_of("r"), sign_record(owners[5], "r", b"", clock.now + 60), clock.now, "s1")
    # One key holds at most 12 slots.
    for i in range(7):
        store.put(
            key_id_of("r"), sign_record(honest, "r", b"", clock.now + 60, subkey=str(i)), clock.now, None
        )
    with pytest.raises(QuotaExceeded, match="key"):
        store.put(key_id_of("r"), sign_record(honest, "r", b"", clock.now + 60, subkey="x"), clock.now, None)
    # Expired records free their quota.
    clock.now += 61
    store.put(key_id_of("k10"), sign_record(spammer, "k10", b"", clock.now + 60), clock.now, "s1")
    assert len(store) == 2  # k0 (refreshed) and k10: the spammer's quota is free again, and s1's
    for i in range(8):
        store.put(key_id_of(f"m{i}"), sign_record(spammer, f"m{i}", b"", clock.now + 60), clock.now, "s1")
    with pytest.raises(QuotaExceeded, match="owner"):
        store.put(key_id_of("m8"), sign_record(spammer, "m8", b"", clock.now + 60), clock.now, "s1")


async def test_one_peer_cannot_fill_a_node(clock: Clock) -> None:
    _, nodes = await swarm(5, clock)
    attacker, victim, honest = nodes[1], nodes[2], nodes[3]
    signer = attacker.signer
    assert signer is not None
    accepted = 0
    for start in range(0, 2400, 400):
        batch = [
            encode_record(sign_record(signer, f"junk{i}", b"x" * 64, clock.now + 600))
            for i in range(start, start + 400)
        ]
        reply = await attacker.transport.call(victim.peer_id, STORE, {"records": batch}, timeout=30)
        accepted += sum(reply["accepted"])
    assert accepted == victim.storage.max_per_owner == 2048  # today: all 2,400 (and 100,000 in all)
    good = encode_record(sign_record(honest.signer, "ffn.0.0", b"ok", clock.now + 60))  # type: ignore[arg-type]
    assert (await honest.transport.call(victim.peer_id, STORE, {"records": [good]}, timeout=5))[
        "accepted"
    ] == [True]


# -- fair replies -----------------------------------------------------------------------------------


def test_fair_order_takes_one_record_per_owner_first(clock: Clock) -> None:
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    many = [sign_record(a, "k", b"", clock.now + 100 + i, subkey=str(i)) for i in range(5)]
    one_b = sign_record(b, "k", b"", clock.now + 10)
    one_c = sign_record(c, "k", b"", clock.now + 50)
    order = fair_order([*many, one_b, one_c])
    assert order[:3] == [many[4], one_c, one_b]
    assert order[3:] == [many[3], many[2], many[1], many[0]]


async def test_forty_junk_records_cannot_hide_the_honest_host(clock: Clock) -> None:
    _, nodes = await swarm(60, clock)
    honest, attacker, trainer = nodes[3], nodes[7], nodes[50]
    await declare_experts(honest, ["ffn.1.1"], honest.peer_id, clock.now + 60)
    signer = attacker.signer
    assert signer is not None
    junk = [
        sign_record(
            signer,
            "ffn.1.1",
            encode_declaration(attacker.peer_id, "ffn.1.1") + b"\0" * 1900,
            clock.now + 3600,
            f"j{i}",
        )
        for i in range(40)
    ]
    for start in range(0, 40, 10):
        assert (await attacker.store_records(junk[start : start + 10])).ok
    infos = await get_experts(trainer, ["ffn.1.1"])
    assert infos[0] is not None and honest.peer_id in infos[0].hosts


# -- assignment proofs ------------------------------------------------------------------------------


def _proof(coordinator: Identity, host: Identity, uid: str, until: float) -> AssignmentProof:
    data = assignment_signed_bytes(host.public_key, uid, uid.split(".")[0], until)
    return AssignmentProof(until, coordinator.sign(data))


async def test_readers_prefer_hosts_the_coordinator_assigned(clock: Clock) -> None:
    _, nodes = await swarm(60, clock)
    coordinator = Identity.generate()
    honest, squatter, thief, trainer = nodes[3], nodes[4], nodes[5], nodes[50]
    honest_id, thief_id = honest.signer, thief.signer
    assert isinstance(honest_id, Identity) and isinstance(thief_id, Identity)
    proof = _proof(coordinator, honest_id, "ffn.1.1", clock.now + 3600)
    declarer = Declarer(honest, ["ffn.1.1"], ttl=60, period=20, proofs={"ffn.1.1": proof})
    assert await declarer.declare_now() == {"ffn.1.1": True}
    # Anyone may declare anything: a squatter without a proof, a thief with the honest host's proof,
    # and a host whose proof is for another expert.
    await declare_experts(squatter, ["ffn.1.1"], squatter.peer_id, clock.now + 120)
    await declare_experts(thief, ["ffn.1.1"], thief.peer_id, clock.now + 120, proofs={"ffn.1.1": proof})
    other = _proof(coordinator, thief_id, "ffn.0.0", clock.now + 3600)
    await declare_experts(thief, ["ffn.1.0"], thief.peer_id, clock.now + 120, proofs={"ffn.1.0": other})

    blind = (await get_experts(trainer, ["ffn.1.1"]))[0]
    assert blind is not None and set(blind.hosts) == {honest.peer_id, squatter.peer_id, thief.peer_id}
    assert blind.assigned == ()
    info = (await get_experts(trainer, ["ffn.1.1"], coordinator_key=coordinator.public_key))[0]
    assert info is not None and info.assigned == (honest.peer_id,) and info.hosts[0] == honest.peer_id
    # The trainer's finder uses only assigned hosts: an expert nobody assigned serves is not alive,
    # even though someone declares it (it would be called exactly when the honest hosts are away).
    lookup = dht_lookup(trainer, coordinator.public_key)
    children = await lookup("ffn.1.")
    assert children == {1: ("ffn.1.1", (honest.peer_id,))}
    assert set(lookup.refused) == {squatter.peer_id, thief.peer_id}
    # The prefix level refuses them too: they do not make "ffn.1." look served by them.
    top = await lookup("ffn.")
    assert top[1] == ("ffn.1", (honest.peer_id,))
    # Without the coordinator's key (a swarm with no coordinator) every declaring host is used.
    blind_children = await dht_lookup(trainer)("ffn.1.")
    assert set(blind_children[1][1]) == {honest.peer_id, squatter.peer_id, thief.peer_id}
    assert blind_children[0] == ("ffn.1.0", (thief.peer_id,))
    # The finder a trainer uses never picks them, and says which hosts it refused.
    finder = DHTExpertFinder(trainer, coordinator_key=coordinator.public_key)
    found = await finder.find("ffn", [[0.0, 0.0], [9.0, 0.0]], k=2)  # ffn.1.0 would score best
    assert found == [("ffn.1.1", honest.peer_id)]
    assert set(finder.refused_hosts) == {squatter.peer_id, thief.peer_id}
    await finder.close()
    # A proof signed by another key, or expired, proves nothing.
    impostor = Identity.generate()
    info = (await get_experts(trainer, ["ffn.1.1"], coordinator_key=impostor.public_key))[0]
    assert info is not None and info.assigned == ()
    clock.now += 3601
    await declarer.declare_now()  # still declared, but the assignment lapsed
    info = (await get_experts(trainer, ["ffn.1.1"], coordinator_key=coordinator.public_key))[0]
    assert info is not None and info.assigned == () and info.hosts == (honest.peer_id,)
