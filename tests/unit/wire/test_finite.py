"""all_finite against torch.isfinite(t).all(), the definition: every special value anywhere, every dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.wire.finite import all_finite

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SPECIALS = [float("nan"), float("inf"), float("-inf")]


def oracle(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("special", SPECIALS)
def test_one_special_anywhere_is_found(dtype: torch.dtype, special: float) -> None:
    base = torch.randn(64, 33).to(dtype)
    assert all_finite(base)
    for i in (0, 1, 1000, base.numel() - 1):
        t = base.clone().view(-1)
        t[i] = special
        assert not all_finite(t.view(64, 33)), (dtype, special, i)


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_sum_that_overflows_is_still_finite(dtype: torch.dtype) -> None:
    big = torch.finfo(dtype).max / 2
    t = torch.full((4096,), big, dtype=dtype)
    assert not bool(torch.isfinite(t.sum()))  # the fast path cannot decide this one
    assert all_finite(t)
    t[7] = float("nan")
    assert not all_finite(t)


def test_infinities_of_both_signs_cancel_to_nan_and_are_refused() -> None:
    assert not all_finite(torch.tensor([float("inf"), float("-inf")], dtype=torch.float16))


def test_empty_scalar_integer_and_strided_tensors() -> None:
    assert all_finite(torch.empty(0, 1024, dtype=torch.float16))
    assert all_finite(torch.tensor(3.0))
    assert not all_finite(torch.tensor(float("nan")))
    assert all_finite(torch.arange(10))
    for dtype in FLOATS:
        t = torch.randn(32, 32).to(dtype)
        t[3, 0] = float("inf")
        assert all_finite(t[:, 1:]) and all_finite(t[::2])  # the inf is outside the view
        assert not all_finite(t.t()[0]) and not all_finite(t.t())


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([65504.0, -65504.0])
        ),
        min_size=1,
        max_size=300,
    ),
    dtype=st.sampled_from(FLOATS),
)
def test_agrees_with_isfinite(values: list[float], dtype: torch.dtype) -> None:
    t = torch.tensor(values, dtype=torch.float32).to(dtype)  # casts may overflow to inf: also a case
    assert all_finite(t) == oracle(t)
