"""``av.CodecContext`` stand-in (see the package docstring)."""

from . import _Unavailable


class CodecContext(_Unavailable):
    pass
