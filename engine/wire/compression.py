"""Lossy tensor compression: pure functions, no framing, no I/O.

Expert activations and gradients dominate volunteer upload bandwidth, and they
tolerate small, *bounded* errors.  Every scheme here therefore states its error
bound, and the tests check it element by element.

float16 (2 bytes/element)
    For |x| in float16's normal range [2**-14, 65504]:
    ``|x - x̂| <= |x| * 2**-11`` (round to nearest).  float64 inputs get
    ``|x| * (2**-11 + 2**-24)``: torch casts them via float32, rounding twice.
    Below 2**-14 precision degrades to an absolute error of at most 2**-25
    (subnormals, then flush to zero).
    NaN and ±inf pass through unchanged.  A *finite* input that would round to
    ±inf (|x| >= 65520) raises ``EncodeError``: silently turning a large
    gradient into inf would poison the receiving optimizer, so the sender must
    decide (clip, or send uncompressed).

int8 blockwise absmax (1 byte/element + 4 bytes/block)
    The flattened tensor is split into blocks of ``block_size`` elements (the
    last block is conceptually zero-padded; padding is never sent).  Per block,
    ``scale = float32(absmax / 127)`` and ``q = clamp(round(x / scale), ±127)``.
    Payload layout: ``[scales: float32 LE * n_blocks][q: int8 * numel]``.
    A block of zeros has scale 0 and decodes to zeros.
    Bound, for every element, with ``absmax`` the block's max |x|, ``u`` the unit
    roundoff of the output dtype (2**-24 f32, 2**-53 f64, 2**-11 f16, 2**-8 bf16)
    and ``s`` the output dtype's smallest subnormal::

        |x - x̂| <= absmax/254 * (1 + 1e-6) + absmax * u + s + 2**-140

        (+ absmax * 2**-22 for float32, float16 and bfloat16 inputs)

    i.e. half a quantization step, plus one rounding into the output dtype, plus
    a tiny absolute term covering scales that underflow float32.  float64 inputs
    are worked in float64 so ``q * scale`` is exact before the final rounding;
    the narrower dtypes are worked in float32 (four times faster, which is what
    keeps quantization off the transport's critical path), whose division and
    product each add at most ``absmax * 2**-23``: the extra term above. Results
    saturate at the dtype's max, so 127 * scale never becomes inf.
    Inputs must be finite (``EncodeError`` otherwise): one inf makes
    the whole block's scale inf and destroys it.  float64 blocks whose absmax
    exceeds float32 range * 127 cannot be represented and raise ``EncodeError``.

int4 blockwise absmax (half a byte/element + 4 bytes/block)
    The same blocks and float32 scales with 7 levels a side:
    ``scale = float32(absmax / 7)``, ``q = clamp(round(x / scale), ±7)``, each
    ``q`` sent as the nibble ``q + 8`` (1..15), two to a byte, the even element
    in the low nibble.  An odd element count leaves the last byte's high nibble
    as padding, which must be 0 (a decoder refuses anything else).  Payload
    layout: ``[scales: float32 LE * n_blocks][nibbles: uint8 * ceil(numel/2)]``.
    The nibble 0 (q = -8) is never sent; a peer's decodes to ``-8 * scale``,
    saturated like int8's -128, so no payload can produce a non-finite value
    from finite scales.  Bound, as int8's with ``absmax/14`` for ``absmax/254``::

        |x - x̂| <= absmax/14 * (1 + 1e-6) + absmax * u + s + 2**-140

        (+ absmax * 2**-22 for float32, float16 and bfloat16 inputs)

    Error feedback is the caller's: the codec is stateless.  Expert calls carry
    different samples on every call, so they have no residual to carry (see
    engine.moe.client).
"""

from __future__ import annotations

import numpy as np
import torch

from .errors import EncodeError
from .finite import all_finite
from .inline import GRAIN, cast

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MAX_BLOCK_SIZE",
    "MIN_BLOCK_SIZE",
    "dequantize_int4",
    "dequantize_int8",
    "from_float16",
    "int4_payload_nbytes",
    "int8_payload_nbytes",
    "is_valid_block_size",
    "n_blocks",
    "quantize_int4",
    "quantize_int8",
    "row_block_size",
    "to_float16",
]

