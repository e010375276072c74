"""The far end of an RPC link driven by hand, for tests of what an endpoint does with exact messages.

A real :class:`FramedChannel` on an in-memory channel and the real wire encoding, without an
:class:`RpcEndpoint` on top: the test decides every message the peer sends (a CREDIT of one byte, a
request id used twice, bytes that do not decode) and sees every message it receives, in order. It
grants stream credit only when told to, so a producer's window is exactly what the test gives it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from engine.p2p.channel import FramedChannel
from engine.p2p.framing import data_frames
from engine.p2p.rpc import RpcEndpoint
from engine.wire import Kind, Message, decode_message, encode_message
from tests.memchannel import MemoryChannel

WINDOW = 4 << 20


class Peer:
    def __init__(self, channel: MemoryChannel) -> None:
        self.got: list[Message] = []
        self.channel = FramedChannel(
            channel, self._on_message, max_frame=16384, window=WINDOW, max_message_bytes=WINDOW // 2
        )

    def _on_message(self, buffer: bytearray) -> None:
        self.channel.release(len(buffer))
        self.got.append(decode_message(buffer))

    async def send(self, msg: Message) -> None:
        await self.channel.send(encode_message(msg))

    async def send_raw(self, data: bytes) -> None:
        await self.channel.send([data])

    def kinds(self) -> list[Kind]:
        return [m.kind for m in self.got]

    def items(self) -> list[Any]:
        return [m.fields.get("i") for m in self.got if m.kind == Kind.STREAM]


def undecodable(kind: Kind, request_id: int, method: str = "") -> bytes:
    """A message whose header passes every check ``peek_message`` makes, but one of whose fields is
    a msgpack extension type the decoder does not know: it fails only when decoded in full."""
    header = msgspec.msgpack.encode([int(kind), request_id, method, {"x": msgspec.msgpack.Ext(5, b"")}, []])
    return struct.pack("<I", len(header)) + header


def feed(endpoint: RpcEndpoint, data: bytes, message_id: int = 1) -> None:
    """Hand one message straight to an endpoint's channel, so an exception in on_message reaches
    the test instead of the event loop's handler."""
    for frame in data_frames(message_id, [data], 16384):
        endpoint.channel._on_frame(frame)


async def settle(turns: int = 30) -> None:
    """Let in-memory deliveries and the tasks they start run: a few loop turns, no wall-clock wait."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def until(condition: Callable[[], object], what: str) -> None:
    """Wait for ``condition``, at most 5 s; name what did not happen if it does not."""
    try:
        async with asyncio.timeout(5):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"no {what} within 5 s") from None
