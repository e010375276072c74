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
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from engine.p2p import Peer

from .beam import plan_calls
from .client import RemoteExpert, new_activation_id
from .errors import ExpertCallFailed, NotEnoughExperts
from .host_call import Answer, backward_many, forward_many
from .loop_thread import LoopThread

__all__ = ["CallObserver", "CallRecord", "ExpertFinder", "RemoteMixtureOfExperts", "StaticExpertFinder"]


class ExpertFinder(Protocol):
    """Finds live experts: up to ``k`` ``(uid, host peer id)``, best score first, for one sample."""

    async def find(
        self, prefix: str, dim_scores: Sequence[Sequence[float]], k: int
    ) -> list[tuple[str, str]]: ...


@dataclass(frozen=True)
class CallRecord:
    """One expert request of a mixture layer, as its observer sees it (receipts, spot checks, health).

    ``ok`` is False for a failed call (``code``: the host's error code, ``"timeout"``, ``"connection"``)
    and for one dropped after the grace period (``"late"``). Forward records carry the wire inputs and
    the reply, so a spot check can re-send exactly what the host computed.
    """

    uid: str
    host: str
    samples: int
    backward: bool
    ok: bool
    code: str
    served_at: float  # unix time the request was sent
    elapsed_s: float
    inputs: torch.Tensor | None = None
    outputs: torch.Tensor | None = None


#: Called on the layer's event loop for every request; must be quick and must not raise.
CallObserver = Callable[[CallRecord], None]


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


