"""``lah export`` and ``lah generate`` against a real swarm: a coordinator (SQLite), two volunteer
processes hosting every expert of a tiny language model (each expert on both: replicas), real aiortc.

``lah train`` trains a few steps (the experts update on their hosts, the dense part is checkpointed);
``lah export`` gathers every expert from every replica and writes one file; the experts in it are
bit for bit the weights their hosts hold (the volunteers' own final checkpoints, written when they
leave), with the update steps those hosts report; ``lah generate`` prints text from the file alone; and
the file's local model computes the swarm's logits on the replicas it took (within the float16 of the
expert calls' wire; the dense part, loaded from the same file, is exact). An export whose hosts cannot
answer in time fails with exit 1 and leaves the file already written alone; with ``--allow-missing``
it writes a file that lists them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coordinator.accounts.trainers import grant_trainer
from engine.lm import LmConfig, TrainSettings, open_corpus
from engine.lm.model_file import expert_prefixes, read_model_file
from engine.moe import StaticExpertFinder
from engine.moe.checkpoint import CheckpointStore
from engine.trainer.lm import layer_config, remote_lm
from lah.cli import main as lah_main
from lah.lm_demo import lm_experiment
from lah.local_swarm import LocalSwarm

pytestmark = pytest.mark.integration

SMALL = dict(context=16, layers=2, heads=2, dim=32, moe_every=1, grid=(2, 2), k_best=2)


def _lah(command: str, url: str, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LAH_HOST_ADDRESSES="127.0.0.1", PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "lah", command, "--coordinator", url, "--experiment", "tiny"]
    args += ["--data-dir", str(home), "--token-file", str(home / "token.json"), *extra]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.timeout(600)
def test_export_gathers_the_hosts_weights_and_generate_runs_them_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = open_corpus()
    assert corpus.tokenizer is not None
    lm = LmConfig(vocab_size=corpus.vocab_size, **SMALL)  # type: ignore[arg-type]
    experiment = lm_experiment(lm, TrainSettings(batch=4), name="tiny", digest=corpus.tokenizer.digest)
    out = tmp_path / "tiny.safetensors"
    folder = tmp_path / "swarm"
    with LocalSwarm([experiment], folder, volunteers=2, replication=2) as swarm:
        home = tmp_path / "alice"
        _, code, _ = swarm.loop.run(grant_trainer(swarm.running.services.accounts, "alice", by=None), 15)
        login = ["train", "login", "--coordinator", swarm.url, "--name", "alice", f"--code={code}"]
        assert lah_main([*login, "--data-dir", str(home), "--token-file", str(home / "token.json")]) == 0
        capsys.readouterr()
        trained = _lah("train", swarm.url, home, "--steps", "6")
        assert trained.returncode == 0, trained.stdout + trained.stderr

        exported = _lah("export", swarm.url, home, "--out", str(out))
        assert exported.returncode == 0, exported.stdout + exported.stderr
        assert "gathered 8 of 8 experts from" in exported.stdout and "missing: none" in exported.stdout
        assert f"bytes to {out}" in exported.stdout and "(step 6)" in exported.stdout
        with capsys.disabled():
            print(exported.stdout)  # the summary, for the log

        loaded = read_model_file(out)
        assert (
            loaded.experiment == "tiny"
            and loaded.missing == []
            and set(loaded.experts) == set(expert_prefixes(lm, "tiny"))
        )
        assert loaded.tokenizer.digest == corpus.tokenizer.digest  # generate needs nothing else
        taken = {uid: info["host"] for uid, info in loaded.experts.items()}
        assert set(taken.values()) <= set(swarm.volunteer_ids)
        replicas = {uid: sum(uid in uids for uids in swarm.hosted.values()) for uid in taken}
        assert all(
            loaded.experts[u]["replicas"] == n == loaded.experts[u]["answered"] for u, n in replicas.items()
        )
        assert any(n > 1 for n in replicas.values())  # replicas were compared
        assert sum(info["steps"] for info in loaded.experts.values()) > 0  # the experts did learn

        # The text, from the file alone (no swarm in that code path: it never opens a socket).
        assert lah_main(["generate", "--model", str(out), "--prompt", "ROMEO:", "--tokens", "40"]) == 0
        text = capsys.readouterr().out.rstrip("\n")
        assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 40
        assert set(text) <= set(corpus.tokenizer.decode(range(corpus.vocab_size)))  # type: ignore[union-attr]
        with capsys.disabled():
            print(f"generated: {text!r}")

        # The swarm's model on the replicas the file took, the dense part from the file: same logits.
        cfg = layer_config(lm, "tiny", timeout=20.0, wire="float16")  # the bound below is float16's
        node = swarm.trainer("checker", cfg)
        assert node.peer is not None
        remote = remote_lm(node.peer, StaticExpertFinder(taken), swarm.loop, lm, "tiny", cfg)
        dense = {k: v for k, v in loaded.model.state_dict().items() if ".experts." not in k}
        remote.load_state_dict(dense, strict=True)
        idx = torch.tensor([corpus.tokenizer.encode("First Citizen:\nBe")[: lm.context]])
        with torch.no_grad():
            local_logits, swarm_logits = loaded.model(idx)[0], remote(idx)[0]
        gap = float((local_logits - swarm_logits).abs().max())
        with capsys.disabled():
            print(f"largest logit gap, local file vs swarm: {gap:.2e}")
        assert gap < 5e-3, gap  # float16 on the expert calls' wire, nothing else
        assert float(local_logits.std()) > 0.1  # logits that mean something, not a flat zero

        # Hosts that cannot answer in time: exit 1, the file written before untouched.
        before = out.read_bytes()
        late = _lah("export", swarm.url, home, "--out", str(out), "--timeout", "0.001")
        assert late.returncode == 1 and "no host answered for 8 experts" in late.stdout, late.stdout
        assert "tiny_b0.0.0 (timeout from 2 hosts)" in late.stdout
        assert "--allow-missing" in late.stdout and out.read_bytes() == before
        partial = tmp_path / "partial.safetensors"
        allowed = _lah(
            "export", swarm.url, home, "--out", str(partial), "--timeout", "0.001", "--allow-missing"
        )
        assert allowed.returncode == 0, allowed.stdout + allowed.stderr
        assert "missing (left at their initialisation): 8" in allowed.stdout
        with capsys.disabled():
            print(late.stdout, allowed.stdout)
        assert sorted(read_model_file(partial).missing) == sorted(taken)

    # Bit for bit what each host held: its own checkpoint, written as the volunteer left.
    names = {peer: name for peer, name in swarm.volunteer_ids.items()}
    prefixes = expert_prefixes(lm, "tiny")
    file_state = loaded.model.state_dict()
    for uid, host in taken.items():
        ckpt = CheckpointStore(folder / names[host] / "experts" / uid).load_latest()
        assert ckpt is not None, (uid, names[host])
        assert ckpt.meta["steps"] == loaded.experts[uid]["steps"]
        for key, value in ckpt.tensors.items():
            if key.startswith("model."):
                assert torch.equal(file_state[prefixes[uid] + key.removeprefix("model.")], value), (uid, key)
