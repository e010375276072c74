"""A whole swarm on this machine: the coordinator in process, each volunteer in a process of its own.

The language-model demo and benchmark run on it (``lah.lm_demo``): the full coordinator (SQLite in a
scratch folder) with the experiments given, ``volunteers`` processes of :mod:`lah.local_volunteer` that
register, bind their keys, host what they are assigned and declare it in the DHT, and trainer nodes
made on demand (registered, then given the trainer role as an admin would). Everything is pinned to
127.0.0.1. Memory for experts is sized so that the volunteers together hold every grid ``replication``
times. Leaving the context stops the trainers, closes the volunteers' standard input (they leave the
swarm and exit; one that does not within 20 s is killed), and stops the coordinator.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psutil  # type: ignore[import-untyped]

from engine.moe import LoopThread
from engine.p2p.patches import install, pin_host_addresses
from engine.trainer import TrainerConfig, TrainerNode

if TYPE_CHECKING:
    from coordinator.config import ExperimentConfig

__all__ = ["LocalSwarm", "SwarmError"]

logger = logging.getLogger(__name__)
JOIN_TIMEOUT_S = 120.0  # a volunteer process: start, register, bind, host, declare


class SwarmError(RuntimeError):
    """The local swarm could not start (a volunteer process died or never reported)."""


class LocalSwarm:
    def __init__(
        self,
        experiments: list[ExperimentConfig],
        folder: Path,
        *,
        volunteers: int = 4,
        replication: int = 2,
        loop: LoopThread | None = None,
    ) -> None:
        self.experiments, self.folder = experiments, folder
        self.volunteers, self.replication = volunteers, replication
        self.loop = loop or LoopThread("swarm-loop")
        self._own_loop = loop is None
        self.running: Any = None
        self.processes: list[subprocess.Popen[str]] = []
        self._cpu_at_start = 0.0
        self.volunteer_ids: dict[str, str] = {}  # peer id -> volunteer name
        self.hosted: dict[str, list[str]] = {}  # volunteer name -> uids
        self.trainers: list[TrainerNode] = []

    @property
    def url(self) -> str:
        return str(self.running.url)

    def ram_mib(self) -> int:
        """Each volunteer's memory for experts: every grid ``replication`` times over all of them."""
        from coordinator.swarm.assignment import expert_bytes

        grids = [g for e in self.experiments for g in e.grids()]
        total = sum(math.prod(g.grid) * expert_bytes(g) * self.replication for g in grids)
        return math.ceil(total / max(1, self.volunteers) / 2**20) + 1

    def __enter__(self) -> LocalSwarm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._cpu_at_start = _cpu(psutil.Process())  # this process may have trained before (benchmarks)
        from coordinator.config import CoordinatorConfig
        from coordinator.server.app import start_full

        pin_host_addresses(["127.0.0.1"])
        install()
        self.folder.mkdir(parents=True, exist_ok=True)
        config = CoordinatorConfig(
            port=0,
            database_url=f"sqlite+aiosqlite:///{self.folder / 'coordinator.sqlite3'}",
            token_key_path=str(self.folder / "token.key"),
            experiments=self.experiments,
            verify_workers=0,  # receipt signatures checked in process: no spawned pool for a local swarm
        )
        self.running = self.loop.run(start_full(config), 60)
        mib = self.ram_mib()
        for i in range(self.volunteers):  # one by one: each bootstraps its DHT from those before it
            self._spawn(f"volunteer-{i}", mib)

    def _spawn(self, name: str, mib: int) -> None:
        env = {**os.environ, "LAH_HOST_ADDRESSES": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
        log = (self.folder / f"{name}.log").open("w")
        cmd = [sys.executable, "-m", "lah.local_volunteer", "--coordinator", self.url, "--name", name]
        cmd += ["--data-dir", str(self.folder / name), "--ram-mib", str(mib)]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env
        )
        self.processes.append(proc)
        line = _read_line(proc, JOIN_TIMEOUT_S)
        if not line:
            raise SwarmError(f"{name} did not join within {JOIN_TIMEOUT_S:.0f} s (see {log.name})")
        joined = json.loads(line)
        self.volunteer_ids[joined["peer_id"]] = name
        self.hosted[name] = list(joined["hosted"])

    def trainer(self, name: str, config: TrainerConfig, **options: Any) -> TrainerNode:
        """A started trainer node with the trainer role (credited receipts)."""
        from coordinator.services import SERVICES

        node = TrainerNode(self.url, name, loop=self.loop, config=config, **options)
        self.trainers.append(node)
        self.loop.run(node.start(), 60)
        services = self.running.runner.app[SERVICES]
        self.loop.run(services.accounts.set_role(name, "trainer", by=None), 15)  # an admin's act
        return node

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) of this process since the swarm started (the coordinator and the
        trainers in it) and of each volunteer process so far."""
        out = {"trainer_process": _cpu(psutil.Process()) - self._cpu_at_start}
        for proc, name in zip(self.processes, self.volunteer_ids.values(), strict=False):
            try:
                out[name] = _cpu(psutil.Process(proc.pid))
            except psutil.NoSuchProcess:
                continue
        return out

    def stop(self) -> None:
        for node in self.trainers:
            _quietly(self.loop, node.stop(), 30)
        self.trainers.clear()
        for proc in self.processes:
            if proc.stdin is not None:
                proc.stdin.close()  # the volunteer leaves the swarm and exits
        deadline = time.monotonic() + 20
        for proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.processes.clear()
        if self.running is not None:
            _quietly(self.loop, self.running.stop(), 15)
            self.running = None
        if self._own_loop:
            self.loop.close()


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The process's first line of output, or "" if it exits or stays silent for ``timeout``."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""))
    reader.daemon = True
    reader.start()
    reader.join(timeout)
    return got[0].strip() if got else ""


def _quietly(loop: LoopThread, coro: Any, timeout: float) -> None:
    try:
        loop.run(coro, timeout)
    except Exception:
        logger.exception("local swarm shutdown step failed")
