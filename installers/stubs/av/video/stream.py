from .. import _Unavailable


class VideoStream(_Unavailable):
    pass
