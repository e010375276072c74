"""RPC over an in-memory channel pair: the protocol logic without sockets."""

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from engine.p2p.channel import FramedChannel
from engine.p2p.errors import ConnectionLost, RemoteError, RpcError, RpcTimeout, UnknownMethod
from engine.p2p.rpc import RpcEndpoint
from engine.p2p.rpc_wire import CallContext, Handlers
from engine.wire import Compression, Kind, Limits, Message
from tests.memchannel import MemoryChannel, channel_pair

WINDOW = 4 << 20


def endpoint(ch: MemoryChannel, handlers: Handlers, name: str) -> RpcEndpoint:
    def make(on_message):  # type: ignore[no-untyped-def]
        return FramedChannel(
            ch,
            on_message,
            max_frame=16384,
            window=WINDOW,
            max_message_bytes=WINDOW // 2,
            high_water=256 << 10,
        )

    return RpcEndpoint(make, handlers, peer_id=name * 40, limits=Limits(max_message_bytes=WINDOW // 2))


class Server:
    def __init__(self) -> None:
        self.handlers = Handlers()
        self.cancelled = asyncio.Event()
        self.consumed = 0
        self.handlers.add_unary("double", self.double)
        self.handlers.add_unary("sleep", self.sleep)
        self.handlers.add_unary("boom", self.boom)
        self.handlers.add_unary("refuse", self.refuse)
        self.handlers.add_stream("count", self.count)
        self.handlers.add_stream("stall", self.stall)

    async def double(self, msg: Message, ctx: CallContext) -> Message:
        return Message(
            Kind.RESPONSE, 0, fields={"n": msg.fields["n"] * 2}, tensors=[t * 2 for t in msg.tensors]
        )

    async def sleep(self, msg: Message, ctx: CallContext) -> Message:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Message(Kind.RESPONSE, 0)

    async def boom(self, msg: Message, ctx: CallContext) -> Message:
        raise ZeroDivisionError("division by zero")

    async def refuse(self, msg: Message, ctx: CallContext) -> Message:
        raise RemoteError("bad_shape", "expected [*, 16]")

    async def count(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(int(msg.fields["n"])):
            yield Message(
                Kind.STREAM, 0, fields={"i": i}, tensors=[torch.full((int(msg.fields["size"]),), float(i))]
            )

    async def stall(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        yield Message(Kind.STREAM, 0, fields={"i": 0})
        await asyncio.sleep(60)
        yield Message(Kind.STREAM, 0, fields={"i": 1})


@pytest.fixture
def pair() -> tuple[RpcEndpoint, RpcEndpoint, Server, MemoryChannel, MemoryChannel]:
    a, b = channel_pair(max_message_size=16384)
    server = Server()
    client = endpoint(a, Handlers(), "b")
    remote = endpoint(b, server.handlers, "a")
    return client, remote, server, a, b


async def test_unary_round_trip_with_tensors(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _, _, _ = pair
    x = torch.randn(300, 64)
    reply = await client.call("double", {"n": 21}, [x], timeout=5)
    assert reply.fields["n"] == 42
    assert torch.equal(reply.tensors[0], x * 2)


async def test_many_calls_in_flight_on_one_channel(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _, _, _ = pair
    xs = [torch.randn(100 * (i + 1)) for i in range(40)]
    replies = await asyncio.gather(
        *(client.call("double", {"n": i}, [x], timeout=10) for i, x in enumerate(xs))
    )
    for i, (x, r) in enumerate(zip(xs, replies, strict=True)):
        assert r.fields["n"] == 2 * i and torch.equal(r.tensors[0], 2 * x)


async def test_compressed_request(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _, _a, _ = pair
    x = torch.randn(1 << 16)
    reply = await client.call("double", {"n": 1}, [x], timeout=5, compression=Compression.INT8)
    assert (reply.tensors[0] - 2 * x).abs().max() < 2 * x.abs().max() / 100
    assert client.channel.bytes_sent < x.numel() * 4 / 3


async def test_stream(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _, _, _ = pair
    got = [m async for m in client.stream("count", {"n": 5, "size": 10}, timeout=5)]
    assert [m.fields["i"] for m in got] == list(range(5))


async def test_timeout_is_typed_and_cancels_the_remote_handler(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, server, _, _ = pair
    with pytest.raises(RpcTimeout):
        await client.call("sleep", timeout=0.2)
    await asyncio.wait_for(server.cancelled.wait(), 5)


async def test_caller_cancellation_reaches_the_remote(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, server, _, _ = pair
    task = asyncio.ensure_future(client.call("sleep", timeout=30))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(server.cancelled.wait(), 5)


async def test_remote_errors_are_typed(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _, _, _ = pair
    with pytest.raises(UnknownMethod):
        await client.call("nope", timeout=5)
    with pytest.raises(RemoteError) as err:
        await client.call("boom", timeout=5)
    assert err.value.code == "internal" and "ZeroDivisionError" in err.value.message
    with pytest.raises(RemoteError) as err:
        await client.call("refuse", timeout=5)
    assert err.value.code == "bad_shape"
    assert (await client.call("double", {"n": 1}, timeout=5)).fields["n"] == 2  # still serving


async def test_stream_that_stops_answering_times_out(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _server, _, _ = pair
    seen = []
    with pytest.raises(RpcTimeout):
        async for m in client.stream("stall", timeout=0.3):
            seen.append(m.fields["i"])
    assert seen == [0]


async def test_malformed_message_drops_the_link_and_fails_pending_calls(pair) -> None:  # type: ignore[no-untyped-def]
    client, remote, _, a, b = pair
    pending = asyncio.ensure_future(client.call("sleep", timeout=10))
    await asyncio.sleep(0.05)
    # A well-framed message whose bytes are not a valid wire message: the remote's fault.
    b.inject(b"\x00\x03\x01\x00\x00\x00" + (4).to_bytes(8, "little") + b"junk")
    assert remote.channel.error is not None
    with pytest.raises(ConnectionLost):
        await asyncio.wait_for(pending, 5)
    assert a.readyState == "closed"


async def test_oversized_message_is_refused_before_sending(pair) -> None:  # type: ignore[no-untyped-def]
    client, _, _, _a, _ = pair
    with pytest.raises(RpcError, match="exceeds max_message_bytes"):
        await client.call("double", {"n": 1}, [torch.zeros(WINDOW // 4 + 1)], timeout=5)
    assert (await client.call("double", {"n": 1}, timeout=5)).fields["n"] == 2


async def test_slow_reader_bounds_what_the_sender_holds(pair) -> None:  # type: ignore[no-untyped-def]
    client, remote, _, _a, _b = pair
    # 40 items of 512 KiB = 20 MiB through a 4 MiB window to a consumer that reads slowly.
    peak_held = 0
    n = 0
    async for _ in client.stream("count", {"n": 40, "size": 128 << 10}, timeout=10):
        n += 1
        peak_held = max(peak_held, client.channel.deframer.held)
        await asyncio.sleep(0.01)
    assert n == 40
    assert peak_held <= WINDOW
    assert remote.channel.peak_buffered <= (256 << 10) + 16384
