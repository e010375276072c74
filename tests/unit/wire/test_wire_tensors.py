"""Tensor codec and compression: round trips and the documented error bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine.wire import (
    DEFAULT_LIMITS,
    SUPPORTED_DTYPES,
    Compression,
    DecodeError,
    EncodeError,
    LimitExceeded,
    TensorMeta,
    decode_tensor,
    encode_tensor,
)

SHAPES = st.one_of(
    st.just(()),
    st.lists(st.integers(0, 6), min_size=1, max_size=4).map(tuple),
    st.lists(st.integers(1, 300), min_size=1, max_size=1).map(tuple),
)
BLOCK_SIZES = st.sampled_from([64, 128, 256, 512, 1024, 4096])
UNIT_ROUNDOFF = {torch.float32: 2**-24, torch.float64: 2**-53, torch.float16: 2**-11, torch.bfloat16: 2**-8}


def raw_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def roundtrip(
    t: torch.Tensor, comp: Compression, block_size: int = 4096, writable: bool = True
) -> torch.Tensor:
    meta, payload = encode_tensor(t, comp, block_size)
    meta = TensorMeta(meta.dtype, tuple(meta.shape), meta.compression, meta.nbytes, meta.block_size)
    buf = bytearray(payload) if writable else bytes(payload)
    out = decode_tensor(meta, memoryview(buf), DEFAULT_LIMITS)
    assert out.dtype == t.dtype
    assert tuple(out.shape) == tuple(t.shape)
    return out


@st.composite
def any_tensor(draw: st.DrawFn) -> torch.Tensor:
    """Arbitrary bit patterns (NaN payloads, subnormals, infs) for every supported dtype."""
    dtype = draw(st.sampled_from(sorted(SUPPORTED_DTYPES)))
    shape = draw(SHAPES)
    numel = math.prod(shape)
    if dtype == "bool":
        return torch.tensor(draw(st.lists(st.booleans(), min_size=numel, max_size=numel))).reshape(shape)
    tdtype = SUPPORTED_DTYPES[dtype]
    data = draw(st.binary(min_size=numel * tdtype.itemsize, max_size=numel * tdtype.itemsize))
    if numel == 0:
        return torch.empty(shape, dtype=tdtype)
    return torch.frombuffer(bytearray(data), dtype=tdtype).reshape(shape)


@settings(max_examples=400, deadline=None)
@given(any_tensor(), st.booleans(), st.sampled_from(list(Compression)))
def test_none_is_bit_exact(t: torch.Tensor, writable: bool, comp: Compression) -> None:
    if t.is_floating_point():
        comp = Compression.NONE  # lossy schemes are covered below; ints always go raw
    out = roundtrip(t, comp, writable=writable)
    assert raw_bytes(out) == raw_bytes(t)


def test_noncontiguous_and_grad_inputs() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6).requires_grad_()
    t = base.t()[1:, ::2]
    out = roundtrip(t, Compression.NONE)
    assert torch.equal(out, t.detach())


def test_writable_buffer_is_zero_copy() -> None:
    t = torch.arange(8, dtype=torch.int64)
    meta, payload = encode_tensor(t)
    buf = bytearray(payload)
    out = decode_tensor(meta, memoryview(buf), DEFAULT_LIMITS)
    buf[0] = 99
    assert int(out[0]) == 99


float_arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    elements=st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True),
)


def f16_representable(x: np.ndarray, dtype: torch.dtype = torch.float32) -> np.ndarray:
    # 65280 is the largest bfloat16 that float16 can hold; rounding 65504 to bfloat16 gives 65536.
    limit = 65280 if dtype == torch.bfloat16 else 65504
    return np.asarray(np.clip(x, -limit, limit), dtype=x.dtype)


@settings(max_examples=300, deadline=None)
@given(float_arrays, st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_float16_bound(arr: np.ndarray, dtype: torch.dtype) -> None:
    t = torch.from_numpy(f16_representable(arr, dtype).copy()).to(dtype)
    out = roundtrip(t, Compression.FLOAT16)
    x, y = t.double(), out.double()
    err = (x - y).abs()
    normal = x.abs() >= 2**-14
    rel = 2**-11 + (2**-24 if dtype == torch.float64 else 0.0)
    assert bool((err[normal] <= x.abs()[normal] * rel).all())
    assert bool((err[~normal] <= 2**-25).all())


def int8_bound(x: torch.Tensor, dtype: torch.dtype, block_size: int) -> torch.Tensor:
    """The module docstring's bound, recomputed independently per element."""
    flat = x.double().reshape(-1)
    nb = -(-flat.numel() // block_size)
    padded = torch.cat([flat.abs(), flat.new_zeros(nb * block_size - flat.numel())])
    absmax = padded.view(nb, block_size).amax(dim=1).repeat_interleave(block_size)[: flat.numel()]
    finfo = torch.finfo(dtype)
    smallest_subnormal = finfo.tiny * finfo.eps
    work_rounding = 0.0 if dtype == torch.float64 else 2**-22  # float32 arithmetic for narrower dtypes
    return (
        absmax / 254 * (1 + 1e-6)
        + absmax * (UNIT_ROUNDOFF[dtype] + work_rounding)
        + smallest_subnormal
        + 2**-140
    )


@settings(max_examples=300, deadline=None)
@given(float_arrays, BLOCK_SIZES, st.sampled_from(list(UNIT_ROUNDOFF)))
def test_int8_bound(arr: np.ndarray, block_size: int, dtype: torch.dtype) -> None:
    if dtype == torch.float16:
        arr = f16_representable(arr)
    t = torch.from_numpy(arr.copy()).to(dtype)
    assume(bool(torch.isfinite(t).all()))  # float32 -> bfloat16 can round up to inf
    out = roundtrip(t, Compression.INT8, block_size)
    err = (t.double() - out.double()).reshape(-1).abs()
    assert bool((err <= int8_bound(t, dtype, block_size)).all())


def test_int8_special_blocks() -> None:
    t = torch.zeros(300)
    t[200:] = torch.linspace(-1e38, 3e38, 100, dtype=torch.float64).float()
    t[5] = 1e-45  # float32's smallest subnormal: its scale underflows to 0
    out = roundtrip(t, Compression.INT8, 64)
    assert bool((out[64:128] == 0).all())
    assert bool(((t.double() - out.double()).abs() <= int8_bound(t, torch.float32, 64)).all())


def test_int8_payload_layout() -> None:
    t = torch.tensor([0.0, 127.0, -63.5] + [0.0] * 67)  # 70 elements, two blocks of 64
    meta, payload = encode_tensor(t, Compression.INT8, 64)
    data = bytes(payload)
    assert meta.nbytes == len(data) == 2 * 4 + 70
    scales = np.frombuffer(data[:8], dtype="<f4")
    assert scales.tolist() == [1.0, 0.0]
    assert np.frombuffer(data[8:11], dtype=np.int8).tolist() == [0, 127, -64]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_int8_rejects_non_finite(bad: float) -> None:
    with pytest.raises(EncodeError):
        encode_tensor(torch.tensor([1.0, bad]), Compression.INT8)


def test_float16_overflow_and_passthrough() -> None:
    with pytest.raises(EncodeError):
        encode_tensor(torch.tensor([1.0, 70000.0]), Compression.FLOAT16)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 65519.0])
    out = roundtrip(special, Compression.FLOAT16)
    assert torch.isnan(out[0]) and out[1] == float("inf") and out[2] == -float("inf") and out[3] == 65504


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint16, torch.float8_e4m3fn])
def test_unsupported_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(EncodeError):
        encode_tensor(torch.zeros(3, dtype=dtype))


