"""Messages over one data channel: framing, credit and back-pressure, bound to the channel's events.

The only I/O part of the framing layer (:mod:`engine.p2p.framing` holds the rules). It works with
anything shaped like aiortc's RTCDataChannel (``send``, ``bufferedAmount``, the ``message``,
``bufferedamountlow`` and ``close`` events), so tests can run it over an in-memory pair.

Back-pressure has two stops on the sending side: credit (the receiver's window, so a slow reader
stops us) and ``high_water`` on the channel's ``bufferedAmount`` (so aiortc's unbounded send queue
never grows past it). Together they bound what the sender holds, however slow the receiver.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .errors import ConnectionLost, ProtocolError
from .framing import (
    DATA_OVERHEAD,
    WINDOW,
    Buffer,
    Deframer,
    LinkMemory,
    abort_frame,
    data_frames,
    is_abort,
    message_size,
    parse_window,
    window_frame,
)

logger = logging.getLogger(__name__)

MessageHandler = Callable[[bytearray], None]
TrafficCounter = Callable[[int, int], None]  # (bytes sent, bytes received)


class RateLimiter(Protocol):
    """A token bucket (engine.resources has one): ``try_acquire(n)`` takes ``n`` bytes if allowed now;
    ``acquire(n)`` returns once they are."""

    def try_acquire(self, n: int) -> bool: ...

    async def acquire(self, n: int) -> None: ...


class DataChannelLike(Protocol):
    bufferedAmountLowThreshold: int

    @property
    def bufferedAmount(self) -> int: ...

    @property
    def readyState(self) -> str: ...

    def send(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def on(self, event: str, f: Any) -> Any: ...


class FramedChannel:
    def __init__(
        self,
        channel: DataChannelLike,
        on_message: MessageHandler,
        *,
        max_frame: int,
        window: int = 64 << 20,
        max_message_bytes: int = 32 << 20,
        high_water: int = 1 << 20,
        on_failure: Callable[[BaseException], None] | None = None,
        upload: RateLimiter | None = None,
        download: RateLimiter | None = None,
        on_traffic: TrafficCounter | None = None,
        memory_budget: int | None = None,
    ) -> None:
        """``upload``/``download``: the volunteer's bandwidth caps. Upload is paced before each frame;
        download by pacing the credit granted back, so the remote slows down to our cap (beyond the
        first window, which is granted up front). ``on_traffic`` counts bytes for the data cap.
        ``memory_budget``: what this link may hold for received data (:class:`LinkMemory`; at least
        the window, which is the default)."""
        self.channel = channel
        self.upload = upload
        self.download = download
        self.on_traffic = on_traffic
        self._grants: set[asyncio.Future[None]] = set()
        self.on_message = on_message
        self.on_failure = on_failure
        self.max_frame = max_frame
        self.max_message_bytes = max_message_bytes
        self.high_water = high_water
        if memory_budget is not None and memory_budget < window:
            raise ValueError("memory_budget must be at least the window")
        self.memory = LinkMemory(capacity=memory_budget or window)
        self.deframer = Deframer(window=window, max_message_bytes=max_message_bytes, memory=self.memory)
        self.credit = window
        self.in_progress_budget = window // 2
        self.in_progress = 0
        self.peak_buffered = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.aborts_sent = 0
        self.error: BaseException | None = None
        self._ids = itertools.count(1)
        self._credit_changed = asyncio.Event()
        self._drained = asyncio.Event()
        self._budget_changed = asyncio.Event()
        channel.bufferedAmountLowThreshold = high_water // 2
        channel.on("message", self._on_frame)
        channel.on("bufferedamountlow", self._drained.set)
        channel.on("close", self._on_close)

    # -- sending ---------------------------------------------------------------------------------

    async def send(self, pieces: Sequence[Buffer]) -> None:
        """Send one message; returns when its last frame is handed to the channel."""
        size = message_size(pieces)
        if size > self.max_message_bytes:
            raise ValueError(f"message of {size} bytes is over the {self.max_message_bytes} byte limit")
        while self.in_progress and self.in_progress + size > self.in_progress_budget:
            self._raise_if_failed()
            self._budget_changed.clear()
            await self._budget_changed.wait()
        self.in_progress += size
        started = finished = False
        message_id = next(self._ids) & 0xFFFFFFFF
        try:
            for frame in data_frames(message_id, pieces, self.max_frame):
                payload = len(frame) - (DATA_OVERHEAD if frame[1] & 1 else DATA_OVERHEAD - 8)
                while self.credit < payload:
                    self._raise_if_failed()
                    self._credit_changed.clear()
                    await self._credit_changed.wait()
                while self.channel.bufferedAmount > self.high_water:
                    self._raise_if_failed()
                    self._drained.clear()
                    await self._drained.wait()
                if self.upload is not None and not self.upload.try_acquire(len(frame)):
                    await self.upload.acquire(len(frame))
                self._raise_if_failed()
                self.credit -= payload
                self.channel.send(frame)
                started = True
                finished = bool(frame[1] & 2)
                self.bytes_sent += len(frame)
                if self.on_traffic is not None:
                    self.on_traffic(len(frame), 0)
                buffered = self.channel.bufferedAmount
                if buffered > self.peak_buffered:
                    self.peak_buffered = buffered
        finally:
            self.in_progress -= size
            self._budget_changed.set()
            if started and not finished:
                self._abort(message_id)

    def _abort(self, message_id: int) -> None:
        """Tell the receiver to drop a message we gave up half way (it would hold its bytes forever)."""
        if self.error is None and self.channel.readyState == "open":
            self.channel.send(abort_frame(message_id))
            self.aborts_sent += 1

    def _raise_if_failed(self) -> None:
        if self.error is None and self.channel.readyState in ("closing", "closed"):
            # closed under us before its close event reached fail(): send would raise aiortc's
            # InvalidStateError (no P2PError) at whoever called; a lost connection, for every sender
            self.fail(ConnectionLost(f"data channel {self.channel.readyState}"))
        if self.error is not None:
            raise ConnectionLost(f"channel closed: {self.error}") from self.error

    # -- receiving -------------------------------------------------------------------------------

    def _on_frame(self, frame: bytes | str) -> None:
        if self.error is not None:
            return
        try:
            if not isinstance(frame, bytes):
                raise ProtocolError("text frame on a binary channel")
            self.bytes_received += len(frame)
            if self.on_traffic is not None:
                self.on_traffic(0, len(frame))
            if frame[:1] == bytes([WINDOW]):
                self.credit += parse_window(frame)
                self._credit_changed.set()
                return
            if is_abort(frame):
                dropped = self.deframer.abort(frame)
                if dropped:
                    self.release(dropped)
                return
            completed = self.deframer.feed(frame)
        except ProtocolError as e:
            self.fail(e)
            return
        for _, buffer in completed:
            self.on_message(buffer)

    def release(self, size: int) -> None:
        """The application is done holding a received message of ``size`` bytes."""
        increment = self.deframer.release(size)
        if not increment:
            return
        if self.download is None or self.download.try_acquire(increment):
            self._grant(increment)  # the common case stays synchronous: no task per message
        else:
            paced = asyncio.ensure_future(self._paced_grant(increment, self.download))
            self._grants.add(paced)
            paced.add_done_callback(self._grants.discard)

    def _grant(self, increment: int) -> None:
        if self.error is None and self.channel.readyState == "open":
            self.channel.send(window_frame(increment))

    async def _paced_grant(self, increment: int, download: RateLimiter) -> None:
        await download.acquire(increment)
        self._grant(increment)

    # -- failure ---------------------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Stop: wake every waiting sender with ConnectionLost, close the channel, tell the owner."""
        if self.error is not None:
            return
        self.error = error
        for event in (self._credit_changed, self._drained, self._budget_changed):
            event.set()
        for paced in list(self._grants):
            paced.cancel()
        if self.channel.readyState not in ("closing", "closed"):
            self.channel.close()
        if self.on_failure is not None:
            self.on_failure(error)

    def _on_close(self) -> None:
        self.fail(ConnectionLost("data channel closed"))

    @property
    def transport_buffered(self) -> int:
        return self.channel.bufferedAmount
