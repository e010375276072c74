"""Every wait finite and every byte held bounded, over real aiortc links on loopback.

Each test plays a hostile or stalled peer against an honest one through the real signaling hub, and
fails on the code before the fix: first frames that reserved their declared size, a client that stops
granting credit and holds handler slots forever, one stalled stream that blocks every call on its link.
"""

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import replace

import torch

from engine.p2p import CallContext, Handlers, LinkConfig
from engine.p2p.framing import DATA, FIRST
from engine.wire import Kind, Limits, Message
from tests.integration.conftest import MakePeer
from tests.integration.test_p2p_loopback import echo_handlers


async def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def first_frame(message_id: int, declared: int, payload: bytes = b"") -> bytes:
    """The first frame of a message that claims ``declared`` bytes and never sends the rest."""
    return bytes([DATA, FIRST]) + message_id.to_bytes(4, "little") + declared.to_bytes(8, "little") + payload


async def test_a_flood_of_first_frames_allocates_nothing(make_peer: MakePeer) -> None:
    """448 bytes of frames used to reserve 32 MiB each: now a partial holds what arrived of it."""
    server = await make_peer(echo_handlers())
    rogue = await make_peer()
    await rogue.call(server.peer_id, "echo", timeout=20)
    link = server.links[rogue.peer_id]
    deframer = link.rpc.channel.deframer
    n, declared = 48, 4 << 20  # 192 MiB claimed (the old code reserved and zeroed all of it)
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(n):
            rogue.links[server.peer_id].data_channel.send(first_frame(1000 + i, declared, b"x" * 10))
        await wait_for(lambda: deframer.partial_count == n, what="the partials to arrive")
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - base < 2 << 20, f"{(current - base) >> 20} MiB allocated for {n} first frames"
    assert deframer.partial_bytes == n * 10
    assert link.rpc.channel.memory.used == n * 10  # charged as the bytes arrived, not as claimed
    # The link still serves its honest traffic.
    assert (await rogue.call(server.peer_id, "echo", {"ok": 1}, timeout=20)).fields["ok"] == 1


def holding_handlers(release: asyncio.Event, running: list[int]) -> Handlers:
    handlers = Handlers()

    async def hold(msg: Message, ctx: CallContext) -> Message:
        running.append(int(msg.tensors[0].numel()))
        await release.wait()
        return Message(Kind.RESPONSE, 0, fields={"n": msg.tensors[0].numel()})

    handlers.add_unary("hold", hold)
    return handlers


async def test_decoded_tensors_count_against_the_links_memory_budget(make_peer: MakePeer) -> None:
    """int8 on the wire, float64 once decoded (8x): handlers start only while the budget admits them."""
    from engine.wire import Compression

    budget = 16 << 20
    config = LinkConfig(
        connect_timeout=10,
        window=budget,
        max_message_bytes=4 << 20,
        limits=Limits(max_message_bytes=4 << 20),
        memory_budget=budget,
    )
    release, running = asyncio.Event(), []
    server = await make_peer(holding_handlers(release, running), config=config)
    client = await make_peer(config=config)
    await client.connect(server.peer_id)
    x = torch.randn(1 << 19, dtype=torch.float64)  # 4 MiB decoded, ~0.5 MiB as int8
    calls = [
        asyncio.ensure_future(
            client.call(server.peer_id, "hold", {}, [x], timeout=30, compression=Compression.INT8)
        )
        for _ in range(8)
    ]
    link = server.links[client.peer_id]
    await wait_for(lambda: len(running) + len(link.rpc._waiting) == 8, what="all 8 requests to arrive")
    await asyncio.sleep(0.2)
    memory = link.rpc.memory
    # 8 requests (32 MiB decoded) against a 16 MiB budget: at most 4 run at once, the rest wait as bytes.
    assert len(running) <= budget // x.nbytes
    assert memory.extra <= budget
    assert memory.refused >= 1
    release.set()
    replies = await asyncio.gather(*calls)
    assert [r.fields["n"] for r in replies] == [x.numel()] * 8
    assert memory.peak <= budget + x.nbytes
    await wait_for(lambda: memory.used == 0 and memory.extra == 0)


