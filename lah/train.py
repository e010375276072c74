"""``lah train``: a researcher's trainer for an experiment the coordinator defines.

``lah train login`` exchanges the operator's single-use code (``lah coordinator grant-trainer NAME``)
for a trainer token, kept by :mod:`lah.train_credentials` (keyring, or a 0600 file). ``lah train``
then fetches the experiment's config (``GET /api/experiments/{name}``: grid, experts' width, target
batch size, the dense model's shape), builds the real :class:`~engine.trainer.Trainer` on a
:class:`~engine.trainer.TrainerNode` (the coordinator's signaling, the DHT through the peers it names,
its identity kept in the data dir and bound to the account), and trains: the dense part together with
every other ``lah train`` of the experiment (:mod:`engine.collab`) when its target batch size is set,
the experts on the volunteers, whom its receipts credit. One line per collaborative step (alone: every
ten seconds) says the step, loss, samples/s, the collaboration's peers and the last round's time.

Ctrl+C (or SIGTERM) stops after the batch in hand: a round under way finishes (bounded by the
collaboration's timeout), so the others get this trainer's part; gradients accumulated towards a step
not yet taken are dropped, as DeDLOC drops any peer that leaves. Receipts are flushed, then the
trainer leaves. A second Ctrl+C quits at once.

Exit status: 0 done or stopped, 1 the coordinator or the swarm could not be reached, 2 a usage problem
(no login, not a trainer, no such experiment, a data set that does not fit the experiment, nothing at
a --coordinator it has no login for: a mistyped URL) or a step whose loss or gradients are not finite
(the sentence names the step and the cause; that step asked no expert for a backward pass and none of
its receipts is sent), 130 quit at once.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.dht.errors import DHTError
from engine.node.errors import AlreadyRunning
from engine.p2p.errors import P2PError

from .train_credentials import TrainerCredentials
from .train_data import Experiment, config_of, load_data
from .trainer_session import (
    TrainError,
    default_data_dir,
    explain,
    kept_login,
    leave,
    pin_from_environment,
    prepare,
    start_node,
)

__all__ = [
    "TrainError",
    "config_of",
    "default_data_dir",
    "load_data",
    "login_command",
    "run_train",
    "train_main",
]

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0  # alone, or between collaborative steps: a line at least this often
WAIT_PEERS_S = 120.0  # --wait-peers: the longest a trainer waits for the others before it starts


async def login_command(coordinator: str, name: str, code: str, store: TrainerCredentials) -> str:
    """Exchange the login code and keep the token; returns where it was kept."""
    from engine.account.coordinator_api import CoordinatorApi

    api = CoordinatorApi(coordinator)
    try:
        credentials = await api.trainer_login(name, code)
    finally:
        await api.close()
    return store.save(coordinator, credentials)


class _Interrupts:
    """First SIGINT/SIGTERM: stop after this batch; a second SIGINT: KeyboardInterrupt at once."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.stop = threading.Event()
        self.say = say
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop.set()
        self.say("stopping after this batch (Ctrl+C again quits at once)")

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is not threading.main_thread():
            return self  # called in process from another thread: its caller stops it (tests)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run_train(
    coordinator: str,
    experiment_name: str,
    *,
    steps: int | None = None,
    samples: int | None = None,
    data: Path | None = None,
    data_dir: Path | None = None,
    token_file: Path | None = None,
    wait_peers: int = 1,
    say: Callable[[str], None] = print,
    tokenizer: Path | None = None,
    resume: bool = False,
) -> int:
    """Train until ``steps``/``samples`` or Ctrl+C (see the module's docstring); the exit status.
    ``tokenizer`` and ``resume``: a language model's (:mod:`lah.train_lm`)."""
    from engine.trainer.trainer import StepNotFinite

    from .train_lm import LmTrainError

    lm_options = {"tokenizer": tokenizer, "resume": resume}
    try:
        return _run(
            coordinator,
            experiment_name,
            steps,
            samples,
            data,
            data_dir,
            token_file,
            wait_peers,
            say,
            lm_options,
        )
    except LmTrainError as e:
        say(f"lah train: {e}")
        return 2
    except StepNotFinite as e:
        say(f"lah train: {e}")
        return 2
    except TrainError as e:
        say(f"lah train: {e}")
        return 2
    except AlreadyRunning as e:
        say(f"lah train: {e} (give each trainer its own --data-dir)")
        return 2
    except CoordinatorUnreachable as e:
        say(f"lah train: {e}")
        return 1
    except (TimeoutError, RuntimeError, P2PError, DHTError) as e:  # signaling, DHT or collaboration
        say(f"lah train: could not join the swarm: {type(e).__name__}: {e}")
        return 1
    except KeyboardInterrupt:  # before training started, or a second Ctrl+C: left at once
        say("lah train: stopped")
        return 130