def test_bad_encode_args() -> None:
    with pytest.raises(EncodeError):
        encode_tensor(torch.zeros(3), Compression.INT8, block_size=100)
    with pytest.raises(EncodeError):
        encode_tensor(torch.zeros(3), 7)  # type: ignore[arg-type]
    with pytest.raises(EncodeError):
        encode_tensor([1.0, 2.0])  # type: ignore[arg-type]


def test_int_tensors_ignore_compression() -> None:
    meta, _ = encode_tensor(torch.arange(5), Compression.INT8)
    assert meta.compression == Compression.NONE and meta.block_size == 0


@pytest.mark.parametrize(
    ("meta", "exc"),
    [
        (TensorMeta("float32", (2**20, 2**20), 0, 2**42), LimitExceeded),
        (TensorMeta("float32", (0,) + (2**27,) * 7, 0, 0), LimitExceeded),
        (TensorMeta("float32", (1,) * 9, 0, 4), LimitExceeded),
        (TensorMeta("float32", (-1, 4), 0, 0), DecodeError),
        (TensorMeta("float32", (2,), 0, 9), DecodeError),
        (TensorMeta("complex64", (2,), 0, 16), DecodeError),
        (TensorMeta("float32", (2,), 9, 8), DecodeError),
        (TensorMeta("int32", (2,), 1, 4), DecodeError),
        (TensorMeta("float32", (2,), 2, 6, 100), DecodeError),
        (TensorMeta("float32", (2,), 0, 8, 64), DecodeError),
    ],
)
def test_hostile_meta(meta: TensorMeta, exc: type[Exception]) -> None:
    with pytest.raises(exc) as info:
        decode_tensor(meta, memoryview(b"\0" * 8), DEFAULT_LIMITS)
    assert type(info.value) is exc


def test_payload_length_mismatch() -> None:
    meta, payload = encode_tensor(torch.ones(4))
    with pytest.raises(DecodeError):
        decode_tensor(meta, memoryview(bytes(payload)[:-1]), DEFAULT_LIMITS)


def test_bool_bytes_are_normalised() -> None:
    out = decode_tensor(
        TensorMeta("bool", (3,), 0, 3), memoryview(bytearray(b"\x00\x02\x01")), DEFAULT_LIMITS
    )
    assert out.tolist() == [False, True, True]
