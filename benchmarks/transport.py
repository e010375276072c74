"""Transport throughput: stock aiortc vs the project's RPC (raw and int8) vs plain TCP, in one run.

Every case is two processes on loopback (spawned, so each starts clean). The parent reads both
processes' CPU time (psutil) around the transfer, so ``cpu_ms_per_MiB`` is sender plus receiver.

(a) stock: aiortc as installed, asyncio's default loop, one data channel, 64 KiB messages,
    a bufferedAmount watermark loop; the baseline.
(b) project: ``Peer.call`` through the coordinator's signaling, 4 MiB float32 tensors, 4 calls in
    flight, patched SCTP, uvloop where available; the bytes counted are tensor bytes.
(c) project_int8: as (b) with 8-bit blockwise compression; counts float32 bytes delivered.
(d) tcp: asyncio streams, 64 KiB writes.
(e) slow reader: (b) to a receiver that consumes one message at a time and sleeps, sampling what
    the sender holds (channel bufferedAmount plus SCTP's queues) every 5 ms.

    .venv/bin/python benchmarks/transport.py --quick     # 64 MiB per case, within 60 s
    .venv/bin/python benchmarks/transport.py             # 256 MiB per case, 1 GiB slow reader
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MIB = 1 << 20
TENSOR_ELEMS = 1 << 20  # 4 MiB of float32 per call
IN_FLIGHT = 4


def _pin() -> None:
    from engine.p2p import patches

    patches.pin_host_addresses(["127.0.0.1"])


# -- (a) stock aiortc -------------------------------------------------------------------------------


async def _stock_side(role: str, sdp: Connection, ctl: Connection, total: int, msg: int) -> None:
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    done = asyncio.Event()
    opened = asyncio.Event()
    if role == "send":
        dc = pc.createDataChannel("bench")
        dc.on("open", opened.set)
        await pc.setLocalDescription(await pc.createOffer())
        sdp.send(pc.localDescription.sdp)
        answer = await asyncio.get_running_loop().run_in_executor(None, sdp.recv)
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        await asyncio.wait_for(opened.wait(), 30)
        ctl.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, ctl.recv)
        payload = os.urandom(msg)
        low = asyncio.Event()
        dc.bufferedAmountLowThreshold = 4 * msg
        dc.on("bufferedamountlow", low.set)
        sent = 0
        while sent < total:
            if dc.bufferedAmount > 8 * msg:
                low.clear()
                await asyncio.wait_for(low.wait(), 60)
            dc.send(payload)
            sent += msg
        await asyncio.get_running_loop().run_in_executor(None, ctl.recv)  # receiver finished
    else:
        got = 0

        @pc.on("datachannel")  # type: ignore[misc]
        def on_channel(channel: Any) -> None:
            @channel.on("message")  # type: ignore[misc]
            def on_message(data: bytes) -> None:
                nonlocal got
                got += len(data)
                if got >= total:
                    done.set()

        offer = await asyncio.get_running_loop().run_in_executor(None, sdp.recv)
        await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        sdp.send(pc.localDescription.sdp)
        await asyncio.wait_for(done.wait(), 600)
        ctl.send("done")
    await pc.close()


def _stock_main(role: str, sdp: Connection, ctl: Connection, total: int, msg: int) -> None:
    _pin()
    asyncio.run(_stock_side(role, sdp, ctl, total, msg))


# -- (b, c, e) the project's RPC --------------------------------------------------------------------


def _project_main(role: str, ctl: Connection, url: str, args: dict[str, Any]) -> None:
    import torch

    from engine.p2p import eventloop, patches

    # Codec work is small next to the transport's; one intra-op thread keeps OpenMP's spinning
    # workers from competing with the event loop for this machine's two cores.
    torch.set_num_threads(1)
    _pin()
    patches.install(strict=True)
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


# -- (d) TCP ----------------------------------------------------------------------------------------


def _tcp_main(role: str, ctl: Connection, total: int, msg: int) -> None:
    asyncio.run(_tcp_side(role, ctl, total, msg))


async def _tcp_side(role: str, ctl: Connection, total: int, msg: int) -> None:
    loop = asyncio.get_running_loop()
    if role == "recv":
        done = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got = 0
            while got < total:
                chunk = await reader.read(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
            done.set()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        ctl.send(server.sockets[0].getsockname()[1])
        await asyncio.wait_for(done.wait(), 600)
        ctl.send("done")
        server.close()
    else:
        port = await loop.run_in_executor(None, ctl.recv)
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        ctl.send("ready")
        await loop.run_in_executor(None, ctl.recv)
        payload = os.urandom(msg)
        for _ in range(total // msg):
            writer.write(payload)
            await writer.drain()
        await loop.run_in_executor(None, ctl.recv)
        writer.close()


# -- the parent -------------------------------------------------------------------------------------


def _cpu(*procs: mp.process.BaseProcess) -> float:
    total = 0.0
    for p in procs:
        t = psutil.Process(p.pid).cpu_times()
        total += t.user + t.system
    return total


def _measure_pair(
    sender: mp.process.BaseProcess, receiver: mp.process.BaseProcess, s_ctl: Connection, wait_end: Any
) -> tuple[float, float, Any]:
    assert s_ctl.poll(120), "sender never became ready"
    assert s_ctl.recv() == "ready"
    cpu0 = _cpu(sender, receiver)
    t0 = time.perf_counter()
    s_ctl.send("go")
    result = wait_end()
    elapsed = time.perf_counter() - t0
    cpu = _cpu(sender, receiver) - cpu0
    return elapsed, cpu, result


def run_stock(ctx: Any, total: int) -> dict[str, float]:
    sdp_a, sdp_b = ctx.Pipe()
    s_ctl, s_child = ctx.Pipe()
    r_ctl, r_child = ctx.Pipe()
    msg = 64 << 10
    sender = ctx.Process(target=_stock_main, args=("send", sdp_a, s_child, total, msg))
    receiver = ctx.Process(target=_stock_main, args=("recv", sdp_b, r_child, total, msg))
    receiver.start()
    sender.start()

    def end() -> None:
        assert r_ctl.poll(600), "stock receiver timed out"
        r_ctl.recv()
        s_ctl.send("finished")

    elapsed, cpu, _ = _measure_pair(sender, receiver, s_ctl, end)
    sender.join(60)
    receiver.join(60)
    mib = total / MIB
    return {"MBps": total / elapsed / 1e6, "cpu_ms_per_MiB": cpu * 1000 / mib}


def run_tcp(ctx: Any, total: int) -> dict[str, float]:
    s_ctl, s_child = ctx.Pipe()
    r_ctl, r_child = ctx.Pipe()
    msg = 64 << 10
    receiver = ctx.Process(target=_tcp_main, args=("recv", r_child, total, msg))
    sender = ctx.Process(target=_tcp_main, args=("send", s_child, total, msg))
    receiver.start()
    assert r_ctl.poll(60)
    port = r_ctl.recv()
    sender.start()
    s_ctl.send(port)

    def end() -> None:
        assert r_ctl.poll(600)
        r_ctl.recv()
        s_ctl.send("finished")

    elapsed, cpu, _ = _measure_pair(sender, receiver, s_ctl, end)
    sender.join(60)
    receiver.join(60)
    return {"MBps": total / elapsed / 1e6, "cpu_ms_per_MiB": cpu * 1000 / (total / MIB)}


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

    _, cpu, result = _measure_pair(sender, receiver, s_ctl, end)
    r_ctl.send("stop")
    sender.join(60)
    receiver.join(60)
    elapsed = result["elapsed"]
    return {
        "MBps": result["bytes"] / elapsed / 1e6,
        "cpu_ms_per_MiB": cpu * 1000 / (result["bytes"] / MIB),
        "wire_MiB": result["wire_bytes"] / MIB,
        "connect_ms": result["connect_ms"],
        "rtt_us_p50": result["rtt_us_p50"],
        "peak_buffered_MiB": result["peak_buffered"] / MIB,
    }


def _coordinator_thread() -> tuple[str, threading.Event]:
    from coordinator.app import start

    ready: dict[str, str] = {}
    stop = threading.Event()
    started = threading.Event()

    async def serve() -> None:
        running = await start("127.0.0.1", 0)
        ready["url"] = running.signaling_url
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await running.stop()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    started.wait(30)
    return ready["url"], stop


def _rate(case: dict[str, float]) -> str:
    return f"{case['MBps']:.1f} MB/s, {case['cpu_ms_per_MiB']:.0f} CPU ms/MiB"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="64 MiB per case (within 60 s)")
    parser.add_argument("--mib", type=int, help="MiB per case (default 256, or 64 with --quick)")
    parser.add_argument(
        "--slow-mib", type=int, help="MiB to the slow reader (default 1024, or 48 with --quick)"
    )
    opts = parser.parse_args()
    total = (opts.mib or (64 if opts.quick else 256)) * MIB
    slow_total = (opts.slow_mib or (48 if opts.quick else 1024)) * MIB
    ctx = mp.get_context("spawn")
    url, stop = _coordinator_thread()
    from engine.p2p.eventloop import loop_name

    stock = run_stock(ctx, total)
    print(f"(a) stock aiortc, asyncio, 64 KiB: {_rate(stock)}", flush=True)
    project = run_project(ctx, url, {"total": total})
    print(f"(b) project RPC raw ({loop_name()}): {_rate(project)}", flush=True)
    int8 = run_project(ctx, url, {"total": total, "int8": True})
    print(
        f"(c) project RPC int8: {int8['MBps']:.1f} MB/s of float32, {int8['wire_MiB']:.1f} MiB on the wire",
        flush=True,
    )
    tcp = run_tcp(ctx, total)
    print(f"(d) asyncio TCP: {tcp['MBps']:.1f} MB/s, {tcp['cpu_ms_per_MiB']:.1f} CPU ms/MiB", flush=True)
    # A reader at about a third of the link's speed: 4 MiB messages, one at a time, 0.5 s each.
    slow = run_project(ctx, url, {"total": slow_total, "reader_delay": 0.5})
    print(
        f"(e) slow reader: {slow_total // MIB} MiB, sender held at most {slow['peak_buffered_MiB']:.2f} MiB",
        flush=True,
    )
    stop.set()
    figures = {
        "stock_MBps": round(stock["MBps"], 2),
        "project_MBps": round(project["MBps"], 2),
        "project_int8_effective_MBps": round(int8["MBps"], 2),
        "tcp_MBps": round(tcp["MBps"], 1),
        "speedup": round(project["MBps"] / stock["MBps"], 2),
        "effective_speedup": round(int8["MBps"] / stock["MBps"], 2),
        "cpu_ms_per_MiB": round(project["cpu_ms_per_MiB"], 1),
        "stock_cpu_ms_per_MiB": round(stock["cpu_ms_per_MiB"], 1),
        "cpu_ratio": round(project["cpu_ms_per_MiB"] / stock["cpu_ms_per_MiB"], 2),
        "int8_cpu_ms_per_float32_MiB": round(int8["cpu_ms_per_MiB"], 1),
        "tcp_cpu_ms_per_MiB": round(tcp["cpu_ms_per_MiB"], 2),
        "connect_ms": round(project["connect_ms"], 1),
        "rtt_us_p50": round(project["rtt_us_p50"]),
        "peak_buffered_MiB": round(max(project["peak_buffered_MiB"], slow["peak_buffered_MiB"]), 2),
        "slow_reader_MiB": slow_total // MIB,
        "slow_reader_peak_buffered_MiB": round(slow["peak_buffered_MiB"], 2),
        "MiB_per_case": total // MIB,
        "loop": loop_name(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
