"""Byzantine trainers in collaborative training of the digits model: honest, then 20% and 30% of 8
trainers malicious, for each attack of issue 28 (the digits half; the language model's is not built).

Setup (in one process): 8 trainers on the digits task (sklearn's 8x8 digits, the MLP and Adam of
``benchmarks/collab_training.py``, target batch ``B`` = 64), each computing a batch of its own size
(``BATCHES``: 12, 10, 10, 8, 8, 6, 6, 4; unequal, as volunteers' are) from its own data order each
step. Every step is one real round of the collab package: the leader's group from
``engine.collab.matchmaking.freeze_group`` over the trainers' claimed bandwidths and samples (the share
cap, the samples bound), then the butterfly all-reduce by the real ``AllReduceService`` /
``PartReducer`` of every trainer, over in-memory links that carry the real framing, wire codec and RPC
(``tests/unit/collab/mesh.py``: ``RpcEndpoint`` pairs on ``tests/memchannel.py`` channels), and the
averaged gradient applied with the optimizer's step scale. Matchmaking through the DHT, progress
records and their timing are not driven (the rounds are synchronous; the unit tests cover those
bounds). The honest members' results are checked to be bit-identical every round.

Malicious trainers: ``ceil(share x 8)`` of them (rounded up, so 20% is 2 of 8 = 25% and 30% is 3 of 8 =
37.5%), the last ones (the smallest batches, so that their missing data weighs least). They reduce
their parts as the code does (forging a reducer's answer is not among these attacks: checking reducers
is not built). Attacks:

- ``sign_flip``: each sends the negative of its gradient.
- ``scaled_x1000``: its gradient times 1000.
- ``alie``: "a little is enough" (Baruch et al. 2019): all send ``mean - z std`` of the honest
  gradients (coordinate-wise, known to them), ``z = Phi^-1((n - s) / n)``, ``s = floor(n/2 + 1) - b``.
- ``inflated_weight``: weight 1e9 with its gradient times -1000 (issue 28's attack; refused above the
  bound, ``2 B``).
- ``weight_at_cap``: the largest weight a reducer accepts (``2 B``) with its gradient times -1000; the
  reducer bounds it to twice the median weight.
- ``inflated_bandwidth``: claims 1e300 bytes/s (and sends its gradient times -1000); its part is capped.
- ``experts_sign_flip``, ``experts_x1000``, ``experts_crafted``: poisoned gradients into experts, the
  digits model with its middle layer on two experts hosted by the real ``ExpertBackend``, with the
  hosts' guards (engine.moe.guard) and without: ``benchmarks/byzantine_experts.py`` (its docstring has
  the setup); their defended gaps join ``gaps`` and the worst gaps, the rest is under ``experts``.
- ``state_epoch_1e9``: at half the run a newcomer takes the collaboration's state from every trainer's
  real ``StateDonor`` (in-memory DHT slots), the malicious ones publishing a forged state (another
  model) at epoch 10^9, and the collaboration goes on from the newcomer's copy. The malicious trainers
  train honestly otherwise. Unit-level as to the DHT (a dict of signed slots, not the Kademlia nodes).

Runs: honest undefended (the plain weighted mean, the old weight bound 1e9), honest defended
(CenteredClip and the bounds: the package's defaults), ``absent`` at both shares (the malicious
trainers' contributions weigh 0: what losing their data costs, part of every attack's gap), every
attack defended at both shares, and every attack undefended at 20% (to show each one bites; for the
state, the old rule, newest epoch claimed, re-created here). Each repeat draws another initialisation
and data order; all runs of a repeat share them, so gaps are paired. Accuracy on the held-out split;
median and spread over repeats.

Last line, JSON: ``worst_gap_20`` / ``worst_gap_30`` (largest median accuracy gap to the honest defended
run over the attacks), ``gaps`` (each attack and share), ``overhead`` (how far the defended honest
run's samples/s falls below the undefended one's, a fraction), ``caught`` (share of malicious trainers
refused by an honest reducer, or flagged as an outlier, 10 radii away or more, in more than half the
chunks they sent to honest reducers over the run; averaged over the attacked runs: CenteredClip
bounds what it does not catch, and nothing here bans anyone), ``gap_missing_data`` (the ``absent``
runs' gaps), ``honest_excluded`` (honest trainers refused or flagged so, any defended run; 0 is the
target; being clipped a little is every honest member's lot at the default radius, not counted).

    nice -n 5 .venv/bin/python benchmarks/byzantine.py --quick   # 150 steps, 2 repeats, ~5 min on 2 cores
    .venv/bin/python benchmarks/byzantine.py                     # 300 steps, 3 repeats
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
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn

from benchmarks.byzantine_experts import EXPERT_ATTACKS, expert_runs
from benchmarks.collab_training import LR, accuracy, make_model
from engine.collab import AllReduceConfig, AllReduceService, CenteredClipConfig
from engine.collab import state as collab_state
from engine.collab.matchmaking import freeze_group
from engine.collab.reducer import MAX_WEIGHT
from engine.collab.snapshot import StateRecord, load_snapshot, take_snapshot
from engine.collab.state import StateDonor, download_state
from engine.collab.stepping import scaled_learning_rate, step_scale
from engine.trainer.model import Digits, load_digits_split
from engine.wire import Compression
from tests.unit.collab.mesh import FakeDHT, mesh

B = 64
N = 8
BATCHES = (12, 10, 10, 8, 8, 6, 6, 4)
BANDWIDTH = 1e7
SHARES = (0.2, 0.3)
ATTACKS = (
    "sign_flip",
    "scaled_x1000",
    "alie",
    "inflated_weight",
    "weight_at_cap",
    "inflated_bandwidth",
    "state_epoch_1e9",
)
CHUNK = 1 << 14
IDS = [f"trainer-{i}-" + "x" * 30 for i in range(N)]
NEWCOMER = "newcomer-" + "x" * 30

logger = logging.getLogger("bench")


@dataclass
class Run:
    attack: str | None  # None: honest
    share: float
    defended: bool
    acc: float = 0.0
    seconds: float = 0.0
    honest_samples: int = 0
    caught: float = 0.0  # share of the malicious trainers caught
    honest_flagged: int = 0
    identical: bool = True
    attacker_share: float = 0.0  # largest share of the vector one malicious trainer reduced
    state_epoch: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        if self.attack is None:
            return "honest " + ("defended" if self.defended else "undefended")
        return f"{self.attack} {round(self.share * 100)}% " + ("defended" if self.defended else "undefended")


def malicious(share: float) -> list[int]:
    """The last ceil(share x N) trainers."""
    b = math.ceil(share * N - 1e-9)
    return list(range(N - b, N))


def alie_z(n: int, b: int) -> float:
    s = math.floor(n / 2 + 1) - b
    return NormalDist().inv_cdf((n - s) / n)


def flat_grad(model: nn.Module) -> torch.Tensor:
    out = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    return out


class AttackerService(AllReduceService):
    """The package's service (its reducer runs the package's code with the honest settings), but it
    sends whatever weight it is given, not at most the bound."""

    def claimed_weight(self, weight: float) -> float:
        return float(weight)


ROBUST = CenteredClipConfig()  # the package's defaults, unless the command line says otherwise


def config(defended: bool) -> AllReduceConfig:
    weight = 2.0 * B if defended else MAX_WEIGHT
    return AllReduceConfig(
        chunk=CHUNK,
        stall_timeout=10,
        round_timeout=60,
        max_weight=weight,
        robust=ROBUST if defended else None,
    )


def newest_claimed(records: dict[str, StateRecord]) -> tuple[int, bytes, list[str]]:
    """The rule before issue 28 (re-created here for the undefended run): the highest epoch any
    record claims, and its most vouched-for hash."""
    epoch = max(r.epoch for r in records.values())
    hashes = sorted({r.manifest_hash for r in records.values() if r.epoch == epoch})
    best = hashes[0]
    return epoch, best, sorted(o for o, r in records.items() if r.epoch == epoch and r.manifest_hash == best)


async def take_state(
    peers: list[Any],
    bad: list[int],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    epoch: int,
    seed: int,
    defended: bool,
) -> tuple[nn.Module, torch.optim.Optimizer, int]:
    """Every trainer a donor (the malicious ones of a forged state at epoch 10^9); a newcomer takes one."""
    dht = FakeDHT()
    honest = take_snapshot("bench", epoch, model, opt)
    forged_model = make_model(seed + 777)
    forged_opt = torch.optim.Adam(forged_model.parameters(), lr=LR)
    forged_model(torch.randn(4, 64)).sum().backward()
    forged_opt.step()
    forged = take_snapshot("bench", 10**9, forged_model, forged_opt)
    for i, p in enumerate(peers[:N]):
        await StateDonor(p, dht.node(p.peer_id), "bench").publish(forged if i in bad else honest)
    fresh = make_model(seed + 999)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=LR)
    rule = collab_state.choose_state
    if not defended:
        collab_state.choose_state = newest_claimed  # type: ignore[assignment]
    try:
        manifest, blob, _ = await download_state(peers[N], dht.node(NEWCOMER), "bench", model=fresh)
    finally:
        collab_state.choose_state = rule
    load_snapshot(fresh, fresh_opt, manifest, blob)
    return fresh, fresh_opt, manifest.epoch


async def train(run: Run, data: Digits, steps: int, seed: int) -> Run:
    bad = malicious(run.share) if run.attack else []
    honest = [i for i in range(N) if i not in bad]
    peers = mesh([*IDS, NEWCOMER])
    services = [
        (AttackerService if i in bad else AllReduceService)(p, config(run.defended))  # type: ignore[arg-type]
        for i, p in enumerate(peers[:N])
    ]
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gens = [torch.Generator().manual_seed(10 + i + 1000 * seed) for i in range(N)]
    size = sum(p.numel() for p in model.parameters())
    refused: set[int] = set()
    clipped = [0] * N
    outliers = [0] * N
    sent_to_honest = [0] * N
    started = time.monotonic()
    for step in range(steps):
        if run.attack == "state_epoch_1e9" and step == steps // 2:
            model, opt, run.state_epoch = await take_state(peers, bad, model, opt, step, seed, run.defended)
        grads = []
        for i in range(N):
            idx = torch.randint(0, len(data.x_train), (BATCHES[i],), generator=gens[i])
            nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
            grads.append(flat_grad(model))
        weights = [float(b) for b in BATCHES]
        bandwidths = [BANDWIDTH] * N
        vectors = list(grads)
        if run.attack == "absent":  # the malicious trainers send nothing that counts: weight 0
            for i in bad:
                weights[i] = 0.0
        elif bad and run.attack != "state_epoch_1e9":
            honest_stack = torch.stack([grads[i] for i in honest])
            mean, std = honest_stack.mean(0), honest_stack.std(0)
            for i in bad:
                if run.attack == "sign_flip":
                    vectors[i] = -grads[i]
                elif run.attack == "scaled_x1000":
                    vectors[i] = 1000.0 * grads[i]
                elif run.attack == "alie":
                    vectors[i] = mean - alie_z(N, len(bad)) * std
                else:
                    vectors[i] = -1000.0 * grads[i]
                    if run.attack == "inflated_weight":
                        weights[i] = 1e9
                    elif run.attack == "weight_at_cap":
                        weights[i] = 2.0 * B
                    elif run.attack == "inflated_bandwidth":
                        bandwidths[i] = 1e300
        info = [(bw, False, int(w)) for bw, w in zip(bandwidths, weights, strict=True)]
        group = freeze_group(f"bench/{seed}/{step}", IDS, info, size, Compression.NONE, target=B)
        if bad:
            run.attacker_share = max(run.attacker_share, max(group.parts[i] for i in bad) / size)
        work = [v.clone() for v in vectors]
        reports = await asyncio.gather(
            *(s.all_reduce(group, v, w) for s, v, w in zip(services, work, weights, strict=True))
        )
        result = work[honest[0]]
        run.identical &= all(torch.equal(work[i], result) for i in honest)
        for j in honest:  # what the honest reducers did with each sender's chunks
            if group.parts[j] == 0:
                continue
            for i in range(N):
                sent_to_honest[i] += 1
                if IDS[i] in reports[j].excluded:
                    refused.add(i)
                clipped[i] += reports[j].clipped.get(IDS[i], 0)
                outliers[i] += reports[j].outliers.get(IDS[i], 0)
        offset = 0
        for p in model.parameters():
            p.grad = result[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        with scaled_learning_rate(opt, step_scale(group.samples, B)):
            opt.step()
        opt.zero_grad(set_to_none=True)
        run.honest_samples += sum(BATCHES[i] for i in honest)
    run.seconds = time.monotonic() - started
    run.acc = accuracy(model, data)
    flagged = {i for i in range(N) if i in refused or outliers[i] * 2 > max(1, sent_to_honest[i])}
    run.caught = len(flagged & set(bad)) / len(bad) if bad else 0.0
    run.honest_flagged = len(flagged - set(bad))
    run.notes = {"clipped": clipped, "outliers": outliers, "chunks_to_honest_reducers": sent_to_honest}
    for p in peers:
        p.close()
    return run


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


async def main_async(
    steps: int, repeats: int, undefended: bool = True, experts: bool = True
) -> dict[str, Any]:
    data = load_digits_split()
    plan: list[tuple[str | None, float, bool]] = [(None, 0.0, False), (None, 0.0, True)]
    plan += [("absent", s, True) for s in SHARES]
    plan += [(a, s, True) for s in SHARES for a in ATTACKS]
    plan += [(a, SHARES[0], False) for a in ATTACKS if undefended]
    results: dict[str, list[Run]] = {}
    for seed in range(repeats):
        for attack, share, defended in plan:
            run = await train(Run(attack, share, defended), data, steps, seed)
            results.setdefault(run.name, []).append(run)
            logger.info(
                "repeat %d  %-34s acc %.3f  %5.1f s  caught %.2f  honest flagged %d  identical %s%s",
                seed,
                run.name,
                run.acc,
                run.seconds,
                run.caught,
                run.honest_flagged,
                run.identical,
                f"  attacker share {run.attacker_share:.3f}" if run.attacker_share else "",
            )
    reference = results["honest defended"]
    gaps: dict[str, float] = {}
    missing: dict[str, float] = {}
    print(f"\n{'run':36s} {'accuracy: median [min, max]':30s} gap to honest defended (median of paired)")
    for name, runs in results.items():
        paired = [ref.acc - r.acc for ref, r in zip(reference, runs, strict=True)]
        gap = statistics.median(paired)
        if runs[0].attack in ATTACKS:
            gaps[name] = round(gap, 4)
        elif runs[0].attack == "absent":
            missing[name] = round(gap, 4)
        print(f"{name:36s} {spread([r.acc for r in runs]):30s} {gap:+.3f}")
    defended = [r for name, runs in results.items() for r in runs if r.defended]
    attacked = [r for r in defended if r.attack in ATTACKS]
    undefended_honest = results["honest undefended"]
    rate = statistics.median(r.honest_samples / r.seconds for r in reference)
    rate_plain = statistics.median(r.honest_samples / r.seconds for r in undefended_honest)

    expert_figures: dict[str, Any] = {}
    if experts:  # poisoned gradients into experts (benchmarks/byzantine_experts.py)
        expert_figures = await expert_runs(steps, repeats, data)
        for name, gap in expert_figures["expert_gaps"].items():
            if name.endswith(" defended"):
                gaps[name] = gap

    def worst(share: float) -> float:
        names = [*ATTACKS, *(EXPERT_ATTACKS if experts else ())]
        return max(gaps[f"{a} {round(share * 100)}% defended"] for a in names)

    state_runs = [r for r in attacked if r.attack == "state_epoch_1e9"]
    figures = {
        "steps": steps,
        "repeats": repeats,
        "centered_clip": {
            "tau_scale": ROBUST.tau_scale,
            "iterations": ROBUST.iterations,
            "weight_to_median": ROBUST.weight_to_median,
        },
        "trainers": N,
        "malicious": {f"{round(s * 100)}%": len(malicious(s)) for s in SHARES},
        "acc_honest_defended": statistics.median(r.acc for r in reference),
        "acc_honest_undefended": statistics.median(r.acc for r in undefended_honest),
        "worst_gap_20": worst(0.2),
        "worst_gap_30": worst(0.3),
        "gaps": gaps,
        "gap_missing_data": missing,
        "overhead": round(1 - rate / rate_plain, 4),
        "samples_per_s_defended": round(rate, 1),
        "samples_per_s_undefended": round(rate_plain, 1),
        "caught": round(statistics.mean(r.caught for r in attacked), 3),
        "caught_by_attack": {
            a: round(statistics.mean(r.caught for r in attacked if r.attack == a), 3) for a in ATTACKS
        },
        "honest_excluded": sum(r.honest_flagged for r in defended),
        "identical_honest_results": all(r.identical for r in defended),
        "max_attacker_share": round(max(r.attacker_share for r in attacked), 4),
        "state_epochs_taken": sorted({r.state_epoch for r in state_runs if r.state_epoch is not None}),
        "load_avg_1m": os.getloadavg()[0],
    }
    if expert_figures:
        figures["experts"] = {k: v for k, v in expert_figures.items() if k != "expert_gaps"}
        figures["experts"]["gaps_undefended"] = {
            k: v for k, v in expert_figures["expert_gaps"].items() if k.endswith(" undefended")
        }
    return figures


def main() -> None:
    global ROBUST, ATTACKS
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--tau-scale", type=float, default=None, help="CenteredClip's radius scale")
    parser.add_argument("--iterations", type=int, default=None, help="CenteredClip's iterations")
    parser.add_argument("--weight-to-median", type=float, default=None, help="weight bound / median")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated subset")
    parser.add_argument("--no-undefended", action="store_true", help="skip the undefended attacked runs")
    parser.add_argument("--no-experts", action="store_true", help="skip poisoned gradients into experts")
    args = parser.parse_args()
    defaults = CenteredClipConfig()
    ROBUST = CenteredClipConfig(
        tau_scale=args.tau_scale or defaults.tau_scale,
        iterations=args.iterations or defaults.iterations,
        weight_to_median=args.weight_to_median or defaults.weight_to_median,
    )
    ATTACKS = tuple(a for a in args.attacks.split(",") if a)
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(message)s")
    logger.setLevel(logging.INFO)
    torch.set_num_threads(1)
    steps = args.steps or (150 if args.quick else 300)
    repeats = args.repeats or (2 if args.quick else 3)
    figures = asyncio.run(main_async(steps, repeats, not args.no_undefended, not args.no_experts))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
