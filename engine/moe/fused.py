"""The backward batches of many experts as one: one autograd call, one clipping pass, one Adam pass.

Each expert still takes its own optimizer step from its own gradients, as Learning@home's experts do;
what is shared is the machinery. An FFN expert of a language model sees a dozen rows per step, so its
arithmetic is microseconds while a ``torch.optim.Adam.step`` walks its six tensors in Python and
``clip_grad_norm_`` two more loops: on a CPU host that overhead was most of a backward. Here every
expert whose backward batch is ready (:mod:`.dispatch`) is planned (:func:`.graphs.plan_backward`),
backpropagated in one ``torch.autograd.backward``, clipped to its own ``max_grad_norm`` from one
``torch._foreach_norm`` over all gradients, and stepped by one call of ``torch.optim.adam.adam`` (the
same function ``Adam.step`` runs, with ``foreach``) per set of hyper-parameters. The optimizers' state
stays in each expert's ``torch.optim.Adam`` (checkpoints and restores are unchanged), initialised as
``Adam`` initialises it. An expert whose optimizer is not a plain Adam (amsgrad, capturable, fused,
differentiable) steps on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch.optim.adam import adam

from .graphs import BackwardRequest, PlannedBackward, plan_backward

__all__ = ["FusedExpert", "backward_together", "step_together"]


class _StepCounts(Protocol):
    steps: int
    recomputed_samples: int


class FusedExpert(Protocol):
    """What these passes read of an expert: :class:`~.backend.ExpertBackend` is one. Named here, not
    imported, because the backend hands its ready backwards to this module."""

    @property
    def module(self) -> torch.nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def max_grad_norm(self) -> float | None: ...
    @property
    def stats(self) -> _StepCounts: ...


def backward_together(
    jobs: Sequence[tuple[FusedExpert, Sequence[tuple[Any, ...]]]],
) -> list[list[tuple[torch.Tensor | None]]]:
    """Every job's backward batch (``ExpertBackend._backward_requests``'s requests) and each expert's
    optimizer step; each job's input gradients on the CPU, one tuple per request."""
    plans: list[PlannedBackward] = []
    for backend, requests in jobs:
        backend.optimizer.zero_grad(set_to_none=True)
        plans.append(plan_backward(backend.module, [BackwardRequest(*r) for r in requests], backend.device))
    outputs = [o for plan in plans for o in plan.outputs]
    if outputs:
        with torch.enable_grad():
            torch.autograd.backward(outputs, [g for plan in plans for g in plan.grads])
    step_together([backend for backend, _ in jobs])
    results = []
    for (backend, _), plan in zip(jobs, plans, strict=True):
        backend.stats.steps += 1  # one writer: this worker thread
        backend.stats.recomputed_samples += plan.recomputed
        results.append([(None if g is None else g.to("cpu"),) for g in plan.input_grads()])
    return results


def step_together(backends: Sequence[FusedExpert]) -> None:
    """Clip each expert's gradient to its ``max_grad_norm`` and take each one's Adam step."""
    _clip_each(backends)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for backend in backends:
        if not all(_plain(group) for group in backend.optimizer.param_groups):
            backend.optimizer.step()
            continue
        for group in backend.optimizer.param_groups:
            key = (group["lr"], *group["betas"], group["eps"], group["weight_decay"], group["maximize"])
            groups.setdefault(key, []).append(group | {"_state": backend.optimizer.state})
    for (lr, beta1, beta2, eps, weight_decay, maximize), members in groups.items():
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for group in members:
            state = group["_state"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                s = state[p]
                if not s:  # as Adam._init_group starts a parameter's state
                    s["step"] = torch.tensor(0.0, dtype=torch.float32)
                    s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(s["exp_avg"])
                exp_avg_sqs.append(s["exp_avg_sq"])
                steps.append(s["step"])
        if not params:
            continue
        with torch.no_grad():
            adam(
                params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, amsgrad=False,
                beta1=beta1, beta2=beta2, lr=lr, weight_decay=weight_decay, eps=eps, maximize=maximize,
            )  # fmt: skip


def _plain(group: dict[str, Any]) -> bool:
    return not any(group.get(k) for k in ("amsgrad", "capturable", "fused", "differentiable")) and not (
        group.get("decoupled_weight_decay")
    )


def _clip_each(backends: Sequence[FusedExpert]) -> None:
    """``clip_grad_norm_(module.parameters(), max_grad_norm)`` for each expert, in foreach passes."""
    grads: list[torch.Tensor] = []
    owner: list[int] = []
    limits: list[float] = []
    for backend in backends:
        if backend.max_grad_norm is None:
            continue
        mine = [p.grad for p in backend.module.parameters() if p.grad is not None]
        grads.extend(mine)
        owner.extend([len(limits)] * len(mine))
        limits.append(float(backend.max_grad_norm))
    if not grads:
        return
    with torch.no_grad():
        norms = torch.stack([n.to(grads[0].device, torch.float32) for n in torch._foreach_norm(grads)])
        index = torch.tensor(owner, device=norms.device)
        totals = torch.zeros(len(limits), device=norms.device).index_add_(0, index, norms.square()).sqrt()
        coefs = (torch.tensor(limits, device=norms.device) / (totals + 1e-6)).clamp(max=1.0)
        by_device: dict[torch.device, tuple[list[torch.Tensor], list[float]]] = {}
        for g, c in zip(grads, coefs[index].tolist(), strict=True):
            tensors, scales = by_device.setdefault(g.device, ([], []))
            tensors.append(g)
            scales.append(c)
        for tensors, scales in by_device.values():
            torch._foreach_mul_(tensors, scales)
