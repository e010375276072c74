import enum

from ..frame import Frame


class PictureType(enum.IntEnum):
    NONE = 0
    I = 1  # noqa: E741 (PyAV's name)
    P = 2
    B = 3


class VideoFrame(Frame):
    pass
