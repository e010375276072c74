"""Lossy compression of all-reduce parts, and error feedback. Pure tensor functions, no I/O.

What a peer sends is decoded by its receiver exactly as :func:`roundtrip` computes locally (the wire's
quantizers are deterministic, and quantizing an already-quantized tensor returns it unchanged), so a
sender knows its error without a reply, and a reducer that hands the same quantized chunk to every
member (itself included) keeps every member's step identical.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): the part of a value that compression lost
is kept and added to the next value sent from the same place, so the error does not accumulate over
rounds. Residuals are kept in bfloat16 (2 bytes per element, half a float32 vector): a residual is
at most half a quantization step, and bfloat16's 8 mantissa bits keep it to within 0.4% of itself
(float32's range, so tiny gradients do not underflow as they would in float16), a second-order error
on an already small correction. They exist only while compression is lossy.
"""

from __future__ import annotations

import torch

from engine.wire import Compression, EncodeError
from engine.wire.compression import (
    DEFAULT_BLOCK_SIZE,
    dequantize_int8,
    from_float16,
    quantize_int8,
    to_float16,
)

__all__ = ["RESIDUAL_DTYPE", "ErrorFeedback", "bytes_per_element", "roundtrip"]

RESIDUAL_DTYPE = torch.bfloat16


def roundtrip(values: torch.Tensor, compression: Compression) -> torch.Tensor:
    """What the receiver of ``values`` sent with ``compression`` decodes. EncodeError if it cannot go."""
    if compression == Compression.NONE:
        return values
    if compression == Compression.FLOAT16:
        return from_float16(to_float16(values), values.dtype)
    scales, q = quantize_int8(values, DEFAULT_BLOCK_SIZE)
    return dequantize_int8(scales, q, values.dtype, DEFAULT_BLOCK_SIZE).view_as(values)


def bytes_per_element(compression: Compression) -> float:
    return {Compression.NONE: 4.0, Compression.FLOAT16: 2.0, Compression.INT8: 1.0 + 4 / DEFAULT_BLOCK_SIZE}[
        compression
    ]


class ErrorFeedback:
    """Residuals over a vector of ``size`` elements, kept across rounds by whoever sends from it."""

    def __init__(self, size: int, compression: Compression) -> None:
        self.compression = compression
        self.size = size
        self.residual: torch.Tensor | None = (
            None if compression == Compression.NONE else torch.zeros(size, dtype=RESIDUAL_DTYPE)
        )

    def apply(self, offset: int, values: torch.Tensor) -> tuple[torch.Tensor, Compression]:
        """``values`` (from ``offset``) plus the residual, as the receiver will decode it; the residual
        keeps what is lost. A chunk that cannot be compressed (float16 overflow) goes uncompressed."""
        if self.residual is None:
            return values, Compression.NONE
        part = self.residual[offset : offset + values.numel()]
        corrected = values.reshape(-1) + part  # float32: the chunk's one temporary
        try:
            sent = roundtrip(corrected, self.compression)
        except EncodeError:
            part.zero_()
            return corrected, Compression.NONE
        part.copy_(corrected.sub_(sent))
        return sent, self.compression
