"""Collaborative training on real aiortc links: progress in a real DHT (forged, replayed, expired and
clock-skewed records), trainers stepping together, a corrupt state donor, all peers but one leaving."""

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
import torch
from torch import nn

from engine.collab import (
    CollabConfig,
    CollaborativeOptimizer,
    Group,
    GroupClosed,
    Matchmaker,
    MatchmakingConfig,
    ProgressTracker,
)
from engine.collab.allreduce import AllReduceConfig
from engine.collab.progress import LocalProgress, encode_progress, progress_key
from engine.collab.snapshot import take_snapshot
from engine.collab.state import STATE_PART, StateDonor, download_state
from engine.dht import DHTNode
from engine.dht.p2p_transport import PeerTransport
from engine.dht.records import Record, encode_record, sign_record
from engine.p2p import CallContext, Peer
from engine.wire import Compression, Kind, Message
from tests.integration.conftest import MakePeer


async def dht_swarm(
    make_peer: MakePeer, n: int, clocks: list[Callable[[], float]] | None = None
) -> list[DHTNode]:
    peers = [await make_peer() for _ in range(n)]
    clocks = clocks or [time.time] * n
    nodes = [
        DHTNode(PeerTransport(p), signer=p.identity, rpc_timeout=15, clock=c)
        for p, c in zip(peers, clocks, strict=True)
    ]
    for node in nodes[1:]:
        await node.bootstrap([nodes[0].peer_id])
    return nodes


def peer_of(node: DHTNode) -> Peer:
    transport = node.transport
    assert isinstance(transport, PeerTransport)
    return transport.peer


async def test_progress_through_the_dht_with_clocks_off_by_minutes(make_peer: MakePeer) -> None:
    clocks = [time.time, lambda: time.time() - 240, lambda: time.time() + 240]  # 4 min slow, 4 min fast
    nodes = await dht_swarm(make_peer, 3, clocks)
    trackers = [
        ProgressTracker(n, "run", target=100, ttl_s=60, clock=c) for n, c in zip(nodes, clocks, strict=True)
    ]
    for i, t in enumerate(trackers):
        t.local.samples, t.local.samples_per_second = 10 * (i + 1), 1.0
    await trackers[0].publish()
    await trackers[2].publish()
    await trackers[1].refresh()  # the slow peer sees the others' clocks ahead of its own ...
    assert 200 < trackers[1].offset() < 520
    assert await trackers[1].publish()  # ... so its record still lies in everyone's future
    got = await trackers[0].refresh()
    assert got.peers == 3 and got.epoch == 0
    assert 60 <= got.samples < 60 + 3 * 31  # 10 + 20 + 30, plus at most 30 s of extrapolation each
    assert got.eta_s < 60 and not got.ready
    # without the offset, a record 4 minutes slow with a 60 s lifetime is already expired elsewhere
    naive = sign_record(peer_of(nodes[1]).identity, progress_key("run"), b"x", clocks[1]() + 60)
    assert not nodes[0].protocol.accept(encode_record(naive))


async def test_forged_replayed_and_expired_progress_records_are_refused(make_peer: MakePeer) -> None:
    nodes = await dht_swarm(make_peer, 3)
    alice, bob = nodes[0], nodes[1]
    reader = ProgressTracker(nodes[2], "run", target=100)
    key = progress_key("run")
    bob_id = peer_of(bob).identity
    old = LocalProgress("run", 1, 10, 1.0, time.time(), seq=1)
    new = LocalProgress("run", 1, 50, 1.0, time.time(), seq=2)
    old_record = sign_record(bob_id, key, encode_progress(old), time.time() + 30)
    new_record = sign_record(bob_id, key, encode_progress(new), time.time() + 60)
    await bob.store_records([new_record])
    assert (await reader.refresh()).samples >= 50

    # forged: bob's key and a real signature, over other content (a lying replica serves it)
    forged = Record(
        key,
        "",
        encode_progress(LocalProgress("run", 9, 10**6, 0.0, 0.0, 3)),
        new_record.expiration + 5,
        new_record.public_key,
        new_record.signature,
    )
    # replayed: bob's genuine older record, served by replicas that lost the newer one
    # expired: a genuine record whose lifetime is over
    expired = sign_record(peer_of(alice).identity, key, encode_progress(new), time.time() - 1)
    for node in nodes:
        node.storage = type(node.storage)()
        node.protocol.storage = node.storage
        key_id = forged.key_id
        node.storage._keys[key_id] = {forged.slot: forged}  # as a malicious holder would serve it
    got = await nodes[2].get(key)
    assert got.rejected >= 1 and not got.records
    for node in nodes:
        node.storage._keys[old_record.key_id] = {old_record.slot: old_record, expired.slot: expired}
    got = await nodes[2].get(key)
    assert list(got.records) == [old_record.slot]  # the expired one was dropped by the DHT
    reader.view.update(got.records.values(), reader.local_clock())
    assert reader.view.replays == 1
    assert reader.view.peers[bob.peer_id].progress.seq == 2  # the replay did not roll bob back
    derived = reader.progress()
    assert derived.epoch == 1 and derived.samples < 10**6


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batches(seed: int, n: int = 8) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(123))

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 16, generator=gen)
        return x, (x @ w).argmax(1)

    return next_batch


