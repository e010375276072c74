"""What a call is on both ends of a link, with no I/O: the handler registry, error replies and reply shapes.

A node serves its methods from one :class:`Handlers` (shared by all of its links); each handler gets
the message and a :class:`CallContext`. A failed call travels as an ERROR message whose ``code`` says
why (``error_message``); the caller turns it back into the package's exception (``raise_remote``):
``unknown_method`` into :class:`UnknownMethod`, ``cancelled`` into :class:`RpcCancelled`, any other code
into :class:`RemoteError`. A reply is compressed as its handler asked (``reply_compression``).

The asyncio face that sends and receives these is :mod:`engine.p2p.rpc`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from engine.wire import Compression, Kind, Message

from .errors import RemoteError, RpcCancelled, UnknownMethod

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


def reply_compression(msg: Message) -> CompressionArg:
    return msg.compression
