"""RPC's bookkeeping: window credit given back on every path, counters, error shapes, the encode thread.

Each pins what a broken engine/p2p/rpc.py would get wrong (`make mutation`, group rpc): over an
in-memory channel pair, no sockets.
"""

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from engine.p2p.channel import FramedChannel
from engine.p2p.errors import (
    ConnectionLost,
    ProtocolError,
    RemoteError,
    RpcCancelled,
    RpcError,
    UnknownMethod,
)
from engine.p2p.framing import data_frames
from engine.p2p.rpc import THREAD_ENCODE_ELEMENTS, RpcEndpoint, _ignore_result, _worth_a_thread
from engine.p2p.rpc_wire import CallContext, Handlers, error_message, raise_remote, reply_compression
from engine.wire import Compression, Kind, Limits, Message, encode_message_bytes
from tests.memchannel import MemoryChannel, channel_pair
from tests.unit.p2p.test_rpc import WINDOW, endpoint


class Recorder:
    def __init__(self) -> None:
        self.handlers = Handlers()
        self.contexts: list[CallContext] = []
        self.release = asyncio.Event()
        self.handlers.add_unary("echo", self.echo)
        self.handlers.add_unary("hold", self.hold)
        self.handlers.add_unary("boom", self.boom)
        self.handlers.add_stream("items", self.items)
        self.handlers.add_stream("stall", self.stall)
        self.handlers.add_stream("echo_stream", self.echo_stream)

    async def echo(self, msg: Message, ctx: CallContext) -> Message:
        self.contexts.append(ctx)
        return Message(Kind.RESPONSE, 0, fields=dict(msg.fields), tensors=list(msg.tensors))

    async def boom(self, msg: Message, ctx: CallContext) -> Message:
        raise KeyError("kaput")

    async def hold(self, msg: Message, ctx: CallContext) -> Message:
        await self.release.wait()
        return Message(Kind.RESPONSE, 0)

    async def echo_stream(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        self.contexts.append(ctx)
        yield Message(Kind.STREAM, 0, tensors=list(msg.tensors))

    async def stall(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        await self.release.wait()
        yield Message(Kind.STREAM, 0)

    async def items(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(int(msg.fields["n"])):
            yield Message(Kind.STREAM, 0, fields={"i": i}, tensors=[torch.zeros(1000)])


def make_pair() -> tuple[RpcEndpoint, RpcEndpoint, Recorder]:
    a, b = channel_pair(max_message_size=16384)
    recorder = Recorder()
    return endpoint(a, Handlers(), "b"), endpoint(b, recorder.handlers, "a"), recorder


async def settle(*ends: RpcEndpoint) -> None:
    async with asyncio.timeout(5):
        while any(e.channel.deframer.held for e in ends):
            await asyncio.sleep(0.01)


async def test_counters_and_the_context_handlers_see() -> None:
    client, server, recorder = make_pair()
    for n in range(3):
        assert (await client.call("echo", {"n": n}, timeout=5)).fields == {"n": n}
    assert (client.calls_made, server.calls_served) == (3, 3)
    assert (client.calls_served, server.calls_made) == (0, 0)
    assert [c.request_id for c in recorder.contexts] == [1, 2, 3]
    assert {c.peer_id for c in recorder.contexts} == {"a" * 40}
    got = [m async for m in client.stream("items", {"n": 2}, timeout=5)]
    assert [m.kind for m in got] == [Kind.STREAM, Kind.STREAM]
    assert client.calls_made == 4
    assert client._pending == {} and client._streams == {}  # nothing left behind per call


async def test_every_message_consumed_gives_its_credit_back() -> None:
    client, server, _ = make_pair()
    await client.call("echo", {"n": 1}, [torch.zeros(5000)], timeout=5)
    assert [m.fields["i"] async for m in client.stream("items", {"n": 3}, timeout=5)] == [0, 1, 2]
    await settle(client, server)
    assert client.channel.deframer.held == server.channel.deframer.held == 0


async def test_a_stream_left_early_gives_back_the_items_nobody_read() -> None:
    client, server, _ = make_pair()
    items = client.stream("items", {"n": 20}, timeout=5)
    assert (await anext(items)).fields["i"] == 0
    await asyncio.sleep(0.1)  # let the rest arrive and queue
    await items.aclose()
    await settle(client, server)
    assert client.channel.deframer.held == 0


async def test_a_late_answer_and_a_cancel_for_nothing_give_their_credit_back() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        client, server, _ = make_pair()
        with pytest.raises(TimeoutError):
            await client.call("hold", timeout=0.1)
        # Answers to calls nobody waits for, and a cancel of a request nobody serves, by hand.
        for late in (Message(Kind.RESPONSE, 999), Message(Kind.END, 998), Message(Kind.ERROR, 997)):
            await client.channel.send(encode_message_pieces(late))
        await server.channel.send(encode_message_pieces(Message(Kind.CANCEL, 12345)))
        await settle(client, server)
    finally:
        loop.set_exception_handler(None)
    assert client.channel.deframer.held == server.channel.deframer.held == 0
    assert errors == []
    assert client.channel.error is None and server.channel.error is None


def encode_message_pieces(msg: Message) -> list[bytes]:
    return [encode_message_bytes(msg)]


async def test_a_reused_request_id_drops_the_link() -> None:
    client, server, _ = make_pair()
    failures: list[BaseException] = []
    server._user_failure = failures.append
    pending = asyncio.ensure_future(client.call("hold", timeout=5))
    await asyncio.sleep(0.05)
    await client.channel.send(encode_message_pieces(Message(Kind.REQUEST, 1, "hold")))
    with pytest.raises(ConnectionLost):
        await pending
    assert server.channel.error is not None and "reused while in flight" in str(server.channel.error)
    assert len(failures) == 1


async def test_close_fails_pending_calls_as_closed_locally() -> None:
    client, _, _ = make_pair()
    pending = asyncio.ensure_future(client.call("hold", timeout=5))
    await asyncio.sleep(0.05)
    client.close()
    with pytest.raises(ConnectionLost, match=r"^closed locally$"):
        await pending


def test_error_message_shape_and_truncation() -> None:
    msg = error_message(7, "bad_shape", "x" * 1500)
    assert (msg.kind, msg.request_id) == (Kind.ERROR, 7)
    assert msg.fields == {"code": "bad_shape", "message": "x" * 1000}


def test_raise_remote_maps_codes_to_types() -> None:
    with pytest.raises(UnknownMethod) as unknown:
        raise_remote(error_message(1, "unknown_method", "no method 'x' here"))
    assert (unknown.value.code, unknown.value.message) == ("unknown_method", "no method 'x' here")
    with pytest.raises(RpcCancelled, match="gone"):
        raise_remote(error_message(1, "cancelled", "gone"))
    with pytest.raises(RemoteError) as plain:
        raise_remote(Message(Kind.ERROR, 1))
    assert type(plain.value) is RemoteError
    assert (plain.value.code, plain.value.message) == ("internal", "")


def test_encoding_moves_to_a_thread_only_for_big_compressed_messages() -> None:
    big = Message(Kind.REQUEST, 1, tensors=[torch.zeros(THREAD_ENCODE_ELEMENTS // 2)] * 2)
    half = THREAD_ENCODE_ELEMENTS // 2
    small = Message(Kind.REQUEST, 1, tensors=[torch.zeros(half), torch.zeros(half - 1)])
    assert THREAD_ENCODE_ELEMENTS == 1 << 18
    assert _worth_a_thread(big, Compression.INT8)
    assert not _worth_a_thread(small, Compression.INT8)
    assert not _worth_a_thread(big, Compression.NONE)
    assert not _worth_a_thread(big, [Compression.NONE, Compression.NONE])
    assert _worth_a_thread(big, [Compression.NONE, Compression.FLOAT16])


def test_reply_compression_is_the_handlers_choice() -> None:
    msg = Message(Kind.RESPONSE, 1, compression=Compression.FLOAT16)
    assert reply_compression(msg) == Compression.FLOAT16


def make_pair_with_channel() -> tuple[RpcEndpoint, RpcEndpoint, MemoryChannel, list[BaseException]]:
    a, b = channel_pair(max_message_size=16384)
    failures: list[BaseException] = []
    client = endpoint(a, Handlers(), "b")
    client._user_failure = failures.append
    return client, endpoint(b, Recorder().handlers, "a"), a, failures


async def test_a_protocol_error_fails_calls_and_streams_as_a_dropped_link() -> None:
    client, _, a, failures = make_pair_with_channel()
    call = asyncio.ensure_future(client.call("hold", timeout=5))

    await asyncio.sleep(0.05)
    stream = asyncio.ensure_future(client.stream("stall", timeout=5).__anext__())
    await asyncio.sleep(0.05)
    a.inject(b"\x00\x03\x01\x00\x00\x00" + (4).to_bytes(8, "little") + b"junk")
    with pytest.raises(
        ConnectionLost, match=r"^dropped bbbbbbbbbbbb: undecodable message from bbbbbbbbbbbb: "
    ) as e:
        await call
    assert isinstance(e.value.__cause__, ProtocolError)
    with pytest.raises(ConnectionLost, match=r"^dropped bbbbbbbbbbbb: "):
        await stream
    assert len(failures) == 1 and isinstance(failures[0], ProtocolError)


async def test_any_other_link_failure_reaches_calls_as_connection_lost() -> None:
    client, _, _, failures = make_pair_with_channel()
    call = asyncio.ensure_future(client.call("hold", timeout=5))
    await asyncio.sleep(0.05)
    cause = RuntimeError("ice failed")
    client.channel.fail(cause)
    with pytest.raises(ConnectionLost, match=r"^link to bbbbbbbbbbbb failed: ice failed$"):
        await call
    assert failures == [cause]


async def test_an_error_reply_on_a_lost_link_is_dropped_quietly() -> None:
    client, _, _, _ = make_pair_with_channel()
    client.close()
    await client._reply_error(1, "internal", "nobody hears this")


async def test_ignore_result_retrieves_errors_and_skips_cancellations() -> None:
    loop = asyncio.get_running_loop()
    cancelled = loop.create_future()
    cancelled.cancel()
    _ignore_result(cancelled)
    failed = loop.create_future()
    failed.set_exception(ValueError("x"))
    _ignore_result(failed)
    assert not failed._log_traceback  # retrieved: no "exception was never retrieved" at collection


async def test_streams_send_cancel_only_when_left_before_their_end() -> None:
    client, server, _ = make_pair()
    cancels: list[int] = []
    real = client._cancel_remote
    client._cancel_remote = lambda rid: (cancels.append(rid), real(rid))[1]  # type: ignore[method-assign]
    assert len([m async for m in client.stream("items", {"n": 2}, timeout=5)]) == 2
    with pytest.raises(UnknownMethod):
        async for _ in client.stream("nope", timeout=5):
            pass
    assert cancels == []  # ended by END, and by ERROR: nothing to cancel
    items = client.stream("items", {"n": 50}, timeout=5)
    await anext(items)
    await items.aclose()  # the consumer leaves early
    assert cancels == [3]
    await settle(client, server)
    assert server._serving == {}


async def test_a_stream_request_carries_its_tensors_and_context() -> None:
    client, _, recorder = make_pair()
    x = torch.arange(10.0)
    (reply,) = [m async for m in client.stream("echo_stream", tensors=[x], timeout=5)]
    assert torch.equal(reply.tensors[0], x)
    assert [(c.peer_id, c.request_id) for c in recorder.contexts] == [("a" * 40, 1)]


async def test_a_failing_handler_is_logged_with_its_method_and_peer(caplog: pytest.LogCaptureFixture) -> None:
    client, _, _ = make_pair()
    with pytest.raises(RemoteError, match="KeyError"):
        await client.call("boom", timeout=5)
    (record,) = [r for r in caplog.records if r.name == "engine.p2p.rpc"]
    assert record.getMessage() == "handler boom failed for aaaaaaaaaaaa"
    assert record.exc_info is not None


async def test_a_stream_request_that_cannot_be_sent_times_out() -> None:
    a, b = channel_pair(max_message_size=16384)
    client = endpoint(a, Handlers(), "b")
    endpoint(b, Recorder().handlers, "a")
    a.paused = True  # nothing drains: the send blocks above the high-water mark
    start = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(3):
            async for _ in client.stream("echo_stream", tensors=[torch.zeros(1 << 18)], timeout=0.2):
                pass
    assert asyncio.get_running_loop().time() - start < 2


async def test_big_compressed_messages_are_encoded_on_a_thread_with_the_endpoints_limits() -> None:
    client, _, _ = make_pair()
    x = torch.randn(THREAD_ENCODE_ELEMENTS)
    reply = await client.call("echo", {"n": 1}, [x], timeout=10, compression=Compression.INT8)
    assert (reply.tensors[0] - x).abs().max() <= x.abs().max() / 127
    assert client.channel.bytes_sent < x.numel() * 4 / 3  # sent as int8, not raw
    too_big = torch.zeros(WINDOW // 2 + 1000)  # over the endpoints' max_message_bytes even as int8
    with pytest.raises(RpcError, match="exceeds max_message_bytes"):
        await client.call("echo", {}, [too_big], timeout=10, compression=Compression.INT8)


async def test_the_receiver_decodes_with_its_own_limits() -> None:
    a, b = channel_pair(max_message_size=16384)
    client = endpoint(a, Handlers(), "b")
    tight = endpoint(b, Recorder().handlers, "a")
    tight.limits = Limits(max_message_bytes=WINDOW // 2, max_tensors=1)
    with pytest.raises(ConnectionLost):
        await client.call("echo", {}, [torch.zeros(1), torch.zeros(1)], timeout=5)
    assert isinstance(tight.channel.error, ProtocolError)
    assert str(tight.channel.error) == "undecodable message from aaaaaaaaaaaa: 2 tensors > max_tensors 1"


async def test_max_concurrent_handlers_default_to_64() -> None:
    client, server, recorder = make_pair()
    calls = [asyncio.ensure_future(client.call("hold", timeout=10)) for _ in range(65)]
    async with asyncio.timeout(5):
        while server.calls_served < 64:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert server.calls_served == 64  # the 65th waits for a slot
    recorder.release.set()
    await asyncio.gather(*calls)
    assert server.calls_served == 65


async def test_cancelling_a_call_logs_no_callback_errors() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        client, _, _ = make_pair()
        with pytest.raises(TimeoutError):
            await client.call("hold", timeout=0.1)
        await asyncio.sleep(0.1)
    finally:
        loop.set_exception_handler(None)
    assert errors == []


async def test_late_answers_of_every_kind_are_released_where_they_land() -> None:
    # Fed straight into the receiving channel, so an exception in on_message reaches the test.
    client, _, _ = make_pair()
    late = [
        Message(Kind.RESPONSE, 999),
        Message(Kind.END, 998),
        Message(Kind.ERROR, 997),
        Message(Kind.STREAM, 996),
    ]
    for msg in [*late, Message(Kind.CANCEL, 12345)]:
        for frame in data_frames(1, [encode_message_bytes(msg)], 16384):
            client.channel._on_frame(frame)
        assert client.channel.deframer.held == 0
    assert client.channel.error is None


async def test_on_failure_given_to_the_constructor_hears_the_failure() -> None:
    a, _ = channel_pair(max_message_size=16384)
    heard: list[BaseException] = []

    def make(on_message):  # type: ignore[no-untyped-def]
        return FramedChannel(a, on_message, max_frame=16384, window=WINDOW, max_message_bytes=WINDOW // 2)

    rpc = RpcEndpoint(make, Handlers(), peer_id="c" * 40, limits=Limits(), on_failure=heard.append)
    rpc.close()
    assert len(heard) == 1 and str(heard[0]) == "closed locally"
