"""Byzantine members against the real collab code, no sockets: each attack of issue 28 (weight 1e9,
values 1e28, a sign-flipped x1000 vector, bandwidth 1e300, a state record at epoch 10^9, a manifest
of 2^50 bytes, 2^53 claimed samples, a join's inflated samples) no longer steers the result.

The stated distance is CenteredClip's bound (engine/collab/robust.py): with the Byzantine share
``delta`` of the bounded weight below 1/2, the result lies within ``delta^L e0 + delta tau / (1 -
delta)`` of the honest members' weighted mean, ``tau`` the radius used and ``e0`` the start's distance;
each test checks the bound's precondition (honest members within ``tau`` throughout) as well.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable, Sequence

import msgspec
import pytest
import torch
from torch import nn

from engine.collab import AllReduceConfig, AllReduceService, CenteredClipConfig, Group
from engine.collab.errors import (
    GroupRefused,
    ManifestRefused,
    NoStateMajority,
    PartRejected,
    WeightRefused,
)
from engine.collab.matchmaking import check_group, freeze_group
from engine.collab.progress import LocalProgress, Seen, derive_progress
from engine.collab.reducer import PartReducer
from engine.collab.robust import _median, bounded_weights, centered_clip, max_share
from engine.collab.snapshot import (
    Manifest,
    StateRecord,
    TensorEntry,
    check_manifest,
    choose_state,
    encode_manifest,
    state_bytes_bound,
    take_snapshot,
)
from engine.collab.state import STATE_MANIFEST, StateDonor, download_state
from engine.collab.stepping import step_scale
from engine.p2p import CallContext
from engine.wire import Compression, Kind, Message
from tests.unit.collab.mesh import FakeDHT, mesh

D = 2000
CONFIG = CenteredClipConfig()  # the defaults: radius 1 x the median distance, 3 iterations
WIDE = CenteredClipConfig(tau_scale=3.0, iterations=5)  # a radius that leaves the honest unclipped
MODEL_SLACK = 1.25  # bound (b) is a model: an attack correlated with one honest member's noise gets past it


def honest_vectors(n: int, seed: int, spread: float = 0.1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(D, generator=g)
    return [base + spread * torch.randn(D, generator=g) for _ in range(n)]


def weighted_mean(xs: Sequence[torch.Tensor], ws: Sequence[float]) -> torch.Tensor:
    return sum((w * x for x, w in zip(xs, ws, strict=True)), torch.zeros(D)) / sum(ws)


def assert_within_bound(
    result: torch.Tensor,
    everyone: Sequence[torch.Tensor],
    weights: Sequence[float],
    honest: Sequence[int],
    tau: float,
    config: CenteredClipConfig = CONFIG,
) -> float:
    """Check ``|v - m| <= q max(tau, r / sqrt(1 - q^2)) + delta^L e_0`` (robust.py's bounds (a) and
    (b)) and, for a radius that leaves the honest unclipped, bound (a)'s precondition; return it."""
    bounded = bounded_weights(weights, config.weight_to_median)
    hx = [everyone[i] for i in honest]
    hw = [bounded[i] for i in honest]
    m = weighted_mean(hx, hw)
    delta = (math.fsum(bounded) - math.fsum(hw)) / math.fsum(bounded)
    assert delta < 0.5
    q = delta / (1 - delta)
    r = max(float((x - m).norm()) for x in hx)
    live = [x for x, w in zip(everyone, bounded, strict=True) if w > 0]
    e0 = float((torch.from_numpy(_median(torch.stack(live).numpy())) - m).norm())
    clipped_bound = q * r / math.sqrt(1 - q * q)
    if config.tau_scale >= 3:  # (a): deterministic
        assert r + max(e0, q * tau) <= tau, "bound (a)'s precondition: honest members within tau"
        stated = q * tau + delta**config.iterations * e0
    else:
        stated = max(q * tau, MODEL_SLACK * clipped_bound) + delta**config.iterations * e0
    assert float((result - m).norm()) <= stated * (1 + 1e-4) + 1e-4
    return stated


