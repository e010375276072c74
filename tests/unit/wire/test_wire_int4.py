"""The 4-bit codec: its stated bound, its exact layout, and every way a peer's int4 payload is refused.

Each edge test pins a line of engine/wire/compression.py or tensors.py that the bound cannot see
(`make mutation`, group wire): the nibble order, the padding nibble, the 7 levels, the saturation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine.wire import (
    Compression,
    DecodeError,
    EncodeError,
    Kind,
    Message,
    TensorMeta,
    decode_message,
    decode_tensor,
    dequantize_int4,
    encode_message_bytes,
    encode_tensor,
    quantize_int4,
)
from engine.wire.compression import int4_payload_nbytes

UNIT_ROUNDOFF = {torch.float32: 2**-24, torch.float64: 2**-53, torch.float16: 2**-11, torch.bfloat16: 2**-8}
F32_MAX = torch.finfo(torch.float32).max
SMALLEST_SUBNORMAL = 2.0**-149

float_arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    elements=st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
)


def roundtrip(t: torch.Tensor, block_size: int | None = 64) -> torch.Tensor:
    meta, payload = encode_tensor(t, Compression.INT4, block_size)
    return decode_tensor(meta, memoryview(bytearray(payload)))


def int4_bound(x: torch.Tensor, dtype: torch.dtype, block_size: int) -> torch.Tensor:
    """The module docstring's bound, recomputed independently per element."""
    flat = x.double().reshape(-1)
    nb = -(-flat.numel() // block_size)
    padded = torch.cat([flat.abs(), flat.new_zeros(nb * block_size - flat.numel())])
    absmax = padded.view(nb, block_size).amax(dim=1).repeat_interleave(block_size)[: flat.numel()]
    finfo = torch.finfo(dtype)
    work_rounding = 0.0 if dtype == torch.float64 else 2**-22
    rounding = absmax * (UNIT_ROUNDOFF[dtype] + work_rounding)
    return absmax / 14 * (1 + 1e-6) + rounding + finfo.tiny * finfo.eps + 2**-140


@settings(max_examples=300, deadline=None)
@given(float_arrays, st.sampled_from([64, 128, 4096]), st.sampled_from(list(UNIT_ROUNDOFF)))
def test_int4_bound(arr: np.ndarray, block_size: int, dtype: torch.dtype) -> None:
    t = torch.from_numpy(arr.copy()).to(dtype)
    assume(bool(torch.isfinite(t).all()))
    out = roundtrip(t, block_size)
    assert out.dtype == dtype and out.shape == t.shape
    err = (t.double() - out.double()).reshape(-1).abs()
    assert bool((err <= int4_bound(t, dtype, block_size)).all())


def test_int4_payload_layout_scales_then_nibbles_even_element_low() -> None:
    t = torch.tensor([0.0, 7.0, -3.0, 1.0, 5.0] + [0.0] * 65)  # 70 elements, two blocks of 64
    meta, payload = encode_tensor(t, Compression.INT4, 64)
    data = bytes(payload)
    assert (meta.compression, meta.block_size) == (Compression.INT4, 64)
    assert meta.nbytes == len(data) == 2 * 4 + 35 == int4_payload_nbytes(70, 64)
    assert np.frombuffer(data[:8], dtype="<f4").tolist() == [1.0, 0.0]
    # q + 8 per element: 8, 15, 5, 9, 13, 8 ... ; the even element in the low nibble
    assert list(data[8:11]) == [8 | 15 << 4, 5 | 9 << 4, 13 | 8 << 4]
    assert list(data[11:]) == [8 | 8 << 4] * 32


def test_int4_odd_count_pads_with_a_zero_nibble_and_decodes() -> None:
    t = torch.tensor([1.0, -1.0, 7.0])
    meta, payload = encode_tensor(t, Compression.INT4, 64)
    assert meta.nbytes == 4 + 2
    assert bytes(payload)[-1] == 15  # q = 7 low, padding 0 high
    assert roundtrip(t).tolist() == [1.0, -1.0, 7.0]


@pytest.mark.parametrize("padding", [1, 8, 15])
def test_int4_decoder_refuses_a_nonzero_padding_nibble(padding: int) -> None:
    meta, payload = encode_tensor(torch.tensor([1.0, -1.0, 7.0]), Compression.INT4, 64)
    data = bytearray(payload)
    data[-1] |= padding << 4
    with pytest.raises(DecodeError, match="padding"):
        decode_tensor(meta, memoryview(data))


def test_int4_even_count_has_no_padding_so_a_high_nibble_is_data() -> None:
    meta, payload = encode_tensor(torch.tensor([7.0, -7.0]), Compression.INT4, 64)
    data = bytearray(payload)
    assert data[-1] == 15 | 1 << 4
    assert decode_tensor(meta, memoryview(data)).tolist() == [7.0, -7.0]


def test_int4_q_clamps_to_7_when_the_scale_is_subnormal() -> None:
    # absmax / 7 rounds down to the smallest subnormal, so x / scale is 8: q must clamp to 7.
    x = 8 * SMALLEST_SUBNORMAL
    scales, packed = quantize_int4(torch.tensor([x, -x, 0.0]), 64)
    assert scales.tolist() == [SMALLEST_SUBNORMAL]
    assert packed.tolist() == [15 | 1 << 4, 8]


def test_int4_uses_seven_levels_a_side() -> None:
    scales, packed = quantize_int4(torch.tensor([7.0, 3.4, -3.6, -7.0]), 64)
    assert scales.tolist() == [1.0]
    assert packed.tolist() == [15 | 11 << 4, 4 | 1 << 4]


def test_int4_nibble_zero_from_a_peer_saturates_instead_of_becoming_inf() -> None:
    # The encoder never sends nibble 0 (q = -8); a peer may, and -8 * F32_MAX must not be -inf.
    scales = torch.tensor([F32_MAX])
    out = dequantize_int4(scales, torch.tensor([0 | 15 << 4], dtype=torch.uint8), 2, torch.float32, 64)
    assert out.tolist() == [-F32_MAX, (7 * torch.tensor(F32_MAX)).clamp(max=F32_MAX).item()]
    meta = TensorMeta("float32", (2,), int(Compression.INT4), 5, 64)
    payload = memoryview(bytearray(np.array([2.0], dtype="<f4").tobytes() + bytes([0 | 8 << 4])))
    assert decode_tensor(meta, payload).tolist() == [-16.0, 0.0]


def test_int4_spans_blocks_and_keeps_each_blocks_scale() -> None:
    t = torch.cat([torch.full((64,), 7.0), torch.full((64,), 0.07)])
    out = roundtrip(t, 64)
    assert out.tolist() == pytest.approx(t.tolist(), rel=1e-6)


def test_int4_row_blocks_by_default() -> None:
    meta, _ = encode_tensor(torch.randn(8, 128), Compression.INT4)
    assert meta.block_size == 128
    meta, _ = encode_tensor(torch.randn(8, 16), Compression.INT4)  # rows under the minimum block
    assert meta.block_size == 4096


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_int4_rejects_non_finite(bad: float) -> None:
    with pytest.raises(EncodeError, match="int4"):
        encode_tensor(torch.tensor([1.0, bad]), Compression.INT4)


def test_int4_rejects_a_bad_block_size_on_both_sides() -> None:
    with pytest.raises(EncodeError, match="block_size"):
        encode_tensor(torch.zeros(4), Compression.INT4, 100)
    meta = TensorMeta("float32", (4,), int(Compression.INT4), 4 + 2, 100)
    with pytest.raises(DecodeError, match="invalid int4 block_size 100"):
        decode_tensor(meta, memoryview(bytearray(6)))


@pytest.mark.parametrize("nbytes", [5, 7, 8 + 4])  # one short, one over, int8's size
def test_int4_decoder_refuses_a_size_the_shape_does_not_imply(nbytes: int) -> None:
    meta = TensorMeta("float32", (4,), int(Compression.INT4), nbytes, 64)
    with pytest.raises(DecodeError, match="implied"):
        decode_tensor(meta, memoryview(bytearray(nbytes)))


def test_int4_decoder_refuses_a_payload_shorter_than_its_meta() -> None:
    meta, payload = encode_tensor(torch.ones(4), Compression.INT4, 64)
    with pytest.raises(DecodeError, match="payload is"):
        decode_tensor(meta, memoryview(bytearray(payload)[:-1]))


def test_int4_is_refused_for_integer_dtypes_and_not_applied_to_them() -> None:
    meta = TensorMeta("int64", (2,), int(Compression.INT4), 5, 64)
    with pytest.raises(DecodeError, match="invalid for dtype"):
        decode_tensor(meta, memoryview(bytearray(5)))
    meta, _ = encode_tensor(torch.tensor([1, 2]), Compression.INT4)
    assert (meta.compression, meta.block_size) == (Compression.NONE, 0)


def test_non_blockwise_meta_with_a_block_size_names_both_blockwise_codecs() -> None:
    meta = TensorMeta("float32", (2,), int(Compression.FLOAT16), 4, 64)
    with pytest.raises(DecodeError, match="INT8 or INT4"):
        decode_tensor(meta, memoryview(bytearray(4)))


def test_int4_empty_tensor() -> None:
    meta, _ = encode_tensor(torch.empty(0, 16), Compression.INT4)
    assert meta.nbytes == 0
    assert roundtrip(torch.empty(0, 16), None).shape == (0, 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_int4_returns_the_senders_dtype(dtype: torch.dtype) -> None:
    out = roundtrip(torch.tensor([7.0, -1.0, 0.0], dtype=dtype))
    assert out.dtype == dtype
    assert out.tolist() == [7.0, -1.0, 0.0]


def test_int4_in_a_message_quarters_float16_bytes() -> None:
    x = torch.randn(64, 128)
    msg = Message(Kind.REQUEST, 1, "m", tensors=[x])
    small = encode_message_bytes(msg, Compression.INT4)
    half = encode_message_bytes(msg, Compression.FLOAT16)
    assert len(small) < len(half) / 3.5
    out = decode_message(small)
    assert bool(((out.tensors[0] - x).abs() <= int4_bound(x, torch.float32, 128).view_as(x)).all())