def collab(node: DHTNode, model: nn.Module, target: int = 64, **kw: object) -> CollaborativeOptimizer:
    config = CollabConfig(
        run="run",
        target_batch_size=target,
        publish_period_s=0.3,
        refresh_period_s=0.3,
        allreduce=AllReduceConfig(chunk=256, stall_timeout=5, round_timeout=30),
        matchmaking=MatchmakingConfig(gather_s=1.5, join_timeout=20),
        **kw,  # type: ignore[arg-type]
    )
    return CollaborativeOptimizer(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), peer_of(node), node, config
    )


async def train_until(opt: CollaborativeOptimizer, epoch: int, seed: int, deadline_s: float = 60) -> None:
    nxt = batches(seed)
    loss_fn = nn.CrossEntropyLoss()
    async with asyncio.timeout(deadline_s):
        while opt.epoch < epoch:
            x, y = nxt()
            loss_fn(opt.model(x), y).backward()
            await opt.step(len(x))
            await asyncio.sleep(0.02)  # a trainer's compute time; lets the others' links breathe


async def test_trainers_step_together_and_a_newcomer_takes_the_state(make_peer: MakePeer) -> None:
    nodes = await dht_swarm(make_peer, 4)
    opts = [collab(n, tiny_model()) for n in nodes[:3]]
    for o in opts:
        await o.join()
    await asyncio.gather(*(train_until(o, 2, seed=i) for i, o in enumerate(opts)))
    steps = [o.reports for o in opts]
    assert any(r.group_size >= 2 for s in steps for r in s)  # they did average, not just step alone
    full = [o for o in opts if all(r.group_size == 3 and r.round and r.round.complete for r in o.reports)]
    if len(full) == 3:  # every step taken by all three, fully averaged: identical models, bit for bit
        for o in full[1:]:
            for a, b in zip(o.model.parameters(), full[0].model.parameters(), strict=True):
                assert torch.equal(a, b)
    # a newcomer joins late: it downloads parameters and optimizer state and trains on from there
    late = collab(nodes[3], tiny_model(seed=99))
    report = await late.join()
    assert report is not None and late.epoch >= 2
    donor = next(o for o in opts if o.epoch == late.epoch)
    for a, b in zip(late.model.parameters(), donor.model.parameters(), strict=True):
        assert torch.equal(a, b)


async def test_a_corrupt_donor_is_detected_and_its_parts_fetched_elsewhere(
    make_peer: MakePeer, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = await dht_swarm(make_peer, 4)
    model = tiny_model()
    adam = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 16)).sum().backward()
    adam.step()
    snap = take_snapshot("run", 5, model, adam, part_bytes=512)
    donors = [StateDonor(peer_of(n), n, "run") for n in nodes[:3]]
    for d in donors:
        await d.publish(snap)
    liar = donors[1]
    honest_serve = peer_of(nodes[1]).handlers.unary[STATE_PART]

    async def corrupt(msg: Message, ctx: CallContext) -> Message:
        reply = await honest_serve(msg, ctx)
        bad = reply.tensors[0].clone()
        bad[0] ^= 0xFF
        return Message(Kind.RESPONSE, 0, tensors=[bad])

    peer_of(nodes[1]).handlers.add_unary(STATE_PART, corrupt)
    with caplog.at_level(logging.WARNING):
        manifest, blob, report = await download_state(peer_of(nodes[3]), nodes[3], "run")
    assert blob == snap.blob and manifest.epoch == 5
    assert report.corrupt == [liar.peer.peer_id] and report.parts_from[liar.peer.peer_id] == 0
    assert sum(report.parts_from.values()) == len(snap.manifest.part_hashes)
    assert f"from {liar.peer.peer_id} does not match" in caplog.text


