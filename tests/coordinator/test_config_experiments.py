"""An experiment's target batch size: trainers train its dense part together when it is set."""

from pathlib import Path

import pytest

from coordinator.config import ConfigError, load_config

EXPERIMENT = """
[[experiments]]
name = "ffn"
expert_type = "ffn"
grid = [4, 4]
"""


def test_an_experiment_defines_its_target_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(EXPERIMENT + "target_batch_size = 256\n")
    assert load_config(path, environ={}).experiments[0].target_batch_size == 256


def test_without_one_its_trainers_train_alone(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(EXPERIMENT)
    assert load_config(path, environ={}).experiments[0].target_batch_size == 0


@pytest.mark.parametrize("value", ["-1", '"many"', "2.5"])
def test_a_bad_target_batch_size_is_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(EXPERIMENT + f"target_batch_size = {value}\n")
    with pytest.raises(ConfigError, match="target_batch_size"):
        load_config(path, environ={})
