"""Transport throughput: stock aiortc vs the project's RPC (raw and int8) vs plain TCP, in one run.

Every case is two processes on loopback (spawned, so each starts clean). The parent reads both
processes' CPU time (psutil) around the transfer, so ``cpu_ms_per_MiB`` is sender plus receiver, for
every row (stock included).

The product comparison (what a user gets):

(a) stock: aiortc as installed, asyncio's default loop, one data channel, 64 KiB messages, a
    bufferedAmount watermark loop (pause above 8 messages buffered, resume at 4); the baseline.
(b) project: ``Peer.call`` through the coordinator's signaling, 4 MiB float32 tensors, 4 calls in
    flight, the project's aiortc patches, uvloop where available; the bytes counted are tensor bytes.
(c) project_int8: as (b) with 8-bit blockwise compression; counts float32 bytes delivered.
(d) tcp: asyncio streams, 64 KiB writes.

Like-for-like rows that isolate one change at a time, all on the raw channel of (a) (same message size,
same watermarks, same code): ``raw_patched_asyncio`` (the patches alone, asyncio), ``raw_stock_uvloop``
(the loop alone) and ``raw_patched_uvloop`` (patches and loop: the patches alone against
``raw_stock_uvloop``). (b) against ``raw_patched_uvloop`` is the cost of the project's framing and RPC.

Every case runs ``--repeat`` times, interleaved (the order rotates each round, so a change in the
machine's load hits every case alike); the summary prints median (min-max) and the JSON holds median,
min, max and spread ((max-min)/median) per case, plus the 1-minute load average before and after every
round. (e) slow reader, once: (b) to a receiver that consumes one message at a time and sleeps,
sampling what the sender holds (channel bufferedAmount plus SCTP's queues) every 5 ms.

The baselines' processes ((a) and (d)) and the measuring of every pair are
``benchmarks/transport_baselines.py``; the project's processes and the report are here.

    .venv/bin/python benchmarks/transport.py --quick --repeat 1   # 32 MiB per case, about a minute
    .venv/bin/python benchmarks/transport.py                      # 128 MiB per case, 3 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from transport_baselines import (  # benchmarks/ is this script's folder, first on sys.path
    MIB,
    RAW_MSG,
    install_patches,
    measure_pair,
    per_mib,
    pin_loopback,
    run_stock,
    run_tcp,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TENSOR_ELEMS = 1 << 20  # 4 MiB of float32 per call
IN_FLIGHT = 4


# -- (b, c, e) the project's RPC --------------------------------------------------------------------


def _project_main(role: str, ctl: Connection, url: str, args: dict[str, Any]) -> None:
    import torch

    from engine.p2p import eventloop

    # Codec work is small next to the transport's; one intra-op thread keeps OpenMP's spinning
    # workers from competing with the event loop for this machine's two cores.
    torch.set_num_threads(1)
    pin_loopback()
    install_patches()
    eventloop.run(_project_side(role, ctl, url, args))


async def _project_side(role: str, ctl: Connection, url: str, args: dict[str, Any]) -> None:
    import torch

    from engine.p2p import CallContext, Handlers, Identity, LinkConfig, Peer
    from engine.wire import Compression, Kind, Message

    loop = asyncio.get_running_loop()
    handlers = Handlers()
    delay = float(args.get("reader_delay", 0.0))

    async def sink(msg: Message, ctx: CallContext) -> Message:
        if delay:
            await asyncio.sleep(delay)
        return Message(Kind.RESPONSE, 0, fields={"n": sum(t.numel() for t in msg.tensors)})

    async def ping(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, fields={}, tensors=msg.tensors)

    handlers.add_unary("sink", sink)
    handlers.add_unary("ping", ping)
    config = LinkConfig(max_concurrent=1 if delay else 64)
    peer = Peer(Identity.generate(), url, handlers=handlers, config=config)
    await peer.start()
    if role == "recv":
        ctl.send(peer.peer_id)
        await loop.run_in_executor(None, ctl.recv)
        await peer.stop()
        return
    remote = await loop.run_in_executor(None, ctl.recv)
    started = time.perf_counter()
    link = await peer.connect(remote)
    connect_ms = (time.perf_counter() - started) * 1000
    small = [torch.zeros(256)]  # 1 KiB
    rtts = []
    for _ in range(200):
        t0 = time.perf_counter()
        await peer.call(remote, "ping", {}, small, timeout=10)
        rtts.append((time.perf_counter() - t0) * 1e6)
    compression = Compression.INT8 if args.get("int8") else Compression.NONE
    total = int(args["total"])
    tensor = torch.randn(TENSOR_ELEMS)
    calls = total // (TENSOR_ELEMS * 4)
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        sctp = link.pc.sctp
        while sampling:
            held = link.data_channel.bufferedAmount
            held += sum(len(c.user_data) for c in sctp._outbound_queue)
            held += sum(len(c.user_data) for c in sctp._sent_queue)
            peak = max(peak, held)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    ctl.send("ready")
    await loop.run_in_executor(None, ctl.recv)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with gate:
            await peer.call(remote, "sink", {}, [tensor], timeout=600, compression=compression)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    elapsed = time.perf_counter() - t0
    sampling = False
    await sampler
    wire = link.rpc.channel.bytes_sent
    ctl.send(
        {
            "elapsed": elapsed,
            "bytes": calls * TENSOR_ELEMS * 4,
            "wire_bytes": wire,
            "connect_ms": connect_ms,
            "rtt_us_p50": statistics.median(rtts),
            "peak_buffered": max(peak, link.rpc.channel.peak_buffered),
        }
    )
    await peer.stop()


def run_project(ctx: Any, url: str, args: dict[str, Any]) -> dict[str, float]:
    s_ctl, s_child = ctx.Pipe()
    r_ctl, r_child = ctx.Pipe()
    receiver = ctx.Process(target=_project_main, args=("recv", r_child, url, args))
    sender = ctx.Process(target=_project_main, args=("send", s_child, url, args))
    receiver.start()
    assert r_ctl.poll(60), "project receiver did not start"
    remote = r_ctl.recv()
    sender.start()
    s_ctl.send(remote)

    def end() -> Any:
        assert s_ctl.poll(1800), "project transfer timed out"
        return s_ctl.recv()

    _, cpu, result = measure_pair(sender, receiver, s_ctl, end)
    r_ctl.send("stop")
    sender.join(60)
    receiver.join(60)
    elapsed = result["elapsed"]
    return {
        "MBps": result["bytes"] / elapsed / 1e6,
        **per_mib(cpu, result["bytes"]),
        "wire_MiB": result["wire_bytes"] / MIB,
        "connect_ms": result["connect_ms"],
        "rtt_us_p50": result["rtt_us_p50"],
        "peak_buffered_MiB": result["peak_buffered"] / MIB,
    }


def _rate(case: dict[str, float]) -> str:
    return f"{case['MBps']:.1f} MB/s, {case['cpu_ms_per_MiB']:.0f} CPU ms/MiB"


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median, min and max of every figure over the repeats (``spread`` = (max - min) / median)."""
    out: dict[str, float] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        med = statistics.median(values)
        out[key] = round(med, 2)
        if key in ("MBps", "cpu_ms_per_MiB"):
            out[f"{key}_min"] = round(min(values), 2)
            out[f"{key}_max"] = round(max(values), 2)
            out[f"{key}_spread"] = round((max(values) - min(values)) / med, 2) if med else 0.0
    out["runs"] = len(runs)
    return out


