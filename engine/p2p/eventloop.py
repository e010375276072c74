"""The event loop every node runs on: uvloop where it can, asyncio's default otherwise.

aiortc's data channels are CPU-bound in Python and pay event-loop cost on every ~1.2 kB SCTP
packet (timers, callbacks, datagram sockets); uvloop runs the same code 1.3-1.7x faster here
(benchmarks/sctp_probe.py). uvloop does not exist on Windows, and may be absent elsewhere, so the
fallback is the standard loop with identical behaviour.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop() -> Any | None:
    if sys.platform == "win32":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's where importable (and not on Windows), else asyncio's."""
    uv = _uvloop()
    if uv is not None:
        return uv.new_event_loop()  # type: ignore[no-any-return]
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Like :func:`asyncio.run`, on a loop from :func:`new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: which loop :func:`new_event_loop` makes."""
    return "uvloop" if _uvloop() is not None else "asyncio"
