"""Butterfly all-reduce over real aiortc links on loopback: averages (the plain weighted mean, and the
default CenteredClip with bounded weights), compression, and faults (wrong-size and non-finite parts, a
member that leaves mid-round, a peer that is not in the round)."""

import asyncio
import logging

import pytest
import torch

from engine.collab import AllReduceConfig, AllReduceService, CenteredClipConfig, Group, balance_parts
from engine.collab.allreduce import REDUCE
from engine.collab.robust import bounded_weights, centered_clip
from engine.p2p import Peer, RemoteError
from engine.wire import Compression
from tests.integration.conftest import MakePeer

SIZE = 20_000
CHUNK = 2048


DEFAULT = CenteredClipConfig()


async def services(
    make_peer: MakePeer, n: int, stall: float = 3.0, robust: CenteredClipConfig | None = DEFAULT
) -> list[AllReduceService]:
    config = AllReduceConfig(
        chunk=CHUNK, window=3, stall_timeout=stall, round_timeout=60, register_wait=10, robust=robust
    )
    peers = [await make_peer() for _ in range(n)]
    # connect every pair up front so that dialing does not count against the stall timeout
    await asyncio.gather(*(a.connect(b.peer_id) for i, a in enumerate(peers) for b in peers[i + 1 :]))
    return [AllReduceService(p, config) for p in peers]


def make_group(svcs: list[AllReduceService], bandwidths: list[float], comp: Compression) -> Group:
    members = tuple(s.me for s in svcs)
    return Group("run/1/test", members, balance_parts(SIZE, bandwidths), comp)


@pytest.mark.parametrize(
    ("comp", "robust"),
    [(Compression.NONE, None), (Compression.INT8, None), (Compression.NONE, DEFAULT)],
    ids=["mean", "mean-int8", "centered-clip"],
)
async def test_weighted_average_with_a_client(
    make_peer: MakePeer, comp: Compression, robust: CenteredClipConfig | None
) -> None:
    svcs = await services(make_peer, 4, robust=robust)
    group = make_group(svcs, [1.0, 2.0, 1.0, 0.0], comp)  # the last member is a client
    assert group.parts[3] == 0 and all(group.parts[:3])
    torch.manual_seed(0)
    vectors = [torch.randn(SIZE) for _ in svcs]
    weights = [1.0, 2.0, 3.0, 4.0]
    if robust is None:  # the plain weighted mean
        expected = sum(w * v for w, v in zip(weights, vectors, strict=True)) / sum(weights)
    else:  # every reducer's chunks combined by CenteredClip, weights bounded by the median's
        expected = torch.empty(SIZE)
        bounded = bounded_weights(weights, robust.weight_to_median)
        for j in range(3):
            lo, hi = group.part_range(j)
            for a in range(lo, hi, CHUNK):
                b = min(hi, a + CHUNK)
                expected[a:b] = centered_clip([v[a:b] for v in vectors], bounded, robust)[0]
    work = [v.clone() for v in vectors]
    reports = await asyncio.wait_for(
        asyncio.gather(*(s.all_reduce(group, w, wt) for s, w, wt in zip(svcs, work, weights, strict=True))),
        60,
    )
    assert all(r.complete for r in reports), reports
    for w in work[1:]:
        assert torch.equal(w, work[0])  # identical on every member, bit for bit
    tolerance = 1e-5 if comp == Compression.NONE else float(expected.abs().max()) / 60
    assert (work[0] - expected).abs().max() <= tolerance
    assert reports[3].bytes_sent > 0  # the client sent its whole vector and reduced nothing


@pytest.mark.parametrize(
    ("bad", "why"),
    [(torch.ones(CHUNK - 1), "expected 2048"), (torch.full((CHUNK,), float("nan")), "non-finite")],
)
async def test_a_member_sending_bad_parts_is_excluded_and_named(
    make_peer: MakePeer, caplog: pytest.LogCaptureFixture, bad: torch.Tensor, why: str
) -> None:
    svcs = await services(make_peer, 3)
    group = make_group(svcs, [1.0, 1.0, 0.0], Compression.NONE)
    liar: Peer = svcs[2].peer
    vectors = [torch.full((SIZE,), 1.0), torch.full((SIZE,), 3.0)]
    with caplog.at_level(logging.WARNING):
        honest = asyncio.gather(
            *(s.all_reduce(group, v, 1.0) for s, v in zip(svcs[:2], vectors, strict=True))
        )
        with pytest.raises(RemoteError, match=why):
            await liar.call(
                svcs[0].me, REDUCE, {"round": group.round_id, "chunk": 0, "weight": 1.0}, [bad], timeout=30
            )
        reports = await asyncio.wait_for(honest, 60)
    assert liar.peer_id in reports[0].excluded and why in reports[0].excluded[liar.peer_id]
    assert f"excluded {liar.peer_id}" in caplog.text
    assert torch.equal(vectors[0], torch.full((SIZE,), 2.0)) and torch.equal(vectors[1], vectors[0])