async def test_all_peers_but_one_leave_and_it_trains_on_alone(
    make_peer: MakePeer, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = await dht_swarm(make_peer, 3)
    opts = [collab(n, tiny_model()) for n in nodes]
    for o in opts:
        await o.join()
    await asyncio.gather(*(train_until(o, 1, seed=i) for i, o in enumerate(opts)))
    for node in nodes[1:]:
        await peer_of(node).stop()
    survivor = opts[0]
    start = survivor.epoch
    with caplog.at_level(logging.INFO):
        await train_until(survivor, start + 2, seed=7, deadline_s=90)
    assert survivor.epoch == start + 2
    last = survivor.reports[-1]
    assert last.group_size == 1 and last.alone_because is not None


async def test_matchmaking_forms_one_group_and_refuses_a_latecomer(make_peer: MakePeer) -> None:
    nodes = sorted(await dht_swarm(make_peer, 4), key=lambda n: n.peer_id)
    config = MatchmakingConfig(gather_s=1.0, join_timeout=15)
    mms = [Matchmaker(peer_of(n), n, "run", config) for n in nodes]
    on_time, late = mms[:3], mms[3]  # the latecomer has the largest id, so it cannot be the leader
    groups = await asyncio.gather(
        *(m.form_group(1, 1000, 1e6, client=(i == 2), samples=10 * (i + 1)) for i, m in enumerate(on_time))
    )
    assert all(g == groups[0] for g in groups)  # every member got the very same group from the leader
    group = groups[0]
    assert group.samples == 10 + 20 + 30  # the epoch's size, told to every member alike
    assert set(group.members) == {n.peer_id for n in nodes[:3]} and group.members[0] == nodes[0].peer_id
    assert group.parts[group.index(nodes[2].peer_id)] == 0  # the client reduces nothing
    assert sum(group.parts) == 1000 and all(group.parts[group.index(n.peer_id)] > 0 for n in nodes[:2])
    with pytest.raises(GroupClosed):
        await late.form_group(1, 1000, 1e6)
    # the next epoch is open to everyone again
    groups = await asyncio.gather(*(m.form_group(2, 1000, 1e6) for m in mms))
    assert all(len(g.members) == 4 and g == groups[0] for g in groups)


async def test_int8_rounds_with_a_client_trainer_step_identically(make_peer: MakePeer) -> None:
    nodes = await dht_swarm(make_peer, 3)
    opts = [
        collab(n, tiny_model(), compression=Compression.INT8, client=(i == 2)) for i, n in enumerate(nodes)
    ]
    assert opts[2].acts_as_client() and not opts[0].acts_as_client()
    for o in opts:
        await o.join()
    await asyncio.gather(*(train_until(o, 2, seed=i) for i, o in enumerate(opts)))
    rounds = [r.round for o in opts for r in o.reports if r.round is not None]
    assert rounds, "no round was averaged"
    full = [o for o in opts if all(r.group_size == 3 and r.round and r.round.complete for r in o.reports)]
    if len(full) == 3:  # every step taken together: int8 averages are the same bits on every member
        for o in full[1:]:
            for a, b in zip(o.model.parameters(), full[0].model.parameters(), strict=True):
                assert torch.equal(a, b)
    assert opts[0].feedback.residual is not None and bool(opts[0].feedback.residual.abs().sum() > 0)


async def test_a_leader_waits_for_expected_peers_and_hands_over_to_a_smaller_id(make_peer: MakePeer) -> None:
    small, large = sorted(await dht_swarm(make_peer, 2), key=lambda n: n.peer_id)
    config = MatchmakingConfig(gather_s=1.0, max_wait_s=8.0, join_timeout=20)
    first, second = (
        Matchmaker(peer_of(small), small, "run", config),
        Matchmaker(peer_of(large), large, "run", config),
    )

    async def late(m: Matchmaker, epoch: int, expected: set[str]) -> Group:
        await asyncio.sleep(3.0)  # later than gather_s: without waiting, the group would be frozen
        return await m.form_group(epoch, 100, 1.0, expected=expected)

    # the leader (smallest id) is early and expects the other
    a, b = await asyncio.gather(
        first.form_group(1, 100, 1.0, expected={large.peer_id}), late(second, 1, {small.peer_id})
    )
    assert a == b and set(a.members) == {small.peer_id, large.peer_id}
    # the larger id is early and leads for a while; the smaller declares late and takes over
    b, a = await asyncio.gather(
        second.form_group(2, 100, 1.0, expected={small.peer_id}), late(first, 2, {large.peer_id})
    )
    assert a == b and a.members[0] == small.peer_id and len(a.members) == 2


async def test_parameters_and_optimizer_state_are_averaged_every_k_epochs(make_peer: MakePeer) -> None:
    nodes = await dht_swarm(make_peer, 2)
    models = [tiny_model(seed=0), tiny_model(seed=1)]  # members that drifted apart
    before = [[p.detach().clone() for p in m.parameters()] for m in models]
    opts = []
    for node, model in zip(nodes, models, strict=True):
        config = CollabConfig(
            run="run",
            target_batch_size=16,
            publish_period_s=0.3,
            refresh_period_s=0.3,
            average_state_every=1,
            allreduce=AllReduceConfig(chunk=256, stall_timeout=5, round_timeout=30),
            matchmaking=MatchmakingConfig(gather_s=1.5, join_timeout=20),
        )
        # lr 0: the gradient step moves nothing, so the parameters after the step are exactly the
        # average of the two starting points; the momentum buffers are the averaged gradient on both
        sgd = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
        opts.append(CollaborativeOptimizer(model, sgd, peer_of(node), node, config))
    for o in opts:
        await o.join()
    await asyncio.gather(*(train_until(o, 1, seed=i) for i, o in enumerate(opts)))
    reports = [o.reports[-1] for o in opts]
    if not all(r.group_size == 2 and r.state_round is not None and r.state_round.complete for r in reports):
        pytest.fail(f"the step was not taken together: {reports}")
    for i, (a, b) in enumerate(zip(models[0].parameters(), models[1].parameters(), strict=True)):
        assert torch.equal(a, b)
        assert torch.allclose(a, (before[0][i] + before[1][i]) / 2, atol=1e-6)
        assert not torch.allclose(a, before[0][i])
        bufs = [o.optimizer.state[p]["momentum_buffer"] for o, p in zip(opts, (a, b), strict=True)]
        assert torch.equal(bufs[0], bufs[1]) and bool(bufs[0].abs().sum() > 0)


def test_a_resized_group_keeps_members_and_shares() -> None:
    group = Group("r", ("a", "b", "c"), (500, 0, 300), Compression.INT8)
    state = group.resized(2003, "r/state", Compression.NONE)
    assert state.members == group.members and state.compression == Compression.NONE
    assert sum(state.parts) == 2003 and state.parts[1] == 0
    assert abs(state.parts[0] / 2003 - 500 / 800) < 1e-3
    assert group.resized(2003, "r/state", Compression.NONE) == state  # every member derives the same


async def test_a_killed_trainer_is_dropped_at_once_and_costs_no_round(make_peer: MakePeer) -> None:
    nodes = await dht_swarm(make_peer, 3)
    # A leader waits up to max_wait_s for every peer it expects; with a dead peer still expected (its
    # progress record lives on for stale_after_s) the next step would wait that long, past the deadline.
    opts = [collab(n, tiny_model(), target=48) for n in nodes]
    for o in opts:
        o.matchmaker.config.max_wait_s = 90
    for o in opts:
        await o.join()
    await asyncio.gather(*(train_until(o, 1, seed=i) for i, o in enumerate(opts)))
    victim = min(opts, key=lambda o: o.peer.peer_id)  # the would-be leader of every group
    survivors = [o for o in opts if o is not victim]
    await victim.peer.stop()  # killed: no goodbye beyond its links closing
    async with asyncio.timeout(20):
        while any(victim.peer.peer_id not in o.tracker.view.gone for o in survivors):
            await asyncio.sleep(0.1)
    for o in survivors:  # its last progress record is still live in the DHT, but no longer counted
        assert victim.peer.peer_id not in o.tracker.view.active(time.monotonic())
    start = max(o.epoch for o in survivors)
    await asyncio.gather(
        *(train_until(o, start + 1, seed=10 + i, deadline_s=45) for i, o in enumerate(survivors))
    )
    # the very next step was taken by both survivors together, fully averaged: nobody stepped alone
    nxt = [next(r for r in o.reports if r.epoch == start + 1) for o in survivors]
    assert all(r.group_size == 2 and r.round is not None and r.round.complete for r in nxt)
    for a, b in zip(survivors[0].model.parameters(), survivors[1].model.parameters(), strict=True):
        assert torch.equal(a, b)
