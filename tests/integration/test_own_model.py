"""A researcher's own model through the swarm facade (engine.swarm): a real coordinator (SQLite) with a
language-model and a classifier experiment, real volunteer processes hosting their grids, the
operator's grant and `lah train login` through the CLI, then both scripts of examples/ run end to end
as subprocesses with the trainer's token file: their loss falls or their accuracy rises, their receipts
reach the coordinator and the volunteers that served them hold more credit. In process: each way
joining can go wrong says so in a sentence, and a layer or input of another width is refused before a
single expert call."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from coordinator.accounts.trainers import grant_trainer
from coordinator.config import DenseModel, ExperimentConfig
from coordinator.credit.leaderboard import leaderboard
from engine.lm import LmConfig, TrainSettings
from engine.swarm import (
    CoordinatorNotFound,
    LoginRequired,
    Mismatch,
    Swarm,
    SwarmOptimizer,
    UnknownExperiment,
    UnknownGrid,
)
from lah.cli import main as lah_main
from lah.lm_demo import lm_experiment
from lah.local_swarm import LocalSwarm

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TINY_LM = LmConfig(vocab_size=65, context=32, layers=2, heads=2, dim=16, moe_every=1, grid=(2, 2), k_best=2)
RECEIPTS = re.compile(r"receipts (\d+) submitted, (\d+) credited, (\d+) rejected")


@dataclass
class Place:
    swarm: LocalSwarm
    home: Path  # the trainer's data dir; its token file is home / "token.json"

    @property
    def token_file(self) -> Path:
        return self.home / "token.json"

    def credit(self) -> dict[str, float]:
        """Each volunteer's credit in the ledger (not the leaderboard's page cache)."""
        services = self.swarm.running.services
        board = self.swarm.loop.run(leaderboard(services.sessions, "hosts", per_page=100), 15)
        totals = {str(e.id): float(e.credit_total) for e in board.entries}
        return {name: totals.get(peer, 0.0) for peer, name in self.swarm.volunteer_ids.items()}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    tmp = tmp_path_factory.mktemp("own-model")
    experiments = [
        lm_experiment(TINY_LM, TrainSettings(batch=8, lr=3e-3), name="tinylm"),  # grids tinylm_b0, tinylm_b1
        ExperimentConfig(
            name="blobs",
            expert_type="ffn",
            grid=[2, 2],
            hyperparams={"d_model": 16, "hidden": 32},
            target_batch_size=128,  # a collaborative step every four batches of 32 (~4 s each, alone)
            dense=DenseModel(batch_size=32, lr=0.01),
        ),
    ]
    with LocalSwarm(experiments, tmp / "swarm", volunteers=2) as swarm:
        home = tmp / "alice"
        _, code, _ = swarm.loop.run(grant_trainer(swarm.running.services.accounts, "alice", by=None), 15)
        login = ["train", "login", "--coordinator", swarm.url, "--name", "alice", f"--code={code}"]
        assert lah_main([*login, "--data-dir", str(home), "--token-file", str(home / "token.json")]) == 0
        yield Place(swarm, home)


def _example(place: Place, script: str, experiment: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LAH_HOST_ADDRESSES="127.0.0.1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    command = [sys.executable, str(ROOT / "examples" / script), "--coordinator", place.swarm.url]
    command += ["--experiment", experiment, "--token-file", str(place.token_file)]
    command += ["--data-dir", str(place.home), *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, cwd=place.home)


def _figure(pattern: str, out: str) -> float:
    found = re.search(pattern, out)
    assert found is not None, (pattern, out)
    return float(found[1])


def _credited_and_paid(place: Place, out: str, before: dict[str, float]) -> None:
    receipts = RECEIPTS.search(out)
    assert receipts is not None, out
    submitted, credited, rejected = (int(n) for n in receipts.groups())
    assert submitted > 0 and credited == submitted and rejected == 0, out
    served = int(_figure(r"(\d+) hosts served", out))
    after = place.credit()
    paid = [name for name in after if after[name] > before[name]]
    # Each expert's calls go to one of its two replicas (per uid, per trainer): the hosts that served
    # this run, and only they, hold more credit now.
    assert served >= 1 and len(paid) == served, (out, before, after)


@pytest.mark.timeout(300)
def test_the_lm_example_trains_its_own_gpt_through_the_volunteers(place: Place) -> None:
    before = place.credit()
    run = _example(place, "lm_own_loop.py", "tinylm", "--steps", "60", "--context", "32", "--heads", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "2 blocks of width 16 on grids tinylm_b0, tinylm_b1" in out, out
    assert "experts found through the DHT: 4 of 4 in tinylm_b0, 4 of 4 in tinylm_b1" in out, out
    assert "steps with the experiment's other trainers" not in out  # tinylm sets no target batch size
    first = _figure(r"validation loss before training: ([\d.]+)", out)
    last = _figure(r"validation loss after 60 steps: ([\d.]+)", out)
    assert last < first - 0.3, out  # ln(65) = 4.17 at the start: it learned characters
    assert "skipped" not in out, out
    _credited_and_paid(place, out, before)
    assert _figure(r"spot checks (\d+) \(", out) > 0, out  # 2% of ~500 answers re-sent to the other replica


@pytest.mark.timeout(300)
def test_the_classifier_example_trains_on_its_own_data_collaboratively(place: Place) -> None:
    before = place.credit()
    data = place.home / "own.npz"
    run = _example(place, "own_classifier.py", "blobs", "--steps", "20", "--lr", "0.05", "--data", str(data))
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert data.exists() and "samples of 20 features, 4 classes" in out, out  # not the digits' 64 and 10
    assert "experts of width 16 on a 2x2 grid" in out, out
    assert re.search(
        r"steps with the experiment's other trainers \(run blobs\.own\.[0-9a-f]{16}, target 128\)", out
    ), out
    before_acc = _figure(r"test accuracy before training: ([\d.]+)", out)
    after_acc = _figure(r"test accuracy after 20 steps: ([\d.]+)", out)
    assert after_acc > before_acc + 0.25 and after_acc > 0.5, out  # 4 classes: a guess is right 1 in 4
    assert "5 collaborative steps (epoch 5)" in out, out  # 20 batches of 32 in steps of 128 samples, alone
    _credited_and_paid(place, out, before)


@pytest.mark.timeout(120)
def test_an_example_that_cannot_join_says_why_and_exits_2(place: Place) -> None:
    run = _example(place, "own_classifier.py", "nope", "--steps", "1", "--data", str(place.home / "own.npz"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.strip().endswith(
        f"own_classifier: the coordinator at {place.swarm.url} runs no experiment called 'nope'"
    )
    assert "Traceback" not in run.stderr


@pytest.mark.timeout(240)
def test_each_way_joining_goes_wrong_is_a_sentence(place: Place, tmp_path: Path) -> None:
    url, tokens = place.swarm.url, place.token_file
    with pytest.raises(
        UnknownExperiment, match=f"the coordinator at {re.escape(url)} runs no experiment called 'nope'"
    ):
        Swarm.join(url, "nope", token_file=tokens, data_dir=tmp_path / "a")
    with pytest.raises(
        LoginRequired, match=r"no trainer login for .* in .*: run `lah train login --coordinator"
    ):
        Swarm.join(url, "blobs", token_file=tmp_path / "nobody.json", data_dir=tmp_path / "b")
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CoordinatorNotFound, match="was refused: nothing listens there"):
        Swarm.join(f"http://127.0.0.1:{port}", "blobs", token_file=tokens, data_dir=tmp_path / "c")
    with pytest.raises(CoordinatorNotFound, match="answered, but not as a Learning@home coordinator"):
        Swarm.join(
            url + "/site", "blobs", token_file=tokens, data_dir=tmp_path / "d"
        )  # the site, not the API
    # Nothing was left behind: each data dir's lock was released (or never taken).
    assert not any(tmp_path.glob("*/train.lock"))


@pytest.mark.timeout(240)
def test_a_layer_or_input_of_another_width_is_refused_before_any_call(place: Place, tmp_path: Path) -> None:
    with Swarm.join(
        place.swarm.url, "tinylm", token_file=place.token_file, data_dir=tmp_path, wait_s=0
    ) as swarm:
        assert {n: (g.shape, g.dim) for n, g in swarm.grids.items()} == {
            "tinylm_b0": ((2, 2), 16),
            "tinylm_b1": ((2, 2), 16),
        }
        with pytest.raises(Mismatch) as e:
            swarm.mixture("tinylm_b0", dim=64)
        assert str(e.value).startswith(
            "grid tinylm_b0's experts take 16 features per token and give back as many; "
            "this layer was asked for 64: make the layer's width 16"
        )
        with pytest.raises(UnknownGrid, match="has no grid 'tinylm_b7'; it offers: tinylm_b0, tinylm_b1"):
            swarm.mixture("tinylm_b7")
        layer = swarm.mixture("tinylm_b0", dim=16, shape=(2, 2))
        with pytest.raises(Mismatch, match=r"take 16 features per token; this input is \[4, 8, 64\]"):
            layer(torch.zeros(4, 8, 64))
        assert swarm.stats.calls_ok + swarm.stats.calls_failed == 0  # nothing was sent
        opt = swarm.optimizer(torch.optim.AdamW, layer.parameters(), lr=1e-3)
        assert type(opt) is torch.optim.AdamW and not isinstance(opt, SwarmOptimizer)  # no target batch size
    assert not (tmp_path / "train.lock").exists()
