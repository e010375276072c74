"""Beam search over a grid of experts, for a whole batch at once, as tensor operations.

The gate scores each grid dimension separately (``scores[d]``: ``[batch, size_d]``) and an expert's score
is the sum of its coordinates' scores, so the best ``k`` live experts of each sample can be found
dimension by dimension (see :mod:`engine.moe.dht_finder` for why the search is exact when every expert is
alive and ``beam_size >= k``). A language model routes every token, thousands per step: a Python loop per
token cost a tenth of a trainer's event loop, so the beams of all samples advance together here, one
``topk`` per dimension, and only the distinct prefixes (at most ``size_0 * beam_size`` of them) are looked
up, through ``children`` (the finder's cache).

:func:`beam_search` is pure apart from those lookups; :func:`plan_calls` turns its coordinates into one
``(rows, slots)`` group per chosen expert, which is what the mixture sends as one request each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import torch

__all__ = ["Children", "beam_search", "distinct_coords", "plan_calls", "uid_of"]

#: ``child coordinate -> (uid, hosts)`` under one prefix.
Children = dict[int, tuple[str, tuple[str, ...]]]


async def beam_search(
    prefix: str,
    scores: Sequence[torch.Tensor],
    k: int,
    beam_size: int,
    children: Callable[[str], Awaitable[Children]],
    gather: Callable[[list[Awaitable[Children]]], Awaitable[list[Children]]],
) -> torch.Tensor:
    """Per sample the best ``k`` live experts under ``prefix``: ``[batch, k', dims]`` coordinates.

    ``k' <= k``, best first, ``-1`` where a sample has fewer live experts than ``k'`` (:func:`uid_of`
    names a cell). ``gather`` runs lookups together
    (``asyncio.gather``), so one step's distinct prefixes are fetched concurrently.
    """
    batch, dims = scores[0].shape[0], len(scores)
    width = max(k, beam_size)
    beam_score = torch.zeros(batch, 1)
    beam_coords = torch.zeros(batch, 1, 0, dtype=torch.long)
    beam_prefix = torch.zeros(batch, 1, dtype=torch.long)  # index into `names`
    names = [prefix + "."]
    for d in range(dims):
        found = await gather([children(p) for p in names])
        size = scores[d].shape[1]
        alive = torch.zeros(len(names) + 1, size, dtype=torch.bool)  # the last row: no prefix at all
        for i, kids in enumerate(found):
            coords = [c for c in kids if 0 <= c < size]
            if coords:
                alive[i, torch.tensor(coords)] = True
        beam_prefix = torch.where(torch.isfinite(beam_score), beam_prefix, len(names))
        cand = beam_score.unsqueeze(2) + scores[d].float().unsqueeze(1)  # [batch, beams, size]
        cand = cand.masked_fill(~alive[beam_prefix], float("-inf")).reshape(batch, -1)
        top = cand.topk(min(k if d == dims - 1 else width, cand.shape[1]), dim=1)
        beam, coord = top.indices // size, top.indices % size
        beam_score = top.values
        beam_coords = torch.cat(
            [beam_coords.gather(1, beam.unsqueeze(2).expand(-1, -1, d)), coord.unsqueeze(2)], dim=2
        )
        if d == dims - 1:
            break
        parent = beam_prefix.gather(1, beam)
        # The next level's prefixes: one per distinct (parent, coordinate) that is still alive.
        key = torch.where(torch.isfinite(beam_score), parent * size + coord, -1)
        distinct, inverse = torch.unique(key, return_inverse=True)
        next_names: list[str] = []
        index: list[int] = []
        for value in distinct.tolist():
            if value < 0:
                index.append(-1)
                continue
            index.append(len(next_names))
            next_names.append(found[value // size][value % size][0] + ".")
        lookup = torch.tensor(index, dtype=torch.long)[inverse]
        beam_prefix = torch.where(lookup >= 0, lookup, len(next_names))
        names = next_names
    valid = torch.isfinite(beam_score)
    kept = int(valid.sum(1).max()) if batch else 0
    return beam_coords[:, :kept].masked_fill(~valid[:, :kept].unsqueeze(2), -1)


def uid_of(prefix: str, coords: Sequence[int]) -> str:
    """``("ffn", (3, 7))`` -> ``"ffn.3.7"``: the canonical name of a grid cell."""
    return prefix + "." + ".".join(map(str, coords))


def _flat_key(flat: torch.Tensor) -> torch.Tensor:
    """One integer per row of ``[n, dims]`` coordinates (``-1`` for a row marked ``-1``)."""
    dims = flat.shape[1]
    sizes = flat.max(0).values.clamp(min=0) + 1
    strides = torch.ones(dims, dtype=torch.long)
    for d in range(dims - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    return torch.where(flat[:, 0] >= 0, (flat * strides).sum(1), -1)


def distinct_coords(coords: torch.Tensor) -> list[tuple[int, ...]]:
    """The distinct coordinate tuples chosen anywhere in ``[batch, k, dims]`` (``-1`` rows left out)."""
    flat = coords.reshape(-1, coords.shape[-1])
    if flat.shape[0] == 0:
        return []
    key = _flat_key(flat)
    distinct, inverse = torch.unique(key, return_inverse=True)
    first = torch.full((distinct.shape[0],), flat.shape[0], dtype=torch.long)
    first = first.scatter_reduce(0, inverse, torch.arange(flat.shape[0]), reduce="amin")
    return [tuple(row) for row, k in zip(flat[first].tolist(), distinct.tolist(), strict=True) if k >= 0]


def plan_calls(coords: torch.Tensor) -> list[tuple[tuple[int, ...], torch.Tensor, torch.Tensor]]:
    """``[batch, k, dims]`` coordinates (``-1``: none) -> ``(coords, rows, slots)`` per distinct expert.

    One sort of the flattened choices instead of a dictionary append per token.
    """
    batch, k, dims = coords.shape
    if batch == 0 or k == 0:
        return []
    flat = coords.reshape(-1, dims)
    key = _flat_key(flat)
    order = torch.argsort(key, stable=True)
    distinct, counts = torch.unique_consecutive(key[order], return_counts=True)
    out = []
    for value, where in zip(distinct.tolist(), torch.split(order, counts.tolist()), strict=True):
        if value < 0:
            continue
        first = int(where[0])
        out.append((tuple(flat[first].tolist()), where // k, where % k))
    return out
