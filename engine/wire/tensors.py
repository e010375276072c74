"""Tensor codec: one tensor <-> (``TensorMeta``, payload bytes).

The metadata is a tiny msgspec struct so it can sit inside the message header;
the payload travels separately so large tensors are never copied into the
header.  Raw payloads are the tensor's bytes in little-endian order.  Only
little-endian hosts are supported (every platform torch ships wheels for): we
refuse to import on a big-endian host rather than silently byteswapping wrong.

Compression applies only to floating dtypes.  Asking to compress an integer or
bool tensor sends it raw (and the meta says NONE): callers can pass one
compression setting for a whole message without special-casing index tensors.
Asking FLOAT16 for a tensor that already is float16 likewise sends it raw.

``decode_tensor`` validates every field of the (untrusted) meta and the exact
payload size *before* allocating, and raises only ``DecodeError`` /
``LimitExceeded``.  Decoded raw tensors alias a writable input buffer
(zero-copy); a read-only buffer (``bytes``) is copied exactly once.
"""

from __future__ import annotations

import enum
import math
import sys
from typing import Any

import msgspec
import torch

from .compression import (
    dequantize_int4,
    dequantize_int8,
    from_float16,
    int4_payload_nbytes,
    int8_payload_nbytes,
    is_valid_block_size,
    n_blocks,
    quantize_int4,
    quantize_int8,
    row_block_size,
    to_float16,
)
from .errors import DecodeError, EncodeError, LimitExceeded
from .inline import contiguous, copy_into
from .limits import DEFAULT_LIMITS, Limits

__all__ = [
    "SUPPORTED_DTYPES",
    "Compression",
    "TensorMeta",
    "check_meta",
    "decode_tensor",
    "decoded_nbytes",
    "encode_tensor",
    "payload_nbytes",
]

if sys.byteorder != "little":  # pragma: no cover - no such host in CI
    raise ImportError("engine.wire assumes a little-endian host; the wire format is little-endian")


class Compression(enum.IntEnum):
    """Stable integers: these values are part of the wire format and must never be renumbered."""

    NONE = 0
    FLOAT16 = 1
    INT8 = 2
    INT4 = 3


class TensorMeta(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """Array-like to keep per-tensor header overhead to a handful of bytes.

    ``dtype`` is the *original* dtype (what the receiver gets back); ``nbytes``
    is the payload size on the wire; ``block_size`` is 0 unless INT8 or INT4.
    """

    dtype: str
    shape: tuple[int, ...]
    compression: int
    nbytes: int
    block_size: int = 0


# Names are the wire format; torch attribute names are not guaranteed stable across versions.
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in SUPPORTED_DTYPES.items()}
_ITEMSIZE: dict[str, int] = {k: v.itemsize for k, v in SUPPORTED_DTYPES.items()}
_FLOATING = frozenset({"float32", "float64", "float16", "bfloat16"})
_COMPRESSION_VALUES = frozenset(int(c) for c in Compression)
_BLOCKWISE = frozenset({Compression.INT8, Compression.INT4})


def payload_nbytes(dtype: str, numel: int, compression: int, block_size: int) -> int:
    """Single source of truth for payload size, used by both sides before touching data."""
    if compression == Compression.FLOAT16:
        return 2 * numel
    if compression == Compression.INT8:
        return int8_payload_nbytes(numel, block_size)
    if compression == Compression.INT4:
        return int4_payload_nbytes(numel, block_size)
    return _ITEMSIZE[dtype] * numel


def _effective_compression(dtype: str, compression: Compression) -> Compression:
    if dtype not in _FLOATING or (compression == Compression.FLOAT16 and dtype == "float16"):
        return Compression.NONE
    return compression


def _raw_view(t: torch.Tensor) -> memoryview:
    # numpy lacks bfloat16, but the bits are all we need: reinterpret as int16 without copying.
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    arr: Any = t.reshape(-1).numpy()  # numpy's stubs don't declare the buffer protocol
    return memoryview(arr).cast("B")


def encode_tensor(
    t: torch.Tensor,
    compression: Compression = Compression.NONE,
    block_size: int | None = None,
) -> tuple[TensorMeta, memoryview | bytes]:
    """Returns metadata plus a payload; a NONE payload aliases ``t``, so don't mutate it before sending.
    ``block_size`` (int8, int4): None for a block per row where rows allow it (``row_block_size``)."""
    if not isinstance(t, torch.Tensor):
        raise EncodeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise EncodeError(f"only dense tensors can be sent, got layout {t.layout}")
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise EncodeError(f"unsupported dtype {t.dtype}; supported: {sorted(SUPPORTED_DTYPES)}")
    try:
        compression = Compression(compression)
    except ValueError:
        raise EncodeError(f"unknown compression {compression!r}") from None
    t = contiguous(t.detach().to("cpu").resolve_conj().resolve_neg())  # no OpenMP team (inline.py)
    shape = tuple(int(d) for d in t.shape)
    comp = _effective_compression(name, compression)
    payload: memoryview | bytes
    if comp == Compression.NONE:
        payload, bs = _raw_view(t), 0
    elif comp == Compression.FLOAT16:
        payload, bs = _raw_view(to_float16(t)), 0
    else:
        if block_size is None:
            block_size = row_block_size(shape)
        quantize = quantize_int8 if comp == Compression.INT8 else quantize_int4
        scales, q = quantize(t, block_size)
        joined = torch.empty(4 * scales.numel() + q.numel(), dtype=torch.uint8)
        copy_into(joined[: 4 * scales.numel()], scales.view(torch.uint8))
        copy_into(joined[4 * scales.numel() :], q.view(torch.uint8))
        payload, bs = _raw_view(joined), block_size
    meta = TensorMeta(dtype=name, shape=shape, compression=int(comp), nbytes=len(payload), block_size=bs)
    return meta, payload


