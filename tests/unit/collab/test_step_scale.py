"""An epoch that missed the target batch size steps by its real size: same learning per sample."""

import pytest
import torch
from torch import nn

from engine.collab.errors import MatchmakingFailed
from engine.collab.group import Group, decode_group, encode_group
from engine.collab.stepping import scaled_learning_rate, step_scale
from engine.wire import Compression


def test_the_step_scale_is_the_epochs_samples_over_the_target_bounded() -> None:
    assert step_scale(64, 64) == 1.0
    assert step_scale(72, 64) == pytest.approx(1.125)
    assert step_scale(48, 64) == pytest.approx(0.75)
    assert step_scale(1000, 64) == 2.0 and step_scale(1, 64) == 0.5  # bounded both ways
    assert step_scale(0, 64) == 1.0 and step_scale(10, 0) == 1.0  # nothing known: as planned


def test_the_learning_rate_is_scaled_for_one_step_and_restored_exactly() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam([{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 3e-3}])
    seen: list[float] = []
    with scaled_learning_rate(opt, 1.125):
        seen = [g["lr"] for g in opt.param_groups]
    assert seen == [pytest.approx(0.1125), pytest.approx(3.375e-3)]
    assert [g["lr"] for g in opt.param_groups] == [0.1, 3e-3]  # the same floats, not divided back
    with pytest.raises(RuntimeError), scaled_learning_rate(opt, 2.0):
        raise RuntimeError("a failed step")
    assert [g["lr"] for g in opt.param_groups] == [0.1, 3e-3]


def test_a_scaled_adam_step_moves_as_far_as_the_scale_says() -> None:
    def one_step(scale: float) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        before = model.weight.detach().clone()
        model(torch.ones(2, 4)).sum().backward()
        with scaled_learning_rate(opt, scale):
            opt.step()
        return (model.weight.detach() - before).abs()

    assert torch.allclose(one_step(1.5), 1.5 * one_step(1.0), rtol=1e-4)


def test_a_group_carries_its_samples_on_the_wire() -> None:
    group = Group("r/1/x", ("a", "b"), (10, 5), Compression.INT8, samples=72)
    assert decode_group(encode_group(group)) == group
    assert group.resized(30, "r/1/x/state", Compression.NONE).samples == 72
    with pytest.raises(MatchmakingFailed):
        Group("r", ("a",), (1,), samples=-1)
