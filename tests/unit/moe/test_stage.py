"""Stage experts: the network (shapes, causality, gradients), its size formulas against torch's own
counts, the spec's depth, and the memory budget's choice and refusal."""

from __future__ import annotations

import pytest
import torch

from engine.moe import ExpertBackend, MoEError, SpecError, build, input_shape
from engine.moe.registry import MAX_DEPTH, ExpertSpec
from engine.moe.stage import (
    StageExpert,
    flop_counter,
    stage_activation_bytes_per_token,
    stage_flops_per_token,
    stage_parameters,
)
from engine.moe.stage_fit import (
    HEADROOM,
    StageTooLarge,
    check_host_fits,
    check_stage_fits,
    largest_stage,
    stage_memory,
)

GIB = 1 << 30
SPEC = ExpertSpec("stage", 32, heads=4, seq_len=8, depth=2)


def test_a_stage_maps_sequences_to_sequences_of_the_same_shape() -> None:
    module = build(SPEC)
    assert isinstance(module, StageExpert) and len(module.blocks) == 2
    assert input_shape(SPEC) == (8, 32)
    assert input_shape(ExpertSpec("stage", 32, heads=4, depth=1)) == (None, 32)
    x = torch.randn(3, 8, 32)
    assert module(x).shape == (3, 8, 32)


def test_a_token_sees_only_earlier_tokens_of_its_own_sample() -> None:
    torch.manual_seed(0)
    module = build(SPEC)
    x = torch.randn(2, 8, 32)
    y = module(x)
    later = x.clone()
    later[0, 5:] = torch.randn(3, 32)  # change sample 0's tokens 5..7
    y2 = module(later)
    assert torch.equal(y2[0, :5], y[0, :5])  # causal: tokens 0..4 do not see them
    assert not torch.allclose(y2[0, 5:], y[0, 5:])
    assert torch.equal(y2[1], y[1])  # another sample never sees them


