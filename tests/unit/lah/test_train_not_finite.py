"""``lah train`` stops with exit status 2 and one sentence naming the step and the cause when a step's
loss or gradients are not finite (engine.trainer.StepNotFinite, engine.lm's LossNotFinite)."""

from __future__ import annotations

from typing import Any

import pytest

import lah.train
from engine.trainer import StepNotFinite


def test_a_step_that_is_not_finite_exits_2_with_its_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    def nan_at_step_7(*args: Any, **kwargs: Any) -> int:
        raise StepNotFinite(7, "the loss is nan")

    monkeypatch.setattr(lah.train, "_run", nan_at_step_7)
    said: list[str] = []
    assert lah.train.run_train("http://127.0.0.1:9", "digits", steps=10, say=said.append) == 2
    assert said == [
        "lah train: step 7: the loss is nan; training stopped there (no backward pass, optimizer step or "
        "receipt for that step)"
    ]
