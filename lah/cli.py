"""The ``lah`` command: ``lah app`` (the tray app), ``lah node`` and its controls (``lah status``,
``lah pause``, ``lah resume``, ``lah snooze MINUTES``), ``lah coordinator``, ``lah demo``,
``lah demo-transport`` and ``lah self-test``.

Everything runs on :func:`engine.p2p.eventloop.run` (uvloop where the platform has it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import torch

from engine.p2p import CallContext, Handlers, Identity, LinkConfig, Peer, eventloop
from engine.p2p.aiortc_patches import pin_host_addresses
from engine.wire import Compression, Kind, Message


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lah", description="Learning@home volunteer client and tools")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    app = sub.add_parser("app", help="the tray app: opt in, host experts while the computer is idle")
    app.add_argument("--coordinator", help="coordinator URL offered on first run (default: the project's)")
    app.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)  # set by `lah demo --app`
    demo = sub.add_parser("demo-transport", help="two peers on loopback exchange tensors over WebRTC")
    demo.add_argument("--mib", type=int, default=64, help="MiB of float32 tensors to send each way")
    coord = sub.add_parser("coordinator", help="run the coordinator: accounts, signaling, ledger, site")
    coord.add_argument("--config", type=Path, help="TOML config (see README); LAH_* variables override it")
    coord.add_argument("--host", help="listen address (default 127.0.0.1)")
    coord.add_argument("--port", type=int, help="listen port (default 8470)")
    coord.add_argument("--make-admin", metavar="NAME", help="give this existing account the admin role")
    node = sub.add_parser("node", help="run the volunteer node (host experts while the computer is idle)")
    node.add_argument("--coordinator", default="http://127.0.0.1:8470", help="coordinator URL")
    node.add_argument("--name", help="account name on first run")
    node.add_argument("--team")
    node.add_argument("--data-dir", type=Path, help="identity, checkpoints (default: user data dir)")
    node.add_argument("--settings", type=Path, help="settings TOML (default: user config dir)")
    node.add_argument("--token-file", type=Path, help="keep the token in this 0600 file, not the keyring")
    status = sub.add_parser("status", help="show the running node's status")
    status.add_argument("-f", "--follow", action="store_true", help="keep printing updates")
    sub.add_parser("pause", help="pause the running node")
    sub.add_parser("resume", help="resume the running node")
    snooze = sub.add_parser("snooze", help="pause the running node for MINUTES")
    snooze.add_argument("minutes", type=float)
    dmoe = sub.add_parser("demo", help="a whole swarm on loopback trains a DMoE model on handwritten digits")
    dmoe.add_argument("--volunteers", type=int, default=4, help="volunteer nodes hosting experts")
    dmoe.add_argument("--steps", type=int, default=150, help="training steps of 64 samples")
    dmoe.add_argument("--linger", type=float, default=0.0, help="seconds to keep the coordinator up after")
    from . import selftest  # light: each part imports what it tests

    selftest.add_arguments(sub.add_parser("self-test", help="check this installation (headless)"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command == "self-test":
        return selftest.run(args)
    if args.command == "app":
        from app.main import main as app_main  # Qt is imported only by the app

        return app_main(coordinator=args.coordinator, demo=args.demo)
    if args.command == "demo-transport":
        eventloop.run(demo_transport(args.mib))
    elif args.command == "demo":
        from .demo import run_demo  # starts its own loop thread (the trainer's autograd is synchronous)

        run_demo(volunteers=args.volunteers, steps=args.steps, linger=args.linger)
    elif args.command == "coordinator":
        from coordinator import cli as coordinator_cli  # the engine runs without the coordinator

        eventloop.run(coordinator_cli.run(args.config, args.host, args.port, args.make_admin))
    elif args.command == "node":
        from engine.control.commands import run_node

        return eventloop.run(
            run_node(
                args.coordinator,
                name=args.name,
                team=args.team,
                data=args.data_dir,
                settings_file=args.settings,
                token_file=args.token_file,
            )
        )
    elif args.command in ("status", "pause", "resume", "snooze"):
        from engine.control.commands import run_client

        minutes = getattr(args, "minutes", 0.0)
        return eventloop.run(run_client(args.command, minutes=minutes, follow=getattr(args, "follow", False)))
    return 0


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
    from coordinator.app import start

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


if __name__ == "__main__":
    sys.exit(main())
