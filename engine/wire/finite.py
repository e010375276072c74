"""Is every element of a tensor finite? The check every untrusted tensor passes, made cheap.

A peer's activations, gradients and averaging chunks are checked for NaN and ±inf before they reach an
optimizer, and the check runs on hot paths: a trainer's event loop checks every reply, a host's every
request. ``torch.isfinite(t).all()`` materialises a bool tensor and, for float16 on a CPU, has no
vectorised kernel: about 0.7 ms for a 256 x 1024 batch on one core, several times the transport's own
cost for the same bytes. Worse, any torch reduction on an event loop thread opens an OpenMP team of its
own, which on a host waits for the cores its compute threads hold (25 µs idle, 100-200 µs beside them).

So on a CPU the check runs in numpy, whose operations never start threads. float32 and float64 have
numpy's vectorised ``isfinite``. For float16 and bfloat16 (none, or none fast) IEEE 754 says it in the
bits: a value is NaN or infinite exactly when its exponent field is all ones, so the tensor is read as
16-bit integers and the check asks whether any element, masked to the exponent, equals the mask: a
vectorised AND and max, exact, about 30 µs for that batch. A tensor on a GPU takes torch's reduction.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["all_finite"]

# half-width dtype -> the exponent field's mask in its 16 bits
_EXPONENT_16 = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80}


def all_finite(t: torch.Tensor) -> bool:
    """True when no element of ``t`` is NaN or infinite."""
    if t.device.type != "cpu" or not t.numel() or not t.is_floating_point():
        return bool(torch.isfinite(t).all())
    t = t.detach()
    mask = _EXPONENT_16.get(t.dtype)
    if mask is not None:
        return int(np.bitwise_and(t.view(torch.int16).numpy(), mask).max()) < mask
    if t.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(t.numpy()).all())
    return bool(torch.isfinite(t).all())
