"""RemoteMixtureOfExperts: gating over a grid of experts, k remote calls, k_min + grace, renormalised.

The Learning@home layer. Experts have grid coordinates (uid ``<prefix>.<i>.<j>``); the gate scores each
grid dimension separately and an expert's score is the sum of its coordinates' scores, so a lookup
service can beam-search the grid (dimension by dimension) instead of scoring every expert. Which
experts are alive, and who hosts them, is the :class:`ExpertFinder`'s business (``DHTExpertFinder`` in
a swarm; a static table in tests).

Fault tolerance by design: each chosen expert gets one batched request; the layer waits until every
sample has ``k_min`` answers, then at most ``grace_s`` more, and drops whoever has not answered. The
softmax over the gate scores is taken over the experts that answered, per sample, so a dead or slow
host only removes a term. Backward does the same: an expert whose backward fails contributes no input
gradient. Fewer than ``k_min`` answers for any sample is :class:`NotEnoughExperts`, unless the layer
was built with ``pass_short=True``: then such a sample's output is its input. That is what a language
model wants of residual experts (``x + FFN(x)``): an expert that did not answer is a zero update, so a
token the swarm could not serve keeps its residual stream, and one token in a batch of thousands does
not cost the whole step (:attr:`RemoteMixtureOfExperts.short_rows` counts them).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from engine.p2p import Peer
from engine.wire import all_finite

from .beam import plan_calls
from .client import RemoteExpert, new_activation_id
from .errors import ExpertCallFailed, NotEnoughExperts
from .layer_calls import CallObserver, ExpertCalls, PlannedCall
from .loop_thread import LoopThread

__all__ = ["ExpertFinder", "RemoteMixtureOfExperts", "StaticExpertFinder"]


class ExpertFinder(Protocol):
    """Finds live experts: up to ``k`` ``(uid, host peer id)``, best score first, for one sample."""

    async def find(
        self, prefix: str, dim_scores: Sequence[Sequence[float]], k: int
    ) -> list[tuple[str, str]]: ...


class StaticExpertFinder:
    """A fixed ``uid -> host`` table, scored exhaustively: for tests and small private swarms."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = dict(hosts)

    async def find(self, prefix: str, dim_scores: Sequence[Sequence[float]], k: int) -> list[tuple[str, str]]:
        scored = []
        for uid, host in self.hosts.items():
            coords = grid_coords(uid, prefix, [len(s) for s in dim_scores])
            if coords is not None:
                scored.append((sum(s[c] for s, c in zip(dim_scores, coords, strict=True)), uid, host))
        scored.sort(key=lambda t: -t[0])
        return [(uid, host) for _, uid, host in scored[:k]]


def grid_coords(uid: str, prefix: str, grid: Sequence[int]) -> tuple[int, ...] | None:
    """``ffn.3.7`` -> ``(3, 7)`` when it lies on ``prefix``'s grid, else ``None``."""
    head, _, rest = uid.partition(".")
    parts = rest.split(".") if rest else []
    if head != prefix or len(parts) != len(grid) or not all(p.isdigit() for p in parts):
        return None
    coords = tuple(int(p) for p in parts)
    return coords if all(0 <= c < n for c, n in zip(coords, grid, strict=True)) else None