async def test_a_member_that_leaves_mid_round_is_dropped_by_timeout(make_peer: MakePeer) -> None:
    svcs = await services(make_peer, 4, stall=5.0)
    group = make_group(svcs, [1.0, 1.0, 1.0, 1.0], Compression.NONE)
    vectors = [torch.full((SIZE,), float(i)) for i in range(4)]
    leaver = asyncio.ensure_future(svcs[3].all_reduce(group, vectors[3], 1.0))
    await asyncio.sleep(0.05)
    leaver.cancel()
    await svcs[3].peer.stop()  # gone: its links close, it reduces nothing more
    reports = await asyncio.wait_for(
        asyncio.gather(*(s.all_reduce(group, v, 1.0) for s, v in zip(svcs[:3], vectors[:3], strict=True))), 90
    )
    gone = svcs[3].me
    for r in reports:
        assert gone in r.failed_reducers  # its slice stayed local everywhere, and the round finished
        assert gone in r.excluded
    lo, hi = group.part_range(3)
    # the slices the live reducers own are averaged identically among the three that stayed
    # (the leaver may have delivered some early chunks before leaving; those count, as the same
    # contribution for everyone)
    for j in range(3):
        a, b = group.part_range(j)
        assert torch.equal(vectors[0][a:b], vectors[1][a:b]) and torch.equal(vectors[1][a:b], vectors[2][a:b])
    assert all(torch.equal(v[lo:hi], torch.full((hi - lo,), float(i))) for i, v in enumerate(vectors[:3]))


async def test_a_peer_joining_mid_round_is_refused_and_changes_nothing(make_peer: MakePeer) -> None:
    svcs = await services(make_peer, 2, stall=10.0)
    newcomer = await make_peer()
    await asyncio.wait_for(newcomer.connect(svcs[0].me), 30)  # dialing must not outlast the round
    group = make_group(svcs, [1.0, 1.0], Compression.NONE)
    vectors = [torch.full((SIZE,), 1.0), torch.full((SIZE,), 5.0)]
    # Only the first member starts, so the round stays open (waiting on the second) while the
    # newcomer's chunk arrives: the refusal must come from membership, not from a round already over.
    first = asyncio.ensure_future(svcs[0].all_reduce(group, vectors[0], 1.0))
    async with asyncio.timeout(10):
        while group.round_id not in svcs[0]._rounds:
            await asyncio.sleep(0.01)
    with pytest.raises(RemoteError, match="not a member"):
        await newcomer.call(
            svcs[0].me,
            REDUCE,
            {"round": group.round_id, "chunk": 0, "weight": 1.0},
            [torch.ones(CHUNK)],
            timeout=30,
        )
    second = svcs[1].all_reduce(group, vectors[1], 1.0)
    reports = await asyncio.wait_for(asyncio.gather(first, second), 60)
    assert all(r.complete for r in reports)
    assert torch.equal(vectors[0], torch.full((SIZE,), 3.0))
    with pytest.raises(RemoteError, match=r"unknown_round|no round"):
        await newcomer.call(
            svcs[0].me, REDUCE, {"round": "nope", "chunk": 0, "weight": 1.0}, [torch.ones(3)], timeout=30
        )


async def test_a_finished_round_lets_go_of_its_slice_and_refuses_late_chunks(make_peer: MakePeer) -> None:
    svcs = await services(make_peer, 2)
    for s in svcs:
        s.config.register_wait = 120  # a late chunk must be told at once, not after this wait
    group = make_group(svcs, [1.0, 1.0], Compression.NONE)
    vectors = [torch.full((SIZE,), 1.0), torch.full((SIZE,), 5.0)]
    reports = await asyncio.wait_for(
        asyncio.gather(*(s.all_reduce(group, v, 1.0) for s, v in zip(svcs, vectors, strict=True))), 60
    )
    assert all(r.complete for r in reports)
    assert all(torch.equal(v, torch.full((SIZE,), 3.0)) for v in vectors)
    assert not svcs[0]._rounds and not svcs[1]._rounds  # no accumulator outlives its round
    with pytest.raises(RemoteError, match="unknown_round"):
        await svcs[1].peer.call(
            svcs[0].me,
            REDUCE,
            {"round": group.round_id, "chunk": 0, "weight": 1.0},
            [torch.ones(CHUNK)],
            timeout=30,  # well under register_wait: only an answer at once passes
        )
