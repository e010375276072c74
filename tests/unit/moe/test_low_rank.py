"""ExpertSpec.wire_rank and the low-rank boundary (engine/moe/low_rank.py): what the spec accepts, what
it says on the wire, what a host builds and checks requests against, and what the trainer's side adds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.moe import LowRankBoundary, LowRankExpert, SpecError
from engine.moe.registry import ExpertSpec, FeedForwardExpert, build, input_shape, sample_nbytes
from engine.moe.stage import StageExpert


@pytest.mark.parametrize("rank", [-1, 17, True, 2.0, "4"])
def test_wire_rank_outside_0_to_dim_or_not_an_int_is_refused(rank: Any) -> None:
    with pytest.raises(SpecError, match="wire_rank"):
        ExpertSpec("ffn", 16, wire_rank=rank)


@pytest.mark.parametrize("rank", [0, 1, 16])
def test_wire_rank_from_0_to_dim_is_accepted(rank: int) -> None:
    assert ExpertSpec("ffn", 16, wire_rank=rank).wire_rank == rank


def test_fields_carry_wire_rank_only_when_set() -> None:
    plain = ExpertSpec("ffn", 16, hidden=32)
    assert "wire_rank" not in plain.to_fields()
    assert ExpertSpec.from_fields(plain.to_fields()) == plain
    low = ExpertSpec("stage", 16, hidden=32, heads=2, depth=2, wire_rank=4)
    assert low.to_fields()["wire_rank"] == 4
    assert ExpertSpec.from_fields(low.to_fields()) == low


@pytest.mark.parametrize("value", ["4", 4.0, True])
def test_fields_with_a_wire_rank_of_the_wrong_type_are_a_spec_error(value: Any) -> None:
    fields = ExpertSpec("ffn", 16).to_fields() | {"wire_rank": value}
    with pytest.raises(SpecError, match="wire_rank"):
        ExpertSpec.from_fields(fields)


def test_a_low_rank_ffn_takes_and_returns_rank_wide_rows() -> None:
    spec = ExpertSpec("ffn", 16, hidden=32, wire_rank=4)
    expert = build(spec)
    assert isinstance(expert, LowRankExpert) and isinstance(expert.inner, FeedForwardExpert)
    assert input_shape(spec) == (4,) and sample_nbytes(spec) == 16
    assert expert(torch.randn(3, 4)).shape == (3, 4)
    z = torch.randn(3, 4)
    assert torch.equal(expert(z), expert.project(expert.inner(expert.lift(z))))


def test_a_low_rank_stage_keeps_its_free_sequence_length() -> None:
    spec = ExpertSpec("stage", 16, hidden=32, heads=2, depth=1, wire_rank=8)
    expert = build(spec)
    assert isinstance(expert, LowRankExpert) and isinstance(expert.inner, StageExpert)
    assert input_shape(spec) == (None, 8)
    assert expert(torch.randn(2, 5, 8)).shape == (2, 5, 8)


def test_without_wire_rank_build_and_shape_are_unchanged() -> None:
    spec = ExpertSpec("ffn", 16, hidden=32)
    assert isinstance(build(spec), FeedForwardExpert)
    assert input_shape(spec) == (16,)


def test_boundary_keeps_the_residual_on_the_trainer_and_sends_rank_wide_rows() -> None:
    seen: list[torch.Size] = []

    class Recorder(torch.nn.Module):
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            seen.append(z.shape)
            return 2 * z

    boundary = LowRankBoundary(Recorder(), 16, 4)
    x = torch.randn(5, 16)
    out = boundary(x)
    assert seen == [torch.Size([5, 4])]
    assert torch.allclose(out, x + boundary.up(2 * boundary.down(x)))
    torch.nn.init.zeros_(boundary.up.weight)
    torch.nn.init.zeros_(boundary.up.bias)
    assert torch.equal(boundary(x), x)
