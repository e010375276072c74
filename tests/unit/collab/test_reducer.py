"""PartReducer without a network: averaging, exclusion of bad or stalled senders, bounded waits."""

import asyncio
import logging
from typing import Any

import pytest
import torch

from engine.collab.errors import PartRejected
from engine.collab.group import Group
from engine.collab.reducer import PartReducer
from engine.collab.robust import CenteredClipConfig, bounded_weights, centered_clip
from engine.wire import Compression

MEAN: dict[str, Any] = {"robust": None}  # the plain weighted mean, undefended
CONFIG = CenteredClipConfig()


def group(comp: Compression = Compression.NONE) -> Group:
    return Group("r1", ("me", "a", "b"), (10, 0, 0), comp)


@pytest.mark.parametrize("robust", [False, True], ids=["mean", "centered-clip"])
async def test_weighted_average_in_chunks(robust: bool) -> None:
    r = PartReducer(group(), "me", chunk=4, stall_timeout=5, **({} if robust else MEAN))
    r.start()
    assert r.n_chunks == 3
    for c, (lo, hi) in enumerate([(0, 4), (4, 8), (8, 10)]):
        r.add("me", c, torch.full((hi - lo,), 1.0), 1.0)
        r.add("a", c, torch.full((hi - lo,), 4.0), 2.0)
        r.add("b", c, torch.full((hi - lo,), 0.0), 0.0)
    results = [await r.result("a", c) for c in range(3)]
    if robust:  # CenteredClip of each chunk, "a" counted as the median member (weight 1.5, not 2)
        for c, (lo, hi) in enumerate([(0, 4), (4, 8), (8, 10)]):
            xs = [torch.full((hi - lo,), v) for v in (1.0, 4.0, 0.0)]
            assert torch.equal(
                results[c], centered_clip(xs, bounded_weights([1.0, 2.0, 0.0], 1.0), CONFIG)[0]
            )
        assert bool(((results[0] > 1.0) & (results[0] < 4.0)).all())
    else:
        assert torch.allclose(torch.cat(results), torch.full((10,), 3.0))
    assert r.complete.is_set() and not r.excluded
    r.stop()


