"""Server-side deadlines, the waiting queue, stream credit and decoded-size budget: every wait finite,
every byte held bounded."""

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from engine.p2p.channel import FramedChannel
from engine.p2p.errors import ConnectionLost, RemoteError
from engine.p2p.rpc import RpcEndpoint
from engine.p2p.rpc_wire import CallContext, Handlers
from engine.wire import Compression, Kind, Limits, Message, encode_message_bytes, peek_message
from tests.memchannel import MemoryChannel, channel_pair

WINDOW = 4 << 20


def endpoint(ch: MemoryChannel, handlers: Handlers, name: str, **kwargs: object) -> RpcEndpoint:
    budget = kwargs.pop("memory_budget", None)

    def make(on_message):  # type: ignore[no-untyped-def]
        return FramedChannel(
            ch,
            on_message,
            max_frame=16384,
            window=WINDOW,
            max_message_bytes=WINDOW // 2,
            memory_budget=budget,
        )

    return RpcEndpoint(
        make, handlers, peer_id=name * 40, limits=Limits(max_message_bytes=WINDOW // 2), **kwargs
    )  # type: ignore[arg-type]


def handlers(gate: asyncio.Event, started: list[int]) -> Handlers:
    h = Handlers()

    async def slow(msg: Message, ctx: CallContext) -> Message:
        started.append(ctx.request_id)
        await gate.wait()
        return Message(Kind.RESPONSE, 0)

    async def items(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(int(msg.fields["n"])):
            yield Message(Kind.STREAM, 0, fields={"i": i}, tensors=[torch.zeros(1 << 16)])  # 256 KiB

    h.add_unary("slow", slow)
    h.add_stream("items", items)
    return h


async def test_a_handler_past_its_deadline_answers_deadline_exceeded() -> None:
    a, b = channel_pair(max_message_size=16384)
    gate, started = asyncio.Event(), []
    client = endpoint(a, Handlers(), "c")
    server = endpoint(b, handlers(gate, started), "s", handler_deadline=0.3)
    with pytest.raises(RemoteError) as err:
        await client.call("slow", timeout=10)
    assert err.value.code == "deadline_exceeded"
    assert server.handler_timeouts == 1 and not server.busy


async def test_requests_wait_as_bytes_up_to_max_queued() -> None:
    a, b = channel_pair(max_message_size=16384)
    gate, started = asyncio.Event(), []
    client = endpoint(a, Handlers(), "c")
    server = endpoint(b, handlers(gate, started), "s", max_concurrent=2, max_queued=3)
    calls = [asyncio.ensure_future(client.call("slow", timeout=10)) for _ in range(5)]
    async with asyncio.timeout(10):
        while len(server._waiting) < 3:
            await asyncio.sleep(0.01)
    assert len(started) == 2 and len(server._serving) == 2  # no task for a waiting request
    calls[2].cancel()  # CANCEL reaches a request still waiting: it leaves the queue
    async with asyncio.timeout(10):
        while len(server._waiting) != 2:
            await asyncio.sleep(0.01)
    gate.set()
    done = await asyncio.gather(*calls, return_exceptions=True)
    assert sum(isinstance(r, Message) for r in done) == 4
    assert sorted(started) == [1, 2, 4, 5]
    # One request more than the queue holds breaks the protocol: the link is dropped.
    gate.clear()
    more = [asyncio.ensure_future(client.call("slow", timeout=10)) for _ in range(6)]
    results = await asyncio.gather(*more, return_exceptions=True)
    assert all(isinstance(r, ConnectionLost) for r in results)
    assert "requests waiting" in str(server.channel.error)


async def test_a_stream_runs_at_most_its_window_ahead_of_its_reader() -> None:
    a, b = channel_pair(max_message_size=16384)
    client = endpoint(a, Handlers(), "c", stream_window=1 << 20)
    server = endpoint(b, handlers(asyncio.Event(), []), "s", stream_window=1 << 20)
    stream = client.stream("items", {"n": 12}, timeout=10)
    assert (await anext(stream)).fields["i"] == 0
    async with asyncio.timeout(10):
        while not server.stream_stalls:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert client.channel.deframer.held <= (1 << 20) + (257 << 10)
    rest = [m.fields["i"] async for m in stream]
    assert rest == list(range(1, 12))


async def test_a_credit_without_bytes_is_a_protocol_error() -> None:
    a, b = channel_pair(max_message_size=16384)
    client = endpoint(a, Handlers(), "c")
    server = endpoint(b, handlers(asyncio.Event(), []), "s")
    await client._send(Message(Kind.CREDIT, 1, fields={"bytes": -5}), Compression.NONE)
    async with asyncio.timeout(5):
        while server.channel.error is None:
            await asyncio.sleep(0.01)
    assert "CREDIT" in str(server.channel.error)


async def test_decoded_size_is_charged_before_a_handler_starts() -> None:
    a, b = channel_pair(max_message_size=16384)
    gate, started = asyncio.Event(), []
    client = endpoint(a, Handlers(), "c")
    server = endpoint(b, handlers(gate, started), "s", memory_budget=WINDOW)
    x = torch.randn(1 << 17, dtype=torch.float64)  # 1 MiB decoded, 128 KiB + scales as int8
    calls = [
        asyncio.ensure_future(client.call("slow", {}, [x], timeout=10, compression=Compression.INT8))
        for _ in range(6)
    ]
    async with asyncio.timeout(10):
        while len(started) + len(server._waiting) < 6:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert len(started) <= 4 and server.memory.refused >= 1
    assert server.memory.extra <= WINDOW
    gate.set()
    await asyncio.gather(*calls)
    assert len(started) == 6
    assert server.memory.used == 0 and server.memory.extra == 0


def test_peek_counts_decoded_bytes_without_decoding() -> None:
    x = torch.randn(1000, dtype=torch.float64)
    raw = encode_message_bytes(Message(Kind.REQUEST, 7, "m", {}, [x, torch.arange(10)]), Compression.INT8)
    head = peek_message(raw)
    assert (head.kind, head.request_id, head.method) == (Kind.REQUEST, 7, "m")
    assert head.decoded_bytes == 8000 + 80
    assert len(raw) < 2000


async def test_a_request_cancelled_before_its_handler_runs_gives_its_credit_back() -> None:
    a, b = channel_pair(max_message_size=16384)
    gate, started = asyncio.Event(), []
    client = endpoint(a, Handlers(), "c")
    server = endpoint(b, handlers(gate, started), "s")
    # Both arrive in one delivery turn: the handler's task exists but has not run when CANCEL lands.
    await client._send(Message(Kind.REQUEST, 1, "slow", {}, [torch.zeros(1000)]), Compression.NONE)
    await client._send(Message(Kind.CANCEL, 1), Compression.NONE)
    async with asyncio.timeout(5):
        while server.busy or server.channel.deframer.received < 4000:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert started == []
    assert server.channel.deframer.held == 0 and server.memory.used == 0


async def test_a_reader_with_a_larger_stream_window_than_its_producer_does_not_stall_it() -> None:
    a, b = channel_pair(max_message_size=16384)
    client = endpoint(a, Handlers(), "c", stream_window=WINDOW)  # batches of 1 MiB
    server = endpoint(b, handlers(asyncio.Event(), []), "s", stream_window=300 << 10, handler_deadline=5)
    got = [m.fields["i"] async for m in client.stream("items", {"n": 10}, timeout=10)]
    assert got == list(range(10))
    assert server.handler_timeouts == 0 and server.stream_stalls >= 1


async def test_a_producer_flooding_tiny_items_past_its_credit_drops_the_link() -> None:
    """Bytes alone would let 64 MiB of 20-byte items queue millions of objects: items are counted too."""
    a, b = channel_pair(max_message_size=16384)
    client = endpoint(a, Handlers(), "c", max_stream_items=50)
    quiet = Handlers()

    async def hang(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        await asyncio.sleep(60)
        yield msg

    quiet.add_stream("hang", hang)
    server = endpoint(b, quiet, "s")
    stream = client.stream("hang", timeout=10)
    first = asyncio.ensure_future(anext(stream))
    async with asyncio.timeout(5):
        while not client._streams:
            await asyncio.sleep(0.001)
    (request_id,) = client._streams
    for i in range(60):  # a hostile producer ignoring its credit: items nobody reads
        await server._send(Message(Kind.STREAM, request_id, fields={"i": i}), Compression.NONE)
    async with asyncio.timeout(5):
        while client.channel.error is None:
            await asyncio.sleep(0.01)
    assert "overran its credit" in str(client.channel.error)
    assert (await first).fields["i"] == 0
    with pytest.raises(ConnectionLost):  # after what had queued (at most 50 items)
        async for _ in stream:
            pass