DEFAULT_BLOCK_SIZE = 4096
MIN_BLOCK_SIZE = 64
MAX_BLOCK_SIZE = 1 << 20

# Elements processed per step: torch runs each step's ops on the calling thread (engine/wire/inline.py:
# the codec runs beside a node's compute and must not start OpenMP teams), and float64 temporaries stay
# small whatever the tensor's size. A block bigger than this (block_size up to 2**20) is one step.
_CHUNK_ELEMENTS = GRAIN


def is_valid_block_size(block_size: int) -> bool:
    """Power of two keeps block boundaries cheap; the range keeps scale overhead and error sane."""
    return (
        isinstance(block_size, int)
        and not isinstance(block_size, bool)
        and MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE
        and block_size & (block_size - 1) == 0
    )


def row_block_size(shape: tuple[int, ...], cap: int = DEFAULT_BLOCK_SIZE) -> int:
    """The block size a tensor of ``shape`` gets by default: the widest power of two that divides its
    rows (the last dimension), when that is at least ``MIN_BLOCK_SIZE`` and below ``cap``, so no block
    spans two rows and every row has scales of its own; else ``cap``.

    Why: in a batch of a mixture's activations or gradients, each row is one token, and tokens' magnitudes
    differ by orders (gate weights, upstream gradients). One 4096-element block over 32 rows of 128 takes
    the largest row's scale, and the typical row then keeps a few levels: 18% median error per row against
    0.6% with a block per row (rows of 128, magnitudes lognormal with sigma 1.5), for 3% more bytes."""
    if len(shape) < 2 or shape[-1] <= 0:
        return cap
    width = shape[-1]
    block = width & -width  # the largest power of two dividing it
    return block if MIN_BLOCK_SIZE <= block < cap else cap


