"""The demo's DMoE model trained three ways for the same steps, in one run.

(a) healthy: the whole swarm on loopback (coordinator, volunteers, trainer; ``lah.demo``);
(b) faulty: the same, with every expert request delayed by 100 ms and 10% of them failing, injected in
    the trainer process between the DMoE layer and its Peer (the faults are counted and asserted);
(c) local: every expert in process (``LocalMixtureOfExperts``), no network;
(d) the wire column: (a) again with expert calls in 8-bit (``TrainerConfig.wire="int8"``: inputs,
    outputs and both gradients blockwise int8 instead of float16), same seed and data.

Prints ``acc_healthy``, ``acc_faulty``, ``acc_local``, ``acc_int8``, step counts and the longest step
against the step timeout; the last line is one JSON object. Targets: acc_healthy >= 0.95, acc_faulty
within 0.02 of it, acc_int8 within 0.01 of acc_healthy, no step longer than its timeout.

    .venv/bin/python benchmarks/dmoe_training.py --quick   # within 60 s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from engine.p2p import Peer, RemoteError
from engine.trainer import Trainer, TrainerConfig, load_digits_split, local_model
from lah.demo import run_demo


class FaultyPeer:
    """Forwards to a Peer; expert requests get ``delay_s`` more latency and fail with ``p_fail``."""

    def __init__(self, peer: Peer, p_fail: float, delay_s: float, seed: int = 0) -> None:
        self.peer, self.p_fail, self.delay_s = peer, p_fail, delay_s
        self.rng = random.Random(seed)
        self.requests = 0
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.peer, name)

    async def call(self, peer_id: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if method.startswith("moe."):
            self.requests += 1
            await asyncio.sleep(self.delay_s)
            if self.rng.random() < self.p_fail:
                self.failed += 1
                raise RemoteError("injected_fault", "benchmark fault injection")
        return await self.peer.call(peer_id, method, *args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer steps: the whole run within 60 s")
    parser.add_argument("--steps", type=int, default=0)
    args = parser.parse_args()
    steps = args.steps or (60 if args.quick else 150)
    config = TrainerConfig()
    quiet = lambda _: None  # noqa: E731
    t0 = time.monotonic()
    healthy = run_demo(volunteers=4, steps=steps, progress=False, config=config, say=quiet)
    print(f"healthy: acc {healthy.accuracy:.3f}, max step {healthy.max_step_s:.2f} s", flush=True)
    faults: list[FaultyPeer] = []

    def wrap(peer: Peer) -> FaultyPeer:
        faults.append(FaultyPeer(peer, 0.10, 0.100))
        return faults[-1]

    faulty = run_demo(volunteers=4, steps=steps, progress=False, config=config, say=quiet, wrap_peer=wrap)
    injected = faults[0]
    assert injected.requests > 0 and injected.failed > 0.05 * injected.requests, "faults did not happen"
    print(
        f"faulty: acc {faulty.accuracy:.3f}, {injected.failed}/{injected.requests} requests failed, "
        f"max step {faulty.max_step_s:.2f} s",
        flush=True,
    )
    int8 = run_demo(volunteers=4, steps=steps, progress=False, config=replace(config, wire="int8"), say=quiet)
    print(f"int8 wire: acc {int8.accuracy:.3f}, max step {int8.max_step_s:.2f} s", flush=True)
    torch.set_num_threads(1)
    trainer = Trainer(local_model(config), load_digits_split(seed=config.seed), config)
    trainer.train(steps, progress=False)
    acc_local = trainer.evaluate()
    max_step = max(healthy.max_step_s, faulty.max_step_s, int8.max_step_s)
    result = {
        "steps": steps,
        "acc_healthy": round(healthy.accuracy, 4),
        "acc_faulty": round(faulty.accuracy, 4),
        "acc_local": round(acc_local, 4),
        "faulty_gap": round(healthy.accuracy - faulty.accuracy, 4),
        "wire": {"float16": round(healthy.accuracy, 4), "int8": round(int8.accuracy, 4)},
        "acc_int8": round(int8.accuracy, 4),
        "int8_gap": round(healthy.accuracy - int8.accuracy, 4),
        "injected_requests": injected.requests,
        "injected_failures": injected.failed,
        "injected_delay_s": injected.delay_s,
        "skipped_steps_healthy": healthy.skipped_steps,
        "skipped_steps_faulty": faulty.skipped_steps,
        "max_step_s": round(max_step, 3),
        "step_timeout_s": config.step_timeout_s,
        "no_step_over_timeout": max_step <= config.step_timeout_s,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