async def test_a_client_that_stops_granting_credit_frees_the_handler_slot(make_peer: MakePeer) -> None:
    handlers = Handlers()

    async def big(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, tensors=[torch.zeros(3 << 18)])  # 3 MiB

    handlers.add_unary("big", big)
    small = LinkConfig(
        connect_timeout=10,
        window=8 << 20,
        max_message_bytes=4 << 20,
        limits=Limits(max_message_bytes=4 << 20),
    )
    server = await make_peer(
        handlers, config=replace(small, handler_deadline=2.0, max_concurrent=2), idle_timeout=3.0
    )
    client = await make_peer(config=small)
    await client.connect(server.peer_id)
    client_link = client.links[server.peer_id]
    client_link.rpc.channel.release = lambda size: None  # type: ignore[method-assign]  # never grants credit
    calls = [asyncio.ensure_future(client.call(server.peer_id, "big", timeout=60)) for _ in range(4)]
    served = server.links[client.peer_id]
    await wait_for(lambda: served.rpc.calls_served >= 2)
    # Two replies fit the 8 MiB window; the third waits for credit that never comes, until the deadline.
    await wait_for(lambda: served.rpc.handler_timeouts >= 1, timeout=30)
    await wait_for(lambda: not served.busy, timeout=30)
    assert served.rpc.channel.aborts_sent >= 1  # the half-sent reply was given up, not left dangling
    await wait_for(lambda: client_link.rpc.channel.deframer.partial_count == 0)
    # No longer busy, the link is reaped once idle like any other.
    await wait_for(lambda: client.peer_id not in server.links, timeout=30)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


def firehose_handlers() -> Handlers:
    handlers = echo_handlers()

    async def firehose(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(12):  # 1 MiB each: three times the stream's window
            yield Message(Kind.STREAM, 0, fields={"i": i}, tensors=[torch.full((1 << 18,), float(i))])

    handlers.add_stream("firehose", firehose)
    return handlers


async def test_a_stalled_stream_does_not_block_other_calls(make_peer: MakePeer) -> None:
    limits = Limits(max_message_bytes=4 << 20)
    config = LinkConfig(connect_timeout=10, window=8 << 20, max_message_bytes=4 << 20, limits=limits)
    server = await make_peer(firehose_handlers(), config=config)
    client = await make_peer(config=config)
    stream = client.stream(server.peer_id, "firehose", timeout=60)
    first = await anext(stream)  # then nobody reads this stream for a while
    assert first.fields["i"] == 0
    held = client.links[server.peer_id].rpc.channel.deframer
    await wait_for(lambda: held.held >= 3 << 20, what="the producer to run ahead")
    await asyncio.sleep(0.5)
    x = torch.randn(1 << 19)  # 2 MiB each way
    reply = await client.call(server.peer_id, "echo", {"k": 1}, [x], timeout=20)
    assert torch.equal(reply.tensors[0], x)
    assert server.links[client.peer_id].rpc.stream_stalls >= 1  # the stream's window stopped it
    assert held.held <= (4 << 20) + (2 << 20)  # its window and one item more, never the link's 8 MiB
    got = [first.fields["i"]] + [m.fields["i"] async for m in stream]
    assert got == list(range(12))


async def test_link_close_is_bounded_when_the_connection_hangs(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer(config=LinkConfig(connect_timeout=10, close_timeout=0.5))
    await client.call(server.peer_id, "echo", timeout=20)
    link = client.links[server.peer_id]
    real_close = link.pc.close
    never = asyncio.Event()

    async def hanging_close() -> None:
        await never.wait()

    link.pc.close = hanging_close  # type: ignore[method-assign]
    await asyncio.wait_for(link.close(), 20)
    assert not link.usable
    await real_close()