def test_gradients_are_autograds_numerically() -> None:
    torch.manual_seed(0)
    module = StageExpert(8, 16, 2, 2).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,), eps=1e-6, atol=1e-5)
    module(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


@pytest.mark.parametrize(
    ("dim", "hidden", "heads", "seq", "depth"), [(64, 256, 4, 32, 2), (48, 96, 3, 16, 3)]
)
def test_size_formulas_match_torchs_counts(dim: int, hidden: int, heads: int, seq: int, depth: int) -> None:
    module = StageExpert(dim, hidden, heads, depth)
    assert sum(p.numel() for p in module.parameters()) == stage_parameters(dim, hidden, depth)
    batch = 3
    x = torch.randn(batch, seq, dim, requires_grad=True)
    with flop_counter() as counter:
        y = module(x)
        y.backward(torch.randn_like(y))
    assert counter.get_total_flops() == stage_flops_per_token(dim, hidden, depth, seq) * batch * seq
    # Without the CPU's attention kernel counted, the count would be short by the attention's share.
    assert stage_flops_per_token(dim, hidden, depth, seq) > stage_flops_per_token(dim, hidden, depth, 0)

    saved: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    per_token = sum(saved.values()) / (batch * seq * depth)
    assert per_token == pytest.approx(stage_activation_bytes_per_token(dim, hidden, heads), rel=0.05)


def test_depth_belongs_to_stages_alone_and_is_bounded() -> None:
    with pytest.raises(SpecError, match="depth in"):
        ExpertSpec("stage", 32, heads=4)  # depth 0
    with pytest.raises(SpecError, match="depth in"):
        ExpertSpec("stage", 32, heads=4, depth=MAX_DEPTH + 1)
    with pytest.raises(SpecError, match="only stages"):
        ExpertSpec("ffn", 32, depth=2)
    with pytest.raises(SpecError, match="depth must be an int"):
        ExpertSpec("stage", 32, heads=4, depth=True)
    with pytest.raises(SpecError, match="divisible"):
        ExpertSpec("stage", 30, heads=4, depth=1)


def test_spec_fields_round_trip_and_other_architectures_fields_are_unchanged() -> None:
    fields = SPEC.to_fields()
    assert fields["depth"] == 2 and ExpertSpec.from_fields(fields) == SPEC
    ffn = ExpertSpec("ffn", 16, hidden=32)
    assert ffn.to_fields() == {"arch": "ffn", "dim": 16, "hidden": 32, "heads": 1, "seq_len": 0}
    assert ExpertSpec.from_fields(ffn.to_fields()) == ffn
    with pytest.raises(SpecError, match="depth"):
        ExpertSpec.from_fields({**fields, "depth": "2"})
    with pytest.raises(SpecError, match="depth in"):
        ExpertSpec.from_fields({k: v for k, v in fields.items() if k != "depth"})


async def test_a_backend_serves_a_stage_forward_and_backward() -> None:
    backend = ExpertBackend("stage.0", SPEC, device="cpu", seed=0, lr=0.0)
    try:
        x = torch.randn(2, 8, 32)
        y = await backend.forward("t", "a1", x.half())
        assert y.shape == (2, 8, 32)
        g = await backend.backward("t", "a1", torch.ones(2, 8, 32))
        assert g.shape == (2, 8, 32) and torch.isfinite(g).all()
        assert backend.stats.steps == 1 and backend.stats.recomputed_samples == 0
    finally:
        await backend.close()


def test_the_budget_picks_the_deepest_stage_that_fits() -> None:
    spec = largest_stage(1024, 16, 20 * GIB, seq_len=1024, batch_tokens=1024)
    assert (spec.arch, spec.dim, spec.hidden, spec.heads, spec.seq_len) == ("stage", 1024, 4096, 16, 1024)
    used = stage_memory(spec, batch_tokens=1024).total
    assert used <= HEADROOM * 20 * GIB
    deeper = ExpertSpec("stage", 1024, 4096, 16, 1024, depth=spec.depth + 1)
    assert stage_memory(deeper, batch_tokens=1024).total > HEADROOM * 20 * GIB
    assert check_stage_fits(spec, 20 * GIB, batch_tokens=1024).total == used
    half = largest_stage(1024, 16, 10 * GIB, seq_len=1024, batch_tokens=1024)
    assert half.depth < spec.depth
    kept = largest_stage(1024, 16, 20 * GIB, seq_len=1024, batch_tokens=1024, kept_bytes=4 * GIB)
    assert kept.depth < spec.depth


def test_a_narrower_ffn_when_one_full_width_block_does_not_fit() -> None:
    full = stage_memory(ExpertSpec("stage", 1024, 4096, 16, depth=1), batch_tokens=64).total
    spec = largest_stage(1024, 16, int(full / HEADROOM) - 1, seq_len=64, batch_tokens=64)
    assert spec.hidden == 2048 and spec.depth >= 1


def test_a_stage_over_the_budget_is_refused_with_a_sentence() -> None:
    too_deep = ExpertSpec("stage", 1024, 4096, 16, 1024, depth=200)
    with pytest.raises(StageTooLarge) as err:
        check_stage_fits(too_deep, 20 * GIB, batch_tokens=1024)
    message = str(err.value)
    deepest = largest_stage(1024, 16, 20 * GIB, seq_len=1024, batch_tokens=1024).depth
    assert "200 blocks at d=1024" in message and "20.0 GiB" in message
    assert f"at most {deepest} blocks" in message
    assert isinstance(err.value, SpecError) and isinstance(err.value, MoEError)
    with pytest.raises(StageTooLarge, match="not one block at d=8192"):
        largest_stage(8192, 16, GIB, seq_len=1024, batch_tokens=4096)
    with pytest.raises(StageTooLarge, match="holds no block"):
        check_stage_fits(ExpertSpec("stage", 8192, 0, 16, depth=1), GIB, batch_tokens=4096)


def test_sizing_takes_stages_and_sane_arguments_only() -> None:
    with pytest.raises(SpecError, match="not a stage"):
        stage_memory(ExpertSpec("ffn", 16), batch_tokens=1)
    with pytest.raises(SpecError, match="batch_tokens"):
        stage_memory(SPEC, batch_tokens=0)
    with pytest.raises(SpecError, match="kept_bytes"):
        stage_memory(SPEC, batch_tokens=1, kept_bytes=-1)


def test_a_hosts_stages_are_planned_together() -> None:
    one = largest_stage(1024, 16, 20 * GIB, seq_len=1024, batch_tokens=1024)
    assert check_host_fits({"ffn.0": ExpertSpec("ffn", 1024)}, GIB, batch_tokens=1024) == 0
    alone = check_host_fits({"s.0": one, "ffn.0": ExpertSpec("ffn", 1024)}, 20 * GIB, batch_tokens=1024)
    assert alone == stage_memory(one, batch_tokens=1024).total
    half = ExpertSpec("stage", 1024, 4096, 16, 1024, depth=one.depth // 2)
    two = check_host_fits({"s.0": half, "s.1": half}, 20 * GIB, batch_tokens=1024)
    plan = stage_memory(half, batch_tokens=1024)
    assert two == 2 * plan.state + plan.work  # one batch runs at a time
    with pytest.raises(StageTooLarge, match=r"2 stages \(s.0, s.1\)"):
        check_host_fits({"s.1": one, "s.0": one}, 20 * GIB, batch_tokens=1024)
    with pytest.raises(StageTooLarge, match="at most"):
        check_host_fits({"s.0": one}, 10 * GIB, batch_tokens=1024)