def _show(name: str, s: dict[str, float]) -> str:
    return (
        f"{name:<22} {s['MBps']:7.1f} MB/s ({s['MBps_min']:.1f}-{s['MBps_max']:.1f})  "
        f"{s['cpu_ms_per_MiB']:6.1f} CPU ms/MiB ({s['cpu_ms_per_MiB_min']:.1f}-{s['cpu_ms_per_MiB_max']:.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="32 MiB per case")
    parser.add_argument("--mib", type=int, help="MiB per case (default 128, or 32 with --quick)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of every case, interleaved (default 3)")
    parser.add_argument(
        "--slow-mib", type=int, help="MiB to the slow reader (default 1024, or 48 with --quick)"
    )
    opts = parser.parse_args()
    total = (opts.mib or (32 if opts.quick else 128)) * MIB
    slow_total = (opts.slow_mib or (48 if opts.quick else 1024)) * MIB
    ctx = mp.get_context("spawn")
    from hub import signaling_hub_thread  # benchmarks/ is this script's folder, first on sys.path

    url, stop = signaling_hub_thread()
    from engine.p2p.eventloop import loop_name

    loop = loop_name()
    have_uv = loop == "uvloop"
    cases: dict[str, Callable[[], dict[str, float]]] = {
        # the product comparison: stock aiortc as a user runs it, the project as it ships
        "stock": lambda: run_stock(ctx, total),
        "project": lambda: run_project(ctx, url, {"total": total}),
        # like-for-like on one raw channel: same message size and watermarks, one switch at a time
        "raw_patched_asyncio": lambda: run_stock(ctx, total, patched=True),
        "project_int8": lambda: run_project(ctx, url, {"total": total, "int8": True}),
        "tcp": lambda: run_tcp(ctx, total),
    }
    if have_uv:
        cases["raw_stock_uvloop"] = lambda: run_stock(ctx, total, uv=True)
        cases["raw_patched_uvloop"] = lambda: run_stock(ctx, total, patched=True, uv=True)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    loads = [_load()]
    names = list(cases)
    for r in range(opts.repeat):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate: drift in load hits every case
        for name in order:
            runs[name].append(cases[name]())
            print(f"  run {r + 1}/{opts.repeat} {name}: {_rate(runs[name][-1])} (load {_load()})", flush=True)
        loads.append(_load())
    # A reader at about a third of the link's speed: 4 MiB messages, one at a time, 0.5 s each.
    slow = run_project(ctx, url, {"total": slow_total, "reader_delay": 0.5})
    stop.set()
    res = {name: _summary(values) for name, values in runs.items()}
    print(f"median (min-max) of {opts.repeat} interleaved runs, {total // MIB} MiB each, loop {loop}:")
    for name, summary in res.items():
        print("  " + _show(name, summary))
    print(f"  slow reader: {slow_total // MIB} MiB, sender held at most {slow['peak_buffered_MiB']:.2f} MiB")
    stock, project, int8, tcp = res["stock"], res["project"], res["project_int8"], res["tcp"]

    def ratio(a: float, b: float) -> float:
        return round(a / b, 2) if b else 0.0

    figures: dict[str, Any] = {
        "stock_MBps": stock["MBps"],
        "project_MBps": project["MBps"],
        "project_int8_effective_MBps": int8["MBps"],
        "tcp_MBps": tcp["MBps"],
        "speedup": ratio(project["MBps"], stock["MBps"]),
        "effective_speedup": ratio(int8["MBps"], stock["MBps"]),
        "cpu_ms_per_MiB": project["cpu_ms_per_MiB"],
        "stock_cpu_ms_per_MiB": stock["cpu_ms_per_MiB"],
        "cpu_ratio": ratio(project["cpu_ms_per_MiB"], stock["cpu_ms_per_MiB"]),
        "int8_cpu_ms_per_float32_MiB": int8["cpu_ms_per_MiB"],
        "tcp_cpu_ms_per_MiB": tcp["cpu_ms_per_MiB"],
        "connect_ms": project["connect_ms"],
        "rtt_us_p50": project["rtt_us_p50"],
        "peak_buffered_MiB": round(max(project["peak_buffered_MiB"], slow["peak_buffered_MiB"]), 2),
        "slow_reader_MiB": slow_total // MIB,
        "slow_reader_peak_buffered_MiB": round(slow["peak_buffered_MiB"], 2),
        # like-for-like: what the patches alone do on each loop, and what the loop alone does
        "patch_speedup_asyncio": ratio(res["raw_patched_asyncio"]["MBps"], stock["MBps"]),
        "patch_cpu_ratio_asyncio": ratio(
            res["raw_patched_asyncio"]["cpu_ms_per_MiB"], stock["cpu_ms_per_MiB"]
        ),
    }
    if have_uv:
        raw_stock, raw_patched = res["raw_stock_uvloop"], res["raw_patched_uvloop"]
        figures["patch_speedup_uvloop"] = ratio(raw_patched["MBps"], raw_stock["MBps"])
        figures["patch_cpu_ratio_uvloop"] = ratio(raw_patched["cpu_ms_per_MiB"], raw_stock["cpu_ms_per_MiB"])
        figures["uvloop_speedup_stock"] = ratio(raw_stock["MBps"], stock["MBps"])
        # the project's framing and RPC over the same patched channel on the same loop
        figures["rpc_vs_raw_patched_cpu_ratio"] = ratio(
            project["cpu_ms_per_MiB"], raw_patched["cpu_ms_per_MiB"]
        )
    figures.update(
        {
            "cases": res,
            "repeat": opts.repeat,
            "MiB_per_case": total // MIB,
            "raw_msg_KiB": RAW_MSG >> 10,
            "loop": loop,
            "load_avg_1m": loads,
            "cpus": os.cpu_count(),
        }
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
