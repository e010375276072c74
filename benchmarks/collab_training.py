"""Collaborative training (DeDLOC) against one trainer alone, at the same number of samples.

The digits task (sklearn's bundled 8x8 digits), an MLP, Adam. Three runs in one process:

- single: one trainer, batch ``B``, ``S`` steps (``S * B`` samples).
- collab: 4 trainers of different speeds on real aiortc links (the coordinator's signaling on
  loopback, a DHT over the same links), each computing batches of ``B / 8``, target batch size ``B``,
  until epoch ``S``. They average gradients and all take the same ``S`` steps.
- churn: as collab, but one trainer is killed at epoch ``S / 2`` and a new one joins at ``3 S / 4``,
  downloading parameters and optimizer state from the others (``state_download_s``).

Trainers are throttled to a fixed number of samples per second (as if their compute took that long),
so the collaboration's progress records keep up and each epoch's batch is close to ``B``; the samples
actually averaged are printed next to ``S * B``. Accuracies are on the held-out split, from trainer 0's
model (collab members hold identical models; the check is printed).

    .venv/bin/python benchmarks/collab_training.py --quick   # S = 12, within about 60 s
    .venv/bin/python benchmarks/collab_training.py           # S = 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
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


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the run's seed: every trainer starts from the same parameters
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def accuracy(model: nn.Module, data: Digits) -> float:
    with torch.no_grad():
        return float((model(data.x_test).argmax(1) == data.y_test).float().mean())


def train_single(data: Digits, steps: int) -> float:
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, len(data.x_train), (B,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        opt.step()
    return accuracy(model, data)


class Swarm:
    def __init__(self, url: str, run: str) -> None:
        self.url = url
        self.run = run
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
        model = make_model()
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


async def collab_run(url: str, data: Digits, steps: int, churn: bool) -> dict[str, Any]:
    swarm = Swarm(url, f"bench-{'churn' if churn else 'collab'}")
    opts = [await swarm.add_trainer() for _ in RATES]
    for o in opts:
        await o.join()
    tasks = [
        asyncio.create_task(run_trainer(o, data, r, steps, seed=10 + i))
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
        tasks.append(asyncio.create_task(run_trainer(late, data, RATES[3], steps, seed=99)))
    await asyncio.gather(*(t for i, t in enumerate(tasks) if not (churn and i == 3)))
    live = [o for i, o in enumerate(opts) if not (churn and i == 3)]
    out["acc"] = accuracy(opts[0].model, data)
    out["identical"] = all(
        torch.equal(a, b)
        for o in live[1:]
        for a, b in zip(o.model.parameters(), live[0].model.parameters(), strict=True)
    )
    out["samples"] = sum(r.samples for o in opts for r in o.reports)
    out["alone_steps"] = sum(1 for o in opts for r in o.reports if r.group_size == 1)
    out["late_skips"] = sum(1 for o in opts for r in o.reports if r.group_size == 0)
    out["incomplete_rounds"] = sum(1 for o in opts for r in o.reports if r.round and not r.round.complete)
    out["epochs"] = [o.epoch for o in opts]
    out["downloads"] = sum(len(o.downloads) for o in opts)
    await swarm.stop()
    return out


async def main_async(steps: int) -> dict[str, Any]:
    from coordinator.app import start
    from engine.p2p.patches import install, pin_host_addresses

    pin_host_addresses(["127.0.0.1"])
    install(strict=True)
    data = load_digits_split()
    coordinator = await start("127.0.0.1", 0)
    try:
        started = time.monotonic()
        single = train_single(data, steps)
        collab, churn = await asyncio.gather(
            collab_run(coordinator.signaling_url, data, steps, churn=False),
            collab_run(coordinator.signaling_url, data, steps, churn=True),
        )
        elapsed = time.monotonic() - started
    finally:
        await coordinator.stop()
    # the same number of samples as the collaboration used (its epochs overshoot B a little)
    single_equal = train_single(data, round(collab["samples"] / B))
    return {
        "steps": steps,
        "target_batch_size": B,
        "samples_single": steps * B,
        "acc_single_same_steps": single,
        "acc_single": single_equal,
        "samples_single_same_samples": round(collab["samples"] / B) * B,
        "acc_collab": collab["acc"],
        "samples_collab": collab["samples"],
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
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
    logging.getLogger("bench").setLevel(logging.INFO)
    for name in ("aiortc", "aioice", "engine.p2p", "engine.dht"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    steps = args.steps or (12 if args.quick else 40)
    figures = asyncio.run(main_async(steps))
    print(
        f"single {figures['acc_single']:.3f} ({figures['samples_single_same_samples']} samples; "
        f"{figures['acc_single_same_steps']:.3f} after {figures['steps']} steps); "
        f"collab {figures['acc_collab']:.3f} ({figures['samples_collab']} samples, identical models: "
        f"{figures['collab_identical_models']}); with churn {figures['acc_with_churn']:.3f}; "
        f"state download {figures['state_download_s']:.2f} s; {figures['seconds']:.0f} s, "
        f"load {figures['load_avg_1m']:.1f}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
