"""The batch beam search and call planning against a per-sample brute force."""

import asyncio
import itertools
import random

import torch

from engine.moe.beam import Children, beam_search, distinct_coords, plan_calls, uid_of

GRID = (5, 6)


def _lookup(alive: set[tuple[int, int]]):  # type: ignore[no-untyped-def]
    calls: list[str] = []

    async def children(prefix: str) -> Children:
        calls.append(prefix)
        parts = prefix.rstrip(".").split(".")[1:]
        if not parts:
            return {i: (f"ffn.{i}", ("h",)) for i in {a for a, _ in alive}}
        i = int(parts[0])
        return {j: (f"ffn.{i}.{j}", ("h",)) for a, j in alive if a == i}

    return children, calls


def _brute(
    scores: list[torch.Tensor], alive: set[tuple[int, int]], row: int, k: int
) -> list[tuple[int, int]]:
    ranked = sorted(alive, key=lambda c: -(scores[0][row, c[0]] + scores[1][row, c[1]]).item())
    return ranked[:k]


async def _gather(aws):  # type: ignore[no-untyped-def]
    return await asyncio.gather(*aws)


async def test_exhaustive_beam_matches_brute_force_on_a_sparse_grid() -> None:
    rng = random.Random(5)
    cells = list(itertools.product(range(GRID[0]), range(GRID[1])))
    alive = {c for c in cells if rng.random() < 0.4}
    scores = [torch.randn(64, n, generator=torch.Generator().manual_seed(n)) for n in GRID]
    children, calls = _lookup(alive)
    coords = await beam_search("ffn", scores, 4, max(GRID), children, _gather)
    assert coords.shape == (64, 4, 2)
    for row in range(64):
        assert [tuple(c) for c in coords[row].tolist()] == _brute(scores, alive, row, 4)
    # One lookup of the root, then each live first coordinate at most once for the whole batch.
    assert calls[0] == "ffn." and len(calls) == len(set(calls)) <= 1 + GRID[0]


async def test_fewer_live_experts_than_k_leave_minus_one_and_a_dead_grid_none() -> None:
    scores = [torch.randn(3, n) for n in GRID]
    children, _ = _lookup({(1, 2), (3, 0)})
    coords = await beam_search("ffn", scores, 4, 4, children, _gather)
    assert coords.shape == (3, 2, 2) and (coords >= 0).all()
    dead, _ = _lookup(set())
    assert (await beam_search("ffn", scores, 4, 4, dead, _gather)).shape == (3, 0, 2)


def test_plan_calls_groups_every_choice_once() -> None:
    coords = torch.tensor([[[1, 2], [0, 0]], [[0, 0], [-1, -1]], [[1, 2], [3, 4]]])
    plan = {where: (rows.tolist(), slots.tolist()) for where, rows, slots in plan_calls(coords)}
    assert plan == {(1, 2): ([0, 2], [0, 0]), (0, 0): ([0, 1], [1, 0]), (3, 4): ([2], [1])}
    assert sorted(distinct_coords(coords)) == [(0, 0), (1, 2), (3, 4)]
    assert uid_of("ffn", (3, 4)) == "ffn.3.4"
    assert plan_calls(torch.full((2, 1, 2), -1)) == [] and distinct_coords(torch.full((2, 1, 2), -1)) == []
