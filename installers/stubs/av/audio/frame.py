from ..frame import Frame


class AudioFrame(Frame):
    pass
