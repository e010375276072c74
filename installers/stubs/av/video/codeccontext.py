from ..codec import CodecContext


class VideoCodecContext(CodecContext):
    pass
