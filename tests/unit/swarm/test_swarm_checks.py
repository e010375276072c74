"""The swarm facade's checks, without sockets: addresses, the coordinator's errors in plain words,
what an experiment fixes, layers and inputs refused before any call, options, the optimizer's run."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import aiohttp
import msgspec
import pytest
import torch
from aiohttp.client_reqrep import ConnectionKey
from torch import nn

from coordinator.config import DenseModel, ExperimentConfig, LanguageModel
from engine.account.errors import CoordinatorError, CoordinatorUnreachable
from engine.account.trainer_tokens import default_trainer_dir
from engine.moe import LoopThread, NotEnoughExperts, RemoteMixtureOfExperts, StaticExpertFinder
from engine.swarm import (
    CoordinatorNotFound,
    LoginRequired,
    Mismatch,
    MixtureLayer,
    Swarm,
    SwarmError,
    SwarmStats,
    UnknownExperiment,
)
from engine.swarm.connect import check_url, explain_refusal, explain_unreachable
from engine.swarm.experiment import Grid, check_layer, parse_experiment
from engine.swarm.optimizer import dense_module, run_name
from lah.train import default_data_dir

URL = "http://127.0.0.1:8470"


def classifier() -> dict[str, object]:
    config = ExperimentConfig(
        name="blobs",
        expert_type="ffn",
        grid=[2, 3],
        hyperparams={"d_model": 16, "hidden": 32},
        target_batch_size=128,
        dense=DenseModel(batch_size=32, lr=0.01, k_best=2),
    )
    return dict(msgspec.to_builtins(config))  # exactly what GET /api/experiments/{name} sends


def language_model() -> dict[str, object]:
    lm = LanguageModel(
        vocab_size=65, context=32, layers=4, heads=2, dim=24, moe_every=2, k_best=3, batch_size=6
    )
    config = ExperimentConfig(name="tiny", kind="lm", expert_type="ffn", grid=[4, 4], lm=lm)
    return dict(msgspec.to_builtins(config))


# -- addresses and the coordinator's errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8470", "ftp://host/", "http://", "", "http://h:port", "http://h/?x=1"]
)
def test_an_address_that_cannot_be_a_coordinators_is_refused_before_any_connection(url: str) -> None:
    with pytest.raises(CoordinatorNotFound, match="is not a coordinator's address"):
        check_url(url)
    with pytest.raises(CoordinatorNotFound, match="is not a coordinator's address"):
        Swarm.join(url, "blobs")  # refused before a loop, a lock or a socket


def test_an_address_keeps_its_path_and_loses_its_trailing_slash() -> None:
    assert check_url(" https://lah.example/ ") == "https://lah.example"
    assert check_url("http://[::1]:8470/") == "http://[::1]:8470"


def _unreachable(cause: BaseException) -> CoordinatorUnreachable:
    try:
        raise CoordinatorUnreachable(f"{URL} unreachable: {cause}") from cause
    except CoordinatorUnreachable as e:
        return e


def test_refused_and_unreachable_say_different_things() -> None:
    key = ConnectionKey("127.0.0.1", 8470, False, True, None, None, None, None)
    refused = aiohttp.ClientConnectorError(
        key, ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    )
    said = str(explain_unreachable(URL, _unreachable(refused), 15))
    assert (
        "refused" in said and "nothing listens there" in said and "is the coordinator running" in said.lower()
    )

    dns = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    said = str(explain_unreachable("http://no-such.invalid:8470", _unreachable(dns), 15))
    assert "unreachable" in said and "'no-such.invalid' does not resolve" in said and "refused" not in said

    said = str(explain_unreachable(URL, _unreachable(TimeoutError()), 15))
    assert "unreachable: no answer within 15 s" in said and "refused" not in said


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        (
            CoordinatorError(404, "http_error", "Not Found"),
            CoordinatorNotFound,
            "not as a Learning@home coordinator",
        ),
        (
            CoordinatorError(200, "bad_reply", "unexpected"),
            CoordinatorNotFound,
            "not as a Learning@home coordinator",
        ),
        (CoordinatorError(401, "token_revoked", "revoked"), LoginRequired, "lah train login --coordinator"),
        (CoordinatorError(403, "not_a_trainer", "no"), LoginRequired, "lah coordinator grant-trainer NAME"),
        (
            CoordinatorError(404, "unknown_experiment", "no"),
            UnknownExperiment,
            "runs no experiment called 'nope'",
        ),
        (
            CoordinatorError(429, "rate_limited", "slow down"),
            SwarmError,
            "refused (429 rate_limited): slow down",
        ),
    ],
)
def test_the_coordinators_refusals_become_sentences(error: CoordinatorError, kind: type, words: str) -> None:
    said = explain_refusal(URL, "nope", error)
    assert type(said) is kind and words in str(said)


# -- what the experiment fixes ---------------------------------------------------------------------


def test_a_classifier_experiment_has_one_grid_named_after_it() -> None:
    spec = parse_experiment(classifier())
    assert spec.kind == "classifier" and list(spec.grids) == ["blobs"]
    grid = spec.grids["blobs"]
    assert (grid.shape, grid.dim, grid.hidden, grid.expert_type, grid.k_best) == ((2, 3), 16, 32, "ffn", 2)
    assert (
        grid.experts == 6 and grid.uids()[:2] == ["blobs.0.0", "blobs.0.1"] and grid.uids()[-1] == "blobs.1.2"
    )
    assert (spec.target_batch_size, spec.batch_size, spec.lr) == (128, 32, 0.01)


def test_a_language_model_has_one_grid_per_mixture_block() -> None:
    spec = parse_experiment(language_model())
    assert spec.kind == "lm" and list(spec.grids) == ["tiny_b1", "tiny_b3"]  # moe_every 2 of 4 blocks
    grid = spec.grids["tiny_b3"]
    assert (grid.shape, grid.dim, grid.hidden, grid.k_best) == ((4, 4), 24, 4 * 24 // 3, 3)
    assert (spec.target_batch_size, spec.batch_size) == (0, 6)


def test_a_config_it_cannot_read_is_refused_with_the_experiments_name() -> None:
    broken = classifier() | {"grid": "four by four"}
    with pytest.raises(SwarmError, match="config of experiment 'blobs' is not one this version"):
        parse_experiment(broken)
    no_lm = language_model() | {"lm": None}
    with pytest.raises(SwarmError, match="'tiny'"):
        parse_experiment(no_lm)


def test_a_layer_of_another_width_grid_or_expert_type_is_refused_with_the_sentence() -> None:
    grid = Grid("blobs", (2, 3), 16, 32, "ffn", 2)
    check_layer(grid, 16, (2, 3))  # what the experiment says: accepted
    with pytest.raises(Mismatch) as e:
        check_layer(grid, dim=64)
    assert str(e.value) == (
        "grid blobs's experts take 16 features per token and give back as many; this layer was asked for "
        "64: make the layer's width 16 (a Linear(64, 16) before it and back after, if your model is 64 wide)"
    )
    with pytest.raises(Mismatch, match="grid blobs is 2x3 experts; this layer was asked for 4x4"):
        check_layer(grid, shape=(4, 4))
    with pytest.raises(Mismatch, match=r"of type 'transformer'.*calls ffn experts only"):
        check_layer(Grid("seq", (2, 2), 16, 32, "transformer", 2))


def test_an_input_of_another_width_is_refused_before_anything_is_sent() -> None:
    grid = Grid("blobs", (2, 2), 16, 32, "ffn", 2)
    with LoopThread("test-loop") as loop:
        # No hosts: an input that got past the checks would reach the finder and fail for want of experts.
        mixture = RemoteMixtureOfExperts(
            None, StaticExpertFinder({}), loop=loop, in_features=16, grid_size=(2, 2), uid_prefix="blobs"
        )  # type: ignore[arg-type]
        layer = MixtureLayer(grid, mixture)
        with pytest.raises(Mismatch) as e:
            layer(torch.zeros(8, 64))
        assert str(e.value) == (
            "grid blobs's experts take 16 features per token; this input is [8, 64]: "
            "give the layer [tokens, 16] (or [..., 16])"
        )
        with pytest.raises(Mismatch, match=r"this input is \[16\]"):
            layer(torch.zeros(16))  # one vector: which are the tokens?
        with pytest.raises(Mismatch, match=r"takes torch\.float32 features, not torch\.float64"):
            layer(torch.zeros(4, 16, dtype=torch.float64))
        with pytest.raises(NotEnoughExperts):
            layer(torch.zeros(2, 5, 16))  # the right width, any leading shape: on to the finder
    assert "grid='blobs', experts=2x2, dim=16, k_best=2" in repr(layer)


# -- options and the optimizer ---------------------------------------------------------------------


def test_options_the_experiment_fixes_or_that_do_not_exist_are_refused_before_joining() -> None:
    with pytest.raises(
        Mismatch, match="the experiment fixes grid, target_batch_size: a script cannot set them"
    ):
        Swarm.join(URL, "blobs", grid=(4, 4), target_batch_size=0)
    with pytest.raises(
        Mismatch, match="join\\(\\) has no option colour; it takes collab_timeout_s, gather_s"
    ):
        Swarm.join(URL, "blobs", colour="red")
    with pytest.raises(UnknownExperiment, match="name the experiment"):
        Swarm.join(URL, "")


def test_the_dense_part_is_the_parameters_themselves_and_names_its_collaboration() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    dense = dense_module([*model.parameters(), model[0].weight])  # a repeat is kept once
    assert [id(p) for p in dense.parameters()] == [id(p) for p in model.parameters()]  # not copies
    adam, sgd = torch.optim.Adam(dense.parameters()), torch.optim.SGD(dense.parameters())
    run = run_name("blobs", dense, adam)
    assert run.startswith("blobs.own.") and run != "blobs.dense"  # never lah train's collaboration
    assert run == run_name(
        "blobs", dense_module(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).parameters()), adam
    )
    assert run != run_name("blobs", dense, sgd)  # another optimizer's state cannot be averaged with this
    assert run != run_name("blobs", dense_module(nn.Linear(4, 9).parameters()), adam)
    with pytest.raises(Mismatch, match="given no parameters"):
        dense_module([])
    with pytest.raises(Mismatch, match=r"must be nn\.Parameter, not Tensor"):
        dense_module([torch.zeros(3)])
    with pytest.raises(Mismatch, match="not groups"):
        dense_module([{"params": list(model.parameters())}])


def test_stats_say_calls_bytes_hosts_receipts_and_spot_checks_in_one_line() -> None:
    stats = SwarmStats(
        calls_ok=120, calls_failed=2, calls_late=1, bytes_sent=2_500_000, bytes_received=1_200_000,
        hosts={"a": 70, "b": 50}, receipts_submitted=120, receipts_credited=118, receipts_rejected=2,
        spot_checks=3, spot_mismatches=0,
    )  # fmt: skip
    assert stats.line() == (
        "calls 120 answered, 2 failed, 1 late; 2.5 MB sent, 1.2 MB received; 2 hosts served; "
        "receipts 120 submitted, 118 credited, 2 rejected; spot checks 3 (0 mismatched)"
    )
    assert "5 collaborative steps (epoch 7)" in SwarmStats(collab_steps=5, epoch=7).line()


def test_a_script_and_lah_train_share_one_default_data_dir(tmp_path: Path) -> None:
    """So the token `lah train login` kept in the data dir's file (no keyring) is the script's too."""
    assert default_trainer_dir() == default_data_dir()
    assert default_trainer_dir().name == "trainer"


def test_the_facade_loads_nothing_of_the_coordinator_the_app_or_lah() -> None:
    """A researcher's script imports the engine only (the coordinator and app need not be installed)."""
    import subprocess
    import sys

    code = (
        "import sys, engine.swarm; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'coordinator', 'app', 'lah', 'PySide6'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
