"""``lah demo-transport``: a coordinator and two peers on 127.0.0.1; a call, a stream, bulk tensors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import torch

from engine.p2p import CallContext, Handlers, Identity, LinkConfig, Peer, eventloop
from engine.p2p.patches import pin_host_addresses
from engine.wire import Compression, Kind, Message


def _demo_handlers() -> Handlers:
    handlers = Handlers()

    async def scale(msg: Message, ctx: CallContext) -> Message:
        factor = float(msg.fields.get("factor", 1.0))
        return Message(
            Kind.RESPONSE,
            0,
            fields={"elements": sum(t.numel() for t in msg.tensors)},
            tensors=[t * factor for t in msg.tensors[:1]] if msg.fields.get("echo") else [],
        )

    async def countdown(msg: Message, ctx: CallContext) -> AsyncIterator[Message]:
        for i in range(int(msg.fields["n"]), 0, -1):
            yield Message(Kind.STREAM, 0, fields={"left": i}, tensors=[torch.full((4,), float(i))])

    handlers.add_unary("scale", scale)
    handlers.add_stream("countdown", countdown)
    return handlers


async def demo_transport(mib: int) -> None:
    from coordinator.server.app import start

    pin_host_addresses(["127.0.0.1"])  # the demo stays on this machine
    coordinator = await start("127.0.0.1", 0)

    def say(text: str) -> None:
        print(text, flush=True)

    say(f"coordinator: signaling at {coordinator.signaling_url} (event loop: {eventloop.loop_name()})")
    alice = Peer(
        Identity.generate(), coordinator.signaling_url, handlers=_demo_handlers(), config=LinkConfig()
    )
    bob = Peer(Identity.generate(), coordinator.signaling_url, handlers=_demo_handlers(), config=LinkConfig())
    await alice.start()
    await bob.start()
    say(f"alice is {alice.peer_id[:12]}…, bob is {bob.peer_id[:12]}… (ids are hashes of their Ed25519 keys)")
    try:
        t0 = time.perf_counter()
        link = await alice.connect(bob.peer_id)
        say(
            f"alice → bob: WebRTC link up in {(time.perf_counter() - t0) * 1000:.0f} ms "
            f"(signed offer/answer via the coordinator, DTLS fingerprint checked), "
            f"max frame {link.rpc.channel.max_frame // 1024} KiB"
        )
        x = torch.randn(1024, 1024)
        reply = await alice.call(bob.peer_id, "scale", {"factor": 2.0, "echo": True}, [x], timeout=30)
        ok = torch.allclose(reply.tensors[0], 2 * x)
        say(f"call: 4 MiB tensor to bob and back doubled: {'correct' if ok else 'WRONG'}")
        items = [m.fields["left"] async for m in alice.stream(bob.peer_id, "countdown", {"n": 5}, timeout=30)]
        say(f"stream: bob counted down {items}")
        for name, compression in (("raw float32", Compression.NONE), ("8-bit blockwise", Compression.INT8)):
            sent_before = link.rpc.channel.bytes_sent
            calls = max(1, mib // 4)
            t0 = time.perf_counter()
            gate = asyncio.Semaphore(4)

            async def one(c: Compression = compression, gate: asyncio.Semaphore = gate) -> None:
                async with gate:
                    await alice.call(bob.peer_id, "scale", {}, [x], timeout=120, compression=c)

            await asyncio.gather(*(one() for _ in range(calls)))
            elapsed = time.perf_counter() - t0
            wire = link.rpc.channel.bytes_sent - sent_before
            rate = calls * 4 * 1.048576 / elapsed
            say(
                f"bulk {name}: {calls * 4} MiB of float32 in {elapsed:.2f} s = {rate:.1f} MB/s, "
                f"{wire / 2**20:.1f} MiB on the wire (both peers share one process here; "
                "benchmarks/transport.py measures two)"
            )
        say(
            f"bob served {bob.links[alice.peer_id].rpc.calls_served} calls on one connection; "
            f"coordinator relayed {coordinator.hub.stats.relayed} descriptions and no tensor bytes"
        )
    finally:
        await alice.stop()
        await bob.stop()
        await coordinator.stop()
    say("done")
