"""``av.video`` stand-ins (see the ``av`` stub's docstring)."""

from . import codeccontext, frame, stream

__all__ = ["codeccontext", "frame", "stream"]
