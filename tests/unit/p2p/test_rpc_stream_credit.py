"""A stream's own flow control, byte for byte: what the producer sends on the credit it has, what the
consumer grants back and when, and what becomes of the producer's iterator when the stream ends early.

Each boundary here is one a broken version of engine/p2p/rpc.py moves (`make mutation`, group rpc).
The far end is driven by hand (tests/unit/p2p/rpc_peer.py), so the credit a producer holds is exactly
what the test granted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine.p2p.rpc import RpcEndpoint
from engine.p2p.rpc_state import ITEM_OVERHEAD
from engine.p2p.rpc_wire import CallContext, Handlers
from engine.wire import Kind, Message, encode_message_bytes
from tests.memchannel import channel_pair
from tests.unit.p2p.rpc_peer import Peer, settle, until
from tests.unit.p2p.test_rpc_limits import endpoint

# Every item below is a STREAM message of request 1 with one small field: the same size on the wire.
ITEM = len(encode_message_bytes(Message(Kind.STREAM, 1, fields={"i": 0})))
UNIT = ITEM + ITEM_OVERHEAD  # the stream credit one item costs


class Producer:
    def __init__(self) -> None:
        self.handlers = Handlers()
        self.hold = asyncio.Event()
        self.made: list[AsyncIterator[Message]] = []
        self.cleaned: list[str] = []
        self.handlers.add_stream("items", self.items)
        self.handlers.add_stream("kept", self.kept)
        self.handlers.add_stream("plain", self.plain)

    async def items(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(int(msg.fields["n"])):
            yield Message(Kind.STREAM, 0, fields={"i": i})
        if msg.fields.get("hold"):
            await self.hold.wait()

    def kept(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        """A handler that keeps its iterator (as a registry of running streams would): only an
        explicit close runs the iterator's cleanup, garbage collection never gets to it."""

        async def gen() -> AsyncIterator[Message]:
            try:
                for i in range(1000):
                    yield Message(Kind.STREAM, 0, fields={"i": i})
            finally:
                self.cleaned.append("closed")
                raise RuntimeError("cleanup failed too")

        iterator = gen()
        self.made.append(iterator)
        return iterator

    def plain(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        return _Countdown(int(msg.fields["n"]))


class _Countdown:
    """An async iterator that is not a generator: it has no aclose()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __aiter__(self) -> _Countdown:
        return self

    async def __anext__(self) -> Message:
        if self.n == 0:
            raise StopAsyncIteration
        self.n -= 1
        return Message(Kind.STREAM, 0, fields={"i": self.n})


def serve(stream_window: int, **kwargs: object) -> tuple[Peer, RpcEndpoint, Producer]:
    a, b = channel_pair(max_message_size=16384)
    producer = Producer()
    return Peer(a), endpoint(b, producer.handlers, "s", stream_window=stream_window, **kwargs), producer


async def credit(peer: Peer, n: int) -> None:
    await peer.send(Message(Kind.CREDIT, 1, fields={"bytes": n}))
    await settle(60)


async def test_a_producer_sends_while_it_has_any_credit_and_waits_at_none() -> None:
    peer, server, _ = serve(stream_window=UNIT)  # exactly one item's worth
    await peer.send(Message(Kind.REQUEST, 1, "items", {"n": 3}))
    await until(lambda: server.stream_stalls, "the first stall")
    await settle(60)
    assert peer.items() == [0] and server.stream_stalls == 1  # credit 0 after one item: it waits
    await credit(peer, 1)  # credit 1: enough to send one more item, however big
    assert peer.items() == [0, 1] and server.stream_stalls == 2
    await credit(peer, 1)  # credit 2 - UNIT: still none
    assert peer.items() == [0, 1] and server.stream_stalls == 2
    await credit(peer, UNIT)
    await until(lambda: Kind.END in peer.kinds(), "the END")
    assert peer.items() == [0, 1, 2] and server.stream_stalls == 2
    assert server._stream_credit == {} and not server.busy


async def test_a_producer_with_one_byte_of_credit_left_does_not_wait() -> None:
    peer, server, _ = serve(stream_window=UNIT + 1)
    assert server.stream_stalls == 0
    await peer.send(Message(Kind.REQUEST, 1, "items", {"n": 2}))
    await until(lambda: Kind.END in peer.kinds(), "the END")
    assert peer.items() == [0, 1] and server.stream_stalls == 0


async def test_a_consumer_grants_in_quarter_windows_and_at_once_when_caught_up() -> None:
    a, b = channel_pair(max_message_size=16384)
    peer = Peer(b)
    client = endpoint(a, Handlers(), "p", stream_window=20 * UNIT + 1)  # a quarter: 5 items, just
    stream = client.stream("items", timeout=5)
    first = asyncio.ensure_future(anext(stream))
    await until(lambda: peer.got, "the request")
    for i in range(10):  # all ten queue before the consumer takes the first
        await peer.send(Message(Kind.STREAM, 1, fields={"i": i}))
    assert (await first).fields["i"] == 0
    assert client._streams[1].qsize() == 9
    for i in range(1, 10):
        assert (await anext(stream)).fields["i"] == i
    await settle(60)
    grants = [m.fields["bytes"] for m in peer.got if m.kind == Kind.CREDIT]
    assert grants == [5 * UNIT, 5 * UNIT]  # after item 5 (a quarter), then item 10 (caught up)
    await peer.send(Message(Kind.END, 1))
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_producer_queueing_past_max_stream_items_drops_the_link_at_the_first_extra() -> None:
    a, b = channel_pair(max_message_size=16384)
    peer = Peer(b)
    client = endpoint(a, Handlers(), "p", max_stream_items=5)
    stream = client.stream("items", timeout=5)
    first = asyncio.ensure_future(anext(stream))
    await until(lambda: peer.got, "the request")
    await peer.send(Message(Kind.STREAM, 1, fields={"i": 0}))
    assert (await first).fields["i"] == 0  # the consumer holds it and reads no more
    for i in range(1, 6):
        await peer.send(Message(Kind.STREAM, 1, fields={"i": i}))
    await settle(60)
    assert client.channel.error is None and client._streams[1].qsize() == 5  # at the limit: fine
    await peer.send(Message(Kind.STREAM, 1, fields={"i": 6}))
    await until(lambda: client.channel.error is not None, "the drop")
    assert str(client.channel.error) == "stream 1 overran its credit with tiny items"
    await stream.aclose()  # type: ignore[attr-defined]


async def test_a_stream_left_early_closes_the_producers_iterator_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    peer, server, producer = serve(stream_window=1)
    await peer.send(Message(Kind.REQUEST, 1, "kept", {}))
    await until(lambda: server.stream_stalls, "the producer waiting for credit")
    assert producer.cleaned == []  # suspended at its second yield, holding whatever it holds
    await peer.send(Message(Kind.CANCEL, 1))
    await until(lambda: not server.busy, "the handler's end")
    # Closed by the server, though the handler still holds a reference; an error in the iterator's
    # own cleanup is the handler's business, not a failure of the call.
    assert producer.cleaned == ["closed"]
    assert producer.made[0].ag_frame is None  # type: ignore[attr-defined]
    assert [r for r in caplog.records if r.name == "engine.p2p.rpc"] == []
    assert server._stream_credit == {}


async def test_an_iterator_without_aclose_ends_its_stream_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    peer, server, _ = serve(stream_window=1 << 20)
    await peer.send(Message(Kind.REQUEST, 1, "plain", {"n": 3}))
    await until(lambda: Kind.END in peer.kinds(), "the END")
    await until(lambda: not server.busy, "the handler's end")
    await settle(60)
    assert peer.kinds() == [Kind.STREAM] * 3 + [Kind.END]  # no ERROR after the END
    assert peer.items() == [2, 1, 0]
    assert [r for r in caplog.records if r.name == "engine.p2p.rpc"] == []
