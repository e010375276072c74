"""``av.packet.Packet`` stand-in (see the package docstring)."""

from . import _Unavailable


class Packet(_Unavailable):
    pass
