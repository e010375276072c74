from .. import _Unavailable


class AudioStream(_Unavailable):
    pass
