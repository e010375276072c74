"""``lah export``'s checks that need no swarm (lah/export.py): the dense part's checkpoint, the tokenizer
and the command line's refusals, each a sentence and exit status 2 before anything joins the swarm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from engine.lm import LmConfig, TrainSettings
from engine.lm.tokenizer import CharTokenizer, save
from engine.moe.checkpoint import CheckpointStore, snapshot_state
from engine.trainer.lm import layer_config, remote_lm
from lah.cli import main as lah_main
from lah.export import ExportError, _dense, _tokenizer
from lah.lm_demo import lm_experiment
from lah.train import config_of

TOK = CharTokenizer.fit("to be or not to be\n")
LM = LmConfig(
    vocab_size=TOK.vocab_size, context=16, layers=2, heads=2, dim=16, moe_every=1, grid=(2, 2), k_best=2
)


def experiment(name: str = "tiny", lm: LmConfig = LM, digest: str = TOK.digest) -> Any:
    spec = lm_experiment(lm, TrainSettings(batch=4), name=name, digest=digest)
    return config_of(msgspec.json.decode(msgspec.json.encode(spec)))  # as the coordinator's API sends it


def checkpoint(folder: Path, step: int, *, name: str = "tiny", lm: LmConfig = LM) -> Path:
    """What lah train writes: the remote model's dense part and its optimizer."""
    model = remote_lm(None, None, None, lm, name, layer_config(lm, name))  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(model.parameters())
    return CheckpointStore(folder).save(snapshot_state(model, optimizer, {"step": step, "experiment": name}))


def test_the_newest_readable_checkpoint_gives_the_dense_part(tmp_path: Path) -> None:
    folder = tmp_path / "lm-tiny"
    checkpoint(folder / "checkpoints", 100)
    second = checkpoint(folder / "checkpoints", 200)
    dense = _dense(experiment(), folder)  # lah train's folder, as the default
    assert dense.step == 200 and dense.source == str(second)
    assert "blocks.0.ffn.gates.1.weight" in dense.tensors and not any(".experts." in k for k in dense.tensors)
    broken = checkpoint(folder / "checkpoints", 300)
    broken.write_bytes(broken.read_bytes()[:100])  # cut short: the previous one is taken
    assert _dense(experiment(), folder / "checkpoints").step == 200
    assert _dense(experiment(), second).step == 200  # a file named directly


def test_a_missing_foreign_or_unfitting_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ExportError, match=r"no checkpoint of the dense part .* \(lah train --experiment tiny writes"
    ):
        _dense(experiment(), tmp_path / "nothing-here")
    other = checkpoint(tmp_path / "other", 5, name="other")
    with pytest.raises(ExportError, match="a checkpoint of 'other', not 'tiny'"):
        _dense(experiment(), other)
    wider = LmConfig(**{**LM.__dict__, "dim": 32})
    with pytest.raises(ExportError, match="does not fit the experiment's model"):
        _dense(experiment(), checkpoint(tmp_path / "wide", 5, lm=wider))
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\x01" * 64)
    with pytest.raises(ExportError, match="cannot read the checkpoint"):
        _dense(experiment(), garbage)


def test_the_tokenizer_must_be_the_experiments(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n")
    assert _tokenizer(experiment(), text, None).digest == TOK.digest
    mine = tmp_path / "tok.json"
    save(TOK, mine)
    assert _tokenizer(experiment(), None, mine).digest == TOK.digest
    other = tmp_path / "other.json"
    save(CharTokenizer("to be"), other)
    with pytest.raises(ExportError, match="differs from the experiment's"):
        _tokenizer(experiment(), None, other)
    with pytest.raises(ExportError, match="the experiment's model has"):  # no digest to compare: the size
        _tokenizer(experiment(digest=""), None, other)


def test_the_command_refuses_before_joining(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    base = ["export", "--coordinator", "http://127.0.0.1:9", "--experiment", "tiny"]
    base += ["--data-dir", str(home), "--token-file", str(home / "token.json")]
    assert lah_main([*base, "--out", str(tmp_path / "m.safetensors")]) == 2
    # no login kept, and nothing answers there: said as a mistyped URL, as lah train says it
    out = capsys.readouterr().out
    assert "the coordinator at http://127.0.0.1:9 is unreachable" in out and "check --coordinator" in out
    assert lah_main([*base, "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().out
    assert lah_main([*base, "--out", str(tmp_path / "no" / "m.safetensors")]) == 2
    assert "is not a folder this user may write in" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        lah_main([*base, "--out", str(tmp_path / "m.safetensors"), "--timeout", "0"])
    assert stop.value.code == 2
    assert not (tmp_path / "m.safetensors").exists()
