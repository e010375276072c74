"""Real aiortc connections on loopback, made through the real signaling endpoint."""

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch

from coordinator.server.app import RunningCoordinator
from engine.p2p import (
    CallContext,
    ConnectionLost,
    Handlers,
    PeerUnreachable,
    RpcTimeout,
    UnknownMethod,
)
from engine.wire import Compression, Kind, Message
from tests.integration.conftest import MakePeer


def echo_handlers() -> Handlers:
    handlers = Handlers()

    async def echo(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields={"from": ctx.peer_id, **msg.fields}, tensors=msg.tensors)

    async def ticks(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(int(msg.fields["n"])):
            yield Message(Kind.STREAM, 0, fields={"i": i}, tensors=[torch.arange(1000) + i])

    async def hang(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        yield Message(Kind.STREAM, 0, fields={"i": 0})
        await asyncio.sleep(3600)
        yield Message(Kind.STREAM, 0)

    handlers.add_unary("echo", echo)
    handlers.add_stream("ticks", ticks)
    handlers.add_stream("hang", hang)
    return handlers


async def test_call_stream_and_reuse(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer()
    x = torch.randn(512, 1024)  # 2 MiB: several frames
    reply = await client.call(server.peer_id, "echo", {"k": "v"}, [x], timeout=20)
    assert reply.fields == {"from": client.peer_id, "k": "v"}
    assert torch.equal(reply.tensors[0], x)
    reply8 = await client.call(server.peer_id, "echo", {}, [x], timeout=20, compression=Compression.INT8)
    assert (reply8.tensors[0] - x).abs().max() <= x.abs().max() / 127
    got = [m.fields["i"] async for m in client.stream(server.peer_id, "ticks", {"n": 4}, timeout=20)]
    assert got == [0, 1, 2, 3]
    assert len(client.links) == 1 and len(server.links) == 1  # one connection, reused by every call
    link = client.links[server.peer_id]
    await asyncio.gather(*(client.call(server.peer_id, "echo", {"i": i}, timeout=20) for i in range(20)))
    assert client.links[server.peer_id] is link


async def test_both_directions_on_one_link(make_peer: MakePeer) -> None:
    a = await make_peer(echo_handlers())
    b = await make_peer(echo_handlers())
    await a.call(b.peer_id, "echo", timeout=20)
    reply = await b.call(a.peer_id, "echo", timeout=20)
    assert reply.fields["from"] == b.peer_id
    assert len(a.links) == len(b.links) == 1


async def test_simultaneous_dials_end_with_one_link(make_peer: MakePeer) -> None:
    a = await make_peer(echo_handlers())
    b = await make_peer(echo_handlers())
    await asyncio.gather(a.call(b.peer_id, "echo", timeout=20), b.call(a.peer_id, "echo", timeout=20))
    await asyncio.sleep(0.2)
    assert a.links[b.peer_id].usable and b.links[a.peer_id].usable


async def test_unknown_peer_fails_fast(make_peer: MakePeer) -> None:
    client = await make_peer()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(PeerUnreachable):
        await client.call("ab" * 20, "echo", timeout=10)
    assert loop.time() - started < 2


async def test_unknown_method(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer()
    with pytest.raises(UnknownMethod):
        await client.call(server.peer_id, "no_such_method", timeout=20)


async def test_peer_that_stops_answering_mid_stream(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer()
    seen = []
    with pytest.raises(RpcTimeout):
        async for m in client.stream(server.peer_id, "hang", timeout=1.0):
            seen.append(m.fields["i"])
    assert seen == [0]
    assert (await client.call(server.peer_id, "echo", {"ok": 1}, timeout=20)).fields["ok"] == 1


async def test_link_is_reestablished_after_failure(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer()
    await client.call(server.peer_id, "echo", timeout=20)
    old = client.links[server.peer_id]
    await server.links[client.peer_id].close()  # the remote end goes away
    for _ in range(100):
        if not old.usable:
            break
        await asyncio.sleep(0.05)
    assert not old.usable
    reply = await client.call(server.peer_id, "echo", {"again": True}, timeout=20)
    assert reply.fields["again"] is True
    assert client.links[server.peer_id] is not old


async def test_idle_links_are_closed(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer(idle_timeout=0.5)
    await client.call(server.peer_id, "echo", timeout=20)
    link = client.links[server.peer_id]
    for _ in range(60):
        if server.peer_id not in client.links:
            break
        await asyncio.sleep(0.1)
    assert server.peer_id not in client.links
    for _ in range(50):
        if link.pc.connectionState == "closed":
            break
        await asyncio.sleep(0.1)
    assert link.pc.connectionState == "closed"


async def test_link_lost_names_a_remote_that_went_but_not_a_link_closed_here(make_peer: MakePeer) -> None:
    server, other = await make_peer(echo_handlers()), await make_peer(echo_handlers())
    client = await make_peer()
    lost: list[str] = []
    client.link_lost.append(lost.append)
    await client.call(server.peer_id, "echo", timeout=20)
    await client.call(other.peer_id, "echo", timeout=20)
    await client.links[other.peer_id].close()  # closed by this side: nobody is gone
    await server.stop()  # the remote goes
    async with asyncio.timeout(20):
        while not lost:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert lost == [server.peer_id]


async def test_pool_is_bounded(make_peer: MakePeer) -> None:
    servers = [await make_peer(echo_handlers()) for _ in range(3)]
    client = await make_peer(max_links=2)
    for s in servers:
        await client.call(s.peer_id, "echo", timeout=20)
    assert len(client.links) == 2
    assert servers[0].peer_id not in client.links  # least recently used went first


async def test_malformed_frames_drop_only_that_peer(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    rogue = await make_peer()
    honest = await make_peer()
    await rogue.call(server.peer_id, "echo", timeout=20)
    await honest.call(server.peer_id, "echo", timeout=20)
    link = rogue.links[server.peer_id]
    # The rogue writes garbage straight onto the data channel, below our framing.
    link.data_channel.send(b"\x00\x03\x01\x00\x00\x00" + (4).to_bytes(8, "little") + b"junk")
    for _ in range(100):
        if rogue.peer_id not in server.links:
            break
        await asyncio.sleep(0.05)
    assert rogue.peer_id not in server.links
    with pytest.raises(ConnectionLost):
        for _ in range(100):
            await link.rpc.call("echo", timeout=5)
            await asyncio.sleep(0.05)
    assert (await honest.call(server.peer_id, "echo", {"still": "here"}, timeout=20)).fields[
        "still"
    ] == "here"


async def test_coordinator_counts_relays(make_peer: MakePeer, coordinator: RunningCoordinator) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer()
    await client.call(server.peer_id, "echo", timeout=20)
    assert coordinator.hub.stats.relayed == 2  # one offer, one answer
    assert set(coordinator.hub.online()) == {server.peer_id, client.peer_id}


async def test_slow_reader_over_real_aiortc_bounds_both_sides(make_peer: MakePeer) -> None:
    from engine.p2p import LinkConfig
    from engine.wire import Limits

    window = 8 << 20
    # One stream may run a whole window ahead here, so the link's own window is what stops it.
    config = LinkConfig(
        window=window,
        max_message_bytes=4 << 20,
        limits=Limits(max_message_bytes=4 << 20),
        stream_window=2 * window,
        memory_budget=window,
    )
    handlers = Handlers()

    async def firehose(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(24):
            one_mib = torch.full((1 << 18,), float(i))
            yield Message(Kind.STREAM, 0, fields={"i": i}, tensors=[one_mib])

    handlers.add_stream("firehose", firehose)
    server = await make_peer(handlers, config=config)
    client = await make_peer(config=config)
    await client.connect(server.peer_id)
    channel = client.links[server.peer_id].rpc.channel
    sender = server.links[client.peer_id].rpc.channel
    held, got = 0, []
    async for m in client.stream(server.peer_id, "firehose", timeout=30):
        got.append(int(m.tensors[0][0]))
        if len(got) == 1:
            # Stop reading until the sender has run out of credit, however fast or slow the link is.
            async with asyncio.timeout(20):
                while sender.credit >= 256 << 10:
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # a stalled sender sends nothing more
            held = channel.deframer.held
            assert sender.credit < 256 << 10
    assert got == list(range(24))
    assert window // 2 < held <= window  # the window filled up (back-pressure engaged) and held
    assert sender.peak_buffered <= sender.high_water + (256 << 10)


async def test_links_agree_a_sack_every_eight_packets(make_peer: MakePeer) -> None:
    """Both descriptions carry the SACK-frequency attribute (engine/p2p/patches/ack_frequency.py), so
    both ends SACK every 8 packets: an 8 MiB request draws a small fraction of its packets in SACKs,
    and arrives intact."""
    from engine.p2p import patches

    handlers = Handlers()

    async def sink(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields={"sum": float(msg.tensors[0].sum())})

    handlers.add_unary("sink", sink)
    server = await make_peer(handlers)
    client = await make_peer()
    await client.connect(server.peer_id)
    for a, b in ((client, server), (server, client)):
        assert patches.transport_stats(a.links[b.peer_id].pc.sctp)["sack_every"] == 8
    dtls = client.links[server.peer_id].pc.sctp.transport
    tx0, rx0 = dtls._RTCDtlsTransport__tx_packets, dtls._RTCDtlsTransport__rx_packets
    x = torch.randn(2048, 1024)
    reply = await client.call(server.peer_id, "sink", {}, [x], timeout=30)
    assert reply.fields["sum"] == float(x.sum())
    sent = dtls._RTCDtlsTransport__tx_packets - tx0  # the request's DATA packets (8 MiB: ~7,000)
    got = dtls._RTCDtlsTransport__rx_packets - rx0  # the server's SACKs and its small reply
    assert sent > 6000 and got < sent / 6, (sent, got)  # standard: one SACK per 2
