"""The processes expert_throughput.py spawns and measures: the in-process baseline, the host and the trainer.

Each is a spawn target on a control pipe that speaks one protocol (``serve_marks``): "warm" once warmed
up, then a snapshot (samples done, time, and the trainer's channel bytes, DTLS records and resends) for
every "mark", until anything else arrives. The parent (``expert_throughput.py``) starts them, reads their
CPU over the window and prints the figures; what each process does is here.

* ``compute_main``: the expert's forward, backward and Adam step in one process, on the device.
* ``host_main``: a volunteer's hosting core: ExpertServer + Peer on the node's event loop.
* ``trainer_main``: RemoteExpert calls over WebRTC from a LoopThread; without a host id it hosts too
  (the ``inprocess`` layout).
"""

from __future__ import annotations

import asyncio
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

UID = "ffn.0.0"


def _stack() -> None:
    """Loopback-only host candidates and the project's aiortc patches, as a node installs them."""
    from engine.p2p import patches

    patches.pin_host_addresses(["127.0.0.1"])
    patches.install(strict=True)


def _spec(args: dict[str, Any]) -> Any:
    from engine.moe import ExpertSpec

    return ExpertSpec("ffn", int(args["d"]), int(args["hidden"]))


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the processes ----------------------------------------------------------------------------------


def compute_main(ctl: Connection, args: dict[str, Any]) -> None:
    """In-process baseline: forward, backward, Adam on the device, counted by a worker thread."""
    import torch

    from engine.moe import build

    device = torch.device(args["device"])
    module = build(_spec(args)).to(device)
    opt = torch.optim.Adam(module.parameters(), lr=1e-3)
    x = torch.randn(args["batch"], args["d"], device=device)
    state = {"done": 0, "stop": False}

    def work() -> None:
        while not state["stop"]:
            out = module(x)
            opt.zero_grad()
            out.backward(torch.randn_like(out))
            opt.step()
            _sync(device)
            state["done"] += args["batch"]

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    serve_marks(
        ctl, lambda: {"done": state["done"], "t": time.perf_counter()}, warm=lambda: state["done"] > 0
    )
    state["stop"] = True
    worker.join(60)


def serve_marks(ctl: Connection, snap: Any, warm: Any, info: dict[str, Any] | None = None) -> None:
    """The measuring protocol: say "warm" once warmed up, answer every "mark" with a snapshot."""
    while not warm():
        time.sleep(0.05)
    ctl.send({"warm": True, **(info or {})})
    while True:
        cmd = ctl.recv()
        if cmd == "mark":
            ctl.send(snap())
        else:
            return


def host_main(ctl: Connection, url: str, args: dict[str, Any]) -> None:
    """A volunteer's hosting core in its own process: ExpertServer + Peer on the node's loop."""
    from engine.p2p import eventloop

    _stack()
    eventloop.run(_host(ctl, url, args))


async def _host(ctl: Connection, url: str, args: dict[str, Any]) -> None:
    from engine.moe import ExpertServer
    from engine.p2p import Handlers, Identity, LinkConfig, Peer

    loop = asyncio.get_running_loop()
    handlers = Handlers()
    server = ExpertServer.create({UID: _spec(args)}, device=args["device"])
    server.register(handlers)
    host = Peer(Identity.generate(), url, handlers=handlers, config=LinkConfig())
    await host.start()
    ctl.send({"peer_id": host.peer_id, "loop_tid": threading.get_native_id()})
    await loop.run_in_executor(None, ctl.recv)
    await host.stop()
    await server.close()


def trainer_main(ctl: Connection, url: str, host_id: str | None, args: dict[str, Any]) -> None:
    """The trainer: RemoteExpert calls from a LoopThread; with ``host_id`` None it also hosts (inprocess)."""
    import torch

    from engine.moe import LoopThread

    torch.set_num_threads(1)  # the trainer only converts to float16; the host's compute gets the cores
    _stack()
    loop = LoopThread("trainer-loop")
    try:
        _trainer(ctl, url, host_id, args, loop)
    finally:
        loop.close()


def _trainer(ctl: Connection, url: str, host_id: str | None, args: dict[str, Any], loop: Any) -> None:
    import torch

    from engine.moe import ExpertServer, RemoteExpert, new_activation_id
    from engine.p2p import Handlers, Identity, LinkConfig, Peer

    server = None
    host = None
    spec = _spec(args)

    async def up() -> tuple[Peer, str, int]:
        nonlocal server, host
        hid = host_id
        if hid is None:
            handlers = Handlers()
            server = ExpertServer.create({UID: spec}, device=args["device"])
            server.register(handlers)
            host = Peer(Identity.generate(), url, handlers=handlers, config=LinkConfig())
            await host.start()
            hid = host.peer_id
        peer = Peer(Identity.generate(), url, config=LinkConfig())
        await peer.start()
        return peer, hid, threading.get_native_id()

    peer, hid, loop_tid = loop.run(up(), 60)
    expert = RemoteExpert(peer, hid, UID, loop=loop, timeout=120, wire=args["wire"])
    x = expert.to_wire(torch.randn(args["batch"], spec.dim))
    g = torch.randn(args["batch"], spec.dim)
    # Output gradients of alternating sign: one fixed gradient would move every weight the same way at
    # every step, and after a few hundred steps the outputs overflow float16 (|x| >= 65520) and the
    # calls fail. The in-process baseline draws a fresh one each step; either way the mean is zero.
    grads = (expert.to_wire(g), expert.to_wire(-g))
    state = {"done": 0, "stop": False, "calls": 0}

    async def one() -> None:
        aid = new_activation_id()
        state["calls"] += 1
        grad = grads[state["calls"] % 2]
        await expert.call_forward(aid, x)
        await expert.call_backward(aid, grad, x)
        state["done"] += args["batch"]

    async def worker() -> None:
        while not state["stop"]:
            await one()

    async def work() -> None:
        await asyncio.gather(*(one() for _ in range(args["in_flight"])))  # warm-up: link, batching
        await asyncio.gather(*(worker() for _ in range(args["in_flight"])))

    running = asyncio.run_coroutine_threadsafe(work(), loop.loop)
    warm_at = args["in_flight"] * args["batch"] * 2  # two rounds of every request in flight

    async def snapshot() -> dict[str, Any]:
        link = peer.links[hid]
        channel = link.rpc.channel
        dtls = link.pc.sctp.transport
        return {
            "done": state["done"],
            "t": time.perf_counter(),
            "wire": channel.bytes_sent + channel.bytes_received,
            "records": dtls._RTCDtlsTransport__tx_packets + dtls._RTCDtlsTransport__rx_packets,
            "resends": expert.resends,
        }

    def warm() -> bool:
        if running.done():
            running.result()  # raises what failed
        return state["done"] >= warm_at

    serve_marks(ctl, lambda: loop.run(snapshot(), 10), warm, {"loop_tid": loop_tid})
    state["stop"] = True
    running.result(180)
    # Every call has completed now: the channel's totals over all of them are exact bytes per sample,
    # which a window's difference is not (calls in flight at its edges count bytes but no samples).
    final = loop.run(snapshot(), 10)

    async def down() -> None:
        await peer.stop()
        if host is not None:
            await host.stop()
        if server is not None:
            await server.close()

    loop.run(down(), 60)
    ctl.send({"bye": True, "wire_total": final["wire"], "samples_total": final["done"]})