# -- CenteredClip, the pure function -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_honest_members_that_agree_get_the_weighted_mean(seed: int) -> None:
    xs = honest_vectors(6, seed)
    ws = [8.0, 12.0, 10.0, 6.0, 16.0, 9.0]
    expected = weighted_mean(xs, ws)
    # every deviation inside tau (a radius 3 x the median distance; weights within twice the median)
    loose = CenteredClipConfig(tau_scale=3.0, weight_to_median=2.0)
    assert bounded_weights(ws, loose.weight_to_median) == ws
    got, report = centered_clip(xs, ws, loose)
    assert not any(report.clipped)
    assert torch.allclose(got, expected, rtol=0, atol=1e-5)
    # an absolute radius larger than every deviation: the same
    wide, _ = centered_clip(xs, ws, CenteredClipConfig(tau=1e6, weight_to_median=2.0))
    assert torch.allclose(wide, expected, rtol=0, atol=1e-5)
    # the defaults clip about half of them a little (and count none above the median weight):
    # a robust average within a fraction of one member's spread of the weighted mean
    default, report = centered_clip(xs, ws, CONFIG)
    spread = max(float((x - expected).norm()) for x in xs)
    assert 0 < sum(report.clipped) < len(xs)
    assert float((default - expected).norm()) < 0.25 * spread


def attacks(honest: Sequence[torch.Tensor]) -> dict[str, Callable[[int], torch.Tensor]]:
    mean = torch.stack(list(honest)).mean(0)
    std = torch.stack(list(honest)).std(0)
    return {
        "sign_flip_x1000": lambda i: -1000.0 * honest[i % len(honest)],
        "values_1e28": lambda i: torch.full((D,), 1e28),
        "float_max": lambda i: torch.full((D,), 3e38 if i % 2 else -3e38),
        "alie": lambda i: mean - 1.0 * std,
        "zeros": lambda i: torch.zeros(D),
    }


@pytest.mark.parametrize("config", [CONFIG, WIDE], ids=["default", "wide"])
@pytest.mark.parametrize("spread", [0.1, 10.0])
@pytest.mark.parametrize("byzantine", [1, 2, 3])
@pytest.mark.parametrize("attack", ["sign_flip_x1000", "values_1e28", "float_max", "alie", "zeros"])
def test_the_bound_holds_for_every_attack(
    byzantine: int, attack: str, spread: float, config: CenteredClipConfig
) -> None:
    honest = honest_vectors(8 - byzantine, seed=byzantine, spread=spread)
    bad = [attacks(honest)[attack](i) for i in range(byzantine)]
    everyone = [*honest, *bad]
    weights = [8.0] * 8
    got, report = centered_clip(everyone, weights, config)
    assert torch.isfinite(got).all()
    stated = assert_within_bound(got, everyone, weights, range(8 - byzantine), report.tau, config)
    # a fraction of one honest member's spread, not the attack's scale (1e28, or 1000 x a gradient)
    r = max(float((x - weighted_mean(honest, [8.0] * len(honest))).norm()) for x in honest)
    assert stated < (1.5 if config is CONFIG else 3.0) * r


def test_weights_are_bounded_by_the_groups_median() -> None:
    assert bounded_weights([256.0, 256.0, 1e9], 1.0) == [256.0, 256.0, 256.0]
    assert bounded_weights([256.0, 256.0, 1e9], 2.0) == [256.0, 256.0, 512.0]
    assert bounded_weights([4.0, 2.0, 6.0, 8.0], 1.0) == [4.0, 2.0, 5.0, 5.0]  # median of 4: 5
    assert bounded_weights([0.0, 0.0, 5.0], 1.0) == [0.0, 0.0, 5.0]  # zeros are not in the median
    assert bounded_weights([0.0, 0.0], 1.0) == [0.0, 0.0]
    # weight 0 takes no part; with nothing weighed the result is zeros, as the weighted sum would be
    xs = honest_vectors(3, 0)
    got, report = centered_clip([*xs, torch.full((D,), 1e28)], [1.0, 1.0, 1.0, 0.0], CONFIG)
    assert float((got - weighted_mean(xs, [1.0] * 3)).norm()) < 0.25 * float((xs[0] - xs[1]).norm())
    assert not report.clipped[3] and report.distances[3] == 0.0
    zero, _ = centered_clip(xs, [0.0, 0.0, 0.0], CONFIG)
    assert torch.equal(zero, torch.zeros(D))


def test_a_member_at_the_weight_cap_counts_as_the_median_member() -> None:
    # one of four claims twice the others' samples (the most a reducer takes): counted as the median
    honest = honest_vectors(3, 7)
    everyone = [*honest, -1000.0 * honest[0]]
    weights = [256.0, 256.0, 256.0, 512.0]
    got, report = centered_clip(everyone, bounded_weights(weights, CONFIG.weight_to_median), CONFIG)
    assert_within_bound(got, everyone, weights, range(3), report.tau)
    assert report.clipped[3]


