"""A language-model experiment: one grid of experts per mixture block, each an experiment of its own to
assignment and credit, and its mistakes refused with the field they are in."""

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import ConfigError, layer_name, load_config
from coordinator.db.models import Account, Host
from coordinator.db.session import session_factory
from coordinator.swarm.assignment import Capacity, assign_host, expert_bytes

LM = """
[[experiments]]
name = "shakespeare"
kind = "lm"
expert_type = "ffn"
grid = [16, 16]
target_batch_size = 96

[experiments.lm]
layers = 4
moe_every = 2
dim = 128
k_best = 4
"""


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path, environ={})


def test_a_language_model_has_a_grid_per_mixture_block(tmp_path: Path) -> None:
    config = _load(tmp_path, LM)
    (lm,) = config.experiments
    assert lm.kind == "lm" and lm.lm is not None and lm.lm.moe_blocks == [1, 3]
    grids = config.grids
    assert [g.name for g in grids] == ["shakespeare_b1", "shakespeare_b3"]
    assert {g.part_of for g in grids} == {"shakespeare"}
    # experts as wide as the model, hidden 4 * dim / k: a dense block's FLOPs per token
    assert grids[0].hyperparams == {"d_model": 128, "hidden": 128} and grids[0].grid == [16, 16]
    assert layer_name("shakespeare", 3) == "shakespeare_b3"


def test_the_engine_names_layers_as_the_coordinator_does() -> None:
    from engine.lm import grid_name

    assert grid_name("shakespeare", 1) == layer_name("shakespeare", 1)


def test_a_classifier_is_its_own_grid(tmp_path: Path) -> None:
    config = _load(tmp_path, '[[experiments]]\nname = "ffn"\nexpert_type = "ffn"\ngrid = [4, 4]\n')
    assert [g.name for g in config.grids] == ["ffn"] and config.experiments[0].kind == "classifier"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (('name = "shakespeare"', 'name = "shake.speare"'), "name"),
        # hosts refuse uids with capitals or dashes, and grids (name_b3) over 32 characters
        (('name = "shakespeare"', 'name = "Tiny-LM"'), r"lowercase letters, digits or _.*'Tiny-LM'"),
        (('name = "shakespeare"', f'name = "{"s" * 30}"'), r"at most 32 characters"),
        (("[experiments.lm]", "[experiments.unused]"), "unknown field `unused`"),
        (("dim = 128", "dim = 130"), "divisible"),
        (("moe_every = 2", "moe_every = 0"), "no mixture blocks"),
        (('expert_type = "ffn"', 'expert_type = "attention"'), "ffn"),
        (("k_best = 4", "k_best = 0"), "k_best"),
        (("layers = 4", 'layers = "four"'), "layers"),
    ],
)
def test_a_bad_language_model_is_refused_with_a_reason(
    tmp_path: Path, change: tuple[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        _load(tmp_path, LM.replace(*change))


def test_a_classifier_named_as_no_host_accepts_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grids \(Digits\) has at most 32"):
        _load(tmp_path, '[[experiments]]\nname = "Digits"\nexpert_type = "ffn"\ngrid = [4, 4]\n')


def test_a_layer_may_not_share_a_name_with_another_experiment(tmp_path: Path) -> None:
    clash = LM + '\n[[experiments]]\nname = "shakespeare_b1"\nexpert_type = "ffn"\ngrid = [2]\n'
    with pytest.raises(ConfigError, match="shakespeare_b1"):
        _load(tmp_path, clash)


async def test_a_host_serves_every_layer_not_only_the_first(db: AsyncEngine, tmp_path: Path) -> None:
    grids = _load(tmp_path, LM).grids
    async with session_factory(db)() as s, s.begin():
        s.add(Host(peer_id="0" * 40, public_key=bytes(32), account=Account(name="v")))
    size = expert_bytes(grids[0])
    got = await assign_host(
        session_factory(db), grids, "0" * 40, Capacity("cpu", 300 * size), now=1000.0, ttl_s=60
    )
    per_grid = Counter(name for name, _ in got)
    assert per_grid == {"shakespeare_b1": 150, "shakespeare_b3": 150}
