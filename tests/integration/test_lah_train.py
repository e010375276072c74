"""Two `lah train` processes of one experiment: a real coordinator (SQLite), two real volunteer nodes
hosting the experts (as the demo starts them), the operator's grant and `lah train login` through the
CLI, then two `lah train` subprocesses that train the dense part together over real aiortc links and
credit the volunteers; the second stops on SIGINT, cleanly."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from coordinator.accounts.trainers import grant_trainer
from coordinator.config import CoordinatorConfig, DenseModel, ExperimentConfig
from coordinator.server.app import start_full
from engine.account.coordinator_api import CoordinatorApi
from engine.moe import LoopThread
from engine.node.join import join_local
from engine.resources import Settings
from lah.cli import main as lah_main
from lah.train_credentials import TrainerCredentials

pytestmark = pytest.mark.integration

STEP = re.compile(r"^step (\d+): .* (\d+) in its round")
DONE = re.compile(r"receipts (\d+) submitted, (\d+) credited, (\d+) rejected")


def _lah_train(url: str, data_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, LAH_HOST_ADDRESSES="127.0.0.1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "lah", "train", "--coordinator", url, "--experiment", "ffn"]
    command += [
        "--data-dir",
        str(data_dir),
        "--token-file",
        str(data_dir / "token.json"),
        "--wait-peers",
        "2",
    ]
    return subprocess.Popen(
        [*command, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _steps(output: str) -> dict[int, int]:
    """Collaborative step -> how many trainers were in its round, from the progress lines."""
    return {int(m[1]): int(m[2]) for m in (STEP.match(line) for line in output.splitlines()) if m}


@pytest.mark.timeout(300)
def test_two_lah_train_runs_step_together_and_credit_the_volunteers(tmp_path: Path) -> None:
    experiment = ExperimentConfig(
        name="ffn",
        expert_type="ffn",
        grid=[2, 2],
        hyperparams={"d_model": 16, "hidden": 32},
        target_batch_size=64,  # two batches of 16 from each trainer per step
        dense=DenseModel(batch_size=16, lr=0.01),
    )
    config = CoordinatorConfig(
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'coordinator.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[experiment],
        verify_workers=0,
    )
    loop = LoopThread("test-loop")
    running = loop.run(start_full(config), 60)
    volunteers: list[Any] = []
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(2):
            volunteers.append(
                loop.run(
                    join_local(running.url, f"volunteer-{i}", tmp_path / f"v{i}", Settings(), device="cpu"),
                    90,
                )
            )
        # The operator grants; each researcher logs in with the code (the CLI, in this process).
        dirs = [tmp_path / "alice", tmp_path / "bob"]
        for name, d in zip(("alice", "bob"), dirs, strict=True):
            _, code, _ = loop.run(grant_trainer(running.services.accounts, name, by=None), 15)
            argv = ["train", "login", "--coordinator", running.url, "--name", name, f"--code={code}"]
            assert lah_main([*argv, "--data-dir", str(d), "--token-file", str(d / "token.json")]) == 0
            assert code not in (d / "token.json").read_text()
        first = _lah_train(running.url, dirs[0], "--steps", "3")
        second = _lah_train(running.url, dirs[1], "--steps", "1000")  # until SIGINT
        procs = [first, second]
        # Ctrl+C for the second once it took step 3: it stops after the batch in hand.
        lines: list[str] = []
        third = threading.Event()

        def read_second() -> None:
            assert second.stdout is not None
            for line in second.stdout:
                lines.append(line)
                if line.startswith("step 3:"):
                    third.set()

        reader = threading.Thread(target=read_second, daemon=True)
        reader.start()
        assert third.wait(200), "".join(lines)
        second.send_signal(signal.SIGINT)
        out_first, _ = first.communicate(timeout=60)
        assert first.returncode == 0, out_first
        assert second.wait(90) == 0, "".join(lines)
        reader.join(10)
        out_second = "".join(lines)
        assert "stopping after this batch" in out_second
        # Both took steps 2 and 3 together, in rounds of two. Step 1 too, unless one of them reached
        # it by taking the other's state instead of a round (it saw the collaboration already under
        # way when its first record went out: a newcomer's path, and "0 in its round" says so).
        firsts = []
        for out in (out_first, out_second):
            steps = _steps(out)
            assert {s: steps.get(s) for s in (2, 3)} == {2: 2, 3: 2}, out
            assert steps.get(1) in (0, 2), out
            firsts.append(steps.get(1))
        assert 2 in firsts, (out_first, out_second)
        # Each one's receipts were credited, and the volunteers hold the credit.
        for out in (out_first, out_second):
            done = DONE.search(out)
            assert done is not None, out
            assert int(done[1]) > 0 and int(done[2]) > 0 and int(done[3]) == 0, out
        api = CoordinatorApi(running.url)
        board = loop.run(api.get("/api/leaderboard?kind=hosts&per_page=100"), 15)
        loop.run(api.close(), 5)
        credit = {str(e["id"]): float(e["credit_total"]) for e in board["entries"]}
        assert any(credit.get(v.peer_id, 0.0) > 0 for v in volunteers), credit
        # No token was ever printed.
        for d, out in zip(dirs, (out_first, out_second), strict=True):
            kept = TrainerCredentials(d, d / "token.json").load(running.url)
            assert kept is not None and kept.token not in out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
        for v in volunteers:
            with contextlib.suppress(Exception):
                loop.run(v.stop(), 30)
        loop.run(running.stop(), 30)
        loop.close()