def test_max_share() -> None:
    assert max_share(1) == 1.0 and max_share(2) == 1.0
    assert max_share(8) == 0.25 and max_share(5) == 0.4
    assert max_share(8, reducers=2) == 0.5  # the parts must still cover the vector


# -- the reducer: one member of three --------------------------------------------------------------


def reducer_of_three(max_weight: float = 512.0) -> PartReducer:
    return PartReducer(Group("r", ("me", "a", "evil"), (D, 0, 0)), "me", D, 5.0, max_weight=max_weight)


async def test_weight_1e9_is_refused_and_its_sender_excluded(caplog: pytest.LogCaptureFixture) -> None:
    x, y = honest_vectors(2, 1)
    r = reducer_of_three()
    r.add("me", 0, x, 256.0)
    r.add("a", 0, y, 256.0)
    with caplog.at_level(logging.WARNING), pytest.raises(WeightRefused, match="weight 1000000000"):
        r.add("evil", 0, torch.randn(D), 1e9)
    assert "evil" in r.excluded and "excluded evil" in caplog.text
    assert r.refusals.by_kind == {"WeightRefused": 1} and r.refusals.by_sender == {"evil": 1}
    got = await r.result("a", 0)
    assert torch.allclose(got, (x + y) / 2, atol=1e-5)  # as if it had never sent anything


@pytest.mark.parametrize("bad", ["values_1e28", "sign_flip_x1000"])
async def test_one_member_of_three_cannot_move_the_result_past_the_bound(bad: str) -> None:
    x, y = honest_vectors(2, 2)
    evil = torch.full((D,), 1e28) if bad == "values_1e28" else -1000.0 * x
    r = reducer_of_three()
    r.add("me", 0, x, 256.0)
    r.add("a", 0, y, 256.0)
    r.add("evil", 0, evil, 256.0)  # as many samples as an honest member: accepted, then clipped
    got = await r.result("a", 0)
    assert r.clipped["evil"] == 1 and r.outliers == {"evil": 1} and not r.excluded
    stated = assert_within_bound(got, [x, y, evil], [256.0] * 3, [0, 1], r.taus[0])
    # the honest mean is about 45 long, the honest members 6.3 apart; the attack, 1e28 or 45,000 away
    assert stated < 1.5 * float((x - y).norm())


async def test_the_plain_mean_is_still_there_undefended() -> None:
    x, y = honest_vectors(2, 2)
    r = PartReducer(Group("r", ("me", "a", "evil"), (D, 0, 0)), "me", D, 5.0, robust=None)
    r.add("me", 0, x, 256.0)
    r.add("a", 0, y, 256.0)
    r.add("evil", 0, torch.full((D,), 1e28), 256.0)
    assert float((await r.result("a", 0)).abs().min()) > 1e27  # the attack issue 28 measured


# -- the all-reduce service over in-memory links (real framing, codec and RPC) ---------------------


