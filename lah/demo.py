"""``lah demo``: a whole Learning@home swarm on loopback, training a DMoE model on handwritten digits.

In one process, on one event loop (a :class:`~engine.moe.LoopThread`) pinned to 127.0.0.1: the full
coordinator (SQLite in a temporary directory, one experiment ``ffn`` on a 4x4 grid, replication 2),
``volunteers`` volunteer nodes that join it with accounts, bind their keys, host the experts they are
assigned and declare them in the DHT, and a trainer whose DMoE layer finds them by beam search and
trains on sklearn's bundled digits. The trainer signs receipts for every answered request; at the end the
demo prints test accuracy, requests served per host, the credit the coordinator recorded and the
leaderboard URL, and keeps the coordinator up for ``linger`` seconds (``None``: until Ctrl+C).

With ``trainers`` > 1 (or an experiment ``target_batch_size``), that many trainers train the dense part
of the model together (DeDLOC, :mod:`engine.collab`: averaged gradients, the same optimizer steps) while
each calls the volunteers' experts and credits them with its own receipts; ``steps`` then counts batches
of the swarm as a whole (``steps * batch_size`` samples, in collaborative epochs of the target batch),
and the demo prints each trainer's batches, epoch, samples/s, last all-reduce round and accuracy.

With ``app``, the tray app joins as one more volunteer (``demo_app.py``): the newcomer goes through its
first-run window, and the trainer trains round after round (until Ctrl+C or the app quits), so the
app's own node gets requests and credit while they watch.

It sits above engine and coordinator (in ``lah``, the package that composes them), so the engine never
imports the coordinator.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.moe import LoopThread
from engine.p2p import Peer
from engine.p2p.patches import install, pin_host_addresses
from engine.trainer import (
    Trainer,
    TrainerConfig,
    TrainerNode,
    TrainStats,
    dense_digest,
    load_digits_split,
    remote_model,
)

from .demo_app import launch_app, stop_app

if TYPE_CHECKING:
    from coordinator.config import ExperimentConfig

__all__ = ["DemoResult", "TrainerResult", "run_demo"]

logger = logging.getLogger(__name__)


@dataclass
class TrainerResult:
    name: str
    steps: int  # batches this trainer computed
    skipped_steps: int
    epoch: int  # collaborative: the dense model's optimizer steps; 0 when it trained alone
    collab_steps: list[tuple[int, int]]  # (epoch, group size) of each collaborative step it took
    samples_per_s: float
    last_round_s: float  # the last all-reduce round's seconds (nan: none)
    accuracy: float
    dense_digest: str  # sha256 of the dense parameters: equal for trainers that stepped together


@dataclass
class DemoResult:
    accuracy: float  # the first trainer's
    steps: int
    skipped_steps: int
    max_step_s: float
    served: dict[str, int]  # volunteer name -> requests its experts served
    host_credit: dict[str, float]  # host peer id -> credit on the coordinator's leaderboard
    receipts: dict[str, Any]
    requests: dict[str, int]
    killed: str | None = None
    served_after_kill: dict[str, int] = field(default_factory=dict)
    leaderboard_url: str = ""
    elapsed_s: float = 0.0
    trainers: list[TrainerResult] = field(default_factory=list)


def experiment_of(cfg: TrainerConfig, replication: int) -> ExperimentConfig:
    """The coordinator's experiment for a local swarm training ``cfg``: its FFN experts on its grid."""
    from coordinator.config import ExperimentConfig

    return ExperimentConfig(
        name=cfg.uid_prefix,
        expert_type="ffn",
        grid=list(cfg.grid),
        hyperparams={"d_model": cfg.dim, "hidden": cfg.hidden},
        replication=replication,
        target_batch_size=cfg.target_batch_size,
    )


