"""Registry shapes and the activation cache's budget and expiry."""

import pytest
import torch

from engine.moe import ActivationCache, ExpertSpec, SpecError, build, input_shape


@pytest.mark.parametrize(
    ("spec", "batch_shape"),
    [
        (ExpertSpec("ffn", 16, hidden=32), (5, 16)),
        (ExpertSpec("ffn", 8), (1, 8)),
        (ExpertSpec("transformer", 16, hidden=32, heads=4, seq_len=6), (3, 6, 16)),
        (ExpertSpec("transformer", 16, heads=2), (2, 9, 16)),
    ],
)
def test_experts_keep_the_input_shape(spec: ExpertSpec, batch_shape: tuple[int, ...]) -> None:
    module = build(spec)
    x = torch.randn(batch_shape)
    assert module(x).shape == x.shape
    want = input_shape(spec)
    assert len(want) == len(batch_shape) - 1
    assert all(w is None or w == s for w, s in zip(want, batch_shape[1:], strict=True))


def test_ffn_layout_and_spec_round_trip() -> None:
    spec = ExpertSpec("ffn", 4, hidden=12)
    names = {n for n, _ in build(spec).named_parameters()}
    assert names == {"norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight", "down.bias"}
    assert ExpertSpec.from_fields(spec.to_fields()) == spec
    assert input_shape(ExpertSpec("transformer", 8, heads=2)) == (None, 8)


@pytest.mark.parametrize(
    "fields",
    [
        {"arch": "evil", "dim": 4, "hidden": 0, "heads": 1, "seq_len": 0},
        {"arch": "ffn", "dim": 0, "hidden": 0, "heads": 1, "seq_len": 0},
        {"arch": "ffn", "dim": 1 << 30, "hidden": 0, "heads": 1, "seq_len": 0},
        {"arch": "ffn", "dim": "4", "hidden": 0, "heads": 1, "seq_len": 0},
        {"arch": "transformer", "dim": 6, "hidden": 0, "heads": 4, "seq_len": 0},
        {"arch": "ffn", "dim": 4},
    ],
)
def test_bad_specs_are_spec_errors(fields: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        ExpertSpec.from_fields(fields)


def test_cache_lru_budget_and_ttl() -> None:
    now = [0.0]
    cache = ActivationCache(max_bytes=3 * 400, ttl_s=10, clock=lambda: now[0])
    for i in range(3):
        assert cache.put(i, torch.zeros(100))  # 400 bytes each
    assert cache.nbytes == 1200
    assert cache.pop(0) is not None  # taken out: one backward per forward
    assert cache.pop(0) is None
    cache.put(3, torch.zeros(100))
    cache.put(4, torch.zeros(100))  # over budget: the least recently stored (1) goes
    assert 1 not in cache and 2 in cache and cache.evictions == 1
    assert not cache.put(5, torch.zeros(1000))  # alone over the budget: not kept, nothing evicted for it
    now[0] = 11.0
    assert len(cache) == 3 and cache.pop(2) is None and len(cache) == 0 and cache.nbytes == 0