async def test_all_reduce_with_a_member_sending_1e28_or_weight_1e9() -> None:
    ids = ["m0" * 20, "m1" * 20, "m2" * 20]
    peers = mesh(ids)
    honest_config = AllReduceConfig(chunk=512, stall_timeout=5, round_timeout=30, max_weight=512)
    evil_config = AllReduceConfig(chunk=512, stall_timeout=5, round_timeout=30, max_weight=1e12)
    svcs = [
        AllReduceService(p, c)
        for p, c in zip(peers, [honest_config, honest_config, evil_config], strict=True)
    ]
    x, y = honest_vectors(2, 3)
    for round_no, (evil_vector, evil_weight) in enumerate([(torch.full((D,), 1e28), 256.0), (-x, 1e9)]):
        group = Group(f"run/{round_no}", tuple(ids), (D // 2, D - D // 2, 0))  # the attacker is a client
        work = [x.clone(), y.clone(), evil_vector.clone()]
        reports = await asyncio.wait_for(
            asyncio.gather(
                *(
                    s.all_reduce(group, v, w)
                    for s, v, w in zip(svcs, work, [256.0, 256.0, evil_weight], strict=True)
                )
            ),
            30,
        )
        assert torch.equal(work[0], work[1])  # the honest members got the very same result
        if evil_weight > 512:  # refused by both reducers; the honest round finished without it
            assert all(ids[2] in r.excluded and "weight" in r.excluded[ids[2]] for r in reports[:2])
            assert torch.allclose(work[0], (x + y) / 2, atol=1e-5)
            assert set(reports[2].failed_reducers) == set(ids[:2])  # the attacker kept its own values
        else:
            assert float((work[0] - (x + y) / 2).norm()) < 1.5 * float((x - y).norm())
            assert all(r.clipped.get(ids[2]) for r in reports[:2])
    assert svcs[0].refusals.by_sender == {ids[2]: 1} and svcs[1].refusals.by_sender == {ids[2]: 1}
    for p in peers:
        p.close()


async def test_a_member_whose_own_part_is_refused_does_not_crash_its_round() -> None:
    # non-finite values (a diverged model, or a weight above the bound sent by a modified client):
    # refused by every reducer, its own included; its round reports so instead of raising
    ids = ["n0" * 20, "n1" * 20, "n2" * 20]
    peers = mesh(ids)
    svcs = [AllReduceService(p, AllReduceConfig(chunk=512, stall_timeout=5, round_timeout=30)) for p in peers]
    group = Group("run/nan", tuple(ids), (700, 700, D - 1400))
    x, y = honest_vectors(2, 4)
    work = [x.clone(), y.clone(), torch.full((D,), float("nan"))]
    reports = await asyncio.wait_for(
        asyncio.gather(*(s.all_reduce(group, v, 8.0) for s, v in zip(svcs, work, strict=True))), 30
    )
    assert ids[2] in reports[2].failed_reducers and "own part" in reports[2].failed_reducers[ids[2]]
    assert all(ids[2] in r.excluded for r in reports)
    assert torch.equal(work[0], work[1]) and torch.allclose(work[0], (x + y) / 2, atol=1e-5)
    for p in peers:
        p.close()


# -- bandwidth claims and the leader's group ---------------------------------------------------------


def test_a_claimed_bandwidth_of_1e300_reduces_at_most_twice_an_even_share() -> None:
    members = [f"p{i}" for i in range(5)]
    info = [(1e300, False, 64), *[(1e7, False, 64)] * 4]
    group = freeze_group("r", members, info, 100_000, Compression.NONE, target=256)
    assert group.parts[0] <= math.ceil(100_000 * 2 / 5) and all(group.parts[1:])
    check_group(group, 256)


def test_a_joins_inflated_samples_count_for_its_share_only() -> None:
    members = [f"p{i}" for i in range(5)]
    info = [*[(1e7, False, 64)] * 4, (1e7, False, 2**53 - 1)]
    group = freeze_group("r", members, info, 1000, Compression.NONE, target=256)
    assert group.samples == 4 * 64 + math.ceil(0.4 * 256)
    assert step_scale(group.samples, 256) == pytest.approx(359 / 256)  # not the 2x cap
    check_group(group, 256)


def test_a_leaders_group_beyond_the_bounds_is_refused() -> None:
    members = tuple(f"p{i}" for i in range(5))
    with pytest.raises(GroupRefused, match="share cap"):
        check_group(Group("r", members, (996, 1, 1, 1, 1)), 256)
    with pytest.raises(GroupRefused, match="samples"):
        check_group(Group("r", members, (200,) * 5, samples=2**52), 256)


# -- progress claims -------------------------------------------------------------------------------


def test_one_peer_claiming_2_53_samples_or_due_does_not_close_every_epoch() -> None:
    honest = {n: Seen(LocalProgress("run", 3, 5, 0.0, 0.0, 1), 0.0) for n in "abcd"}
    liar = Seen(LocalProgress("run", 3, 2**53, 0.0, 0.0, 1), 0.0)
    got = derive_progress({**honest, "evil": liar}, 0.0, 256)
    assert not got.ready and got.capped == 1 and got.samples == 20 + 0.4 * 256
    due_liar = Seen(LocalProgress("run", 3, 2**53, 0.0, 0.0, 1, due=True), 0.0)
    got = derive_progress({**honest, "evil": due_liar}, 0.0, 256)
    assert got.due == 0 and not got.ready
    # the epoch closes when the honest peers bring their part: 3/5 of the target (or 1/10 with due)
    enough = {n: Seen(LocalProgress("run", 3, 39, 0.0, 0.0, 1), 0.0) for n in "abcd"}
    assert derive_progress({**enough, "evil": liar}, 0.0, 256).ready
    # an honest due, seen by the others, still closes the epoch for everyone
    peers = {n: Seen(LocalProgress("run", 3, 60, 0.0, 0.0, 1, due=(n == "a")), 0.0) for n in "abcd"}
    assert derive_progress(peers, 0.0, 256).ready


# -- state: the majority's, bounded by the model ------------------------------------------------------


def trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def test_a_record_at_epoch_1e9_is_one_vote() -> None:
    records = {n: StateRecord(7, b"honest", 6, b"before") for n in "abc"}
    records["evil"] = StateRecord(10**9, b"forged", 10**9 - 1, b"forged-1")
    assert choose_state(records) == (7, b"honest", ["a", "b", "c"])
    # as many liars as honest donors: nothing is taken (never the liars' state)
    records["evil2"] = StateRecord(10**9, b"forged")
    records["evil3"] = StateRecord(10**9, b"forged")
    with pytest.raises(NoStateMajority):
        choose_state(records)


async def test_a_newcomer_takes_the_majoritys_state_not_the_newest_claimed() -> None:
    ids = ["d0" * 20, "d1" * 20, "d2" * 20, "ev" * 20, "nw" * 20]
    peers = mesh(ids)
    dht = FakeDHT()
    model, opt = trained(0)
    honest = take_snapshot("run", 7, model, opt, part_bytes=256)
    forged_model, forged_opt = trained(1)
    forged = take_snapshot("run", 10**9, forged_model, forged_opt, part_bytes=256)
    for p, snap in zip(peers[:4], [honest, honest, honest, forged], strict=True):
        await StateDonor(p, dht.node(p.peer_id), "run").publish(snap)
    newcomer, _ = trained(2)
    manifest, blob, report = await download_state(
        peers[4],
        dht.node(ids[4]),
        "run",
        model=newcomer,
    )
    assert manifest.epoch == 7 and blob == honest.blob and ids[3] not in report.donors
    for p in peers:
        p.close()


def huge_manifest(epoch: int) -> Manifest:
    entries = [TensorEntry("param.0.weight", "float32", [2**48])]
    return Manifest("run", epoch, 1 << 18, 2**50, entries, [b"\0" * 32])  # what a wire message holds


def test_a_manifest_of_2_50_bytes_is_refused_before_anything_is_allocated() -> None:
    model, _ = trained(0)
    bound = state_bytes_bound(model)
    assert bound < 10_000  # 211 float32 parameters, 3 optimizer copies, scalars
    with pytest.raises(ManifestRefused, match="bytes"):
        check_manifest(huge_manifest(7), "run", 7, model)
    with pytest.raises(ManifestRefused):  # no model to check against: still bounded (16 GiB)
        check_manifest(huge_manifest(7), "run", 7, None)
    other = nn.Sequential(nn.Linear(8, 17), nn.ReLU(), nn.Linear(17, 3))
    snap = take_snapshot("run", 7, *trained(0))
    with pytest.raises(ManifestRefused, match="does not fit"):
        check_manifest(snap.manifest, "run", 7, other)
    check_manifest(snap.manifest, "run", 7, model)  # a real one passes


async def test_a_majority_serving_a_2_50_byte_manifest_gets_a_typed_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = ["d0" * 20, "d1" * 20, "d2" * 20, "nw" * 20]
    peers = mesh(ids)
    dht = FakeDHT()
    raw = encode_manifest(huge_manifest(7))
    digest = hashlib.sha256(raw).digest()

    async def serve(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields={"manifest": raw})

    for p in peers[:3]:
        p.handlers.add_unary(STATE_MANIFEST, serve)
        await dht.node(p.peer_id).store("run.state", msgspec.msgpack.encode(StateRecord(7, digest)), 0.0)
    model, _ = trained(0)
    with caplog.at_level(logging.WARNING), pytest.raises(ManifestRefused):
        await download_state(peers[3], dht.node(ids[3]), "run", model=model)
    assert f"from {ids[0]}" in caplog.text  # logged with the sender
    for p in peers:
        p.close()


def test_typed_errors_are_collab_errors() -> None:
    from engine.collab.errors import CollabError, MatchmakingFailed, StateDownloadFailed

    assert issubclass(WeightRefused, PartRejected) and issubclass(PartRejected, CollabError)
    assert issubclass(GroupRefused, MatchmakingFailed)
    assert issubclass(ManifestRefused, StateDownloadFailed) and issubclass(
        NoStateMajority, StateDownloadFailed
    )
