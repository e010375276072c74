"""The volunteer's bandwidth caps, enforced in the transport: upload paced per frame, download by credit."""

import time
from collections.abc import AsyncIterator

import torch

from engine.p2p.channel import FramedChannel
from engine.p2p.rpc import RpcEndpoint
from engine.p2p.rpc_wire import CallContext, Handlers
from engine.resources import TokenBucket
from engine.wire import Kind, Limits, Message
from tests.memchannel import MemoryChannel, channel_pair

WINDOW = 1 << 20
MIB = 1 << 20


def endpoint(ch: MemoryChannel, handlers: Handlers, **caps: object) -> RpcEndpoint:
    def make(on_message):  # type: ignore[no-untyped-def]
        return FramedChannel(
            ch, on_message, max_frame=16384, window=WINDOW, max_message_bytes=WINDOW // 2, **caps
        )  # type: ignore[arg-type]

    return RpcEndpoint(make, handlers, peer_id="p" * 40, limits=Limits(max_message_bytes=WINDOW // 2))


async def sink(msg: Message, ctx: CallContext) -> Message:
    return Message(Kind.RESPONSE, 0)


async def firehose(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
    for _ in range(12):
        yield Message(Kind.STREAM, 0, tensors=[torch.zeros(1 << 16)])  # 256 KiB each, 3 MiB in all


async def test_upload_cap_paces_sending_and_traffic_is_counted() -> None:
    a, b = channel_pair(max_message_size=16384, rate=64 << 20)
    counted = [0, 0]

    def count(sent: int, received: int) -> None:
        counted[0] += sent
        counted[1] += received

    handlers = Handlers()
    handlers.add_unary("sink", sink)
    endpoint(b, handlers)
    client = endpoint(a, Handlers(), upload=TokenBucket(4 * MIB, burst=256 << 10), on_traffic=count)
    t0 = time.monotonic()
    for _ in range(8):  # 2 MiB at 4 MiB/s
        await client.call("sink", {}, [torch.zeros(1 << 16)], timeout=10)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.35, elapsed  # (2 MiB - 256 KiB burst) / 4 MiB/s = 0.44 s, minus timer slack
    assert counted[0] >= 2 * MIB and counted[1] > 0


async def test_download_cap_paces_the_remote_through_credit() -> None:
    a, b = channel_pair(max_message_size=16384, rate=64 << 20)
    handlers = Handlers()
    handlers.add_stream("firehose", firehose)
    endpoint(b, handlers)
    client = endpoint(a, Handlers(), download=TokenBucket(2 * MIB, burst=128 << 10))
    t0 = time.monotonic()
    got = [m async for m in client.stream("firehose", timeout=10)]
    elapsed = time.monotonic() - t0
    assert len(got) == 12
    # 3 MiB with a 1 MiB window granted up front: the other ~2 MiB wait for paced credit at 2 MiB/s.
    assert elapsed >= 0.8, elapsed
