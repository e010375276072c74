"""Two researchers' `lah train` processes training one language model's dense part together (DeDLOC)
through real volunteer processes' experts: matchmaking, all-reduce and state over real aiortc links.

Each trainer draws its own windows (``lah.train_lm.data_seed``), hands its gradients to the
collaboration, and stops at the collaboration's step 4 (``--steps`` counts the dense model's steps);
both end with identical dense weights, having stepped in groups of two, and both credit the volunteers
that answered them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from coordinator.accounts.trainers import grant_trainer
from engine.lm import LmConfig, TrainSettings, open_corpus
from lah.cli import main as lah_main
from lah.lm_demo import lm_experiment
from lah.local_swarm import LocalSwarm

pytestmark = pytest.mark.integration

SMALL = dict(context=32, layers=2, heads=2, dim=32, moe_every=1, grid=(4, 4), k_best=2)


def _train(url: str, home: Path, steps: int) -> subprocess.Popen[str]:
    env = dict(os.environ, LAH_HOST_ADDRESSES="127.0.0.1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "lah", "train", "--coordinator", url, "--experiment", "duo"]
    command += ["--data-dir", str(home), "--token-file", str(home / "token.json"), "--steps", str(steps)]
    command += ["--wait-peers", "2"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _dense(home: Path) -> dict[str, torch.Tensor]:
    newest = sorted((home / "lm-duo" / "checkpoints").glob("ckpt-*.safetensors"))[-1]
    return {k: v for k, v in load_file(str(newest)).items() if k.startswith("model.")}


@pytest.mark.timeout(600)
def test_two_lah_trainers_step_a_language_model_together(tmp_path: Path) -> None:
    corpus = open_corpus()
    assert corpus.tokenizer is not None
    lm = LmConfig(vocab_size=corpus.vocab_size, **SMALL)  # type: ignore[arg-type]
    experiment = lm_experiment(
        lm, TrainSettings(steps=0, batch=8), name="duo", digest=corpus.tokenizer.digest
    )
    experiment = msgspec.structs.replace(experiment, target_batch_size=16)  # two batches a step
    with LocalSwarm([experiment], tmp_path / "swarm", volunteers=2) as swarm:
        homes = []
        for name in ("ada", "grace"):
            home = tmp_path / name
            _, code, _ = swarm.loop.run(grant_trainer(swarm.running.services.accounts, name, by=None), 15)
            login = ["train", "login", "--coordinator", swarm.url, "--name", name, f"--code={code}"]
            assert lah_main([*login, "--data-dir", str(home), "--token-file", str(home / "token.json")]) == 0
            homes.append(home)

        runs = [_train(swarm.url, home, 4) for home in homes]
        outputs = [run.communicate(timeout=420)[0] for run in runs]

        for run, out in zip(runs, outputs, strict=True):
            assert run.returncode == 0, out
            assert "training the dense part with the experiment's other trainers: target 16" in out, out
            assert "collaboration: at its step 4;" in out, out
            took = out.split("collaboration: at its step 4; this trainer took ", 1)[1]
            assert "2" in took.split("groups of ", 1)[1].split(")", 1)[0], out  # some step in a pair
            assert "credited" in out, out
        first, second = (_dense(home) for home in homes)
        assert first.keys() == second.keys() and first
        assert all(torch.equal(first[k], second[k]) for k in first), "the dense parts differ"
