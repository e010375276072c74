"""Every wire limit at its boundary, hostile shapes, value checks and the codec's rarely run paths.

Each test is named after what a broken decoder or codec would let through.
"""

from __future__ import annotations

import warnings

import msgspec
import numpy as np
import pytest
import torch

from engine.wire import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LIMITS,
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    Compression,
    DecodeError,
    EncodeError,
    Kind,
    LimitExceeded,
    Limits,
    Message,
    TensorMeta,
    decode_message,
    decode_tensor,
    encode_message,
    encode_message_bytes,
    encode_tensor,
)
from engine.wire.compression import dequantize_int8, is_valid_block_size, quantize_int8


def decode(meta: TensorMeta, payload: bytes, limits: Limits = DEFAULT_LIMITS) -> torch.Tensor:
    return decode_tensor(meta, memoryview(bytearray(payload)), limits)


def reference_int8(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """The codec's definition in float64, written independently of compression.py."""
    flat = x.double().reshape(-1)
    nb = -(-flat.numel() // block_size)
    blocks = torch.cat([flat, flat.new_zeros(nb * block_size - flat.numel())]).view(nb, block_size)
    scale = (blocks.abs().amax(dim=1) / 127).float().double().unsqueeze(1)
    q = torch.where(scale > 0, blocks / torch.where(scale > 0, scale, 1.0), 0.0).round().clamp(-127, 127)
    return (q * scale).reshape(-1)[: flat.numel()].to(x.dtype).reshape(x.shape)


def assert_within_int8_bound(t: torch.Tensor, out: torch.Tensor, block_size: int) -> None:
    """The bound of compression.py's docstring, per block (float32 work adds absmax * 2**-22)."""
    flat, got = t.double().reshape(-1), out.double().reshape(-1)
    nb = -(-flat.numel() // block_size)
    padded = torch.cat([flat.abs(), flat.new_zeros(nb * block_size - flat.numel())])
    absmax = padded.view(nb, block_size).amax(dim=1).repeat_interleave(block_size)[: flat.numel()]
    u = 2**-53 if t.dtype == torch.float64 else 2**-24 + 2**-22
    assert bool(((flat - got).abs() <= absmax / 254 * (1 + 1e-6) + absmax * u + 2**-140).all())


# -- 2. limits at their boundary -------------------------------------------------------------------


def test_tensor_of_exactly_max_ndim_dims_decodes() -> None:
    limits = Limits(max_ndim=3)
    assert decode(TensorMeta("uint8", (1, 1, 1), 0, 1), b"\x07", limits).tolist() == [[[7]]]
    with pytest.raises(LimitExceeded, match="max_ndim 3"):
        decode(TensorMeta("uint8", (1, 1, 1, 1), 0, 1), b"\x07", limits)


def test_tensor_of_exactly_max_tensor_elements_decodes() -> None:
    limits = Limits(max_tensor_elements=12)
    assert decode(TensorMeta("uint8", (3, 4), 0, 12), bytes(range(12)), limits).shape == (3, 4)
    assert decode(TensorMeta("uint8", (0, 12), 0, 0), b"", limits).shape == (0, 12)
    for shape in [(13,), (0, 13), (13, 0)]:
        with pytest.raises(LimitExceeded, match="max_tensor_elements 12"):
            decode(TensorMeta("uint8", shape, 0, 13 if 0 not in shape else 0), bytes(13), limits)


def test_encoder_accepts_exactly_max_ndim_and_max_tensor_elements() -> None:
    limits = Limits(max_ndim=3, max_tensor_elements=12)
    for t in [torch.zeros(1, 3, 4), torch.zeros(0, 12)]:
        out = decode_message(b"".join(encode_message(Message(Kind.REQUEST, 1, tensors=[t]), limits=limits)))
        assert out.tensors[0].shape == t.shape
    for t in [torch.zeros(1, 1, 1, 1), torch.zeros(13), torch.zeros(0, 13)]:
        with pytest.raises(EncodeError):
            encode_message(Message(Kind.REQUEST, 1, tensors=[t]), limits=limits)


def test_message_of_exactly_max_message_bytes_is_accepted() -> None:
    msg = Message(Kind.REQUEST, 1, "m", {"a": 1}, [torch.arange(10)])
    size = len(encode_message_bytes(msg))
    exact = Limits(max_message_bytes=size)
    data = encode_message_bytes(msg, limits=exact)
    assert torch.equal(decode_message(data, exact).tensors[0], torch.arange(10))
    with pytest.raises(EncodeError, match="max_message_bytes"):
        encode_message(msg, limits=Limits(max_message_bytes=size - 1))
    with pytest.raises(LimitExceeded, match="max_message_bytes"):
        decode_message(data, Limits(max_message_bytes=size - 1))


def test_every_count_limit_is_inclusive_on_both_sides() -> None:
    msg = Message(Kind.REQUEST, 1, "m" * 5, {str(i): i for i in range(3)}, [torch.zeros(1)] * 4)
    header = len(encode_message(msg)[0]) - 4
    exact = Limits(max_method_len=5, max_fields=3, max_tensors=4, max_header_bytes=header)
    assert decode_message(encode_message_bytes(msg, limits=exact), exact).method == "m" * 5
    data = encode_message_bytes(msg)
    for name, value in [
        ("max_method_len", 4),
        ("max_fields", 2),
        ("max_tensors", 3),
        ("max_header_bytes", header - 1),
    ]:
        tight = Limits(**{name: value})  # type: ignore[arg-type]
        with pytest.raises(EncodeError):
            encode_message(msg, limits=tight)
        with pytest.raises(LimitExceeded):
            decode_message(data, tight)


@pytest.mark.parametrize("block_size", [MIN_BLOCK_SIZE, MAX_BLOCK_SIZE])
def test_int8_block_size_at_both_ends_of_its_range(block_size: int) -> None:
    t = torch.linspace(-3, 3, 200)
    meta, payload = encode_tensor(t, Compression.INT8, block_size)
    assert meta.block_size == block_size
    out = decode_tensor(meta, memoryview(bytearray(payload)))
    assert_within_int8_bound(t, out, block_size)
    assert meta.nbytes == 4 * -(-200 // block_size) + 200


@pytest.mark.parametrize("block_size", [MIN_BLOCK_SIZE // 2, MAX_BLOCK_SIZE * 2, 96, 0, -64])
def test_int8_block_size_outside_its_range_is_refused(block_size: int) -> None:
    # MAX_BLOCK_SIZE bounds what dequantize_int8 allocates per chunk of a hostile message.
    assert not is_valid_block_size(block_size)
    with pytest.raises(EncodeError, match="block_size"):
        encode_tensor(torch.zeros(4), Compression.INT8, block_size)
    with pytest.raises(DecodeError, match="invalid int8 block_size"):
        decode(TensorMeta("float32", (4,), 2, 8, block_size), bytes(8))


def test_int8_block_size_must_be_an_int() -> None:
    assert is_valid_block_size(64)
    assert not is_valid_block_size(True)
    assert not is_valid_block_size(64.0)  # type: ignore[arg-type]


# -- 3. hostile shapes -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(-1, 0), (0, -1), (-1,), (-(2**40), 0)])
def test_negative_dimension_with_no_payload_is_a_decode_error(shape: tuple[int, ...]) -> None:
    with pytest.raises(DecodeError, match="negative dimension") as info:
        decode(TensorMeta("float32", shape, 0, 0), b"")
    assert type(info.value) is DecodeError
    header = [0, 1, "m", {}, [["float32", list(shape), 0, 0, 0]]]
    body = msgspec.msgpack.encode(header)
    with pytest.raises(DecodeError, match="negative dimension"):
        decode_message(len(body).to_bytes(4, "little") + body)


# -- 4. value checks -------------------------------------------------------------------------------


def test_bool_payload_without_a_zero_byte_decodes_to_0_and_1() -> None:
    out = decode(TensorMeta("bool", (2,), 0, 2), b"\x02\x03")
    assert out.tolist() == [True, True]
    assert out.view(torch.uint8).tolist() == [1, 1]
    out = decode(TensorMeta("bool", (2,), 0, 2), b"\x02\x01")
    assert out.view(torch.uint8).tolist() == [1, 1]


def test_bool_payload_of_0_and_1_is_decoded_without_a_copy() -> None:
    buf = bytearray(b"\x01\x00\x01")
    out = decode_tensor(TensorMeta("bool", (3,), 0, 3), memoryview(buf))
    assert out.tolist() == [True, False, True]
    buf[1] = 1
    assert out.tolist() == [True, True, True]


def test_read_only_payload_is_copied_once_not_aliased() -> None:
    data = torch.arange(4, dtype=torch.float32).numpy().tobytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when handed a buffer it may not write
        out = decode_tensor(TensorMeta("float32", (4,), 0, 16), memoryview(data))
    out[0] = 7.0
    assert data[:4] == bytes(4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int16, torch.bfloat16])
def test_misaligned_payload_still_gives_an_aligned_tensor(dtype: torch.dtype) -> None:
    t = torch.arange(6).to(dtype)
    meta, payload = encode_tensor(t)
    buf = bytearray(1) + bytearray(payload)
    out = decode_tensor(meta, memoryview(buf)[1:])
    assert out.data_ptr() % dtype.itemsize == 0
    assert torch.equal(out, t)


def test_float16_with_float16_compression_is_sent_raw() -> None:
    t = torch.tensor([1.0, -2.5, 60000.0], dtype=torch.float16)
    meta, payload = encode_tensor(t, Compression.FLOAT16)
    assert (meta.compression, meta.block_size, meta.nbytes) == (Compression.NONE, 0, 6)
    assert bytes(payload) == t.numpy().tobytes()
    meta, _ = encode_tensor(t.bfloat16(), Compression.FLOAT16)
    assert meta.compression == Compression.FLOAT16


def test_sparse_tensor_is_refused() -> None:
    with pytest.raises(EncodeError, match="dense"):
        encode_tensor(torch.zeros(3).to_sparse())


def test_float64_above_the_float32_range_survives_int8_within_the_bound() -> None:
    t = torch.tensor([1e40, -3e40, 5e39, 0.0] + [1e39] * 60, dtype=torch.float64)
    out = decode_tensor(*_as_decodable(encode_tensor(t, Compression.INT8, 64)))
    absmax = 3e40
    assert bool(((out - t).abs() <= absmax / 254 * (1 + 1e-6) + absmax * 2**-53).all())
    assert torch.equal(out, reference_int8(t, 64))
    with pytest.raises(EncodeError, match="float32 scale"):
        encode_tensor(torch.tensor([1e48], dtype=torch.float64), Compression.INT8)


def _as_decodable(encoded: tuple[TensorMeta, memoryview | bytes]) -> tuple[TensorMeta, memoryview]:
    meta, payload = encoded
    return meta, memoryview(bytearray(payload))


# -- 5. paths never run ----------------------------------------------------------------------------


def test_int8_with_the_default_block_size() -> None:
    t = torch.randn(DEFAULT_BLOCK_SIZE + 5, generator=torch.Generator().manual_seed(1))
    meta, payload = encode_tensor(t, Compression.INT8)
    assert meta.block_size == DEFAULT_BLOCK_SIZE == 4096
    assert meta.nbytes == 2 * 4 + t.numel()
    scales, q = quantize_int8(t)
    assert scales.numel() == 2
    assert torch.equal(
        dequantize_int8(scales, q, torch.float32), decode_tensor(meta, memoryview(bytearray(payload)))
    )
    assert_within_int8_bound(t, dequantize_int8(scales, q, torch.float32), DEFAULT_BLOCK_SIZE)
    expected = [float(t[:4096].abs().max() / 127), float(t[4096:].abs().max() / 127)]
    assert scales.tolist() == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_int8_above_2_21_elements_with_a_partial_last_block(dtype: torch.dtype) -> None:
    # Two chunks of blocks, the last one partial: the path every tensor over 2**21 elements takes.
    n = (1 << 21) + 100
    t = torch.randn(n, generator=torch.Generator().manual_seed(2)).to(dtype)
    t[-100:] *= 1000  # the partial last block has its own scale
    meta, payload = encode_tensor(t, Compression.INT8, 64)
    assert meta.nbytes == 4 * (-(-n // 64)) + n
    out = decode_tensor(meta, memoryview(bytearray(payload)))
    assert_within_int8_bound(t, out, 64)
    if dtype == torch.float64:  # worked in float64: exactly the definition
        assert torch.equal(out, reference_int8(t, 64))
    scales = np.frombuffer(bytes(payload)[:8], dtype="<f4").tolist()
    assert scales == (t[:128].double().abs().view(2, 64).amax(dim=1) / 127).float().tolist()
    last_scale = np.frombuffer(bytes(payload)[4 * (n // 64) : 4 * (n // 64) + 4], dtype="<f4")
    assert last_scale.tolist() == [float(np.float32(t[-(n % 64) :].double().abs().max().item() / 127))]


def test_limits_accept_1_and_refuse_zero_floats_and_bools() -> None:
    assert Limits(max_ndim=1, max_tensors=1).max_ndim == 1
    for bad in [0, -1, 1.5, True, "8"]:
        with pytest.raises(ValueError, match="must be a positive int"):
            Limits(max_ndim=bad)  # type: ignore[arg-type]
