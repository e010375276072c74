"""``av.frame.Frame`` stand-in (see the package docstring)."""

from . import _Unavailable


class Frame(_Unavailable):
    pass
