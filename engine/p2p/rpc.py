"""Remote procedure calls over one framed channel: unary and server-streaming, many in flight.

Both ends of a link can call and serve. Each call has a finite timeout (``DEFAULT_TIMEOUT`` unless the
caller gives one); a call that times out or whose task is cancelled sends CANCEL so the remote stops
work it no longer needs. Handler failures come back as :class:`RemoteError` with a code; bytes that
do not decode are the remote's fault: the link is failed with :class:`ProtocolError`.

Memory: a received message counts against the receive window until it is consumed. A request is
consumed when its handler starts (at most ``max_concurrent`` run per link; the rest wait, holding
window), a response when the caller gets it, a stream item when the consumer takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.wire import (
    Compression,
    DecodeError,
    EncodeError,
    Kind,
    Limits,
    Message,
    decode_message,
    encode_message,
)

from .channel import FramedChannel
from .errors import (
    ConnectionLost,
    ProtocolError,
    RemoteError,
    RpcCancelled,
    RpcError,
    RpcTimeout,
    UnknownMethod,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
UnaryHandler = Callable[[Message, "CallContext"], Awaitable[Message]]
StreamHandler = Callable[[Message, "CallContext"], AsyncIterator[Message]]
CompressionArg = Compression | Sequence[Compression]


@dataclass(frozen=True)
class CallContext:
    peer_id: str
    request_id: int


@dataclass
class Handlers:
    """Methods a node serves, by name. Shared by all of its links."""

    unary: dict[str, UnaryHandler] = field(default_factory=dict)
    streams: dict[str, StreamHandler] = field(default_factory=dict)

    def add_unary(self, method: str, handler: UnaryHandler) -> None:
        self.unary[method] = handler

    def add_stream(self, method: str, handler: StreamHandler) -> None:
        self.streams[method] = handler


def error_message(request_id: int, code: str, text: str) -> Message:
    return Message(kind=Kind.ERROR, request_id=request_id, fields={"code": code, "message": text[:1000]})


def raise_remote(msg: Message) -> None:
    code = str(msg.fields.get("code", "internal"))
    text = str(msg.fields.get("message", ""))
    if code == "unknown_method":
        raise UnknownMethod(code, text)
    if code == "cancelled":
        raise RpcCancelled(text)
    raise RemoteError(code, text)


class RpcEndpoint:
    def __init__(
        self,
        channel_factory: Callable[[Callable[[bytearray], None]], FramedChannel],
        handlers: Handlers,
        *,
        peer_id: str,
        limits: Limits,
        max_concurrent: int = 64,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.handlers = handlers
        self.peer_id = peer_id
        self.limits = limits
        self.channel = channel_factory(self._on_message)
        self._user_failure = on_failure
        self.channel.on_failure = self._on_failure
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._streams: dict[int, asyncio.Queue[tuple[Message, int] | BaseException]] = {}
        self._serving: dict[int, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(max_concurrent)
        self.calls_made = 0
        self.calls_served = 0

    # -- client side -----------------------------------------------------------------------------

    async def call(
        self,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        compression: CompressionArg = Compression.NONE,
    ) -> Message:
        request_id = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self.calls_made += 1
        try:
            async with asyncio.timeout(timeout):
                await self._send(
                    Message(Kind.REQUEST, request_id, method, fields or {}, list(tensors)), compression
                )
                reply = await future
        except TimeoutError as e:
            self._cancel_remote(request_id)
            raise RpcTimeout(f"{method} to {self.peer_id[:12]}: no answer within {timeout:.3g} s") from e
        except asyncio.CancelledError:
            self._cancel_remote(request_id)
            raise
        finally:
            self._pending.pop(request_id, None)
        if reply.kind == Kind.ERROR:
            raise_remote(reply)
        return reply

    async def stream(
        self,
        method: str,
        fields: dict[str, Any] | None = None,
        tensors: Sequence[torch.Tensor] = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        compression: CompressionArg = Compression.NONE,
    ) -> AsyncIterator[Message]:
        """Yield the remote's stream items; ``timeout`` bounds the wait for each one."""
        request_id = next(self._ids)
        queue: asyncio.Queue[tuple[Message, int] | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        self.calls_made += 1
        finished = False
        try:
            async with asyncio.timeout(timeout):
                await self._send(
                    Message(Kind.REQUEST, request_id, method, fields or {}, list(tensors)), compression
                )
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        item = await queue.get()
                except TimeoutError as e:
                    raise RpcTimeout(
                        f"{method} stream from {self.peer_id[:12]}: idle for {timeout:.3g} s"
                    ) from e
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                msg, size = item
                self.channel.release(size)
                if msg.kind == Kind.END:
                    finished = True
                    return
                if msg.kind == Kind.ERROR:
                    finished = True
                    raise_remote(msg)
                yield msg
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._cancel_remote(request_id)
            while not queue.empty():  # give back window held by items nobody will read
                leftover = queue.get_nowait()
                if not isinstance(leftover, BaseException):
                    self.channel.release(leftover[1])

    def _cancel_remote(self, request_id: int) -> None:
        if self.channel.error is None:
            task = asyncio.ensure_future(self._send(Message(Kind.CANCEL, request_id), Compression.NONE))
            task.add_done_callback(_ignore_result)

    # -- both sides ------------------------------------------------------------------------------

    async def _send(self, msg: Message, compression: CompressionArg) -> None:
        try:
            if _worth_a_thread(msg, compression):
                # Quantizing megabytes takes milliseconds; on the loop it would stall SCTP meanwhile.
                pieces = await asyncio.to_thread(encode_message, msg, compression, limits=self.limits)
            else:
                pieces = encode_message(msg, compression, limits=self.limits)
        except EncodeError as e:
            raise RpcError(f"cannot encode {msg.method or msg.kind.name}: {e}") from e
        await self.channel.send(pieces)

    def _on_message(self, buffer: bytearray) -> None:
        size = len(buffer)
        try:
            msg = decode_message(buffer, self.limits)
        except DecodeError as e:
            self.channel.fail(ProtocolError(f"undecodable message from {self.peer_id[:12]}: {e}"))
            return
        kind = msg.kind
        if kind == Kind.REQUEST:
            self._serve(msg, size)
        elif kind in (Kind.RESPONSE, Kind.ERROR) and msg.request_id in self._pending:
            self.channel.release(size)
            future = self._pending[msg.request_id]
            if not future.done():
                future.set_result(msg)
        elif kind in (Kind.STREAM, Kind.END, Kind.ERROR) and msg.request_id in self._streams:
            self._streams[msg.request_id].put_nowait((msg, size))
        elif kind == Kind.CANCEL:
            self.channel.release(size)
            task = self._serving.get(msg.request_id)
            if task is not None:
                task.cancel()
        else:  # a late answer to a call that already timed out or was cancelled
            self.channel.release(size)

    # -- server side -----------------------------------------------------------------------------

    def _serve(self, msg: Message, size: int) -> None:
        request_id = msg.request_id
        if request_id in self._serving:
            self.channel.release(size)
            self.channel.fail(ProtocolError(f"request id {request_id} reused while in flight"))
            return
        task = asyncio.ensure_future(self._run_handler(msg, size))
        self._serving[request_id] = task
        task.add_done_callback(lambda _: self._serving.pop(request_id, None))

    async def _run_handler(self, msg: Message, size: int) -> None:
        ctx = CallContext(self.peer_id, msg.request_id)
        try:
            async with self._slots:
                self.channel.release(size)
                self.calls_served += 1
                if msg.method in self.handlers.unary:
                    reply = await self.handlers.unary[msg.method](msg, ctx)
                    reply.kind, reply.request_id = Kind.RESPONSE, msg.request_id
                    await self._send(reply, reply_compression(reply))
                elif msg.method in self.handlers.streams:
                    async for item in self.handlers.streams[msg.method](msg, ctx):
                        item.kind, item.request_id = Kind.STREAM, msg.request_id
                        await self._send(item, reply_compression(item))
                    await self._send(Message(Kind.END, msg.request_id), Compression.NONE)
                else:
                    await self._reply_error(
                        msg.request_id, "unknown_method", f"no method {msg.method!r} here"
                    )
        except asyncio.CancelledError:
            return  # the caller cancelled; it expects nothing more
        except ConnectionLost:
            return
        except RemoteError as e:
            await self._reply_error(msg.request_id, e.code, e.message)
        except Exception as e:
            logger.exception("handler %s failed for %s", msg.method, self.peer_id[:12])
            await self._reply_error(msg.request_id, "internal", f"{type(e).__name__}: {e}")

    async def _reply_error(self, request_id: int, code: str, text: str) -> None:
        with contextlib.suppress(ConnectionLost):
            await self._send(error_message(request_id, code, text), Compression.NONE)

    # -- failure ---------------------------------------------------------------------------------

    def _on_failure(self, error: BaseException) -> None:
        lost = (
            error
            if isinstance(error, ConnectionLost)
            else ConnectionLost(f"link to {self.peer_id[:12]} failed: {error}")
        )
        if isinstance(error, ProtocolError):
            lost = ConnectionLost(f"dropped {self.peer_id[:12]}: {error}")
            lost.__cause__ = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(lost)
        for queue in self._streams.values():
            queue.put_nowait(lost)
        for task in list(self._serving.values()):
            task.cancel()
        if self._user_failure is not None:
            self._user_failure(error)

    def close(self) -> None:
        self.channel.fail(ConnectionLost("closed locally"))


THREAD_ENCODE_ELEMENTS = 1 << 18


def _worth_a_thread(msg: Message, compression: CompressionArg) -> bool:
    if compression == Compression.NONE or (
        not isinstance(compression, Compression) and all(c == Compression.NONE for c in compression)
    ):
        return False
    return sum(t.numel() for t in msg.tensors) >= THREAD_ENCODE_ELEMENTS


def reply_compression(msg: Message) -> CompressionArg:
    return msg.compression


def _ignore_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
