"""LmConfig.wire_rank: the language model's mixtures behind a low-rank boundary (engine.moe.low_rank)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.lm import ConfigError, LanguageModel, LmConfig
from engine.lm.model_file import expert_prefixes, local_model
from engine.moe import LocalMixtureOfExperts, LowRankBoundary, LowRankExpert

LOW = LmConfig(vocab_size=11, context=8, layers=2, heads=2, dim=16, grid=(2, 2), k_best=2, wire_rank=4)


@pytest.mark.parametrize("rank", [-1, 17, True, 4.0])
def test_a_wire_rank_outside_0_to_dim_is_a_config_error(rank: Any) -> None:
    with pytest.raises(ConfigError, match="wire_rank"):
        LmConfig(vocab_size=11, dim=16, heads=2, wire_rank=rank)


def test_off_by_default_and_the_mixture_takes_rows_of_dim() -> None:
    plain = LmConfig(vocab_size=11, dim=16, heads=2)
    assert plain.wire_rank == 0 and plain.mixture_width == 16 and plain.expert_spec.wire_rank == 0
    model = local_model(plain)
    assert isinstance(model.blocks[1].ffn, LocalMixtureOfExperts)


def test_with_wire_rank_the_mixture_sees_rows_of_r_and_experts_are_low_rank() -> None:
    assert LOW.mixture_width == 4 and LOW.expert_spec.wire_rank == 4
    seen: list[torch.Size] = []
    model = local_model(LOW)
    ffn = model.blocks[1].ffn
    assert isinstance(ffn, LowRankBoundary) and isinstance(ffn.mixture, LocalMixtureOfExperts)
    assert all(isinstance(e, LowRankExpert) for e in ffn.mixture.experts)
    ffn.mixture.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape))
    idx = torch.randint(0, 11, (3, 8))
    _, loss = model(idx, idx)
    assert loss is not None and seen == [torch.Size([24, 4])]
    loss.backward()
    assert ffn.down.weight.grad is not None and ffn.up.weight.grad is not None


def test_experts_are_not_dense_parameters_behind_the_boundary_but_projections_are() -> None:
    model = local_model(LOW)
    dense = {id(p) for p in model.dense_parameters()}
    ffn = model.blocks[1].ffn
    assert isinstance(ffn, LowRankBoundary) and isinstance(ffn.mixture, LocalMixtureOfExperts)
    assert not any(id(p) in dense for p in ffn.mixture.experts.parameters())
    trainer_side = [*ffn.down.parameters(), *ffn.up.parameters(), *ffn.mixture.gates.parameters()]
    assert all(id(p) in dense for p in trainer_side)


def test_expert_prefixes_name_the_low_rank_experts_state() -> None:
    keys = local_model(LOW).state_dict().keys()
    prefixes = expert_prefixes(LOW, "tiny")
    assert len(prefixes) == 4
    for prefix in prefixes.values():
        assert prefix.startswith("blocks.1.ffn.mixture.experts.")
        assert any(k.startswith(prefix + "lift.") for k in keys)


def test_the_factory_builds_the_inner_mixture_at_mixture_width() -> None:
    widths: list[int] = []

    def factory(_block: int) -> torch.nn.Module:
        widths.append(LOW.mixture_width)
        return LocalMixtureOfExperts(LOW.mixture_width, LOW.grid, LOW.expert_spec, LOW.k_best)

    LanguageModel(LOW, factory)
    assert widths == [4]