def _run(
    url: str,
    name: str,
    steps: int | None,
    samples: int | None,
    data: Path | None,
    data_dir: Path | None,
    token_file: Path | None,
    wait_peers: int,
    say: Callable[[str], None],
    lm_options: dict[str, Any],
) -> int:
    import torch

    from engine.account.coordinator_api import CoordinatorApi
    from engine.moe import LoopThread
    from engine.node.lock import InstanceLock
    from engine.trainer import Trainer, TrainerNode, remote_model

    data_dir = data_dir or default_data_dir()
    store = TrainerCredentials(data_dir, token_file)
    stored = kept_login(store, url)
    pin_from_environment()
    torch.set_num_threads(1)  # small dense layers: threads only contend
    lock = InstanceLock(data_dir / "train.lock")
    lock.acquire()
    loop = LoopThread("train-loop")
    node: TrainerNode | None = None
    try:
        credentials, account, spec = loop.run(prepare(CoordinatorApi(url), store, stored, name), 60)
        experiment = config_of(spec)
        cfg = experiment.trainer
        lm = not isinstance(experiment, Experiment)
        if lm:
            from engine.trainer.lm import trainer_threads

            from .train_lm import open_lm_data

            torch.set_num_threads(trainer_threads())

            dataset = open_lm_data(experiment, data, lm_options["tokenizer"])
            if samples is not None:
                raise TrainError("a language model trains for --steps (or until Ctrl+C), not --samples")
        else:
            if lm_options["tokenizer"] is not None or lm_options["resume"]:
                raise TrainError("--tokenizer and --resume are for experiments of kind lm")
            dataset = load_data(experiment, data)
        node = start_node(
            url, account, loop, data_dir / "identity.key", cfg, credentials, store, data_dir / "outbox"
        )
        assert node.peer is not None and node.finder is not None
        identity = node.identity
        grids = experiment.grids if lm else [cfg.uid_prefix]
        uids = [f"{g}.{i}.{j}" for g in grids for i in range(cfg.grid[0]) for j in range(cfg.grid[1])]
        seen = loop.run(node.finder.wait_for_hosts(uids, 30), 40) if len(cfg.grid) == 2 else -1
        say(f"{account} ({identity.peer_id[:12]}…) joined {name}: {seen} experts found through the DHT")
        if lm:
            from .train_lm import train_language_model

            with _Interrupts(say) as interrupts:
                status = train_language_model(
                    node, loop, experiment, dataset, steps=steps, stop=interrupts.stop,
                    folder=data_dir / f"lm-{name}", resume=lm_options["resume"], say=say,
                )  # fmt: skip
                loop.run(node.receipts.flush(), 30)
            r = node.receipts.stats
            say(f"receipts {r.submitted} submitted, {r.accepted} credited, {r.rejected} rejected")
            return status
        model = remote_model(
            node.peer,
            node.finder,
            loop,
            cfg,
            node.observe,
            in_features=experiment.in_features,
            n_classes=experiment.classes,
        )
        data_seed = int.from_bytes(hashlib.sha256(identity.peer_id.encode()).digest()[:4], "little")
        node.hold_steps = True  # a step's receipts wait until it proves finite (Trainer.settle)
        if cfg.target_batch_size > 0:
            collab = loop.run(node.collaborate(model), 60)
            trainer = Trainer(
                model, dataset, cfg, collab=collab, loop=loop, data_seed=data_seed, settle=node.settle_step
            )
            say(
                f"training the dense part with the experiment's other trainers: "
                f"target batch {cfg.target_batch_size}"
            )
        else:
            trainer = Trainer(model, dataset, cfg, data_seed=data_seed, settle=node.settle_step)
            say("this experiment has no target batch size: training alone")
        with _Interrupts(say) as interrupts:
            if trainer.collab is not None and wait_peers > 1:
                _wait_for_peers(loop, trainer.collab, wait_peers, interrupts.stop, say)
            _loop(trainer, steps, samples, interrupts.stop, say)
            accuracy = trainer.evaluate()
            loop.run(node.receipts.flush(), 30)
        r = node.receipts.stats
        say(
            f"done: step {trainer.stats.epoch if trainer.collab else trainer.stats.steps}, "
            f"{trainer.stats.samples} samples, test accuracy {accuracy:.3f}; "
            f"receipts {r.submitted} submitted, {r.accepted} credited, {r.rejected} rejected"
        )
        return 0
    except CoordinatorError as e:
        raise TrainError(explain(e, url, name)) from e
    finally:
        leave(node, loop, lock, say)


