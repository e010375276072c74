"""``av.audio`` stand-ins (see the ``av`` stub's docstring)."""

from .stream import AudioStream

__all__ = ["AudioStream"]