def _check_meta(meta: TensorMeta, limits: Limits) -> tuple[torch.dtype, int]:
    """Validates untrusted meta; returns (dtype, numel).  Never allocates from claimed sizes."""
    dtype = SUPPORTED_DTYPES.get(meta.dtype)
    if dtype is None:
        raise DecodeError(f"unknown dtype {meta.dtype[:32]!r}")
    if meta.compression not in _COMPRESSION_VALUES:
        raise DecodeError(f"unknown compression {meta.compression}")
    if meta.compression != Compression.NONE and meta.dtype not in _FLOATING:
        raise DecodeError(f"compression {meta.compression} is invalid for dtype {meta.dtype}")
    if meta.compression in _BLOCKWISE:
        if not is_valid_block_size(meta.block_size):
            name = Compression(meta.compression).name.lower()
            raise DecodeError(f"invalid {name} block_size {meta.block_size}")
    elif meta.block_size != 0:
        raise DecodeError("block_size must be 0 unless compression is INT8 or INT4")
    if len(meta.shape) > limits.max_ndim:
        raise LimitExceeded(f"tensor has {len(meta.shape)} dims > max_ndim {limits.max_ndim}")
    for d in meta.shape:
        if d < 0:
            raise DecodeError(f"negative dimension {d}")
    # Product over max(d, 1): an empty tensor with absurd other dims would still overflow torch's strides.
    if math.prod(max(d, 1) for d in meta.shape) > limits.max_tensor_elements:
        raise LimitExceeded(f"tensor shape exceeds max_tensor_elements {limits.max_tensor_elements}")
    numel = math.prod(meta.shape)
    expected = payload_nbytes(meta.dtype, numel, meta.compression, meta.block_size)
    if meta.nbytes != expected:
        raise DecodeError(f"meta.nbytes {meta.nbytes} != {expected} implied by shape/dtype/compression")
    return dtype, numel


def check_meta(meta: TensorMeta, limits: Limits = DEFAULT_LIMITS) -> int:
    """Lets the message decoder validate all metas (and sum sizes) before decoding any payload."""
    return _check_meta(meta, limits)[1]


def decoded_nbytes(meta: TensorMeta) -> int:
    """Bytes the decoded tensor takes (its original dtype), for a meta ``check_meta`` accepted."""
    return _ITEMSIZE[meta.dtype] * math.prod(meta.shape)


def _frombuffer(payload: memoryview, dtype: torch.dtype, count: int) -> torch.Tensor:
    # torch warns on (and may write through) read-only buffers, so copy those exactly once.
    buf: memoryview | bytearray = bytearray(payload) if payload.readonly else payload
    t = torch.frombuffer(buf, dtype=torch.uint8, count=count * dtype.itemsize)
    if dtype.itemsize > 1 and t.data_ptr() % dtype.itemsize:
        # A misaligned slice of a larger frame: one copy beats unaligned-access surprises. A bytearray
        # (CPython's allocators align to 16 bytes) rather than a torch clone: this runs on the event
        # loop, where a torch copy opens an OpenMP team beside the host's compute (see finite.py).
        t = torch.frombuffer(bytearray(payload), dtype=torch.uint8, count=count * dtype.itemsize)
    return t.view(dtype)


def decode_tensor(meta: TensorMeta, payload: memoryview, limits: Limits = DEFAULT_LIMITS) -> torch.Tensor:
    """Inverse of ``encode_tensor`` for untrusted input; raises only ``DecodeError``."""
    dtype, numel = _check_meta(meta, limits)
    if len(payload) != meta.nbytes:
        raise DecodeError(f"payload is {len(payload)} bytes, meta says {meta.nbytes}")
    if numel == 0:
        return torch.empty(meta.shape, dtype=dtype)
    if meta.compression == Compression.NONE:
        if dtype == torch.bfloat16:
            flat = _frombuffer(payload, torch.int16, numel).view(torch.bfloat16)
        elif dtype == torch.bool:
            # Any byte other than 0/1 in a bool tensor is undefined behaviour in torch; normalise.
            raw = _frombuffer(payload, torch.uint8, numel)
            bytes_ = raw.numpy()  # numpy: no OpenMP team on the caller's thread (inline.py)
            flat = torch.from_numpy(bytes_ != 0) if bool((bytes_ > 1).any()) else raw.view(torch.bool)
        else:
            flat = _frombuffer(payload, dtype, numel)
    elif meta.compression == Compression.FLOAT16:
        flat = from_float16(_frombuffer(payload, torch.float16, numel), dtype)
    elif meta.compression == Compression.INT8:
        nb = n_blocks(numel, meta.block_size)
        scales = _frombuffer(payload[: 4 * nb], torch.float32, nb)
        q = _frombuffer(payload[4 * nb :], torch.int8, numel)
        flat = dequantize_int8(scales, q, dtype, meta.block_size)
    else:
        nb = n_blocks(numel, meta.block_size)
        if numel % 2 and payload[-1] >> 4:
            raise DecodeError("int4 padding nibble (the last byte's high half) must be 0")
        scales = _frombuffer(payload[: 4 * nb], torch.float32, nb)
        packed = _frombuffer(payload[4 * nb :], torch.uint8, (numel + 1) // 2)
        flat = dequantize_int4(scales, packed, numel, dtype, meta.block_size)
    return flat.reshape(meta.shape)
