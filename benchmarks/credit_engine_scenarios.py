"""Credit scenarios on the engine's side, for ``benchmarks/credit_integrity.py``: a real swarm on loopback.

Each scenario runs the whole coordinator (``start_full``, SQLite in a scratch folder, on a fixed port so it
can come back on the same address), real volunteers (``join_local``: Volunteers in this process, their
experts countersigning every reply) and a real digits trainer (``TrainerNode`` with its outbox on disk,
the ``Trainer`` loop), everything over aiortc pinned to 127.0.0.1, as ``lah demo`` runs them.

- :func:`receipts_lost_outage`: the trainer trains, the coordinator is stopped mid-run for ``outage_s``
  (60 s in full mode) while training goes on, then restarted on the same address and database; the
  trainer goes on until its outbox is empty. Receipts lost: answered requests the trainer made a
  receipt of that the coordinator never stored or answered for; counted twice: credits beyond one per
  stored receipt. Target: 0 and 0.
- :func:`honest_flags`: replication 2 (three volunteers, every expert on two of them, each training
  apart), one trainer spot-checking at its default fraction: flags against honest replicas over the
  run (target 0); then the host the trainer calls most starts perturbing 1% of the rows it answers, and
  ``cheat_caught_s`` is the time until the trainer's checker reports it (target: within the run).

Both are ``async`` (they run their swarm on a thread of their own) and return a dict of figures::

    from benchmarks.credit_engine_scenarios import honest_flags, receipts_lost_outage
    print(await receipts_lost_outage(quick=True), await honest_flags(quick=True))

Run alone: ``.venv/bin/python benchmarks/credit_engine_scenarios.py [--quick]`` (one JSON line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator.config import CoordinatorConfig
from coordinator.db.models import Receipt
from coordinator.server.app import RunningCoordinator, start_full
from coordinator.services import SERVICES
from engine.moe import LoopThread
from engine.node.join import join_local
from engine.node.volunteer import Volunteer
from engine.p2p import CallContext, Handlers
from engine.p2p.patches import install, pin_host_addresses
from engine.resources import Settings
from engine.trainer import Trainer, TrainerConfig, TrainerNode, load_digits_split
from engine.wire import Message
from lah.demo import experiment_of

__all__ = ["honest_flags", "receipts_lost_outage"]

CFG = TrainerConfig(grid=(4, 4), dim=32, hidden=64, batch_size=32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Swarm:
    loop: LoopThread
    config: CoordinatorConfig
    running: RunningCoordinator | None
    volunteers: list[Volunteer]
    node: TrainerNode
    trainer: Trainer

    def restart(self) -> None:
        self.running = self.loop.run(start_full(self.config), 60)

    def stop_coordinator(self) -> None:
        if self.running is not None:
            self.loop.run(self.running.stop(), 30)
            self.running = None


@contextmanager
def _swarm(folder: Path, volunteers: int, spot_check_fraction: float) -> Iterator[Swarm]:
    torch.set_num_threads(1)
    pin_host_addresses(["127.0.0.1"])
    install()
    cfg = replace(CFG, spot_check_fraction=spot_check_fraction)
    config = CoordinatorConfig(
        port=_free_port(),
        database_url=f"sqlite+aiosqlite:///{folder / 'coordinator.sqlite3'}",
        token_key_path=str(folder / "token.key"),
        experiments=[experiment_of(cfg, replication=2)],
        verify_workers=0,
    )
    loop = LoopThread("credit-scenarios")
    running: RunningCoordinator | None = loop.run(start_full(config), 60)
    assert running is not None
    vols: list[Volunteer] = []
    node: TrainerNode | None = None
    swarm: Swarm | None = None
    try:
        per_expert = 16 * (2 * cfg.dim * cfg.hidden + cfg.hidden + 3 * cfg.dim)
        mib = max(1, -(-2 * 16 * per_expert // volunteers // 2**20) + 1)

        async def start_volunteers() -> list[Volunteer]:
            out = []
            for i in range(volunteers):
                v = await join_local(
                    running.url, f"v{i}", folder / f"v{i}", Settings(ram_budget_mib=mib), device="cpu"
                )
                out.append(v)
            return out

        vols = loop.run(start_volunteers(), 60 + 30 * volunteers)
        node = TrainerNode(running.url, "trainer", loop=loop, config=cfg, outbox_dir=folder / "outbox")
        loop.run(node.start(), 60)
        loop.run(running.runner.app[SERVICES].accounts.set_role("trainer", "trainer", by=None), 15)
        assert node.finder is not None
        uids = [f"{cfg.uid_prefix}.{i}.{j}" for i in range(cfg.grid[0]) for j in range(cfg.grid[1])]
        loop.run(node.finder.wait_for_hosts(uids, 30), 40)
        trainer = Trainer(node.model(), load_digits_split(seed=cfg.seed), cfg, settle=node.settle_step)
        node.hold_steps = True
        swarm = Swarm(loop, config, running, vols, node, trainer)
        yield swarm
    finally:
        if node is not None:
            _quietly(loop, node.stop(), 30)
        for v in vols:
            _quietly(loop, v.stop(), 30)
        current = swarm.running if swarm is not None else running
        if current is not None:
            _quietly(loop, current.stop(), 30)
        loop.close()


def _quietly(loop: LoopThread, coro: Any, timeout: float) -> None:
    try:
        loop.run(coro, timeout)
    except Exception as e:  # a benchmark's teardown must not hide its figures
        print(f"teardown: {type(e).__name__}: {e}", file=sys.stderr)


def _train_for(swarm: Swarm, seconds: float) -> int:
    steps, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        swarm.trainer.step()
        steps += 1
    return steps


def _stored_receipts(swarm: Swarm) -> int:
    from sqlalchemy import func, select

    assert swarm.running is not None
    sessions = swarm.running.services.sessions

    async def count() -> int:
        async with sessions() as s:
            return int((await s.execute(select(func.count()).select_from(Receipt))).scalar_one())

    return swarm.loop.run(count(), 30)


def _outage_run(quick: bool, outage_s: float | None) -> dict[str, Any]:
    outage = outage_s if outage_s is not None else (10.0 if quick else 60.0)
    before, after = (10.0, 10.0) if quick else (30.0, 30.0)
    with tempfile.TemporaryDirectory(prefix="lah-credit-") as tmp, _swarm(Path(tmp), 3, 0.0) as swarm:
        book = swarm.node.receipts
        steps = _train_for(swarm, before)
        swarm.stop_coordinator()
        t0 = time.monotonic()
        steps += _train_for(swarm, outage)
        waiting = book.pending + len(swarm.node._held)
        swarm.restart()
        back = time.monotonic() - t0
        steps += _train_for(swarm, after)
        swarm.loop.run(swarm.node._settle(True), 10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (book.pending or book._queue):
            swarm.loop.run(book.flush(), 60)
            time.sleep(0.5)
        s = book.stats
        stored = _stored_receipts(swarm)
        made = s.queued  # every answered request the trainer made a receipt of
        answered = s.submitted  # each delivered batch counted once, when the coordinator answered it
        return {
            "outage_s": round(back, 1),
            "steps": steps,
            "receipts_made": made,
            "receipts_waiting_at_restart": waiting,
            "receipts_stored": stored,
            "receipts_rejected": s.rejected,
            "rejected_reasons": dict(s.rejected_reasons),
            "receipts_lost": made - answered - book.pending,  # dropped ones included
            "receipts_dropped": s.dropped,
            "receipts_counted_twice": max(0, s.accepted - stored),
            "failed_posts": s.failed_posts,
        }


def _perturb(handlers: Handlers, fraction: float, seed: int, caught: dict[str, float]) -> None:
    """The host behind ``handlers`` adds noise of a row's own size to ``fraction`` of its answer rows."""
    rng = random.Random(seed)
    for method in ("moe.forward", "moe.forward_many"):
        honest = handlers.unary[method]

        async def cheat(msg: Message, ctx: CallContext, honest: Any = honest) -> Message:
            reply: Message = await honest(msg, ctx)
            for t in reply.tensors:
                for row in range(len(t)):
                    if rng.random() < fraction:
                        t[row] += torch.randn_like(t[row]) * t[row].norm() / t[row].numel() ** 0.5
                        caught.setdefault("first_perturbed", time.monotonic())
            return reply

        handlers.add_unary(method, cheat)


