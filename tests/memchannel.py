"""An in-memory data channel pair shaped like aiortc's RTCDataChannel, for socket-free tests.

Delivery is asynchronous (call_soon), ordered, and ``bufferedAmount`` drains at ``rate`` bytes per
loop turn, so back-pressure paths run as they would over SCTP. ``max_message_size`` raises like aiortc.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any


class MemoryChannel:
    def __init__(self, max_message_size: int = 262144, rate: int = 1 << 20) -> None:
        self.peer: MemoryChannel | None = None
        self.bufferedAmountLowThreshold = 0
        self.bufferedAmount = 0
        self.readyState = "open"
        self.max_message_size = max_message_size
        self.rate = rate
        self.sent_frames = 0
        self.paused = False
        self._queue: deque[bytes] = deque()
        self._listeners: dict[str, list[Callable[..., Any]]] = {}
        self._pumping = False

    def on(self, event: str, f: Callable[..., Any] | None = None) -> Any:
        assert f is not None
        self._listeners.setdefault(event, []).append(f)
        return f

    def remove_listener(self, event: str, f: Callable[..., Any]) -> None:
        self._listeners[event].remove(f)

    def emit(self, event: str, *args: Any) -> None:
        for f in list(self._listeners.get(event, [])):
            f(*args)

    def send(self, data: bytes) -> None:
        if self.readyState != "open":
            raise RuntimeError("InvalidStateError")
        if len(data) > self.max_message_size:
            raise ValueError(f"message of {len(data)} bytes over {self.max_message_size}")
        self.sent_frames += 1
        self.bufferedAmount += len(data)
        self._queue.append(data)
        if not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        budget = self.rate
        while self._queue and budget > 0 and not self.paused:
            data = self._queue.popleft()
            budget -= len(data)
            before = self.bufferedAmount
            self.bufferedAmount -= len(data)
            if before > self.bufferedAmountLowThreshold >= self.bufferedAmount:
                self.emit("bufferedamountlow")
            if self.peer is not None and self.peer.readyState == "open":
                self.peer.emit("message", data)
        if self._queue and self.readyState == "open":
            asyncio.get_running_loop().call_later(0.001 if self.paused else 0, self._pump)
        else:
            self._pumping = False

    def inject(self, data: bytes) -> None:
        """Deliver raw bytes to this channel as if the remote sent them (for hostile-peer tests)."""
        self.emit("message", data)

    def close(self) -> None:
        if self.readyState == "closed":
            return
        self.readyState = "closed"
        self.emit("close")
        if self.peer is not None:
            self.peer.close()


def channel_pair(**kwargs: Any) -> tuple[MemoryChannel, MemoryChannel]:
    a, b = MemoryChannel(**kwargs), MemoryChannel(**kwargs)
    a.peer, b.peer = b, a
    return a, b