def run_demo(
    *,
    volunteers: int = 4,
    steps: int = 150,
    linger: float | None = 0.0,
    app: bool = False,
    kill_at: int | None = None,
    progress: bool = True,
    config: TrainerConfig | None = None,
    say: Callable[[str], None] = print,
    data_dir: Path | None = None,
    wrap_peer: Callable[[Peer], Any] | None = None,
    trainers: int = 1,
) -> DemoResult | None:
    """Run the demo (``None`` when Ctrl+C stopped it before the end); ``kill_at``: stop the first
    volunteer after that many steps (routing around it; one trainer alone only).

    ``wrap_peer``: what the trainer's DMoE layer calls experts through instead of its Peer (benchmarks
    inject faults and latency there)."""
    from coordinator.config import CoordinatorConfig
    from coordinator.server.app import start_full
    from coordinator.services import SERVICES
    from engine.node.join import join_local
    from engine.resources import Settings

    cfg = config or TrainerConfig()
    if trainers < 1:
        raise ValueError("the demo needs at least one trainer")
    if trainers > 1 and cfg.target_batch_size == 0:  # each trainer two batches per epoch
        cfg = replace(cfg, target_batch_size=2 * trainers * cfg.batch_size)
    collaborative = cfg.target_batch_size > 0
    if collaborative and kill_at is not None:
        raise ValueError("kill_at is for one trainer alone")
    torch.set_num_threads(1)  # tiny matrices: threads only contend (with the hosts' worker threads too)
    pin_host_addresses(["127.0.0.1"])
    install()  # also run directly by benchmarks, not only through the lah CLI
    t_start = time.monotonic()
    loop = LoopThread("demo-loop")
    with tempfile.TemporaryDirectory(prefix="lah-demo-") as tmp_name:
        tmp = data_dir or Path(tmp_name)
        experiment = experiment_of(cfg, replication=2)
        coordinator_config = CoordinatorConfig(
            port=0,
            database_url=f"sqlite+aiosqlite:///{tmp / 'coordinator.sqlite3'}",
            token_key_path=str(tmp / "token.key"),
            experiments=[experiment],
            verify_workers=0,  # receipt signatures checked in process: no spawned pool for a demo
        )
        running = loop.run(start_full(coordinator_config), 60)
        vols: list[Any] = []
        node: TrainerNode | None = None
        nodes: list[TrainerNode] = []
        app_proc = None
        try:
            say(f"coordinator: {running.url} (SQLite in {tmp})")
            # RAM budget in MiB: enough for twice the grid over all volunteers (replication 2)
            per_expert = 16 * (2 * cfg.dim * cfg.hidden + cfg.hidden + 3 * cfg.dim)
            n_experts = 1
            for n in cfg.grid:
                n_experts *= n
            mib = max(1, -(-2 * n_experts * per_expert // max(1, volunteers) // 2**20) + 1)
            settings = Settings(ram_budget_mib=mib)

            async def start_volunteers() -> list[Any]:
                out = []
                for i in range(volunteers):  # one by one: each bootstraps its DHT from those before it
                    out.append(
                        await join_local(running.url, f"volunteer-{i}", tmp / f"v{i}", settings, device="cpu")
                    )
                return out

            vols = loop.run(start_volunteers(), 60 + 30 * volunteers)
            names = {v.peer_id: f"volunteer-{i}" for i, v in enumerate(vols)}
            for i, v in enumerate(vols):
                hosted = " ".join(v.hosted_uids)
                say(f"volunteer-{i} ({v.peer_id[:12]}…) hosts {len(v.hosted_uids)} experts: {hosted}")
            services = running.runner.app[SERVICES]
            for name in ["trainer"] if trainers == 1 else [f"trainer-{i}" for i in range(trainers)]:
                nodes.append(TrainerNode(running.url, name, loop=loop, config=cfg))
                loop.run(nodes[-1].start(), 60)
                loop.run(services.accounts.set_role(name, "trainer", by=None), 15)  # an admin's act
            node = nodes[0]
            assert node.finder is not None
            uids = [f"{cfg.uid_prefix}.{i}.{j}" for i in range(cfg.grid[0]) for j in range(cfg.grid[1])]
            seen = loop.run(node.finder.wait_for_hosts(uids, 30), 40) if len(cfg.grid) == 2 else -1
            say(f"{node.name} ({node.identity.peer_id[:12]}…) finds {seen} experts through the DHT")

            data = load_digits_split(seed=cfg.seed)
            team: list[Trainer] = []
            for i, tn in enumerate(nodes):
                if wrap_peer is None:
                    model = tn.model()
                else:
                    assert tn.peer is not None and tn.finder is not None
                    model = remote_model(wrap_peer(tn.peer), tn.finder, loop, cfg, tn.observe)
                if not collaborative:
                    team.append(Trainer(model, data, cfg))
                    continue
                collab = loop.run(tn.collaborate(model), 60)
                team.append(Trainer(model, data, cfg, collab=collab, loop=loop, data_seed=cfg.seed + i))
            trainer = team[0]
            epochs_per_round = max(1, math.ceil(steps * cfg.batch_size / max(1, cfg.target_batch_size)))
            if collaborative:
                say(
                    f"{trainers} trainers train the dense part together: target batch "
                    f"{cfg.target_batch_size}, {epochs_per_round} collaborative epochs"
                )
            killed: list[str] = []
            before_kill: dict[str, int] = {}

            def on_step(i: int) -> None:
                if kill_at is not None and i + 1 == kill_at and vols:
                    victim = vols[0]
                    before_kill.update(node.stats.served if node else {})
                    loop.run(victim.stop(), 30)
                    killed.append(victim.peer_id)
                    logger.info("stopped %s mid-training", names[victim.peer_id])

            app_proc = launch_app(running.url, tmp / "app") if app else None
            say(f"leaderboard: {running.url}/leaderboard")
            if app_proc is not None:
                say("the tray app is starting: go through its window to join as one more volunteer")
            rounds = 0
            while True:
                if collaborative:
                    stats = _train_together(team, epochs_per_round * (rounds + 1), steps, progress)
                else:
                    stats = trainer.train(steps, progress=progress, on_step=on_step)
                accuracies = [t.evaluate(progress=progress) for t in team]
                accuracy = accuracies[0]
                for tn in nodes:
                    loop.run(tn.receipts.flush(), 30)
                rounds += 1
                if app_proc is None or app_proc.poll() is not None:
                    break
                by_host = ", ".join(
                    f"{names.get(h, 'your app')}: {n}" for h, n in sorted(_served(nodes).items())
                )
                say(f"round {rounds}: accuracy {accuracy:.3f}; requests served so far: {by_host}")
            time.sleep(0.2)
            board = loop.run(node.api.get("/api/leaderboard?kind=hosts&per_page=100"), 15)
            credit = {
                str(e.get("id", "")): float(e.get("credit_total", 0.0)) for e in board.get("entries", [])
            }
            all_served = _served(nodes)
            served = {names[h]: n for h, n in all_served.items() if h in names}
            after = {names[h]: n - before_kill.get(h, 0) for h, n in all_served.items() if h in names}
            receipts: Counter[str] = Counter()
            requests: Counter[str] = Counter()
            for tn in nodes:
                receipts.update({k: v for k, v in vars(tn.receipts.stats).items() if isinstance(v, int)})
                requests.update(tn.stats.requests)
            per_trainer = [
                TrainerResult(
                    name=tn.name,
                    steps=t.stats.steps,
                    skipped_steps=t.stats.skipped_steps,
                    epoch=t.stats.epoch,
                    collab_steps=list(t.stats.collab_steps),
                    samples_per_s=t.stats.samples_per_s,
                    last_round_s=t.stats.last_round_s,
                    accuracy=a,
                    dense_digest=dense_digest(t.model),
                )
                for tn, t, a in zip(nodes, team, accuracies, strict=True)
            ]
            result = DemoResult(
                accuracy=accuracy,
                steps=stats.steps,
                skipped_steps=stats.skipped_steps,
                max_step_s=stats.max_step_s,
                served=dict(sorted(served.items())),
                host_credit=credit,
                receipts=dict(receipts),
                requests=dict(requests),
                killed=names[killed[0]] if killed else None,
                served_after_kill=dict(sorted(after.items())) if killed else {},
                leaderboard_url=f"{running.url}/leaderboard",
                elapsed_s=time.monotonic() - t_start,
                trainers=per_trainer,
            )
            if collaborative:
                for tr in per_trainer:
                    say(
                        f"{tr.name}: {tr.steps} steps ({tr.skipped_steps} skipped), epoch {tr.epoch}, "
                        f"{tr.samples_per_s:.0f} samples/s, last round {tr.last_round_s:.2f} s, "
                        f"test accuracy {tr.accuracy:.3f}"
                    )
                same = len({tr.dense_digest for tr in per_trainer}) == 1
                averaged = sum(t.stats.collab_samples for t in team) / max(1, trainer.stats.epoch)
                say(
                    f"dense parameters {'identical' if same else 'DIFFER'} across trainers; "
                    f"{averaged:.0f} samples averaged per epoch (target {cfg.target_batch_size})"
                )
            say(f"test accuracy: {accuracy:.3f} after {stats.steps} steps ({stats.skipped_steps} skipped)")
            for name, n in result.served.items():
                say(f"  {name}: served {n} requests")
            say(
                f"receipts: {receipts['submitted']} submitted, {receipts['accepted']} credited, "
                f"{receipts['rejected']} rejected"
            )
            say(f"leaderboard: {result.leaderboard_url}")
            if linger is None:
                say("the coordinator stays up until Ctrl+C")
                _wait_for_interrupt()
            elif linger > 0:
                say(f"keeping the coordinator up for {linger:.0f} s")
                time.sleep(linger)
            return result
        except KeyboardInterrupt:
            say("stopping the demo")
            return None
        finally:
            if app_proc is not None:
                stop_app(app_proc)
            for tn in nodes:
                _quietly(loop, tn.stop(), 30)
            for v in vols:
                _quietly(loop, v.stop(), 30)
            _quietly(loop, running.stop(), 15)
            loop.close()


def _train_together(team: list[Trainer], epochs: int, steps: int, progress: bool) -> TrainStats:
    """Every trainer on its own thread (they step together, so they must run at once) until the
    collaboration reaches ``epochs``; a bound of ``20 * steps`` batches each stops a stalled one."""
    with ThreadPoolExecutor(len(team), thread_name_prefix="trainer") as pool:
        futures = [
            pool.submit(t.train_epochs, epochs, progress=progress and i == 0, max_batches=20 * steps)
            for i, t in enumerate(team)
        ]
        try:
            return next(f.result() for f in futures)
        except BaseException:  # Ctrl+C, or one trainer failed: the others stop after their batch
            for t in team:
                t.stop()
            raise


def _served(nodes: list[TrainerNode]) -> Counter[str]:
    total: Counter[str] = Counter()
    for tn in nodes:
        total.update(tn.stats.served)
    return total


def _wait_for_interrupt() -> None:
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        return


def _quietly(loop: LoopThread, coro: Any, timeout: float) -> None:
    try:
        loop.run(coro, timeout)
    except Exception:
        logger.exception("demo shutdown step failed")
