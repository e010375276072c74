"""The wire package's single exception tree.

Callers sit on a network boundary: a peer can send anything.  They need to
tell "the peer sent garbage" (drop the frame, maybe ban the peer) apart from
"we tried to send something unsendable" (a bug on our side) without catching
``Exception``.  Hence one root and exactly two branches::

    WireError(Exception)
    ├── DecodeError        the ONLY exception decoding untrusted bytes may raise
    │   └── LimitExceeded  the bytes claim more than a hard limit allows
    └── EncodeError        the local caller handed us something unsendable
                           (unsupported dtype, non-finite int8 input,
                           float16 overflow, a message over limits)

``LimitExceeded`` is a ``DecodeError`` so that ordinary receive loops need a
single ``except DecodeError``; code that wants to treat resource attacks more
harshly can catch the subclass first.
"""

from __future__ import annotations

__all__ = ["DecodeError", "EncodeError", "LimitExceeded", "WireError"]


class WireError(Exception):
    """Root so callers can catch every wire failure without catching bugs elsewhere."""


class DecodeError(WireError):
    """Untrusted bytes were malformed; safe to drop the frame and carry on."""


class LimitExceeded(DecodeError):
    """Untrusted bytes asked for more resources than we are willing to give."""


class EncodeError(WireError):
    """Raised on the sending side, where the input is ours and the fault is a local bug."""
