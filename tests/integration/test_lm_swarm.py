"""The language model through volunteers: a real coordinator (SQLite) with an experiment of kind lm,
real volunteer processes hosting both of its layers' grids, real aiortc links.

`run_lm` (the demo's and benchmark's path) trains a small GPT whose loss falls, credits every volunteer
and logs metrics rows to CSV; `lah train` on an lm experiment trains, checkpoints, resumes from its
checkpoint, and refuses a tokenizer or vocabulary that is not the experiment's, with exit status 2."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from coordinator.accounts.trainers import grant_trainer
from engine.lm import LmConfig, TrainSettings, open_corpus
from engine.lm.tokenizer import CharTokenizer, save
from lah.cli import main as lah_main
from lah.lm_demo import lm_experiment, run_lm
from lah.local_swarm import LocalSwarm

pytestmark = pytest.mark.integration

SMALL = dict(context=32, layers=2, heads=2, dim=32, moe_every=1, grid=(4, 4), k_best=2)


@pytest.mark.timeout(300)
def test_a_language_model_trains_through_volunteer_processes(tmp_path: Path) -> None:
    corpus = open_corpus()
    lm = LmConfig(vocab_size=corpus.vocab_size, **SMALL)  # type: ignore[arg-type]
    settings = TrainSettings(steps=40, batch=8, eval_every=20, eval_batches=4)
    lines: list[str] = []
    run = run_lm(
        corpus, lm, settings, volunteers=2, folder=tmp_path / "swarm", csv=tmp_path / "m.csv",
        sample_tokens=40, say=lines.append,
    )  # fmt: skip
    assert any("the trainer finds 32 of 32 experts" in line for line in lines), lines
    first, last = run.rows[0], run.rows[-1]
    assert last.val_loss is not None and first.val_loss is not None
    assert last.val_loss < math.log(corpus.vocab_size) - 0.5, run.rows  # it learned something
    assert run.skipped_steps == 0 and run.short_rows == 0
    assert last.calls.calls_ok > 0 and last.calls.bytes_sent > 0 and last.calls.bytes_received > 0
    # both layers' grids on both volunteers, each credited for what it served
    assert set(run.served) == {"volunteer-0", "volunteer-1"}
    assert all(run.host_credit[name] > 0 for name in run.served), run.host_credit
    assert set(run.cpu_s) == {"trainer_process", "volunteer-0", "volunteer-1"}
    assert len(run.sample) > 20 and set(run.sample) <= set(corpus.tokenizer.decode(range(corpus.vocab_size)))  # type: ignore[union-attr]
    assert run.posted == 3  # both evaluations for the experiment's page, then the last with the sample
    assert run.experiment_url.endswith("/experiments/shakespeare")
    with (tmp_path / "m.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [20, 40]
    assert {"val_loss", "tokens_per_s", "calls_ok", "calls_failed", "calls_late", "bytes_sent"} <= set(
        rows[0]
    )


def _lah(url: str, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LAH_HOST_ADDRESSES="127.0.0.1", PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "lah", "train", "--coordinator", url, "--experiment", "tiny"]
    command += ["--data-dir", str(home), "--token-file", str(home / "token.json"), *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.timeout(600)
def test_lah_train_trains_checkpoints_resumes_and_refuses_other_tokens(tmp_path: Path) -> None:
    corpus = open_corpus()
    assert corpus.tokenizer is not None
    lm = LmConfig(vocab_size=corpus.vocab_size, **SMALL)  # type: ignore[arg-type]
    settings = TrainSettings(steps=0, batch=8)
    experiment = lm_experiment(lm, settings, name="tiny", digest=corpus.tokenizer.digest)
    with LocalSwarm([experiment], tmp_path / "swarm", volunteers=2) as swarm:
        home = tmp_path / "alice"
        _, code, _ = swarm.loop.run(grant_trainer(swarm.running.services.accounts, "alice", by=None), 15)
        login = ["train", "login", "--coordinator", swarm.url, "--name", "alice", f"--code={code}"]
        assert lah_main([*login, "--data-dir", str(home), "--token-file", str(home / "token.json")]) == 0

        done = _lah(swarm.url, home, "--steps", "100")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "step 100: loss" in done.stdout and "credited" in done.stdout, done.stdout
        assert "1,003,854 training and 111,540 validation tokens (the first 90%" in done.stdout, done.stdout
        folder = home / "lm-tiny"
        assert len(list((folder / "checkpoints").glob("ckpt-*.safetensors"))) == 1
        assert list((folder / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard events"
        again = _lah(swarm.url, home, "--steps", "100", "--resume")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "resumed at step 100" in again.stdout and "step 200: loss" in again.stdout, again.stdout
        with (folder / "metrics.csv").open() as f:
            assert [int(r["step"]) for r in csv.DictReader(f)] == [100, 200]
        # Each evaluation reached the experiment's page, with what the model wrote at the last one.
        with urllib.request.urlopen(f"{swarm.url}/api/site/experiments/tiny", timeout=15) as r:
            page = json.load(r)
        (curve,) = page["curves"]
        assert curve["account_name"] == "alice" and [p["step"] for p in curve["points"]] == [100, 200]
        assert page["sample"]["step"] == 200 and len(page["sample"]["text"]) > 100, page["sample"]

        # Another tokenizer (a character set the experiment did not fix): refused, nothing trained.
        other = tmp_path / "other.json"
        save(CharTokenizer("abc \n"), other)
        refused = _lah(swarm.url, home, "--steps", "5", "--tokenizer", str(other))
        assert refused.returncode == 2 and "differs from the experiment's" in refused.stdout, refused.stdout
        # Text whose vocabulary is another size than the model's.
        text = tmp_path / "small.txt"
        text.write_text("to be or not to be, that is the question\n" * 400)
        wrong = _lah(swarm.url, home, "--steps", "5", "--data", str(text))
        assert wrong.returncode == 2, wrong.stdout
        assert "differs from the experiment's" in wrong.stdout or "vocabulary" in wrong.stdout, wrong.stdout
        with (folder / "metrics.csv").open() as f:
            assert [int(r["step"]) for r in csv.DictReader(f)] == [100, 200]  # nothing lost
