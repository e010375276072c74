"""The work gate: one switch in front of the expert methods, so the node stops taking work at once.

``close(reason)`` makes every new ``moe.forward`` / ``moe.backward`` fail with ``RemoteError("unavailable")``
before any tensor is touched (trainers route around such hosts), while calls already inside run to the
end; ``drain`` waits for those, bounded. ``moe.info`` stays open: it costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from engine.p2p import CallContext, Handlers, RemoteError
from engine.wire import Message

GATED = ("moe.forward", "moe.backward")
UNAVAILABLE = "unavailable"


class WorkGate:
    def __init__(self) -> None:
        self.open = False
        self.reason = "starting"
        self.closed_at: float | None = time.monotonic()
        self.refused = 0
        self.served = 0
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def close(self, reason: str) -> None:
        if self.open:
            self.closed_at = time.monotonic()
        self.open = False
        self.reason = reason

    def reopen(self) -> None:
        self.open = True
        self.reason = ""
        self.closed_at = None

    async def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for calls in flight; True when none are left."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        return self._in_flight == 0

    def wrap(self, handlers: Handlers) -> None:
        """Put the gate in front of the gated methods already registered on ``handlers``."""
        for method in GATED:
            inner = handlers.unary.get(method)
            if inner is None or getattr(inner, "__wrapped_by_gate__", None) is self:
                continue

            async def gated(msg: Message, ctx: CallContext, inner: object = inner) -> Message:
                if not self.open:
                    self.refused += 1
                    raise RemoteError(UNAVAILABLE, f"host is not taking work: {self.reason}")
                self._in_flight += 1
                self._idle.clear()
                try:
                    reply: Message = await inner(msg, ctx)  # type: ignore[operator]
                    self.served += 1
                    return reply
                finally:
                    self._in_flight -= 1
                    if self._in_flight == 0:
                        self._idle.set()

            gated.__wrapped_by_gate__ = self  # type: ignore[attr-defined]
            handlers.add_unary(method, gated)
