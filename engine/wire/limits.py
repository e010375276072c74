"""Hard resource limits shared by the encoder and the decoder.

Both sides use the same numbers so that anything we agree to send, a peer with
default limits agrees to receive.  The decoder checks every limit against the
*claimed* sizes in a header before it allocates anything sized from the input,
so a 20-byte frame cannot make us reserve gigabytes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "Limits"]


@dataclass(frozen=True)
class Limits:
    """Frozen so one instance can be shared across connections without defensive copies."""

    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_ndim: int = 8
    max_tensor_elements: int = 2**28
    max_message_bytes: int = 512 * 1024 * 1024
    max_method_len: int = 128
    max_fields: int = 64

    def __post_init__(self) -> None:
        # A negative or zero limit is almost certainly a configuration typo; failing loudly
        # here beats silently rejecting (or accepting) every message later.
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()
