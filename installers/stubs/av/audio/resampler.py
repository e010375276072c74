from .. import _Unavailable


class AudioResampler(_Unavailable):
    pass
