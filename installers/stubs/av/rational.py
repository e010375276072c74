"""``av.rational`` stand-in (see the package docstring)."""

from . import _Unavailable


class AVRational(_Unavailable):
    pass
