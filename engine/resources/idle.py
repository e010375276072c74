"""Seconds since the user last touched keyboard or mouse, behind one interface.

``IdleSource.read()`` returns an ``IdleReading``: seconds, or ``None`` with a plain reason where the platform
gives nothing (a Wayland session without an idle portal, no display at all). Implementations:

- X11: the MIT-SCREEN-SAVER extension through python-xlib (``DISPLAY``); tested under Xvfb.
- Windows: ``GetLastInputInfo`` (user32). It only sees the caller's session, so the tray process reads it.
- macOS: ``CGEventSourceSecondsSinceLastEventType`` (CoreGraphics), any input event, HID system state.

The Windows and macOS readers are written against the documented C signatures and cannot be run here.

Where the node cannot see the user's input itself (on Windows only the user's own session may call
``GetLastInputInfo``; on Wayland only the desktop answers), the tray app reads it and feeds it through
the control API: :class:`FedIdle` prefers that reading while it is fresh and falls back to the node's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class IdleReading:
    seconds: float | None
    reason: str = ""  # why ``seconds`` is None


class IdleSource(Protocol):
    def read(self) -> IdleReading: ...

    def close(self) -> None: ...


class UnknownIdle:
    """A platform that says nothing about user input."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> IdleReading:
        return IdleReading(None, self.reason)

    def close(self) -> None:
        pass


MAX_FED_IDLE_S = 10 * 365 * 86_400.0


class FedIdle:
    """Idle seconds fed by the user's tray app, preferred over ``fallback`` while younger than ``fresh_s``.

    Between feeds the reading grows with the monotonic clock (nobody touched anything that the app saw);
    once the app stops feeding (it quit, or hangs) the node's own reading takes over again, so a dead app
    can never keep the node believing that the user is away for longer than ``fresh_s``.
    """

    def __init__(
        self,
        fallback: Callable[[], IdleReading],
        *,
        fresh_s: float = 10.0,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fallback = fallback
        self.fresh_s = fresh_s
        self._mono = mono
        self._fed: tuple[float, float, str] | None = None  # seconds, monotonic time, source
        self.feeds = 0

    def feed(self, seconds: float, source: str) -> None:
        """Raises ValueError for anything that is not a plausible number of seconds."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ValueError("idle seconds must be a finite number")
        if not 0 <= seconds <= MAX_FED_IDLE_S:
            raise ValueError(f"idle seconds must be between 0 and {MAX_FED_IDLE_S:.0f}")
        self._fed = (float(seconds), self._mono(), source[:64])
        self.feeds += 1

    @property
    def source(self) -> str | None:
        """Who the current reading comes from: the feeder's name while fresh, else ``None`` (the node)."""
        fed = self._fed
        if fed is None or self._mono() - fed[1] > self.fresh_s:
            return None
        return fed[2]

    def read(self) -> IdleReading:
        fed = self._fed
        if fed is not None:
            age = self._mono() - fed[1]
            if 0 <= age <= self.fresh_s:
                return IdleReading(fed[0] + age)
        return self._fallback()


class X11Idle:
    """MIT-SCREEN-SAVER's idle counter (milliseconds since the last input the X server saw)."""

    def __init__(self, display: str | None = None) -> None:
        self._name = display
        self._display: Any = None

    def _connect(self) -> Any:
        from Xlib import display as xdisplay  # type: ignore[import-untyped]
        from Xlib.ext import screensaver  # type: ignore[import-untyped]  # noqa: F401 (registers methods)

        d = xdisplay.Display(self._name)
        if not d.has_extension("MIT-SCREEN-SAVER"):
            d.close()
            raise OSError("the X server has no MIT-SCREEN-SAVER extension")
        return d

    def read(self) -> IdleReading:
        try:
            if self._display is None:
                self._display = self._connect()
            info = self._display.screen().root.screensaver_query_info()
            return IdleReading(info.idle / 1000.0)
        except Exception as e:  # Xlib raises many types (DisplayError, ConnectionClosedError, OSError...)
            self.close()
            return IdleReading(None, f"X11 idle time unavailable: {e}")

    def close(self) -> None:
        if self._display is not None:
            with contextlib.suppress(Exception):
                self._display.close()
            self._display = None


class WindowsIdle:
    """``GetLastInputInfo``: tick of the last input in this session; ``GetTickCount`` wraps at 2^32 ms."""

    def __init__(self) -> None:
        if sys.platform == "win32":

            class LASTINPUTINFO(ctypes.Structure):
                _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint32)]

            self._info = LASTINPUTINFO()
            self._info.cbSize = ctypes.sizeof(LASTINPUTINFO)
            user32 = ctypes.WinDLL("user32")
            kernel32 = ctypes.WinDLL("kernel32")
            self._get_last = user32.GetLastInputInfo
            self._get_last.argtypes = [ctypes.POINTER(LASTINPUTINFO)]
            self._get_last.restype = ctypes.c_int
            self._ticks = kernel32.GetTickCount
            self._ticks.restype = ctypes.c_uint32

    def read(self) -> IdleReading:
        if sys.platform != "win32":
            return IdleReading(None, "GetLastInputInfo exists only on Windows")
        if not self._get_last(ctypes.byref(self._info)):
            return IdleReading(None, "GetLastInputInfo failed")
        elapsed_ms = (self._ticks() - self._info.dwTime) & 0xFFFFFFFF
        return IdleReading(elapsed_ms / 1000.0)

    def close(self) -> None:
        pass


class MacIdle:
    """``CGEventSourceSecondsSinceLastEventType(kCGEventSourceStateHIDSystemState, kCGAnyInputEventType)``."""

    HID_SYSTEM_STATE = 1
    ANY_INPUT_EVENT = 0xFFFFFFFF  # kCGAnyInputEventType = ~0

    def __init__(self) -> None:
        path = ctypes.util.find_library("CoreGraphics") or (
            "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
        )
        lib = ctypes.CDLL(path)
        self._fn = lib.CGEventSourceSecondsSinceLastEventType
        self._fn.argtypes = [ctypes.c_int32, ctypes.c_uint32]
        self._fn.restype = ctypes.c_double

    def read(self) -> IdleReading:
        seconds = float(self._fn(self.HID_SYSTEM_STATE, self.ANY_INPUT_EVENT))
        if seconds < 0 or seconds != seconds:
            return IdleReading(None, "macOS returned no idle time")
        return IdleReading(seconds)

    def close(self) -> None:
        pass


def default_idle_source(environ: dict[str, str] | None = None, platform: str = sys.platform) -> IdleSource:
    """The right reader for this platform and session, or an ``UnknownIdle`` saying why there is none."""
    env = os.environ if environ is None else environ
    try:
        if platform == "win32":
            return WindowsIdle()
        if platform == "darwin":
            return MacIdle()
    except OSError as e:
        return UnknownIdle(f"the system's idle-time call could not be loaded ({e})")
    if env.get("XDG_SESSION_TYPE") == "wayland" or env.get("WAYLAND_DISPLAY"):
        # XWayland's counter only sees input to X11 windows, so it would call an active user idle.
        return UnknownIdle("this Wayland session does not report idle time to applications")
    if env.get("DISPLAY"):
        return X11Idle(env["DISPLAY"])
    return UnknownIdle("no display: the computer has no graphical session to watch")