@dataclass
class _Call:
    expert: RemoteExpert
    rows: torch.Tensor  # sample indices
    slots: torch.Tensor  # which of the k slots of those samples


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
            calls.append(_Call(self._expert(uid, host), rows, slots))
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

    async def call_forward(
        self, plan: list[_Call], wire: list[torch.Tensor], aids: list[str], n_samples: int
    ) -> dict[int, torch.Tensor]:
        """Results by plan index: wait for k_min answers per sample, then ``grace_s``, then drop the rest.
        The calls to one host travel as one request (:mod:`.host_call`)."""
        loop = asyncio.get_running_loop()
        tasks = {
            loop.create_task(self._host_forward(plan, wire, aids, group)): group
            for group in _by_host(plan).values()
        }
        counts = torch.zeros(n_samples, dtype=torch.long)
        results: dict[int, torch.Tensor] = {}
        deadline = time.monotonic() + self.timeout
        pending = set(tasks)
        try:
            while pending and (remaining := deadline - time.monotonic()) > 0:
                done, pending = await asyncio.wait(
                    pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task.exception() is not None:
                        continue
                    for i, y in task.result().items():
                        if y.shape == wire[i].shape:
                            results[i] = y
                            counts[plan[i].rows] += 1
                if bool((counts >= self.k_min).all()) and deadline > time.monotonic() + self.grace_s:
                    deadline = time.monotonic() + self.grace_s
        finally:
            for task in pending:
                task.cancel()
        return results

    async def call_backward(
        self, plan: list[_Call], aids: list[str], grads: list[torch.Tensor], wire: list[torch.Tensor]
    ) -> dict[int, torch.Tensor]:
        """Input gradients by plan index, one request per host; a failed or late expert is skipped."""
        groups = list(_by_host(plan).values())
        coros = [
            asyncio.wait_for(self._host_backward(plan, aids, grads, wire, group), self.timeout)
            for group in groups
        ]
        answers: dict[int, torch.Tensor] = {}
        for got in await asyncio.gather(*coros, return_exceptions=True):
            if isinstance(got, dict):
                answers.update((i, a) for i, a in got.items() if a.shape == grads[i].shape)
        return answers

    async def _host_forward(
        self, plan: list[_Call], wire: list[torch.Tensor], aids: list[str], group: list[int]
    ) -> dict[int, torch.Tensor]:
        if len(group) == 1:  # one expert: the plain call (any host version answers it)
            i = group[0]
            try:
                return {
                    i: await self._observed(
                        plan[i], plan[i].expert.call_forward(aids[i], wire[i]), False, wire[i]
                    )
                }
            except ExpertCallFailed:
                return {}
        answers = await self._send_group(forward_many, plan, group, aids, wire, False, wire)
        return {i: a for i, a in zip(group, answers, strict=True) if isinstance(a, torch.Tensor)}

    async def _host_backward(
        self,
        plan: list[_Call],
        aids: list[str],
        grads: list[torch.Tensor],
        wire: list[torch.Tensor],
        group: list[int],
    ) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        retry = group
        if len(group) > 1:
            answers = await self._send_group(backward_many, plan, group, aids, grads, True, None)
            out = {i: a for i, a in zip(group, answers, strict=True) if isinstance(a, torch.Tensor)}
            retry = [i for i, a in zip(group, answers, strict=True) if _evicted(a)]
        for i in retry:  # the plain call re-sends the inputs the host evicted
            coro = plan[i].expert.call_backward(aids[i], grads[i], wire[i])
            try:
                out[i] = await self._observed(plan[i], coro, True)
            except ExpertCallFailed:
                continue
        return out

    async def _send_group(
        self,
        many: Any,
        plan: list[_Call],
        group: list[int],
        aids: list[str],
        tensors: list[torch.Tensor],
        backward: bool,
        inputs: list[torch.Tensor] | None,
    ) -> list[Answer]:
        """One host's request for ``group`` (``forward_many`` or ``backward_many``), observed per expert;
        an expert whose inputs were evicted is observed by the plain call that re-sends them."""
        served_at, t0 = time.time(), time.monotonic()
        answers: list[Answer] | None = None
        try:
            answers = await many(
                self.peer,
                plan[group[0]].expert.host_peer_id,
                [plan[i].expert.uid for i in group],
                [aids[i] for i in group],
                [tensors[i] for i in group],
                wire=self.wire,
                timeout=self.timeout,
            )
            return answers
        finally:
            got: list[Answer | None] = list(answers) if answers is not None else [None] * len(group)
            kept = [(i, a) for i, a in zip(group, got, strict=True) if not _evicted(a)]
            self._observe_group(
                plan,
                [i for i, _ in kept],
                None if answers is None else [a for _, a in kept if a is not None],
                backward,
                served_at,
                time.monotonic() - t0,
                inputs,
            )

    def _observe_group(
        self,
        plan: list[_Call],
        group: list[int],
        answers: list[Answer] | None,
        backward: bool,
        served_at: float,
        elapsed: float,
        inputs: list[torch.Tensor] | None,
    ) -> None:
        """One record per expert of a host's request (``answers`` None: it was cancelled, late)."""
        if self.observer is None:
            return
        for n, i in enumerate(group):
            answer = None if answers is None else answers[n]
            ok = isinstance(answer, torch.Tensor)
            code = "" if ok else "late" if answer is None else (answer.code or "error")  # type: ignore[union-attr]
            expert = plan[i].expert
            record = CallRecord(
                expert.uid,
                expert.host_peer_id,
                len(plan[i].rows),
                backward,
                ok,
                code,
                served_at,
                elapsed,
                None if inputs is None else inputs[i],
                answer if ok else None,  # type: ignore[arg-type]
            )
            self._tell(record)

    async def _observed(
        self, call: _Call, coro: Any, backward: bool, inputs: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Await one request and tell the observer how it went (cancellation: ``"late"``)."""
        if self.observer is None:
            result: torch.Tensor = await coro
            return result
        served_at, t0 = time.time(), time.monotonic()
        ok, code, out = False, "late", None
        try:
            out = await coro
            ok, code = True, ""
            return out  # type: ignore[no-any-return]
        except ExpertCallFailed as e:
            code = e.code or "error"
            raise
        finally:
            expert = call.expert
            self._tell(
                CallRecord(
                    expert.uid,
                    expert.host_peer_id,
                    len(call.rows),
                    backward,
                    ok,
                    code,
                    served_at,
                    time.monotonic() - t0,
                    inputs,
                    out,
                )
            )

    def _tell(self, record: CallRecord) -> None:
        assert self.observer is not None
        try:
            self.observer(record)
        except Exception:  # an observer's bug must not break training
            logging.getLogger(__name__).exception("mixture observer failed")


def _evicted(answer: object) -> bool:
    return isinstance(answer, ExpertCallFailed) and answer.code == "inputs_evicted"


def _by_host(plan: list[_Call]) -> dict[str, list[int]]:
    """Plan indices grouped by host, in plan order."""
    groups: dict[str, list[int]] = {}
    for i, call in enumerate(plan):
        groups.setdefault(call.expert.host_peer_id, []).append(i)
    return groups


class _MixtureCall(torch.autograd.Function):
    """All expert calls of one layer as one autograd node: ``[batch, k, *shape]`` outputs + answered mask."""

    @staticmethod
    def forward(ctx: Any, layer: RemoteMixtureOfExperts, x: torch.Tensor, plan: list[_Call], k: int) -> Any:  # type: ignore[override]
        wire = [c.expert.to_wire(x[c.rows]) for c in plan]
        aids = [new_activation_id() for _ in plan]
        timeout = layer.timeout + 2.0
        try:
            results = layer.loop.run(layer.call_forward(plan, wire, aids, x.shape[0]), timeout)
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
        plan = [ctx.plan[i] for i in ok]
        grads = [c.expert.to_wire(grad_outputs[c.rows, c.slots]) for c in plan]
        wire = [ctx.wire[i] for i in ok]
        aids = [ctx.aids[i] for i in ok]
        try:
            answers = layer.loop.run(layer.call_backward(plan, aids, grads, wire), layer.timeout + 2.0)
        except TimeoutError:
            answers = {}
        grad_x = torch.zeros_like(x)
        for i, g in answers.items():
            grad_x.index_add_(0, plan[i].rows.to(x.device), g.to(x.device, x.dtype))
        return None, grad_x, None, None