def _wait_for_peers(
    loop: Any, collab: Any, peers: int, stop: threading.Event, say: Callable[[str], None]
) -> None:
    """Until ``peers`` trainers (this one included) are in the collaboration, or ``WAIT_PEERS_S``:
    trainers started together then take their first step together instead of each alone."""

    async def count() -> int:
        await collab.tracker.publish()
        return int((await collab.tracker.refresh()).peers)

    say(f"waiting for {peers} trainers of the experiment (up to {WAIT_PEERS_S:.0f} s)")
    deadline = time.monotonic() + WAIT_PEERS_S
    seen = 1
    while not stop.is_set() and time.monotonic() < deadline:
        seen = loop.run(count(), 30)
        if seen >= peers:
            say(f"{seen} trainers in the collaboration: starting")
            return
        stop.wait(1.0)
    say(f"{seen} of {peers} trainers in the collaboration: starting anyway")


def _peers(collab: Any) -> int:
    """Trainers whose progress records are live, in any epoch (this one included): the collaboration."""
    tracker = collab.tracker
    return len({*dict(tracker.view.active(tracker.local_clock())), tracker.me})


def _loop(
    trainer: Any, steps: int | None, samples: int | None, stop: threading.Event, say: Callable[[str], None]
) -> None:
    """Batches until ``steps`` (the collaboration's steps; alone, this trainer's), ``samples`` (this
    trainer's) or a stop; a line per step taken together, else every ``PROGRESS_EVERY_S``."""
    stats, collab = trainer.stats, trainer.collab
    last_line, last_epoch, t0 = time.monotonic(), 0, time.monotonic()
    while not stop.is_set():
        done = collab.epoch if collab is not None else stats.steps
        if (steps is not None and done >= steps) or (samples is not None and stats.samples >= samples):
            break
        trainer.step()
        now = time.monotonic()
        stepped = collab is not None and collab.epoch != last_epoch
        if stepped or now - last_line >= PROGRESS_EVERY_S:
            last = stats.collab_steps[-1] if stats.collab_steps else (0, 0)
            group = last[1] if collab is not None and last[0] == collab.epoch else 0  # 0: caught up by state
            peers = _peers(collab) if collab is not None else 1
            round_s = "-" if math.isnan(stats.last_round_s) else f"{stats.last_round_s:.2f} s"
            say(
                f"step {collab.epoch if collab is not None else stats.steps}: loss {stats.last_loss:.3f}, "
                f"{stats.samples_per_s:.0f} samples/s, {peers} peers, {group} in its round, "
                f"last round {round_s}, {stats.samples} samples in {now - t0:.0f} s"
            )
            last_line = now
            if collab is not None:
                last_epoch = collab.epoch


def train_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``lah train login`` and ``lah train`` from the parsed command line."""
    data_dir = args.data_dir or default_data_dir()
    if args.train_action == "login":
        code = args.code or getpass.getpass("login code (from the project's operator): ")
        store = TrainerCredentials(data_dir, args.token_file)
        from engine.p2p import eventloop

        try:
            place = eventloop.run(login_command(args.coordinator, args.name, code.strip(), store))
        except CoordinatorError as e:
            print(f"lah train login: the coordinator refused ({e.code}): {e.message}")
            return 2
        except CoordinatorUnreachable as e:
            print(f"lah train login: {e}")
            return 1
        print(f"logged in as trainer {args.name}; the token is kept in {place}")
        return 0
    if not args.experiment:
        parser.error("lah train needs --experiment NAME (or: lah train login)")
    if (args.steps is not None and args.steps < 1) or (args.samples is not None and args.samples < 1):
        parser.error("--steps and --samples must be at least 1")
    if args.wait_peers < 1:
        parser.error("--wait-peers must be at least 1")
    return run_train(
        args.coordinator,
        args.experiment,
        steps=args.steps,
        samples=args.samples,
        data=args.data,
        data_dir=data_dir,
        token_file=args.token_file,
        wait_peers=args.wait_peers,
        say=lambda line: print(line, flush=True),
        tokenizer=args.tokenizer,
        resume=args.resume,
    )
