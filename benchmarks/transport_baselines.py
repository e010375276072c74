"""The rows transport.py holds the project against, and how every row is measured.

Baselines, each a pair of spawned processes on loopback: (a) a raw aiortc data channel with 64 KiB
messages and a bufferedAmount watermark loop (pause above 8 messages buffered, resume at 4), stock or
with the project's patches and/or uvloop (``run_stock``); (d) TCP over asyncio streams, 64 KiB writes
(``run_tcp``). The project's own rows (``transport.py``) are measured the same way: ``measure_pair``
reads both processes' CPU (psutil) around the transfer, ``per_mib`` turns it into CPU ms per MiB.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection
from typing import Any

import psutil

MIB = 1 << 20
RAW_MSG = 64 << 10  # raw channel rows: 64 KiB messages, watermarks at 8 (pause) and 4 (resume) messages


def pin_loopback() -> None:
    """Host candidates on 127.0.0.1 only."""
    from engine.p2p.patches import pin_host_addresses

    pin_host_addresses(["127.0.0.1"])


def install_patches() -> None:
    """The project's aiortc/aioice patches, exactly as a node installs them."""
    from engine.p2p import patches

    patches.install(strict=True)


# -- (a) stock aiortc, and the like-for-like raw channel rows ---------------------------------------


async def _stock_side(role: str, sdp: Connection, ctl: Connection, total: int, msg: int) -> None:
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from engine.p2p.patches import advertise_sack_frequency, agree_sack_frequency  # no-ops when stock

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    done = asyncio.Event()
    opened = asyncio.Event()
    if role == "send":
        dc = pc.createDataChannel("bench")
        dc.on("open", opened.set)
        await pc.setLocalDescription(await pc.createOffer())
        offer = advertise_sack_frequency(pc.localDescription.sdp)  # as a node's link does
        sdp.send(offer)
        answer = await asyncio.get_running_loop().run_in_executor(None, sdp.recv)
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        agree_sack_frequency(pc.sctp, offer, answer)
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
        answer = advertise_sack_frequency(pc.localDescription.sdp)
        agree_sack_frequency(pc.sctp, answer, offer)
        sdp.send(answer)
        await asyncio.wait_for(done.wait(), 600)
        ctl.send("done")
    await pc.close()


def _stock_main(
    role: str, sdp: Connection, ctl: Connection, total: int, msg: int, patched: bool, uv: bool
) -> None:
    """One side of a raw data channel; ``patched``/``uv`` switch the project's patches and loop on."""
    from engine.p2p import eventloop

    pin_loopback()
    if patched:
        install_patches()
    main = _stock_side(role, sdp, ctl, total, msg)
    eventloop.run(main) if uv else asyncio.run(main)


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


# -- measuring a pair, and the baselines' runs ---------------------------------------------------


def cpu_seconds(*procs: mp.process.BaseProcess) -> float:
    total = 0.0
    for p in procs:
        t = psutil.Process(p.pid).cpu_times()
        total += t.user + t.system
    return total


def measure_pair(
    sender: mp.process.BaseProcess, receiver: mp.process.BaseProcess, s_ctl: Connection, wait_end: Any
) -> tuple[float, tuple[float, float], Any]:
    """Elapsed seconds, (sender, receiver) CPU seconds, and what ``wait_end`` returned."""
    assert s_ctl.poll(120), "sender never became ready"
    assert s_ctl.recv() == "ready"
    cpu0 = cpu_seconds(sender), cpu_seconds(receiver)
    t0 = time.perf_counter()
    s_ctl.send("go")
    result = wait_end()
    elapsed = time.perf_counter() - t0
    return elapsed, (cpu_seconds(sender) - cpu0[0], cpu_seconds(receiver) - cpu0[1]), result


def per_mib(cpu: tuple[float, float], nbytes: int) -> dict[str, float]:
    mib = nbytes / MIB
    return {
        "cpu_ms_per_MiB": sum(cpu) * 1000 / mib,
        "sender_cpu_ms_per_MiB": cpu[0] * 1000 / mib,
        "receiver_cpu_ms_per_MiB": cpu[1] * 1000 / mib,
    }


def run_stock(ctx: Any, total: int, patched: bool = False, uv: bool = False) -> dict[str, float]:
    sdp_a, sdp_b = ctx.Pipe()
    s_ctl, s_child = ctx.Pipe()
    r_ctl, r_child = ctx.Pipe()
    msg = RAW_MSG
    sender = ctx.Process(target=_stock_main, args=("send", sdp_a, s_child, total, msg, patched, uv))
    receiver = ctx.Process(target=_stock_main, args=("recv", sdp_b, r_child, total, msg, patched, uv))
    receiver.start()
    sender.start()

    def end() -> None:
        assert r_ctl.poll(600), "stock receiver timed out"
        r_ctl.recv()
        s_ctl.send("finished")

    elapsed, cpu, _ = measure_pair(sender, receiver, s_ctl, end)
    sender.join(60)
    receiver.join(60)
    return {"MBps": total / elapsed / 1e6, **per_mib(cpu, total)}


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

    elapsed, cpu, _ = measure_pair(sender, receiver, s_ctl, end)
    sender.join(60)
    receiver.join(60)
    return {"MBps": total / elapsed / 1e6, **per_mib(cpu, total)}
