"""The forward pass's autograd graph kept for its backward, so a host computes each forward once.

Without it a host answers ``moe.forward`` without a graph and, on ``moe.backward``, runs the forward
again on the cached inputs to backpropagate: one forward more per sample, about a third of an FFN
expert's forward-backward-Adam work (on two CPU cores 0.28 of 1.19 ms per sample, on a GPU as much of
its time). Here the forward runs with grad and its graph is kept in an :class:`~.cache.ActivationCache` of
its own beside the inputs' one, charged with the bytes autograd saved (activations; the parameters it
refers to are the module's own and cost nothing), under its own budget and the same TTL: graphs, forty
times the inputs' size, never push inputs out (an evicted input costs the trainer a re-send, an evicted
graph only a forward). Whatever the budget cannot hold, whatever was evicted, and a backward whose
trainer re-sent its inputs fall back to recomputing.

**Which weights the backward sees.** The graph refers to the module's parameters, which Adam steps of
other requests change in place between a forward and its backward. Autograd would refuse such a graph
(its version check); here the saved tensors go through ``saved_tensors_hooks``, which skips that check,
so a kept graph backpropagates through the activations of its own forward and the weights as they are
now. Recomputing instead uses the current weights throughout. Either gradient is a few steps stale,
which the asynchronous updates of Learning@home take as they come (the trainer's own activations are
as old); with no step in between both are exactly autograd's, which the tests check.

**Batches.** A forward batch merges several requests into one graph; their backwards may come in
different backward batches. The first backward batch that holds any member consumes the graph, with
zero output gradients for the members it does not hold (so their rows add nothing to the weights'
gradient); a member that comes later recomputes from its inputs. Each request's gradient thus reaches
the weights exactly once.

Everything here runs on the device's worker thread (:mod:`.batching`), one batch at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

__all__ = [
    "BackwardRequest",
    "GraphSlice",
    "KeptGraph",
    "PlannedBackward",
    "backward",
    "forward_keeping_graph",
    "plan_backward",
]


class KeptGraph:
    """One forward batch's input leaf, output and the bytes autograd saved for them."""

    __slots__ = ("__weakref__", "nbytes", "row_shape", "rows", "x", "y")

    def __init__(self, x: torch.Tensor, y: torch.Tensor, nbytes: int) -> None:
        self.x: torch.Tensor | None = x
        self.y: torch.Tensor | None = y
        self.nbytes = nbytes
        self.rows = int(x.shape[0])
        self.row_shape = tuple(int(n) for n in x.shape[1:])

    @property
    def consumed(self) -> bool:
        """A backward ran on it (and let its activations go)."""
        return self.x is None

    def split(self, sizes: Sequence[int]) -> list[GraphSlice]:
        """Each request's rows of this batch (:func:`.batching._run_batch` calls it)."""
        out, start = [], 0
        for n in sizes:
            out.append(GraphSlice(self, start, start + n))
            start += n
        return out

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(input leaf, output) the first time; None once a backward consumed it."""
        x, y = self.x, self.y
        if x is None or y is None:
            return None
        self.x = self.y = None  # the activations go with the backward that runs them
        return x, y


class GraphSlice(NamedTuple):
    """One request's rows of a :class:`KeptGraph`: what the graphs' cache holds for the request."""

    graph: KeptGraph
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        """This request's share of the graph's saved bytes (what the cache charges it)."""
        g = self.graph
        return -(-g.nbytes * (self.stop - self.start) // g.rows)

    @property
    def shape(self) -> tuple[int, ...]:
        """The request's input (and output) shape."""
        return (self.stop - self.start, *self.graph.row_shape)


class BackwardRequest(NamedTuple):
    grad_outputs: torch.Tensor
    inputs: torch.Tensor | None  # to recompute when there is no live graph; None: evicted
    kept: GraphSlice | None


