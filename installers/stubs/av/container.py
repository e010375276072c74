"""``av.container`` stand-ins (see the package docstring)."""

from . import _Unavailable


class InputContainer(_Unavailable):
    pass


class OutputContainer(_Unavailable):
    pass
