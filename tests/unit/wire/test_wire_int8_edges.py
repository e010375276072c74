"""The 8-bit codec at its numeric edges: saturation, subnormal and zero scales, float32 work.

Each test pins a line of engine/wire/compression.py (`make mutation`, group wire) that the error-bound
property tests cannot see, because a broken version stays within the bound or never meets the input.
"""

from __future__ import annotations

import pytest
import torch

from engine.wire import Compression, decode_tensor, encode_tensor
from engine.wire.compression import dequantize_int8, quantize_int8

F32_MAX = torch.finfo(torch.float32).max
SMALLEST_SUBNORMAL = 2.0**-149


def roundtrip(t: torch.Tensor, block_size: int = 64) -> torch.Tensor:
    meta, payload = encode_tensor(t, Compression.INT8, block_size)
    return decode_tensor(meta, memoryview(bytearray(payload)))


@pytest.mark.parametrize("numel", [2, 64])  # a partial block, and a whole one (the broadcast branch)
def test_int8_saturates_at_float32_max_instead_of_becoming_inf(numel: int) -> None:
    t = torch.zeros(numel)
    t[0], t[1] = F32_MAX, -F32_MAX
    scales, q = quantize_int8(t, 64)
    assert float(127 * scales[0]) == float("inf")  # the product overflows without the clamp
    out = roundtrip(t)
    assert out[:2].tolist() == [F32_MAX, -F32_MAX]
    assert bool(torch.isfinite(dequantize_int8(scales, q, torch.float32)).all())


def test_int8_q_stays_within_127_when_the_scale_is_subnormal() -> None:
    # absmax / 127 rounds down to the smallest subnormal, so x / scale is 128: q must clamp to 127.
    x = 128 * SMALLEST_SUBNORMAL
    scales, q = quantize_int8(torch.tensor([x, -x, 0.0]), 64)
    assert scales.tolist() == [SMALLEST_SUBNORMAL]
    assert q.tolist() == [127, -127, 0]


@pytest.mark.parametrize(
    ("values", "dtype"), [([1e-300, -1e-300], torch.float64), ([SMALLEST_SUBNORMAL, 0.0], torch.float32)]
)
def test_int8_zero_scale_blocks_send_q_0(values: list[float], dtype: torch.dtype) -> None:
    scales, q = quantize_int8(torch.tensor(values, dtype=dtype), 64)
    assert scales.tolist() == [0.0]
    assert q.tolist() == [0, 0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int8_narrow_dtypes_take_a_float32_scale(dtype: torch.dtype) -> None:
    scales, q = quantize_int8(torch.tensor([3.0, 1.0], dtype=dtype), 64)
    assert scales.tolist() == [(torch.tensor(3.0) / 127).item()]
    assert q.tolist() == [127, 42]


def test_int8_float32_inputs_are_divided_in_float32() -> None:
    # x / scale is 2.5 plus a hair: float32 division rounds it to the tie 2.5, which rounds to even (2);
    # float64 would see the hair and give 3. Either is within the bound; the codec is float32 by design.
    absmax, x = 1.6369617, 0.032223657
    scales, q = quantize_int8(torch.tensor([absmax, x]), 64)
    assert scales.tolist() == [(torch.tensor(absmax) / 127).item()]
    assert q.tolist() == [127, 2]
