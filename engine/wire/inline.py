"""Tensor casts and copies that run on the calling thread only, never on an OpenMP team of their own.

torch runs an elementwise op (a cast, a copy) over more than :data:`GRAIN` elements on OpenMP threads,
and libgomp gives every thread that starts such an op a team of its own. The wire codec runs on event
loops and encode workers, beside a node's compute thread, whose team should be the only one: with two
teams the process has more OpenMP threads than the machine has cores, and libgomp then stops spinning
at its barriers (GOMP_SPINCOUNT's throttled value) and sleeps instead. On a 2-core host that left the
cores idle a tenth of the time, the compute threads sleeping at each barrier while the event loop's
thread held the other core (benchmarks/expert_throughput.py: machine 0.90 busy with a second team,
0.98 without; remote samples/s 2,480 -> 2,780). Here the same op runs in slices of at most
:data:`GRAIN` elements, which torch runs inline: about 60 µs for a 256 x 1024 float32 cast on one
core, against 17 µs on two threads and a team.
"""

from __future__ import annotations

import torch

__all__ = ["GRAIN", "cast", "contiguous", "copy_into"]

#: at::internal::GRAIN_SIZE: torch parallelises an elementwise op only above this many elements.
GRAIN = 32768


def copy_into(out: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out.copy_(src)`` (same shape; dtype cast as copy_ does) in slices torch runs inline."""
    n = src.numel()
    if n <= GRAIN or src.dim() == 0:
        return out.copy_(src)
    rows = src.shape[0]
    per_row = n // rows if rows else 0
    if per_row > GRAIN:  # one row is too big: slice each row along its own first dimension
        for i in range(rows):
            copy_into(out[i], src[i])
        return out
    step = max(1, GRAIN // max(per_row, 1))
    for i in range(0, rows, step):
        out[i : i + step].copy_(src[i : i + step])
    return out


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` (a new contiguous tensor) without an OpenMP team; ``t`` itself when it already
    has that dtype, as ``.to`` returns it."""
    if t.dtype == dtype:
        return t
    if t.numel() <= GRAIN:
        return t.to(dtype)
    return copy_into(torch.empty(t.shape, dtype=dtype, device=t.device), t)


def contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t.contiguous()`` without an OpenMP team."""
    if t.is_contiguous():
        return t
    return copy_into(torch.empty(t.shape, dtype=t.dtype, device=t.device), t)
