"""``lah train``'s reading of an experiment's config and of its data: what the trainer is built from, and
a clear TrainError (exit status 2) for a config or a data set that does not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from coordinator.config import DenseModel, ExperimentConfig
from lah.cli import main as lah_main
from lah.train import TrainError, config_of, load_data

EXP = ExperimentConfig(
    name="ffn",
    expert_type="ffn",
    grid=[3, 5],
    hyperparams={"d_model": 32, "hidden": 96},
    target_batch_size=512,
    dense=DenseModel(in_features=8, classes=3, k_best=2, batch_size=24, lr=0.02),
)


def _json(experiment: ExperimentConfig = EXP) -> dict[str, Any]:
    return msgspec.json.decode(msgspec.json.encode(experiment))  # as the API sends it


def test_the_trainer_is_built_from_the_experiment() -> None:
    got = config_of(_json())
    cfg = got.trainer
    assert (cfg.uid_prefix, cfg.grid, cfg.dim, cfg.hidden) == ("ffn", (3, 5), 32, 96)
    assert (cfg.k_best, cfg.batch_size, cfg.lr, cfg.target_batch_size) == (2, 24, 0.02, 512)
    assert (got.in_features, got.classes, got.dataset) == (8, 3, "digits")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"expert_type": "transformer"}, "ffn experts"),
        ({"grid": "4x4"}, "not one lah train understands"),
        ({"hyperparams": {"d_model": "wide"}}, "not one lah train understands"),
        ({"name": None, "grid": None}, "not one lah train understands"),
    ],
)
def test_a_config_it_cannot_build_is_a_train_error(change: dict[str, Any], match: str) -> None:
    with pytest.raises(TrainError, match=match):
        config_of({**_json(), **change})
    with pytest.raises(TrainError, match="not one lah train understands"):
        config_of({k: v for k, v in _json().items() if k != "expert_type"})


def test_digits_are_the_default_data_and_must_fit_the_model(tmp_path: Path) -> None:
    digits = config_of(_json(ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2])))
    data = load_data(digits, None)
    assert data.x_train.shape[1] == 64 and len(data.x_test) > 0
    with pytest.raises(TrainError, match="64 features; the experiment's model takes 8"):
        load_data(config_of(_json()), None)
    other = config_of(_json(msgspec.structs.replace(EXP, dense=DenseModel(dataset="cifar"))))
    with pytest.raises(TrainError, match=r"--data FILE\.npz"):
        load_data(other, None)


def test_an_npz_of_the_experiments_shape_is_split_80_20(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.random.default_rng(1).random((50, 8)), y=np.arange(50) % 3)
    data = load_data(config_of(_json()), path)
    assert (len(data.x_train), len(data.x_test)) == (40, 10)
    assert data.x_train.shape[1] == 8 and str(data.y_train.dtype) == "torch.int64"


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"x": np.zeros((10, 7)), "y": np.zeros(10, dtype=int)}, "7 features"),
        ({"x": np.zeros((10, 8)), "y": np.full(10, 3)}, r"labels must lie in \[0, 3\)"),
        ({"x": np.zeros((10, 8)), "y": np.full(10, -1)}, r"labels must lie"),
        ({"x": np.zeros((10, 8)), "y": np.zeros(9, dtype=int)}, "one integer label per sample"),
        ({"x": np.zeros((10, 8)), "y": np.zeros(10)}, "one integer label per sample"),  # float labels
        ({"x": np.zeros(10), "y": np.zeros(10, dtype=int)}, "samples x features"),
        ({"features": np.zeros((10, 8))}, "arrays x and y"),
    ],
)
def test_a_data_set_that_does_not_fit_is_a_train_error(
    tmp_path: Path, arrays: dict[str, Any], match: str
) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    with pytest.raises(TrainError, match=match):
        load_data(config_of(_json()), path)


def test_an_unreadable_data_file_is_a_train_error(tmp_path: Path) -> None:
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for path in (tmp_path / "junk.npz", tmp_path / "missing.npz"):
        with pytest.raises(TrainError, match="cannot read"):
            load_data(config_of(_json()), path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train"], "needs --experiment"),
        (["train", "--experiment", "ffn", "--steps", "0"], "at least 1"),
        (["train", "--experiment", "ffn", "--samples", "-5"], "at least 1"),
        (["train", "--experiment", "ffn", "--wait-peers", "0"], "at least 1"),
        (["train", "--experiment", "ffn", "--steps", "3", "--samples", "9"], "not allowed with"),
        (["train", "login"], "--name"),
    ],
)
def test_bad_command_lines_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        lah_main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_the_dense_model_is_read_from_the_coordinators_toml(tmp_path: Path) -> None:
    from coordinator.config import ConfigError, load_config

    base = '[[experiments]]\nname = "ffn"\nexpert_type = "ffn"\ngrid = [4, 4]\n'
    path = tmp_path / "c.toml"
    path.write_text(base + 'dense = { in_features = 8, classes = 3, dataset = "mine" }\n')
    dense = load_config(path, environ={}).experiments[0].dense
    assert (dense.in_features, dense.classes, dense.dataset, dense.batch_size) == (8, 3, "mine", 64)
    path.write_text(base)
    assert load_config(path, environ={}).experiments[0].dense == DenseModel()
    bad_fields = ("in_features = 0", "classes = -1", "lr = 0", 'dataset = ""', "colour = 1", "k_best = 'x'")
    for bad in bad_fields:
        path.write_text(base + f"dense = {{ {bad} }}\n")
        with pytest.raises(ConfigError, match="dense"):
            load_config(path, environ={})
