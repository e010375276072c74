"""The trainer's collaborative mode, its inputs: what it refuses, what it reports."""

import asyncio

import pytest
import torch
from torch import nn

from engine.collab import CollabConfig, CollaborativeOptimizer
from engine.dht import DHTNode
from engine.dht.p2p_transport import PeerTransport
from engine.moe import LoopThread
from engine.p2p import Identity, Peer
from engine.trainer import (
    Trainer,
    TrainerConfig,
    TrainerNode,
    TrainStats,
    dense_digest,
    load_digits_split,
    local_model,
)
from lah.cli import main
from lah.demo import run_demo


def unstarted_collab(model: nn.Module) -> CollaborativeOptimizer:
    peer = Peer(Identity.generate(), "ws://127.0.0.1:9/ws/signal")  # never started: nothing is sent
    dht = DHTNode(PeerTransport(peer), signer=peer.identity)
    optimizer = torch.optim.Adam(model.parameters())
    return CollaborativeOptimizer(model, optimizer, peer, dht, CollabConfig("ffn.dense", 128))


def test_a_collaborative_trainer_needs_the_loop_its_collaboration_runs_on() -> None:
    config = TrainerConfig(target_batch_size=128)
    model = local_model(config)
    collab = unstarted_collab(model)
    with pytest.raises(ValueError, match="loop"):
        Trainer(model, load_digits_split(), config, collab=collab)


def test_collaborating_without_a_target_batch_size_is_refused() -> None:
    loop = LoopThread("test-loop")
    try:
        node = TrainerNode("http://127.0.0.1:9", "t", loop=loop, config=TrainerConfig())
        with pytest.raises(ValueError, match="target_batch_size"):
            asyncio.run(node.collaborate(local_model(TrainerConfig())))
    finally:
        loop.close()


def test_run_demo_refuses_no_trainers_and_a_kill_among_collaborators() -> None:
    with pytest.raises(ValueError, match="at least one"):
        run_demo(trainers=0, say=lambda _: None)
    with pytest.raises(ValueError, match="kill_at"):
        run_demo(trainers=2, kill_at=3, say=lambda _: None)


@pytest.mark.parametrize("args", [["--trainers", "0"], ["--target-batch-size", "-1"], ["--trainers", "x"]])
def test_lah_demo_refuses_bad_trainer_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", *args])
    assert exc.value.code == 2
    assert "--t" in capsys.readouterr().err


def test_a_trainer_alone_counts_samples_and_its_digest_follows_its_steps() -> None:
    config = TrainerConfig(batch_size=16)
    trainer = Trainer(local_model(config), load_digits_split(), config)
    before = dense_digest(trainer.model)
    assert dense_digest(local_model(config)) == before  # same seed, same parameters, same digest
    assert trainer.step() is not None
    assert trainer.stats.samples == 16 and trainer.stats.steps == 1 and trainer.stats.epoch == 0
    assert trainer.stats.samples_per_s > 0 and not trainer.stats.collab_steps
    assert dense_digest(trainer.model) != before


def test_samples_per_second_counts_the_time_spent_collaborating() -> None:
    stats = TrainStats(samples=100, elapsed_s=1.0, collab_s=3.0)
    assert stats.samples_per_s == 25.0
    assert TrainStats().samples_per_s == 0.0


def test_a_stopped_collaborative_trainer_returns_before_its_first_batch() -> None:
    config = TrainerConfig(target_batch_size=128)
    model = local_model(config)
    collab = unstarted_collab(model)
    loop = LoopThread("test-loop")
    try:
        trainer = Trainer(model, load_digits_split(), config, collab=collab, loop=loop)
        trainer.stop()
        stats = trainer.train_epochs(5, progress=False)
        assert stats.steps == 0 and stats.epoch == 0
    finally:
        loop.close()


def test_a_trainer_says_which_declared_hosts_it_refused() -> None:
    class Finder:
        refused_hosts = {"a" * 40: 3, "b" * 40: 1}

    loop = LoopThread("test-loop")
    try:
        node = TrainerNode("http://127.0.0.1:9", "t", loop=loop, config=TrainerConfig())
        assert node.refused_line() is None  # not started: nothing refused
        node.finder = Finder()  # type: ignore[assignment]
        line = node.refused_line()
        assert line is not None and "2 hosts" in line and "without the coordinator's assignment" in line
        assert "aaaaaaaaaaaa" in line and "bbbbbbbbbbbb" in line
    finally:
        loop.close()