class RemoteMixtureOfExperts(nn.Module):
    """A DMoE layer over ``[batch, dim]`` inputs: ``sum_e softmax(gate)_e * expert_e(x)`` over answers."""

    def __init__(
        self,
        peer: Peer,
        finder: ExpertFinder,
        *,
        loop: LoopThread,
        in_features: int,
        grid_size: Sequence[int],
        uid_prefix: str,
        k_best: int = 4,
        k_min: int = 1,
        grace_s: float = 0.5,
        timeout: float = 30.0,
        observer: CallObserver | None = None,
        wire: str = "float16",
        pass_short: bool = False,
    ) -> None:
        """``observer``: told of every expert request (see :class:`CallRecord`); ``finder`` may also
        offer ``find_coords(prefix, scores, k)`` (as ``DHTExpertFinder``), used instead of one ``find``
        per sample; ``wire``:
        how expert calls travel (:data:`~engine.moe.client.WIRE_FORMATS`); ``pass_short``: a sample
        with fewer than ``k_min`` answers passes its input through instead of failing the batch."""
        super().__init__()
        self.observer = observer
        self.peer, self.finder, self.loop = peer, finder, loop
        self.grid_size, self.uid_prefix = tuple(grid_size), uid_prefix
        self.k_best, self.k_min, self.grace_s, self.timeout = k_best, k_min, grace_s, timeout
        self.wire, self.pass_short = wire, pass_short
        self.short_rows = 0  # samples passed through for want of k_min answers (pass_short)
        self.gates = nn.ModuleList(nn.Linear(in_features, n) for n in self.grid_size)
        self.calls = ExpertCalls(
            peer, wire=wire, timeout=timeout, k_min=k_min, grace_s=grace_s, observer=observer
        )
        self._experts: dict[tuple[str, str], RemoteExpert] = {}
        self._coords: dict[str, tuple[int, ...] | None] = {}  # uid -> grid coordinates, parsed once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim_scores = [gate(x) for gate in self.gates]
        coords, named = self.loop.run(self._choose([s.detach().cpu() for s in dim_scores]), self.timeout)
        k = max(1, coords.shape[1])
        if coords.shape[1] == 0:
            coords = torch.full((x.shape[0], 1, len(self.grid_size)), -1, dtype=torch.long)
        calls = []
        for where, rows, slots in plan_calls(coords):
            uid, host = named[where]
            calls.append(PlannedCall(self._expert(uid, host), rows, slots))
        coords = coords.to(x.device)
        logits = torch.zeros(x.shape[0], k, dtype=x.dtype, device=x.device)
        for i, scores in enumerate(dim_scores):
            logits = logits + torch.gather(scores, 1, coords[:, :, i].clamp(min=0))
        outputs, answered = _MixtureCall.apply(self, x, calls, k)  # type: ignore[no-untyped-call]
        short = answered.sum(1) < self.k_min
        if bool(short.any()):
            if not self.pass_short:
                raise NotEnoughExperts(f"fewer than k_min={self.k_min} experts answered for some samples")
            self.short_rows += int(short.sum())
            answered = answered & ~short.unsqueeze(1)
        # Softmax over the experts that answered; a row with none (only when k_min is 0) gets zeros.
        masked = logits.masked_fill(~answered, float("-inf")).masked_fill(~answered.any(1, keepdim=True), 0.0)
        weights = torch.softmax(masked, dim=1) * answered
        out: torch.Tensor = (weights.unsqueeze(-1) * outputs).sum(1)
        if self.pass_short:
            out = torch.where(short.unsqueeze(1), x, out)
        return out

    def _coords_of(self, uid: str) -> tuple[int, ...] | None:
        if uid not in self._coords:
            if len(self._coords) > 4 * math.prod(self.grid_size):  # a finder naming ever new uids
                self._coords.clear()
            self._coords[uid] = grid_coords(uid, self.uid_prefix, self.grid_size)
        return self._coords[uid]

    def _expert(self, uid: str, host: str) -> RemoteExpert:
        key = (uid, host)
        if key not in self._experts:
            self._experts[key] = RemoteExpert(
                self.peer, host, uid, loop=self.loop, timeout=self.timeout, wire=self.wire
            )
        return self._experts[key]

    async def _choose(
        self, scores: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[tuple[int, ...], tuple[str, str]]]:
        """``[batch, k', dims]`` chosen coordinates (``-1``: none) and each chosen cell's ``(uid, host)``:
        from the finder's batch search where it has one, else from one ``find`` per sample."""
        find_coords = getattr(self.finder, "find_coords", None)
        if find_coords is not None:
            batch: tuple[torch.Tensor, dict[tuple[int, ...], tuple[str, str]]]
            batch = await find_coords(self.uid_prefix, scores, self.k_best)
            return batch
        lists = [s.tolist() for s in scores]
        per_sample = [[dim[row] for dim in lists] for row in range(len(lists[0]))]
        finds = (self.finder.find(self.uid_prefix, sample, self.k_best) for sample in per_sample)
        chosen = await asyncio.gather(*finds)
        k = max((len(c) for c in chosen), default=0)
        coords = torch.full((len(chosen), k, len(self.grid_size)), -1, dtype=torch.long)
        named: dict[tuple[int, ...], tuple[str, str]] = {}
        for row, found in enumerate(chosen):
            for slot, (uid, host) in enumerate(found):
                where = self._coords_of(uid)
                if where is None:
                    continue  # a finder that returns foreign uids: ignore them rather than trust them
                coords[row, slot] = torch.tensor(where)
                named.setdefault(where, (uid, host))
        return coords, named


class _MixtureCall(torch.autograd.Function):
    """All expert calls of one layer as one autograd node: ``[batch, k, *shape]`` outputs + answered mask."""

    @staticmethod
    def forward(
        ctx: Any, layer: RemoteMixtureOfExperts, x: torch.Tensor, plan: list[PlannedCall], k: int
    ) -> Any:  # type: ignore[override]
        wire = [c.expert.to_wire(x[c.rows]) for c in plan]
        aids = [new_activation_id() for _ in plan]
        timeout = layer.timeout + 2.0
        try:
            results = layer.loop.run(layer.calls.forward(plan, wire, aids, x.shape[0]), timeout)
        except TimeoutError as e:
            raise ExpertCallFailed(f"mixture forward: {e}", "timeout") from e
        outputs = x.new_zeros((x.shape[0], k, *x.shape[1:]))
        answered = torch.zeros(x.shape[0], k, dtype=torch.bool, device=x.device)
        for i, y in results.items():
            outputs[plan[i].rows, plan[i].slots] = y.to(x.device, x.dtype)
            answered[plan[i].rows, plan[i].slots] = True
        ctx.layer, ctx.plan, ctx.wire, ctx.aids, ctx.ok = layer, plan, wire, aids, sorted(results)
        ctx.like = x
        ctx.mark_non_differentiable(answered)
        return outputs, answered

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor, _: Any) -> tuple[None, torch.Tensor, None, None]:  # type: ignore[override]
        layer: RemoteMixtureOfExperts = ctx.layer
        x: torch.Tensor = ctx.like
        ok: list[int] = ctx.ok
        if not all_finite(grad_outputs):  # no expert is asked to learn from it: the trainer stops
            return None, torch.full_like(x, math.nan), None, None
        plan = [ctx.plan[i] for i in ok]
        grads = [c.expert.to_wire(grad_outputs[c.rows, c.slots]) for c in plan]
        wire = [ctx.wire[i] for i in ok]
        aids = [ctx.aids[i] for i in ok]
        try:
            answers = layer.loop.run(layer.calls.backward(plan, aids, grads, wire), layer.timeout + 2.0)
        except TimeoutError:
            answers = {}
        grad_x = torch.zeros_like(x)
        for i, g in answers.items():
            grad_x.index_add_(0, plan[i].rows.to(x.device), g.to(x.device, x.dtype))
        return None, grad_x, None, None
