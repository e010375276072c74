"""A stand-in for PyAV inside the bundle: aiortc imports ``av`` at import time, Learning@home never
uses audio or video.

aiortc (1.16) imports PyAV's frame, packet and codec classes when ``aiortc`` is imported, for its media
tracks and codecs; the product opens data channels only (``engine.p2p``), where no codec, frame or
packet is ever created. PyAV and its FFmpeg libraries weigh 102 MiB of the bundle, so the spec puts this
package first on the analysis path in their place (installers/learning-at-home.spec): the names aiortc
imports exist, and creating any of them raises :class:`MediaUnavailable` with a sentence saying why.
``tests/installers/test_av_stub.py`` runs a real aiortc data channel with only this package as ``av``;
the self-test does the same in every bundle. A source checkout uses the real PyAV.
"""

from __future__ import annotations

from typing import Any, NoReturn

__version__ = "0+learning-at-home-stub"
STUB = True


class MediaUnavailable(NotImplementedError):
    """Audio and video are not part of Learning@home's bundle (data channels only)."""


class FFmpegError(Exception):
    """PyAV's base error, for ``except av.FFmpegError`` clauses."""


class _Unavailable:
    """Base of every stand-in class: defining and annotating with it works, creating one raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unavailable(type(self).__name__)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> NoReturn:
        _unavailable(f"{cls.__name__}.create")


def _unavailable(what: str) -> NoReturn:
    raise MediaUnavailable(f"{what}: audio and video codecs are not in this bundle (data channels only)")


def open(*args: Any, **kwargs: Any) -> NoReturn:
    _unavailable("av.open")


from .audio.frame import AudioFrame  # noqa: E402  (the submodules need _Unavailable defined first)
from .audio.resampler import AudioResampler  # noqa: E402
from .codec import CodecContext  # noqa: E402
from .packet import Packet  # noqa: E402
from .video.frame import VideoFrame  # noqa: E402

__all__ = [
    "AudioFrame", "AudioResampler", "CodecContext", "FFmpegError", "MediaUnavailable", "Packet", "VideoFrame",
    "open",
]
