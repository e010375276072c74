"""One FFN expert (d=1024, hidden 4096): forward+backward samples/s in process vs through the whole stack.

In process: the module's forward, backward and Adam step on batches of ``--batch`` float32 samples.
Remote: the trainer side's ``RemoteExpert.call_forward`` / ``call_backward`` (float16 on the wire, the
backward sends only the output gradient) → Peer → WebRTC data channel on loopback → ExpertServer
(batching, a worker thread, the host's Adam step), ``--in-flight`` requests at once. Both peers and the
signaling coordinator run in this one process on one event loop, sharing its CPU with the expert's
compute, which makes the remote figure a pessimistic one. ``wire_bytes_per_sample`` counts every byte
both channels sent (headers, tensors, frames) per sample; float16 inputs, outputs and gradients both ways
are 4 x 2 KiB = 8 KiB for d=1024. The last line is one JSON object.

    .venv/bin/python benchmarks/expert_throughput.py --quick   # within 60 s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from engine.moe import ExpertServer, ExpertSpec, LoopThread, RemoteExpert, build, new_activation_id
from engine.p2p import Handlers, Identity, LinkConfig, Peer
from engine.p2p.patches import install, pin_host_addresses


def inprocess_sps(spec: ExpertSpec, batch: int, seconds: float) -> float:
    module = build(spec)
    opt = torch.optim.Adam(module.parameters(), lr=1e-3)
    x = torch.randn(batch, spec.dim)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or done == 0:
        out = module(x)
        opt.zero_grad()
        out.backward(torch.randn_like(out))
        opt.step()
        done += batch
    return done / (time.perf_counter() - t0)


async def remote_sps(spec: ExpertSpec, batch: int, seconds: float, in_flight: int, loop: LoopThread) -> dict:
    from coordinator.app import start  # the benchmark's own signaling hub

    coordinator = await start("127.0.0.1", 0)
    handlers = Handlers()
    server = ExpertServer.create({"ffn.0.0": spec}, device="cpu")
    server.register(handlers)
    host = Peer(Identity.generate(), coordinator.signaling_url, handlers=handlers, config=LinkConfig())
    trainer = Peer(Identity.generate(), coordinator.signaling_url, config=LinkConfig())
    await host.start()
    await trainer.start()
    try:
        expert = RemoteExpert(trainer, host.peer_id, "ffn.0.0", loop=loop, timeout=60)
        x = expert.to_wire(torch.randn(batch, spec.dim))
        g = expert.to_wire(torch.randn(batch, spec.dim))

        async def one() -> None:
            aid = new_activation_id()
            await expert.call_forward(aid, x)
            await expert.call_backward(aid, g, x)

        await asyncio.gather(*(one() for _ in range(in_flight)))  # warm-up: link, batching, allocator
        link = trainer.links[host.peer_id]
        back = host.links[trainer.peer_id]
        sent0 = link.rpc.channel.bytes_sent + back.rpc.channel.bytes_sent
        done, t0 = 0, time.perf_counter()
        deadline = t0 + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one()
                done += batch

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - t0
        wire = link.rpc.channel.bytes_sent + back.rpc.channel.bytes_sent - sent0
        return {
            "remote_sps": done / elapsed,
            "wire_bytes_per_sample": wire / max(1, done),
            "resends": expert.resends,
        }
    finally:
        await trainer.stop()
        await host.stop()
        await server.close()
        await coordinator.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=4)
    args = parser.parse_args()
    seconds = 8.0 if args.quick else 30.0
    pin_host_addresses(["127.0.0.1"])
    install(strict=True)
    spec = ExpertSpec("ffn", 1024, 4096)
    local = inprocess_sps(spec, args.batch, seconds)
    print(f"in process: {local:.0f} samples/s", flush=True)
    loop = LoopThread("bench-loop")
    try:
        remote = loop.run(remote_sps(spec, args.batch, seconds, args.in_flight, loop), seconds + 120)
    finally:
        loop.close()
    print(f"remote: {remote['remote_sps']:.0f} samples/s", flush=True)
    result = {
        "d": spec.dim,
        "hidden": spec.hidden,
        "batch": args.batch,
        "in_flight": args.in_flight,
        "inprocess_sps": round(local, 1),
        "remote_sps": round(remote["remote_sps"], 1),
        "ratio": round(remote["remote_sps"] / local, 3),
        "wire_bytes_per_sample": round(remote["wire_bytes_per_sample"], 1),
        "inputs_resent": remote["resends"],
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
