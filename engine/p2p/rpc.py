"""Remote procedure calls over one framed channel: unary and server-streaming, many in flight.

Both ends of a link can call and serve. Every wait is finite on both sides:

- a call has a timeout (``DEFAULT_TIMEOUT`` unless the caller gives one); a call that times out or
  whose task is cancelled sends CANCEL so the remote stops work it no longer needs;
- a handler and the sending of its reply run under ``handler_deadline`` (a stream's: per item), so a
  caller that stops granting credit, or a handler that never returns, frees its slot in time; the
  caller then gets ``deadline_exceeded`` if the link still carries it;
- CANCEL, CREDIT and error replies are small and sent under ``CONTROL_SEND_TIMEOUT``.

Handler failures come back as :class:`RemoteError` with a code; bytes that do not decode are the
remote's fault: the link is failed with :class:`ProtocolError`.

Memory: a received message counts against the receive window until it is consumed. A request is
consumed when its handler starts (at most ``max_concurrent`` run per link, at most ``max_queued``
wait, as bytes: no task per waiting request), a response when the caller gets it, a stream item
when the consumer takes it. Messages are routed on their header (``peek_message``) and decoded only
when consumed; a handler starts only once the link's memory budget admits its request's decoded
tensors (``LinkMemory.try_charge``), which stay charged until the handler ends.

Streams have their own credit on top of the link's window (:mod:`engine.p2p.rpc_state`); a producer
that queues more than ``max_stream_items`` on one stream ignores its credit, and the link is dropped.

This module is the asyncio face: :class:`RpcEndpoint` routes, sends, waits and times out. What a call
is on both ends (handlers, error replies) is :mod:`engine.p2p.rpc_wire`; the state it keeps per
waiting request and per served stream is :mod:`engine.p2p.rpc_state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
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
    encoded_size,
    peek_message,
)

from .channel import FramedChannel
from .errors import ConnectionLost, ProtocolError, RemoteError, RpcError, RpcTimeout
from .rpc_state import ITEM_OVERHEAD, StreamCredit, Waiting, WaitingRequests
from .rpc_wire import CallContext, CompressionArg, Handlers, error_message, raise_remote, reply_compression

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
DEFAULT_HANDLER_DEADLINE = 60.0
DEFAULT_STREAM_WINDOW = 4 << 20
CONTROL_SEND_TIMEOUT = 5.0


class RpcEndpoint:
    def __init__(
        self,
        channel_factory: Callable[[Callable[[bytearray], None]], FramedChannel],
        handlers: Handlers,
        *,
        peer_id: str,
        limits: Limits,
        max_concurrent: int = 64,
        max_queued: int = 1024,
        handler_deadline: float = DEFAULT_HANDLER_DEADLINE,
        stream_window: int = DEFAULT_STREAM_WINDOW,
        max_stream_items: int = 1 << 17,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.handlers = handlers
        self.peer_id = peer_id
        self.limits = limits
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.handler_deadline = handler_deadline
        self.stream_window = stream_window
        self.max_stream_items = max_stream_items
        self.channel = channel_factory(self._on_message)
        self.memory = self.channel.memory
        self._user_failure = on_failure
        self.channel.on_failure = self._on_failure
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._streams: dict[int, asyncio.Queue[tuple[bytearray, int] | BaseException]] = {}
        self._waiting = WaitingRequests()
        self._serving: dict[int, asyncio.Task[None]] = {}
        self._stream_credit: dict[int, StreamCredit] = {}
        self._control: set[asyncio.Task[None]] = set()
        self.calls_made = 0
        self.calls_served = 0
        self.handler_timeouts = 0  # handlers (or their replies) stopped at the deadline
        self.stream_stalls = 0  # times a served stream waited for its consumer's credit

    @property
    def busy(self) -> bool:
        return bool(self._pending or self._streams or self._serving or self._waiting)

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
        queue: asyncio.Queue[tuple[bytearray, int] | BaseException] = asyncio.Queue()
        self._streams[request_id] = queue
        self.calls_made += 1
        finished = False
        consumed = 0  # bytes taken and not yet granted back to the producer
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
                buffer, size = item
                self.channel.release(size)
                msg = self._decode(buffer)
                if msg.kind == Kind.END:
                    finished = True
                    return
                if msg.kind == Kind.ERROR:
                    finished = True
                    raise_remote(msg)
                consumed += size + ITEM_OVERHEAD
                if consumed >= self.stream_window // 4 or queue.empty():
                    # In batches while items are queued; at once when we have caught up, so a producer
                    # whose window is smaller than our batch never waits on credit we are sitting on.
                    self._send_control(Message(Kind.CREDIT, request_id, fields={"bytes": consumed}))
                    consumed = 0
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
        self._send_control(Message(Kind.CANCEL, request_id))

    def _send_control(self, msg: Message) -> None:
        if self.channel.error is None:
            task = asyncio.ensure_future(self._send_bounded(msg))
            self._control.add(task)
            task.add_done_callback(self._control.discard)

    async def _send_bounded(self, msg: Message) -> None:
        with contextlib.suppress(ConnectionLost, RpcError, TimeoutError):
            async with asyncio.timeout(CONTROL_SEND_TIMEOUT):
                await self._send(msg, Compression.NONE)

    # -- both sides ------------------------------------------------------------------------------

    async def _send(self, msg: Message, compression: CompressionArg) -> int:
        """Send one message; returns its size on the wire."""
        try:
            if _worth_a_thread(msg, compression):
                # Quantizing megabytes takes milliseconds; on the loop it would stall SCTP meanwhile.
                pieces = await asyncio.to_thread(encode_message, msg, compression, limits=self.limits)
            else:
                pieces = encode_message(msg, compression, limits=self.limits)
        except EncodeError as e:
            raise RpcError(f"cannot encode {msg.method or msg.kind.name}: {e}") from e
        await self.channel.send(pieces)
        return encoded_size(pieces)

    def _decode(self, buffer: bytearray) -> Message:
        try:
            return decode_message(buffer, self.limits)
        except DecodeError as e:
            error = ProtocolError(f"undecodable message from {self.peer_id[:12]}: {e}")
            self.channel.fail(error)
            raise ConnectionLost(f"dropped {self.peer_id[:12]}: {error}") from error

    def _on_message(self, buffer: bytearray) -> None:
        size = len(buffer)
        try:
            head = peek_message(buffer, self.limits)
        except DecodeError as e:
            self.channel.fail(ProtocolError(f"undecodable message from {self.peer_id[:12]}: {e}"))
            return
        kind, request_id = head.kind, head.request_id
        if kind == Kind.REQUEST:
            self._enqueue(Waiting(buffer, head, size))
        elif kind in (Kind.RESPONSE, Kind.ERROR) and request_id in self._pending:
            self.channel.release(size)
            with contextlib.suppress(ConnectionLost):
                msg = self._decode(buffer)
                future = self._pending[request_id]
                if not future.done():
                    future.set_result(msg)
        elif kind in (Kind.STREAM, Kind.END, Kind.ERROR) and request_id in self._streams:
            queue = self._streams[request_id]
            if queue.qsize() >= self.max_stream_items:
                self.channel.release(size)
                self.channel.fail(ProtocolError(f"stream {request_id} overran its credit with tiny items"))
                return
            queue.put_nowait((buffer, size))  # decoded when the consumer takes it
        elif kind == Kind.CANCEL:
            self.channel.release(size)
            self._cancel_served(request_id)
        elif kind == Kind.CREDIT:
            self.channel.release(size)
            with contextlib.suppress(ConnectionLost):
                granted = self._decode(buffer).fields.get("bytes")
                if isinstance(granted, bool) or not isinstance(granted, int) or granted <= 0:
                    self.channel.fail(ProtocolError(f"CREDIT of {granted!r} from {self.peer_id[:12]}"))
                    return
                credit = self._stream_credit.get(request_id)
                if credit is not None:
                    credit.grant(granted)
        else:  # a late answer to a call that already timed out or was cancelled
            self.channel.release(size)

    # -- server side -----------------------------------------------------------------------------

    def _enqueue(self, waiting: Waiting) -> None:
        request_id = waiting.head.request_id
        if request_id in self._serving or request_id in self._waiting:
            self.channel.release(waiting.size)
            self.channel.fail(ProtocolError(f"request id {request_id} reused while in flight"))
            return
        if len(self._waiting) >= self.max_queued:
            self.channel.release(waiting.size)
            self.channel.fail(ProtocolError(f"more than {self.max_queued} requests waiting for a handler"))
            return
        self._waiting.append(waiting)
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting requests, in order, while a slot is free and the memory budget admits them."""
        while self._waiting and len(self._serving) < self.max_concurrent and self.channel.error is None:
            waiting = self._waiting.first()
            charged = waiting.head.decoded_bytes
            if not self.memory.try_charge(charged):
                return  # a running handler holds decoded tensors; its end starts this one
            self._waiting.pop_first()
            request_id = waiting.head.request_id
            # Consumed now, not when the task first runs: a CANCEL may cancel it before that.
            self.channel.release(waiting.size)
            task = asyncio.ensure_future(self._run_handler(waiting))
            self._serving[request_id] = task
            task.add_done_callback(functools.partial(self._handler_done, request_id, charged))

    def _handler_done(self, request_id: int, charged: int, _: object = None) -> None:
        self._serving.pop(request_id, None)
        self.memory.release(charged, extra=True)
        self._start_waiting()

    def _cancel_served(self, request_id: int) -> None:
        task = self._serving.get(request_id)
        if task is not None:
            task.cancel()
            return
        waiting = self._waiting.remove(request_id)
        if waiting is not None:
            self.channel.release(waiting.size)

    async def _run_handler(self, waiting: Waiting) -> None:
        request_id, method = waiting.head.request_id, waiting.head.method
        try:
            msg = self._decode(waiting.buffer)
        except ConnectionLost:
            return
        del waiting
        ctx = CallContext(self.peer_id, request_id)
        self.calls_served += 1
        deadline = asyncio.timeout(self.handler_deadline)
        try:
            if method in self.handlers.unary:
                async with deadline:
                    reply = await self.handlers.unary[method](msg, ctx)
                    reply.kind, reply.request_id = Kind.RESPONSE, request_id
                    await self._send(reply, reply_compression(reply))
            elif method in self.handlers.streams:
                await self._serve_stream(self.handlers.streams[method](msg, ctx), request_id)
            else:
                await self._reply_error(request_id, "unknown_method", f"no method {method!r} here")
        except asyncio.CancelledError:
            return  # the caller cancelled; it expects nothing more
        except ConnectionLost:
            return
        except TimeoutError:
            if method in self.handlers.unary and not deadline.expired():
                logger.exception("handler %s failed for %s", method, self.peer_id[:12])
                await self._reply_error(request_id, "internal", "TimeoutError in the handler")
                return
            self.handler_timeouts += 1
            logger.info(
                "%s for %s passed its %.3g s deadline", method, self.peer_id[:12], self.handler_deadline
            )
            await self._reply_error(
                request_id, "deadline_exceeded", f"{method} took over {self.handler_deadline:.3g} s"
            )
        except RemoteError as e:
            await self._reply_error(request_id, e.code, e.message)
        except Exception as e:
            logger.exception("handler %s failed for %s", method, self.peer_id[:12])
            await self._reply_error(request_id, "internal", f"{type(e).__name__}: {e}")

    async def _serve_stream(self, items: AsyncIterator[Message], request_id: int) -> None:
        """Each step (the next item, its credit, its sending) runs under the handler deadline."""
        credit = StreamCredit(self.stream_window)
        self._stream_credit[request_id] = credit
        try:
            while True:
                async with asyncio.timeout(self.handler_deadline):
                    try:
                        item = await anext(items)
                    except StopAsyncIteration:
                        break
                    if credit.available <= 0:
                        self.stream_stalls += 1
                        await credit.wait()
                    item.kind, item.request_id = Kind.STREAM, request_id
                    credit.spend(await self._send(item, reply_compression(item)) + ITEM_OVERHEAD)
            async with asyncio.timeout(self.handler_deadline):
                await self._send(Message(Kind.END, request_id), Compression.NONE)
        finally:
            self._stream_credit.pop(request_id, None)
            close = getattr(items, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    async def _reply_error(self, request_id: int, code: str, text: str) -> None:
        with contextlib.suppress(ConnectionLost, RpcError, TimeoutError):
            async with asyncio.timeout(CONTROL_SEND_TIMEOUT):
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
        self._waiting.clear()
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


def _ignore_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
