"""Checkpoints: round trip, atomic files, a truncated newest file skipped, keep-last-N."""

import logging
from pathlib import Path

import pytest
import torch

from engine.moe import CheckpointStore, ExpertSpec, build, restore_state, snapshot_state


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = build(ExpertSpec("ffn", 8, hidden=16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.9))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        opt.step()
    return model, opt


def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build(ExpertSpec("ffn", 8, hidden=16))
    return model, torch.optim.Adam(model.parameters(), lr=1.0)


def test_round_trip_restores_weights_and_optimizer(tmp_path: Path) -> None:
    model, opt = trained(0)
    store = CheckpointStore(tmp_path)
    path = store.save(snapshot_state(model, opt, {"steps": 3}))
    assert path.exists() and not list(tmp_path.glob("*.tmp"))
    assert b"pickle" not in path.read_bytes()[:64]
    ckpt = store.load_latest()
    assert ckpt is not None and ckpt.meta["steps"] == 3
    model2, opt2 = fresh()
    restore_state(model2, opt2, ckpt)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert opt2.param_groups[0]["lr"] == 1e-2 and tuple(opt2.param_groups[0]["betas"]) == (0.8, 0.9)
    # The same next step from both: optimizer moments (and step counts) came back too.
    x = torch.randn(4, 8)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.allclose(a, b)


def test_truncated_newest_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path)
    model, opt = trained(1)
    store.save(snapshot_state(model, opt, {"steps": 1}))
    store.save(snapshot_state(model, opt, {"steps": 2}))
    newest = store.files()[-1]
    newest.write_bytes(newest.read_bytes()[:-100])  # a crash mid-write, without the atomic rename
    (tmp_path / "ckpt-0000000009.safetensors.tmp").write_bytes(b"partial")
    with caplog.at_level(logging.WARNING, logger="engine.moe.checkpoint"):
        ckpt = store.load_latest()
    assert ckpt is not None and ckpt.meta["steps"] == 1
    assert "skipping checkpoint" in caplog.text and newest.name in caplog.text
    assert not list(tmp_path.glob("*.tmp"))


def test_garbage_only_gives_none(tmp_path: Path) -> None:
    (tmp_path / "ckpt-0000000001.safetensors").write_bytes(b"\x00" * 3)
    assert CheckpointStore(tmp_path).load_latest() is None
    assert CheckpointStore(tmp_path / "missing").load_latest() is None


def test_keeps_last_n(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    model, opt = trained(2)
    for step in range(5):
        store.save(snapshot_state(model, opt, {"steps": step}))
    assert [p.name for p in store.files()] == ["ckpt-0000000004.safetensors", "ckpt-0000000005.safetensors"]
    ckpt = store.load_latest()
    assert ckpt is not None and ckpt.meta["steps"] == 4