def forward_keeping_graph(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, KeptGraph]:
    """``module(x)`` with its graph kept; (detached output, graph). ``x`` is float32 on the device."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if t.untyped_storage().data_ptr() not in params:  # a weight or a view of one costs nothing
            saved += t.numel() * t.element_size()
        return t

    leaf = x.detach().requires_grad_(True)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        y = module(leaf)
    return y.detach(), KeptGraph(leaf, y, saved)


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


class PlannedBackward(NamedTuple):
    """A backward batch ready for autograd: the outputs and their gradients to backpropagate (one
    ``torch.autograd.backward`` may take several experts' at once), and where each request's input
    gradient will be found afterwards (:meth:`input_grads`)."""

    outputs: list[torch.Tensor]
    grads: list[torch.Tensor]
    where: list[tuple[torch.Tensor, int, int] | None]  # each request's (input leaf, start, stop)
    recomputed: int  # samples whose forward ran again

    def input_grads(self) -> list[torch.Tensor | None]:
        """Each request's input gradient once autograd ran (None: neither a live graph nor inputs)."""
        result: list[torch.Tensor | None] = []
        for w in self.where:
            if w is None:
                result.append(None)
                continue
            leaf, a, b = w
            assert leaf.grad is not None
            result.append(leaf.grad[a:b])
        return result


def backward(
    module: torch.nn.Module, requests: Sequence[BackwardRequest], device: torch.device
) -> tuple[list[torch.Tensor | None], int]:
    """Backpropagate a backward batch in one autograd call: kept graphs where they live, a recomputed
    forward for the rest. Returns each request's input gradient (float32, on ``device``; None for one
    with neither a live graph nor inputs, whose graph a sibling's backward took after the caller looked)
    and how many samples were recomputed. The caller zeroes and steps the optimizer around it."""
    plan = plan_backward(module, requests, device)
    if plan.outputs:
        with torch.enable_grad():
            torch.autograd.backward(plan.outputs, plan.grads)
    return plan.input_grads(), plan.recomputed


def plan_backward(
    module: torch.nn.Module, requests: Sequence[BackwardRequest], device: torch.device
) -> PlannedBackward:
    """Everything :func:`backward` does before autograd runs: kept graphs taken, the rest recomputed."""
    outputs: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    # each request's (input leaf, start row, stop row) once its graph is known
    where: list[tuple[torch.Tensor, int, int] | None] = [None] * len(requests)
    taken: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # id(graph): leaf, y, grad
    recompute: list[int] = []
    for j, r in enumerate(requests):
        kept = r.kept
        if kept is not None:
            key = id(kept.graph)
            g = r.grad_outputs.to(device, torch.float32)
            if key not in taken:
                pair = kept.graph.take()
                if pair is not None and kept.stop - kept.start == kept.graph.rows:  # its only member
                    taken[key] = (*pair, g)
                elif pair is not None:  # rows of members not in this batch get zero gradients
                    taken[key] = (*pair, torch.zeros_like(pair[1]))
            if key in taken:
                leaf, _, grad = taken[key]
                if grad is not g:
                    grad[kept.start : kept.stop] = g
                where[j] = (leaf, kept.start, kept.stop)
                continue
        if r.inputs is not None:
            recompute.append(j)
    for _, y, grad in taken.values():
        outputs.append(y)
        grads.append(grad)
    recomputed = 0
    if recompute:
        xs = [_inputs(requests[j]) for j in recompute]
        x = torch.cat(xs).to(device, torch.float32).detach().requires_grad_(True)
        with torch.enable_grad():
            outputs.append(module(x))
        grads.append(torch.cat([requests[j].grad_outputs for j in recompute]).to(device, torch.float32))
        start = 0
        for j, xi in zip(recompute, xs, strict=True):
            where[j] = (x, start, start + int(xi.shape[0]))
            start += int(xi.shape[0])
        recomputed = start
    return PlannedBackward(outputs, grads, where, recomputed)


def _inputs(r: BackwardRequest) -> torch.Tensor:
    assert r.inputs is not None  # only requests with inputs are recomputed
    return r.inputs
