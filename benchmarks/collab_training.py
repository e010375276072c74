"""Collaborative training (DeDLOC) against one trainer alone, at the same number of samples.

The digits task (sklearn's bundled 8x8 digits), an MLP, Adam. Three runs in one process:

- single: one trainer, batch ``B``, ``S`` steps (``S * B`` samples).
- collab: 4 trainers of different speeds on real aiortc links (the coordinator's signaling on
  loopback, a DHT over the same links), each computing batches of ``B / 8``, target batch size ``B``,
  until epoch ``S``. They average gradients and all take the same ``S`` steps.
- churn: as collab, but one trainer is killed at epoch ``S / 2`` and a new one joins at ``3 S / 4``,
  downloading parameters and optimizer state from the others (``state_download_s``).

Trainers are throttled to a fixed number of samples per second (as if their compute took that long).
Epochs close near ``B`` (the optimizer holds back a batch that would overshoot, and a peer stepping
closes the epoch for all), but peers decide on views a DHT read old, so some overshoot by a batch or
two; the samples actually averaged per epoch are printed (``epoch_samples``). Each collaborative step
scales its learning rate by its samples over ``B`` (``step_scale``). Like for like, ``acc_single`` is
one trainer with batch ``B`` for as many samples as the collaboration used, and
``acc_single_same_batches`` one trainer taking exactly the collaboration's per-epoch batch sizes (same
steps, same samples, the learning rate unscaled). Accuracies are on the held-out split, from trainer 0's model
(collab members hold identical models; the check is printed). Each repeat draws another model
initialisation and other batch orders; medians over repeats, with each repeat's figures.

    .venv/bin/python benchmarks/collab_training.py --quick   # S = 12, one repeat, within about 60 s
    .venv/bin/python benchmarks/collab_training.py           # S = 40, 3 repeats
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch import nn

from engine.trainer.model import Digits, load_digits_split

B = 64
RATES = (30.0, 20.0, 15.0, 10.0)  # samples per second per trainer: unequal, as volunteers are
LR = 3e-3


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)  # the run's seed: every trainer starts from the same parameters
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def accuracy(model: nn.Module, data: Digits) -> float:
    with torch.no_grad():
        return float((model(data.x_test).argmax(1) == data.y_test).float().mean())


def train_single(data: Digits, batches: list[int], seed: int = 0) -> float:
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1 + 1000 * seed)
    for size in batches:
        idx = torch.randint(0, len(data.x_train), (size,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        opt.step()
    return accuracy(model, data)


class Swarm:
    def __init__(self, url: str, run: str, seed: int) -> None:
        self.url = url
        self.run = run
        self.seed = seed
        self.peers: list[Any] = []
        self.nodes: list[Any] = []

    async def add_trainer(self) -> Any:
        from engine.collab import CollabConfig, CollaborativeOptimizer, MatchmakingConfig
        from engine.collab.allreduce import AllReduceConfig
        from engine.dht import DHTNode
        from engine.dht.p2p_transport import PeerTransport
        from engine.p2p import Identity, LinkConfig, Peer

        peer = Peer(Identity.generate(), self.url, config=LinkConfig(connect_timeout=30))
        await peer.start()
        node = DHTNode(PeerTransport(peer), signer=peer.identity, rpc_timeout=10)
        if self.nodes:
            await node.bootstrap([self.nodes[0].peer_id])
        self.peers.append(peer)
        self.nodes.append(node)
        model = make_model(self.seed)
        config = CollabConfig(
            run=self.run,
            target_batch_size=B,
            publish_period_s=0.1,
            refresh_period_s=0.1,
            allreduce=AllReduceConfig(chunk=1 << 14, stall_timeout=5, round_timeout=30),
            matchmaking=MatchmakingConfig(gather_s=0.6, max_wait_s=3.0, join_timeout=15),
        )
        return CollaborativeOptimizer(model, torch.optim.Adam(model.parameters(), lr=LR), peer, node, config)

    async def stop(self) -> None:
        for p in self.peers:
            await p.stop()


async def run_trainer(opt: Any, data: Digits, rate: float, until: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = B // 8  # a trainer's batch is small next to the target, as in DeDLOC
    while opt.epoch < until:
        started = time.monotonic()
        idx = torch.randint(0, len(data.x_train), (batch,), generator=gen)
        nn.functional.cross_entropy(opt.model(data.x_train[idx]), data.y_train[idx]).backward()
        await opt.step(batch)
        await asyncio.sleep(max(0.0, batch / rate - (time.monotonic() - started)))


async def collab_run(url: str, data: Digits, steps: int, churn: bool, seed: int) -> dict[str, Any]:
    swarm = Swarm(url, f"bench-{'churn' if churn else 'collab'}-{seed}", seed)
    opts = [await swarm.add_trainer() for _ in RATES]
    for o in opts:
        await o.join()
    tasks = [
        asyncio.create_task(run_trainer(o, data, r, steps, seed=10 + i + 1000 * seed))
        for i, (o, r) in enumerate(zip(opts, RATES, strict=True))
    ]
    out: dict[str, Any] = {}
    if churn:
        while opts[0].epoch < steps // 2:  # noqa: ASYNC110 (polling a counter the optimizer owns)
            await asyncio.sleep(0.1)
        tasks[3].cancel()
        await swarm.peers[3].stop()  # killed: no goodbye
        while opts[0].epoch < (3 * steps) // 4:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        late = await swarm.add_trainer()
        started = time.monotonic()
        report = await late.join()
        out["state_download_s"] = time.monotonic() - started
        out["state_donors"] = len(report.parts_from) if report else 0
        opts.append(late)
        tasks.append(asyncio.create_task(run_trainer(late, data, RATES[3], steps, seed=99 + 1000 * seed)))
    await asyncio.gather(*(t for i, t in enumerate(tasks) if not (churn and i == 3)))
    live = [o for i, o in enumerate(opts) if not (churn and i == 3)]
    out["acc"] = accuracy(opts[0].model, data)
    out["identical"] = all(
        torch.equal(a, b)
        for o in live[1:]
        for a, b in zip(o.model.parameters(), live[0].model.parameters(), strict=True)
    )
    out["samples"] = sum(r.samples for o in opts for r in o.reports)
    per_epoch: dict[int, int] = {}
    for o in opts:
        for r in o.reports:
            if r.group_size > 0:
                per_epoch[r.epoch] = per_epoch.get(r.epoch, 0) + r.samples
    out["batches"] = [per_epoch[e] for e in sorted(per_epoch)]
    out["alone_steps"] = sum(1 for o in opts for r in o.reports if r.group_size == 1)
    out["late_skips"] = sum(1 for o in opts for r in o.reports if r.group_size == 0)
    out["incomplete_rounds"] = sum(1 for o in opts for r in o.reports if r.round and not r.round.complete)
    out["epochs"] = [o.epoch for o in opts]
    out["downloads"] = sum(len(o.downloads) for o in opts)
    await swarm.stop()
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


async def one_repeat(url: str, data: Digits, steps: int, seed: int) -> dict[str, Any]:
    started = time.monotonic()
    collab, churn = await asyncio.gather(
        collab_run(url, data, steps, churn=False, seed=seed),
        collab_run(url, data, steps, churn=True, seed=seed),
    )
    elapsed = time.monotonic() - started
    batches = collab["batches"]
    return {
        "seed": seed,
        "acc_single_same_steps": train_single(data, [B] * steps, seed),
        # the same number of samples as the collaboration used, in batches of B
        "acc_single": train_single(data, [B] * round(collab["samples"] / B), seed),
        # exactly the collaboration's per-epoch batches: same steps, same samples
        "acc_single_same_batches": train_single(data, batches, seed),
        "acc_collab": collab["acc"],
        "samples_collab": collab["samples"],
        "epoch_samples_mean": statistics.mean(batches) if batches else 0.0,
        "epoch_samples_min": min(batches, default=0),
        "epoch_samples_max": max(batches, default=0),
        "epoch_samples": batches,
        "churn_epoch_samples": churn["batches"],
        "collab_identical_models": collab["identical"],
        "acc_with_churn": churn["acc"],
        "samples_with_churn": churn["samples"],
        "churn_identical_models": churn["identical"],
        "state_download_s": churn.get("state_download_s"),
        "alone_steps": collab["alone_steps"] + churn["alone_steps"],
        "late_skips": collab["late_skips"] + churn["late_skips"],
        "incomplete_rounds": collab["incomplete_rounds"] + churn["incomplete_rounds"],
        "collab_epochs": collab["epochs"],
        "state_downloads": collab["downloads"] + churn["downloads"],
        "seconds": elapsed,
    }


async def main_async(steps: int, repeats: int) -> dict[str, Any]:
    from coordinator.server.app import start
    from engine.p2p.patches import install, pin_host_addresses

    pin_host_addresses(["127.0.0.1"])
    install(strict=True)
    data = load_digits_split()
    coordinator = await start("127.0.0.1", 0)
    runs = []
    try:
        for seed in range(repeats):
            run = await one_repeat(coordinator.signaling_url, data, steps, seed)
            runs.append(run)
            print(
                f"repeat {seed}: single {run['acc_single']:.3f} (same batches "
                f"{run['acc_single_same_batches']:.3f}), collab {run['acc_collab']:.3f} "
                f"({run['samples_collab']} samples, per epoch {run['epoch_samples_min']}-"
                f"{run['epoch_samples_max']}, identical: {run['collab_identical_models']}), churn "
                f"{run['acc_with_churn']:.3f}, state download {run['state_download_s']:.2f} s, "
                f"{run['seconds']:.0f} s",
                flush=True,
            )
    finally:
        await coordinator.stop()
    figures: dict[str, Any] = {"steps": steps, "target_batch_size": B, "repeats": repeats}
    for key in (
        "acc_single",
        "acc_single_same_batches",
        "acc_single_same_steps",
        "acc_collab",
        "acc_with_churn",
        "state_download_s",
        "epoch_samples_mean",
        "samples_collab",
        "seconds",
    ):
        figures[key] = _median([r[key] for r in runs])
    gaps = [r["acc_single"] - r["acc_collab"] for r in runs]
    churn_gaps = [r["acc_single"] - r["acc_with_churn"] for r in runs]
    figures["gap_median"] = _median(gaps)
    figures["gap_min"], figures["gap_max"] = min(gaps), max(gaps)
    figures["churn_gap_median"] = _median(churn_gaps)
    figures["epoch_samples_min"] = min(r["epoch_samples_min"] for r in runs)
    figures["epoch_samples_max"] = max(r["epoch_samples_max"] for r in runs)
    figures["all_identical_models"] = all(
        r["collab_identical_models"] and r["churn_identical_models"] for r in runs
    )
    for key in ("alone_steps", "late_skips", "incomplete_rounds", "state_downloads"):
        figures[key] = sum(r[key] for r in runs)
    figures["runs"] = runs
    figures["load_avg_1m"] = os.getloadavg()[0]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
    logging.getLogger("bench").setLevel(logging.INFO)
    for name in ("aiortc", "aioice", "engine.p2p", "engine.dht"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    steps = args.steps or (12 if args.quick else 40)
    repeats = args.repeats or (1 if args.quick else 3)
    figures = asyncio.run(main_async(steps, repeats))
    print(
        f"medians of {repeats}: single {figures['acc_single']:.3f} (same batches "
        f"{figures['acc_single_same_batches']:.3f}), collab {figures['acc_collab']:.3f} (gap "
        f"{figures['gap_median']:+.3f}, from {figures['gap_min']:+.3f} to {figures['gap_max']:+.3f}; "
        f"epochs of {figures['epoch_samples_min']}-{figures['epoch_samples_max']} samples for {B}), "
        f"with churn {figures['acc_with_churn']:.3f}; state download {figures['state_download_s']:.2f} s; "
        f"identical models: {figures['all_identical_models']}; load {figures['load_avg_1m']:.1f}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