def _flags_run(quick: bool, honest_s: float | None) -> dict[str, Any]:
    honest = honest_s if honest_s is not None else (30.0 if quick else 600.0)
    limit = 120.0 if quick else 600.0
    with (
        tempfile.TemporaryDirectory(prefix="lah-credit-") as tmp,
        _swarm(Path(tmp), 3, CFG.spot_check_fraction) as swarm,
    ):
        spot = swarm.node.spot
        assert spot is not None
        steps = _train_for(swarm, honest)
        time.sleep(1.0)  # the last checks finish
        honest_stats = dict(vars(spot.stats))
        served = swarm.node.stats.served
        cheat_id = max(served, key=lambda h: served[h])
        cheat = next(v for v in swarm.volunteers if v.peer_id == cheat_id)
        caught: dict[str, float] = {}
        before = spot.stats.reported
        t0 = time.monotonic()
        _perturb(cheat.handlers, 0.01, seed=1, caught=caught)
        while time.monotonic() - t0 < limit and spot.stats.reported == before:
            swarm.trainer.step()
            steps += 1
        caught_s = time.monotonic() - t0 if spot.stats.reported > before else None
        return {
            "honest_s": honest,
            "steps": steps,
            "honest_flags": honest_stats["mismatches"],
            "honest_checks": honest_stats["checked"],
            "honest_inconclusive": honest_stats["inconclusive"],
            "honest_failed": honest_stats["failed"],
            "cheat_caught_s": None if caught_s is None else round(caught_s, 1),
            "cheat_rows_perturbed_from_s": (
                round(caught["first_perturbed"] - t0, 1) if "first_perturbed" in caught else None
            ),
        }


async def receipts_lost_outage(quick: bool = False, outage_s: float | None = None) -> dict[str, Any]:
    """Receipts lost and counted twice across a coordinator outage mid-run (module docstring)."""
    return await asyncio.to_thread(_outage_run, quick, outage_s)


async def honest_flags(quick: bool = False, honest_s: float | None = None) -> dict[str, Any]:
    """Flags against honest replicas (replication 2) and seconds to catch a 1%-perturbing host."""
    return await asyncio.to_thread(_flags_run, quick, honest_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 s outage, 30 s honest run (about 2 minutes)")
    args = parser.parse_args(argv)

    async def both() -> dict[str, Any]:
        return {
            "receipts_lost_outage": await receipts_lost_outage(args.quick),
            "honest_flags": await honest_flags(args.quick),
        }

    print(json.dumps(asyncio.run(both())))


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