@pytest.mark.parametrize(
    ("values", "weight", "why"),
    [
        (torch.ones(3), 1.0, "expected 4"),
        (torch.ones(4, dtype=torch.float64), 1.0, "float64"),
        (torch.tensor([1.0, float("nan"), 0.0, 0.0]), 1.0, "non-finite"),
        (torch.tensor([1.0, float("inf"), 0.0, 0.0]), 1.0, "non-finite"),
        (torch.ones(4), -1.0, "weight"),
        (torch.ones(4), float("nan"), "weight"),
    ],
)
async def test_bad_chunks_exclude_the_sender_by_name(
    values: torch.Tensor, weight: float, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    r = PartReducer(group(), "me", chunk=4, stall_timeout=5)
    with caplog.at_level(logging.WARNING), pytest.raises(PartRejected, match=why):
        r.add("a", 0, values, weight)
    assert "a" in r.excluded and "excluded a" in caplog.text
    with pytest.raises(PartRejected, match="excluded"):
        r.add("a", 1, torch.ones(4), 1.0)
    # the round goes on without it
    for c in range(3):
        n = 4 if c < 2 else 2
        r.add("me", c, torch.full((n,), 2.0), 1.0)
        r.add("b", c, torch.full((n,), 4.0), 1.0)
    assert torch.allclose(await r.result("b", 0), torch.full((4,), 3.0))
    assert r.complete.is_set()


async def test_non_members_duplicates_and_bad_indices_are_refused() -> None:
    r = PartReducer(group(), "me", chunk=4, stall_timeout=5)
    with pytest.raises(PartRejected, match="not a member"):
        r.add("stranger", 0, torch.ones(4), 1.0)
    r.add("a", 0, torch.ones(4), 1.0)
    with pytest.raises(PartRejected, match="twice"):
        r.add("a", 0, torch.ones(4), 1.0)
    with pytest.raises(PartRejected, match="out of range"):
        r.add("b", 9, torch.ones(4), 1.0)
    assert "stranger" not in r.excluded and "b" in r.excluded


async def test_a_stalled_sender_is_dropped_after_the_stall_timeout(caplog: pytest.LogCaptureFixture) -> None:
    r = PartReducer(group(), "me", chunk=4, stall_timeout=0.3)
    r.start()
    for c, n in enumerate([4, 4, 2]):
        r.add("me", c, torch.full((n,), 1.0), 1.0)
        r.add("a", c, torch.full((n,), 3.0), 1.0)
    with caplog.at_level(logging.WARNING):
        async with asyncio.timeout(20):
            await r.complete.wait()
    assert "stalled" in r.excluded["b"] and "excluded b" in caplog.text
    assert torch.allclose(await r.result("a", 2), torch.full((2,), 2.0))


async def test_int8_results_are_what_every_member_decodes() -> None:
    r = PartReducer(Group("r", ("me", "a"), (4096, 0), Compression.INT8), "me", chunk=4096, stall_timeout=5)
    x = torch.randn(4096)
    r.add("me", 0, x, 1.0)
    r.add("a", 0, -x * 0.5, 1.0)
    got = await r.result("a", 0)
    from engine.collab.codec import roundtrip

    assert torch.equal(roundtrip(got.clone(), Compression.INT8), got)
    assert torch.allclose(got, x * 0.25, atol=float(x.abs().max()) / 100)


async def test_chunks_are_held_only_until_every_contributor_has_its_result() -> None:
    r = PartReducer(Group("r", ("me", "a", "b"), (40, 0, 0)), "me", chunk=4, stall_timeout=5)
    for c in range(10):  # the reducer's own member hands its whole slice over at once: no copy yet
        r.add("me", c, torch.full((4,), float(c)), 1.0)
    assert not r.acc
    for c in range(10):  # the others send in order: one chunk open at a time here
        for k, m in ((1, "a"), (2, "b")):
            r.add(m, c, torch.full((4,), float(k + c)), 1.0)
        got = [await r.result(m, c) for m in ("a", "b", "me")]
        assert all(torch.equal(g, got[0]) for g in got)
        assert torch.equal(got[0], torch.full((4,), float(1 + c)))
        assert c not in r.acc  # handed to all three: dropped
    assert r.peak_held == 1 and not r.acc and r.complete.is_set()
    with pytest.raises(PartRejected, match="already handed"):
        await r.result("a", 0)


@pytest.mark.parametrize("robust", [True, False])
async def test_a_refused_part_writes_nothing_into_the_chunk(robust: bool) -> None:
    members = ("me", "a", "b", "c", "d")
    r = PartReducer(
        Group("r", members, (10, 0, 0, 0, 0)), "me", chunk=4, stall_timeout=5, **({} if robust else MEAN)
    )
    r.add("a", 0, torch.full((4,), 4.0), 1.0)

    def held() -> object:
        return dict(r.held[0]) if robust else r.acc[0].clone()

    before = held()
    bad_parts = {"b": torch.ones(5), "c": torch.ones(3), "d": torch.tensor([1.0, float("inf"), 1.0, 1.0])}
    for sender, bad in bad_parts.items():
        with pytest.raises(PartRejected, match=r"expected 4|non-finite"):
            r.add(sender, 0, bad, 1.0)
        now = held()
        if robust:  # an oversized, short or non-finite part left no trace
            assert now == before
        else:
            assert isinstance(now, torch.Tensor) and isinstance(before, torch.Tensor)
            assert torch.equal(now, before)
    r.add("me", 0, torch.full((4,), 2.0), 1.0)
    assert torch.equal(await r.result("a", 0), torch.full((4,), 3.0))  # the refused parts never counted
    assert set(r.excluded) == {"b", "c", "d"}
    assert r.refusals.by_sender == {"b": 1, "c": 1, "d": 1}
