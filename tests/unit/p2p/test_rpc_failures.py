"""What an RPC endpoint does when something goes wrong: bytes that fail to decode, a CREDIT that is no
count of bytes, a handler past its deadline or raising TimeoutError itself, a control message or an
error reply that cannot be sent, and request ids that come back.

Each test pins the outcome a broken version of engine/p2p/rpc.py changes (`make mutation`, group
rpc). No sockets: in-memory channels, the far end often driven by hand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from engine.p2p import rpc
from engine.p2p.channel import FramedChannel
from engine.p2p.errors import ConnectionLost, ProtocolError
from engine.p2p.rpc import RpcEndpoint
from engine.p2p.rpc_wire import CallContext, Handlers
from engine.wire import Kind, Limits, Message
from tests.memchannel import MemoryChannel, channel_pair
from tests.unit.p2p.rpc_peer import WINDOW, Peer, feed, settle, undecodable, until
from tests.unit.p2p.test_rpc_limits import endpoint

HIGH_WATER = 256 << 10


class Service:
    def __init__(self) -> None:
        self.handlers = Handlers()
        self.release = asyncio.Event()
        for name in ("echo", "hold", "slow", "late"):
            self.handlers.add_unary(name, getattr(self, name))
        self.handlers.add_stream("stall", self.stall)

    async def echo(self, msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields=dict(msg.fields), tensors=list(msg.tensors))

    async def hold(self, msg: Message, ctx: CallContext) -> Message:
        await self.release.wait()
        return Message(Kind.RESPONSE, 0)

    async def slow(self, msg: Message, ctx: CallContext) -> Message:
        await asyncio.sleep(60)
        return Message(Kind.RESPONSE, 0)

    async def late(self, msg: Message, ctx: CallContext) -> Message:
        raise TimeoutError("the database did not answer")  # the handler's own, not the deadline

    async def stall(self, msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        yield Message(Kind.STREAM, 0, fields={"i": 0})
        await asyncio.sleep(60)
        yield Message(Kind.STREAM, 0, fields={"i": 1})


def bounded(ch: MemoryChannel, handlers: Handlers, name: str, **kwargs: Any) -> RpcEndpoint:
    """An endpoint whose channel stops taking frames at HIGH_WATER bytes buffered."""

    def make(on_message):  # type: ignore[no-untyped-def]
        return FramedChannel(
            ch,
            on_message,
            max_frame=16384,
            window=WINDOW,
            max_message_bytes=WINDOW // 2,
            high_water=HIGH_WATER,
        )

    return RpcEndpoint(
        make, handlers, peer_id=name * 40, limits=Limits(max_message_bytes=WINDOW // 2), **kwargs
    )


def served(**kwargs: object) -> tuple[Peer, RpcEndpoint, Service]:
    a, b = channel_pair(max_message_size=16384)
    service = Service()
    return Peer(a), endpoint(b, service.handlers, "p", **kwargs), service


async def stuck(ch: MemoryChannel, end: RpcEndpoint) -> asyncio.Future[None]:
    """Stop ``ch`` draining and fill it past the high-water mark: every send on it now waits."""
    ch.paused = True
    filler = asyncio.ensure_future(end.channel.send([bytes(300_000)]))
    await until(lambda: ch.bufferedAmount > HIGH_WATER, "a full send buffer")
    return filler


# -- limits and bytes that do not decode -----------------------------------------------------------


async def test_endpoints_check_and_decode_with_their_own_looser_limits() -> None:
    a, b = channel_pair(max_message_size=16384)
    loose = Limits(max_message_bytes=WINDOW // 2, max_tensors=80)  # the default allows 64
    client = endpoint(a, Handlers(), "c")
    server = endpoint(b, Service().handlers, "s")
    client.limits = server.limits = loose
    reply = await client.call("echo", {}, [torch.full((2,), float(i)) for i in range(70)], timeout=5)
    assert [float(t[0]) for t in reply.tensors] == [float(i) for i in range(70)]
    assert server.channel.error is None and client.channel.error is None


async def test_a_request_whose_fields_do_not_decode_drops_the_link_as_the_peers_fault() -> None:
    peer, server, _ = served()
    await peer.send_raw(undecodable(Kind.REQUEST, 1, "echo"))
    await until(lambda: server.channel.error is not None, "the drop")
    assert isinstance(server.channel.error, ProtocolError)
    assert str(server.channel.error) == (
        "undecodable message from pppppppppppp: unknown msgpack ext code 5 in fields"
    )
    await until(lambda: not server.busy, "the handler's end")


async def test_an_undecodable_answer_or_credit_fails_the_link_and_raises_nothing() -> None:
    a, b = channel_pair(max_message_size=16384)
    peer = Peer(b)
    client = endpoint(a, Handlers(), "p")
    call = asyncio.ensure_future(client.call("echo", timeout=5))
    await until(lambda: peer.got, "the request")
    feed(client, undecodable(Kind.RESPONSE, 1))  # straight in: anything on_message raises lands here
    assert isinstance(client.channel.error, ProtocolError)
    with pytest.raises(ConnectionLost, match="unknown msgpack ext code 5"):
        await call
    _, server, _ = served()
    feed(server, undecodable(Kind.CREDIT, 1))
    assert isinstance(server.channel.error, ProtocolError)


@pytest.mark.parametrize("granted", [0, -5, True, "5", 2.5])
async def test_a_credit_that_is_no_positive_count_of_bytes_drops_the_link(granted: object) -> None:
    peer, server, _ = served()
    await peer.send(Message(Kind.CREDIT, 1, fields={"bytes": granted}))
    await until(lambda: server.channel.error is not None, "the drop")
    assert str(server.channel.error) == f"CREDIT of {granted!r} from pppppppppppp"


# -- deadlines ---------------------------------------------------------------------------------------


async def test_a_handler_raising_timeout_error_itself_is_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    peer, server, _ = served()
    await peer.send(Message(Kind.REQUEST, 1, "late"))
    await until(lambda: peer.got, "the answer")
    (answer,) = peer.got
    assert (answer.kind, answer.request_id) == (Kind.ERROR, 1)
    assert answer.fields == {"code": "internal", "message": "TimeoutError in the handler"}
    assert server.handler_timeouts == 0
    (record,) = [r for r in caplog.records if r.name == "engine.p2p.rpc"]
    assert record.getMessage() == "handler late failed for pppppppppppp"
    assert record.exc_info is not None and isinstance(record.exc_info[1], TimeoutError)


async def test_every_deadline_passed_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine.p2p.rpc")
    peer, server, _ = served(handler_deadline=0.2)
    await peer.send(Message(Kind.REQUEST, 1, "slow"))
    await peer.send(Message(Kind.REQUEST, 2, "slow"))
    await until(lambda: len(peer.got) == 2, "two answers")
    assert {(m.request_id, m.fields["code"]) for m in peer.got} == {
        (1, "deadline_exceeded"),
        (2, "deadline_exceeded"),
    }
    assert peer.got[0].fields["message"] == "slow took over 0.2 s"
    assert server.handler_timeouts == 2
    logged = [r.getMessage() for r in caplog.records if r.name == "engine.p2p.rpc"]
    assert logged == ["slow for pppppppppppp passed its 0.2 s deadline"] * 2


async def test_a_stream_that_stalls_between_items_ends_at_the_deadline() -> None:
    peer, server, _ = served(handler_deadline=0.2)
    await peer.send(Message(Kind.REQUEST, 1, "stall"))
    await until(lambda: len(peer.got) == 2, "an item and the error")
    assert peer.items() == [0]
    assert peer.got[1].kind == Kind.ERROR and peer.got[1].fields["code"] == "deadline_exceeded"
    assert server.handler_timeouts == 1


async def test_a_stream_end_that_cannot_be_sent_is_bounded_by_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc, "CONTROL_SEND_TIMEOUT", 0.05)
    a, b = channel_pair(max_message_size=16384)
    fillers: list[asyncio.Future[None]] = []
    handlers = Handlers()

    async def one_then_stuck(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        yield Message(Kind.STREAM, 0, fields={"i": 0})
        fillers.append(await stuck(b, server))  # the link stops draining after the last item

    handlers.add_stream("one_then_stuck", one_then_stuck)
    server = bounded(b, handlers, "p", handler_deadline=0.3)
    await Peer(a).send(Message(Kind.REQUEST, 1, "one_then_stuck"))
    await until(lambda: server.handler_timeouts == 1 and not server.busy, "the handler's end")
    assert len(fillers) == 1  # the END, not the item, was what could not be sent
    fillers[0].cancel()


# -- control messages and error replies that cannot be sent -------------------------------------------


async def control_sent(end: RpcEndpoint, msg: Message) -> BaseException | None:
    """Send ``msg`` as a control message and wait for that send to end; what it raised, if anything."""
    end._send_control(msg)
    (task,) = end._control  # held until done, so it is neither collected nor lost
    async with asyncio.timeout(3):
        await asyncio.wait({task})
    return task.exception()


async def test_a_control_message_on_a_link_failing_meanwhile_is_dropped_quietly() -> None:
    a, _ = channel_pair(max_message_size=16384)
    client = bounded(a, Handlers(), "p")
    client._send_control(Message(Kind.CANCEL, 7))
    (task,) = client._control
    client.channel.fail(RuntimeError("ice failed"))
    async with asyncio.timeout(3):
        await asyncio.wait({task})
    assert task.exception() is None


async def test_a_control_message_that_cannot_be_encoded_is_dropped_quietly() -> None:
    a, _ = channel_pair(max_message_size=16384)
    client = bounded(a, Handlers(), "p")
    client.limits = Limits(max_header_bytes=8)
    assert await control_sent(client, Message(Kind.CREDIT, 1, fields={"bytes": 1 << 40})) is None


async def test_a_control_message_that_cannot_be_sent_in_time_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc, "CONTROL_SEND_TIMEOUT", 0.05)
    a, _ = channel_pair(max_message_size=16384)
    client = bounded(a, Handlers(), "p")
    filler = await stuck(a, client)
    assert await control_sent(client, Message(Kind.CANCEL, 7)) is None
    assert client._control == set()
    filler.cancel()


async def test_an_error_reply_that_cannot_be_encoded_or_sent_in_time_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc, "CONTROL_SEND_TIMEOUT", 0.05)
    a, _ = channel_pair(max_message_size=16384)
    server = bounded(a, Handlers(), "p")
    server.limits = Limits(max_header_bytes=200)  # a 1,000-character message does not fit
    await asyncio.wait_for(server._reply_error(1, "internal", "x" * 1000), 3)
    server.limits = Limits(max_message_bytes=WINDOW // 2)
    filler = await stuck(a, server)
    await asyncio.wait_for(server._reply_error(1, "internal", "nobody hears this"), 3)
    filler.cancel()


# -- request ids ---------------------------------------------------------------------------------------


async def test_a_request_id_may_come_back_once_its_call_has_ended() -> None:
    peer, server, _ = served()
    for n in (1, 2):
        await peer.send(Message(Kind.REQUEST, 1, "echo", {"n": n}))
        await until(lambda: len(peer.got) == n, f"answer {n}")  # noqa: B023
    assert [(m.kind, m.request_id, m.fields["n"]) for m in peer.got] == [
        (Kind.RESPONSE, 1, 1),
        (Kind.RESPONSE, 1, 2),
    ]
    assert server.channel.error is None and server.calls_served == 2


async def test_a_request_id_cancelled_while_it_waited_may_come_back() -> None:
    peer, server, service = served(max_concurrent=1)
    await peer.send(Message(Kind.REQUEST, 1, "hold"))
    await peer.send(Message(Kind.REQUEST, 2, "echo", {"n": 1}))
    await until(lambda: len(server._waiting) == 1, "a waiting request")
    await peer.send(Message(Kind.CANCEL, 2))
    await until(lambda: not server._waiting, "the cancel")
    await peer.send(Message(Kind.REQUEST, 2, "echo", {"n": 2}))
    await until(lambda: len(server._waiting) == 1, "the request again")
    service.release.set()
    await until(lambda: len(peer.got) == 2, "both answers")
    assert sorted((m.request_id, m.fields.get("n")) for m in peer.got) == [(1, None), (2, 2)]
    assert server.channel.error is None


async def test_up_to_1024_requests_wait_for_a_handler_by_default() -> None:
    peer, server, _ = served(max_concurrent=1)
    for request_id in range(1, 1026):  # one running, 1,024 waiting
        await peer.send(Message(Kind.REQUEST, request_id, "hold"))
    await until(lambda: len(server._waiting) == 1024, "a full queue")
    await settle()
    assert server.channel.error is None
    await peer.send(Message(Kind.REQUEST, 1026, "hold"))
    await until(lambda: server.channel.error is not None, "the drop")
    assert str(server.channel.error) == "more than 1024 requests waiting for a handler"