def n_blocks(numel: int, block_size: int) -> int:
    """Shared by encoder and decoder so both agree on payload size without touching data."""
    return -(-numel // block_size)


def int8_payload_nbytes(numel: int, block_size: int) -> int:
    """Lets the decoder validate a claimed payload size before allocating anything."""
    return 4 * n_blocks(numel, block_size) + numel


def int4_payload_nbytes(numel: int, block_size: int) -> int:
    """Lets the decoder validate a claimed payload size before allocating anything."""
    return 4 * n_blocks(numel, block_size) + (numel + 1) // 2


def _require_float(t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise EncodeError(f"compression needs a floating tensor, got {t.dtype}")


def to_float16(t: torch.Tensor) -> torch.Tensor:
    """Halves bandwidth; refuses to silently turn large finite values into inf."""
    _require_float(t)
    h = cast(t, torch.float16)
    # A finite result is the common case and proves that nothing overflowed, in one cheap pass.
    if t.dtype != torch.float16 and not all_finite(h) and bool((torch.isinf(h) & torch.isfinite(t)).any()):
        raise EncodeError("finite values overflow float16 (|x| >= 65520); clip or send uncompressed")
    return h


def from_float16(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Restores the sender's dtype so receivers never see the compression choice."""
    return cast(h, dtype)


def quantize_int8(t: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(scales float32[n_blocks], q int8[numel])``; see the module docstring for the bound."""
    return _quantize(t, block_size, 127, "int8")


def quantize_int4(t: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(scales float32[n_blocks], nibbles uint8[ceil(numel/2)])``; see the module docstring."""
    scales, q = _quantize(t, block_size, 7, "int4")
    codes = q.numpy().astype(np.uint8) + np.uint8(8)
    if codes.size % 2:
        codes = np.concatenate([codes, np.zeros(1, dtype=np.uint8)])  # the padding nibble is 0
    return scales, torch.from_numpy(codes[0::2] | (codes[1::2] << np.uint8(4)))


def _quantize(t: torch.Tensor, block_size: int, top: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise absmax to ``top`` levels a side: ``(scales float32[n_blocks], q int8[numel])``."""
    _require_float(t)
    if not is_valid_block_size(block_size):
        raise EncodeError(f"block_size must be a power of two in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]")
    flat = t.detach().reshape(-1)
    numel = flat.numel()
    nb = n_blocks(numel, block_size)
    scales = torch.empty(nb, dtype=torch.float32)
    q = torch.empty(numel, dtype=torch.int8)
    if numel == 0:
        return scales, q
    if not all_finite(flat):
        raise EncodeError(f"{name} quantization needs finite values (found NaN or inf)")
    work = torch.float64 if flat.dtype == torch.float64 else torch.float32
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // block_size)
    # The arithmetic in numpy, which never starts threads (torch.round and reductions over a few blocks
    # start an OpenMP team on the calling thread even below the grain); same IEEE operations, and
    # rint, like torch.round, rounds half to even.
    for first in range(0, nb, rows_per_chunk):
        last = min(nb, first + rows_per_chunk)
        lo, hi = first * block_size, min(numel, last * block_size)
        x = cast(flat[lo:hi], work).numpy()  # may alias the input: only read below
        pad = (last - first) * block_size - (hi - lo)
        if pad:
            x = np.concatenate([x, np.zeros(pad, dtype=x.dtype)])
        blocks = x.reshape(last - first, block_size)
        with np.errstate(over="ignore"):  # a float64 absmax past float32's range: caught just below
            s32 = (np.abs(blocks).max(axis=1) / x.dtype.type(top)).astype(np.float32)
        if not np.isfinite(s32).all():
            raise EncodeError("block absmax exceeds what a float32 scale can represent")
        s = s32.astype(x.dtype)[:, None]
        # A zero scale means every |x| in the block is below float32's reach; q = 0 is within the bound.
        divisor = np.where(s > 0, s, x.dtype.type(1))
        qb = np.clip(np.rint(blocks / divisor), -top, top).astype(np.int8)
        scales[first:last] = torch.from_numpy(s32)
        q[lo:hi] = torch.from_numpy(qb.reshape(-1)[: hi - lo])
    return scales, q


def dequantize_int8(
    scales: torch.Tensor, q: torch.Tensor, dtype: torch.dtype, block_size: int = DEFAULT_BLOCK_SIZE
) -> torch.Tensor:
    """Inverse of ``quantize_int8``; returns a fresh flat tensor of ``dtype``.

    Callers (the decoder) must already have checked that ``scales`` has exactly
    ``n_blocks(q.numel(), block_size)`` entries; this function trusts its inputs.
    """
    numel = q.numel()
    out = torch.empty(numel, dtype=dtype)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    # 127 * float32(absmax / 127) can land just past the dtype's max; saturate rather than emit inf.
    top = torch.finfo(dtype).max
    nb = scales.numel()
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // block_size)
    for first in range(0, nb, rows_per_chunk):
        last = min(nb, first + rows_per_chunk)
        lo, hi = first * block_size, min(numel, last * block_size)
        rows = last - first
        if hi - lo == rows * block_size:  # whole blocks: broadcast the scales instead of repeating them
            prod = q[lo:hi].to(work).view(rows, block_size) * scales[first:last].to(work).unsqueeze(1)
            out[lo:hi] = prod.view(-1).clamp_(-top, top).to(dtype)
        else:
            s = scales[first:last].to(work).repeat_interleave(block_size)[: hi - lo]
            out[lo:hi] = (q[lo:hi].to(work) * s).clamp_(-top, top).to(dtype)
    return out


def dequantize_int4(
    scales: torch.Tensor,
    packed: torch.Tensor,
    numel: int,
    dtype: torch.dtype,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> torch.Tensor:
    """Inverse of ``quantize_int4``; returns a fresh flat tensor of ``numel`` elements of ``dtype``.

    Trusts its inputs as ``dequantize_int8`` does: the decoder has checked that ``packed`` holds
    ``ceil(numel / 2)`` bytes and ``scales`` ``n_blocks(numel, block_size)`` entries."""
    codes = packed.numpy()  # numpy: no OpenMP team on the caller's thread (inline.py)
    q = np.empty(2 * codes.size, dtype=np.int8)
    q[0::2] = codes & np.uint8(15)
    q[1::2] = codes >> np.uint8(4)
    q -= np.int8(8)
    return dequantize_int8(scales, torch.from_numpy(q[:numel]), dtype, block_size)
