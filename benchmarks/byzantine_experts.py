"""Poisoned gradients into experts: the digits model with its middle layer on two hosted experts, 8
trainers, honest and 20% / 30% malicious, with the hosts' guards (engine.moe.guard) and without.

Part of ``benchmarks/byzantine.py`` (its attack "poisoned gradients into experts"; it imports this
module and runs :func:`expert_runs` after the collaborative attacks); runnable alone too:

    nice -n 5 .venv/bin/python benchmarks/byzantine_experts.py --quick

Model: ``Linear(64, 128) -> ReLU -> mean of two FFN experts (dim 128, hidden 256, residual) ->
Linear(128, 10)``. The experts are real :class:`engine.moe.ExpertBackend` objects in this process (their
checks, batching, kept graphs, Adam and clip at ``max_grad_norm`` 1.0, and with ``guard=``
:data:`engine.moe.backend.DEFAULT_GUARD` or ``None``), called as a trainer's layer calls them: a forward
per trainer and expert, then a backward with the output gradient; a refused backward counts as a
skipped expert (zero input gradient), as :mod:`engine.moe.layer_calls` does. The dense layers are
shared: every step applies the mean of the trainers' dense gradients (weighted by batch) with Adam; the
malicious trainers' head gradients are honest and their first layer's is missing (they keep no honest
expert answer to backpropagate), the all-reduce's attacks being the other part of the benchmark, so
what differs is what reaches the experts. No network: the RPC layer is not what is
measured here (``tests/unit/moe`` covers the server's codes).

Malicious trainers (the last ``ceil(share x 8)``, as in byzantine.py) send ``REPEAT`` poisoned backwards
per expert and step (each after a forward of its own: "as often as the trainer likes"):

- ``experts_sign_flip``: the negative of its true output gradient;
- ``experts_x1000``: its true output gradient times -1000;
- ``experts_crafted``: every row the same direction, the one that raises class 0's logit through the
  shared head, at 0.9 x the guard's bound (8 x its own true gradient's size): the largest a guarded
  host takes, sent to move every output one way;
- ``experts_crafted_once``: the same, but one backward per expert and step, as an honest trainer sends
  (the share bound has nothing to refuse: this is the attack the guards bound least).

Gaps: paired accuracy differences to the honest run under the same hosts (guarded attack against
guarded honest, unguarded against unguarded); overhead: how far the guarded honest run's samples/s
falls below the unguarded one's, per pair (each repeat's, and ``OVERHEAD_PAIRS`` more honest pairs
run back to back), median and range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn

from engine.moe import ActivationCache, ExpertBackend, ExpertRequestError, ExpertSpec
from engine.moe.backend import DEFAULT_GUARD
from engine.trainer.model import Digits, load_digits_split

N = 8
B = 64
BATCHES = (12, 10, 10, 8, 8, 6, 6, 4)
SHARES = (0.2, 0.3)
EXPERT_ATTACKS = ("experts_sign_flip", "experts_x1000", "experts_crafted", "experts_crafted_once")
EXPERTS = 2
DIM, HIDDEN = 128, 256
LR = 3e-3
REPEAT = 8
OVERHEAD_PAIRS = 3
IDS = [f"trainer-{i}-" + "x" * 30 for i in range(N)]

logger = logging.getLogger("bench.experts")


@dataclass
class ExpertRun:
    attack: str | None
    share: float
    guarded: bool
    acc: float = 0.0
    seconds: float = 0.0
    honest_samples: int = 0
    refused_bad: int = 0  # malicious backwards the hosts refused
    sent_bad: int = 0
    refused_honest: int = 0  # honest backwards the hosts refused
    rollbacks: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        hosts = "defended" if self.guarded else "undefended"
        if self.attack is None:
            return f"experts honest {hosts}"
        return f"{self.attack} {round(self.share * 100)}% {hosts}"


def malicious(share: float) -> list[int]:
    b = math.ceil(share * N - 1e-9)
    return list(range(N - b, N))


class Dense(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(64, DIM)
        self.head = nn.Linear(DIM, 10)


def accuracy(dense: Dense, experts: list[ExpertBackend], data: Digits) -> float:
    with torch.no_grad():
        h = torch.relu(dense.inp(data.x_test))
        z = sum(e.module(h) for e in experts) / len(experts)
        return float((dense.head(z).argmax(1) == data.y_test).float().mean())  # type: ignore[arg-type]


def poison(attack: str, true: torch.Tensor, head: nn.Linear) -> torch.Tensor:
    if attack == "experts_sign_flip":
        return -true
    if attack == "experts_x1000":
        return -1000.0 * true
    size = float(true.square().sum(1).mean().sqrt())  # what the guard measures of the true gradient
    direction = -head.weight[0].detach()  # descent moves the outputs against the gradient: up class 0
    direction = direction / direction.norm()
    return (0.9 * DEFAULT_GUARD.norm_multiple * size * direction).expand_as(true).contiguous()


async def honest_backward(
    expert: ExpertBackend, peer: str, aid: str, grad: torch.Tensor
) -> torch.Tensor | None:
    """The input gradient, or ``None`` when the host refused (the trainer skips that expert)."""
    try:
        return await expert.backward(peer, aid, grad)
    except ExpertRequestError:
        return None


async def poisoned(expert: ExpertBackend, peer: str, aid: str, h: torch.Tensor, grad: torch.Tensor) -> bool:
    """One more forward and a poisoned backward; ``False`` when the host refused it."""
    try:
        await expert.forward(peer, aid, h)
        await expert.backward(peer, aid, grad)
        return True
    except ExpertRequestError:
        return False


async def train(run: ExpertRun, data: Digits, steps: int, seed: int) -> ExpertRun:
    bad = malicious(run.share) if run.attack else []
    executor = ThreadPoolExecutor(1, thread_name_prefix="bench-experts")
    cache, graphs = ActivationCache(64 << 20, 60.0), ActivationCache(256 << 20, 60.0)
    experts = [
        ExpertBackend(
            f"ffn.{e}",
            ExpertSpec("ffn", DIM, hidden=HIDDEN),
            device="cpu",
            executor=executor,
            cache=cache,
            graphs=graphs,
            lr=LR,
            max_wait_s=0.002,
            seed=1000 * seed + e,
            guard=DEFAULT_GUARD if run.guarded else None,
        )
        for e in range(EXPERTS)
    ]
    dense = Dense(seed)
    opt = torch.optim.Adam(dense.parameters(), lr=LR)
    gens = [torch.Generator().manual_seed(10 + i + 1000 * seed) for i in range(N)]
    started = time.monotonic()
    for step in range(steps):
        xs, ys = [], []
        for i in range(N):
            idx = torch.randint(0, len(data.x_train), (BATCHES[i],), generator=gens[i])
            xs.append(data.x_train[idx])
            ys.append(data.y_train[idx])
        hs = [torch.relu(dense.inp(x)) for x in xs]
        outs = await asyncio.gather(
            *(e.forward(IDS[i], f"{step}.{i}", hs[i].detach()) for i in range(N) for e in experts)
        )
        leaves = [o.clone().requires_grad_(True) for o in outs]
        losses = []
        for i in range(N):
            mine = leaves[i * EXPERTS : (i + 1) * EXPERTS]
            z = sum(mine) / EXPERTS
            losses.append(nn.functional.cross_entropy(dense.head(z), ys[i]) * BATCHES[i] / sum(BATCHES))
        torch.stack(losses).sum().backward()
        grads: list[torch.Tensor] = [leaf.grad for leaf in leaves]  # type: ignore[misc]

        honest_calls = [
            honest_backward(experts[e], IDS[i], f"{step}.{i}", grads[i * EXPERTS + e])
            for i in range(N)
            if i not in bad
            for e in range(EXPERTS)
        ]
        bad_calls = [
            poisoned(
                experts[e],
                IDS[i],
                f"{step}.{i}.bad{r}",
                hs[i].detach(),
                poison(run.attack or "", grads[i * EXPERTS + e], dense.head),
            )
            for i in bad
            for e in range(EXPERTS)
            for r in range(1 if run.attack == "experts_crafted_once" else REPEAT)
        ]
        answers = await asyncio.gather(*honest_calls, *bad_calls)
        honest = [i for i in range(N) if i not in bad]
        for k, i in enumerate(honest):
            mine = answers[k * EXPERTS : (k + 1) * EXPERTS]
            run.refused_honest += sum(1 for g in mine if g is None)
            got = [g for g in mine if isinstance(g, torch.Tensor)]
            if got:  # a refused expert is skipped: its share of the input gradient is zero
                hs[i].backward(sum(got) / EXPERTS)
        run.sent_bad += len(bad_calls)
        run.refused_bad += sum(1 for ok in answers[len(honest_calls) :] if ok is False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        run.honest_samples += sum(BATCHES[i] for i in range(N) if i not in bad)
    run.seconds = time.monotonic() - started
    run.acc = accuracy(dense, experts, data)
    run.rollbacks = sum(e.stats.rollbacks for e in experts)
    run.stats = {e.uid: e.stats.as_dict() for e in experts}
    for e in experts:
        await e.close()
    executor.shutdown(wait=True)
    return run


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


async def expert_runs(steps: int, repeats: int, data: Digits | None = None) -> dict[str, Any]:
    """Every run of the expert attack, ``repeats`` times; the figures byzantine.py adds to its own."""
    data = data or load_digits_split()
    plan: list[tuple[str | None, float, bool]] = [(None, 0.0, False), (None, 0.0, True)]
    plan += [(a, s, g) for g in (True, False) for s in SHARES for a in EXPERT_ATTACKS]
    results: dict[str, list[ExpertRun]] = {}
    for seed in range(repeats):
        for attack, share, guarded in plan:
            run = await train(ExpertRun(attack, share, guarded), data, steps, seed)
            results.setdefault(run.name, []).append(run)
            logger.info(
                "repeat %d  %-36s acc %.3f  %5.1f s  bad refused %d/%d  honest refused %d  rollbacks %d",
                seed,
                run.name,
                run.acc,
                run.seconds,
                run.refused_bad,
                run.sent_bad,
                run.refused_honest,
                run.rollbacks,
            )
    gaps: dict[str, float] = {}
    print(f"\n{'run':38s} {'accuracy: median [min, max]':30s} gap to honest (same hosts, paired median)")
    for name, runs in results.items():
        reference = results["experts honest " + ("defended" if runs[0].guarded else "undefended")]
        gap = statistics.median(ref.acc - r.acc for ref, r in zip(reference, runs, strict=True))
        if runs[0].attack is not None:
            gaps[name] = round(gap, 4)
        print(f"{name:38s} {spread([r.acc for r in runs]):30s} {gap:+.3f}")
    guarded = results["experts honest defended"]
    plain = results["experts honest undefended"]
    timed_plain, timed = list(plain), list(guarded)
    for k in range(OVERHEAD_PAIRS):  # more honest pairs, for the overhead only: it is noisy on a shared box
        timed_plain.append(await train(ExpertRun(None, 0.0, False), data, steps, 100 + k))
        timed.append(await train(ExpertRun(None, 0.0, True), data, steps, 100 + k))
    rates = [r.honest_samples / r.seconds for r in timed]
    rates_plain = [r.honest_samples / r.seconds for r in timed_plain]
    overheads = [1 - g / p for g, p in zip(rates, rates_plain, strict=True)]
    attacked = [r for runs in results.values() for r in runs if r.attack is not None and r.guarded]
    return {
        "expert_gaps": gaps,
        "acc_experts_honest_defended": statistics.median(r.acc for r in guarded),
        "acc_experts_honest_undefended": statistics.median(r.acc for r in plain),
        "expert_guard_overhead": round(statistics.median(overheads), 4),
        "expert_guard_overhead_range": [round(min(overheads), 4), round(max(overheads), 4)],
        "expert_overhead_pairs": len(overheads),
        "expert_samples_per_s": [
            round(statistics.median(rates), 1),
            round(statistics.median(rates_plain), 1),
        ],
        "expert_honest_refused": sum(
            r.refused_honest for runs in results.values() for r in runs if r.guarded
        ),
        "expert_rollbacks_honest": sum(r.rollbacks for r in guarded),
        "expert_refused_bad": {
            a: round(
                statistics.mean(r.refused_bad / max(1, r.sent_bad) for r in attacked if r.attack == a), 3
            )
            for a in EXPERT_ATTACKS
        },
        "expert_rollbacks_attacked": {
            a: sum(r.rollbacks for r in attacked if r.attack == a) for a in EXPERT_ATTACKS
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(message)s")
    logger.setLevel(logging.INFO)
    torch.set_num_threads(1)
    steps = args.steps or (150 if args.quick else 300)
    repeats = args.repeats or (2 if args.quick else 3)
    figures = asyncio.run(expert_runs(steps, repeats))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
