"""The demo with two trainers training the dense part together: a real coordinator, volunteers hosting
the experts, real aiortc links between the trainers (matchmaking, all-reduce, state in the DHT)."""

import math

import pytest

from engine.trainer import TrainerConfig
from lah.demo import run_demo

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_two_trainers_step_together_through_the_volunteers_experts() -> None:
    config = TrainerConfig(batch_size=32, target_batch_size=128, lr=1e-2, gather_s=1.5)
    # 32 steps of 32 samples = 8 collaborative epochs of 128 (about two batches per trainer each)
    result = run_demo(volunteers=2, trainers=2, steps=32, config=config, progress=False, say=lambda _: None)
    assert result is not None
    first, second = result.trainers
    assert first.epoch == second.epoch == 8
    # every step taken together: the same epochs, both in a group of two, identical dense parameters
    assert first.collab_steps == second.collab_steps == [(e, 2) for e in range(1, 9)]
    assert first.dense_digest == second.dense_digest
    assert not math.isnan(first.last_round_s) and first.last_round_s > 0
    assert first.steps >= 8 and second.steps >= 8  # each brought at least a batch to every step
    assert first.accuracy > 0.5 and second.accuracy > 0.5  # chance is 0.1
    # both trainers' receipts credited the volunteers that answered them
    assert result.receipts["submitted"] > 0 and result.receipts["rejected"] == 0
    assert sum(c > 0 for c in result.host_credit.values()) >= 1
