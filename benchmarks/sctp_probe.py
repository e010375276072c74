"""Two-process loopback probe of one aiortc data channel.

Sends ``--mib`` MiB in ``--msg-kib`` KiB messages from one process to another over a real
RTCPeerConnection (ICE host candidates pinned to 127.0.0.1, ``iceServers=[]``, SDP exchanged
through a Pipe), with a bufferedAmount watermark loop, and reports MB/s and the CPU seconds each
process spent while the bytes flowed. The last line of output is one JSON object.

    .venv/bin/python benchmarks/sctp_probe.py --stock --asyncio --msg-kib 64 --mib 64
    .venv/bin/python benchmarks/sctp_probe.py --patched --uvloop --msg-kib 256 --mib 64
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MIB = 1 << 20


def _setup(
    patched: bool,
    use_uvloop: bool,
    sender_fast: bool = True,
    cc: str | None = None,
    stock_groups: Sequence[str] = (),
) -> asyncio.AbstractEventLoop:
    from engine.p2p import patches
    from engine.p2p.patches import registry

    patches.pin_host_addresses(["127.0.0.1"])
    if patched:
        patches.install(strict=True)
        if cc:
            patches.set_default_congestion_control(cc)
        for group in stock_groups:  # A/B: one patch group put back to stock
            registry.uninstall_group(group)
        if not sender_fast:  # A/B: the receiver patches with aiortc's stock sender
            from aiortc.rtcsctptransport import RTCSctpTransport

            for name in ("_receive_sack_chunk", "_transmit", "_t3_expired", "_update_rto"):
                original = registry.ORIGINALS[f"aiortc.rtcsctptransport.RTCSctpTransport.{name}"]
                setattr(RTCSctpTransport, name, original)
    if use_uvloop:
        import uvloop

        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    return asyncio.new_event_loop()


_SCTP_SHOWN = ("retransmissions", "rto_expiries", "cc", "sack_every")

def _config() -> Any:
    from aiortc import RTCConfiguration

    return RTCConfiguration(iceServers=[])


async def _sender(conn: Connection, args: argparse.Namespace) -> dict[str, Any]:
    from aiortc import RTCPeerConnection, RTCSessionDescription

    from engine.p2p.patches import advertise_sack_frequency, agree_sack_frequency

    pc = RTCPeerConnection(_config())
    ch = pc.createDataChannel("probe")
    opened = asyncio.Event()
    low = asyncio.Event()
    ch.on("open", opened.set)
    ch.on("bufferedamountlow", low.set)
    await pc.setLocalDescription(await pc.createOffer())
    offer = advertise_sack_frequency(pc.localDescription.sdp)  # as a node's link does; stock: unchanged
    conn.send((offer, pc.localDescription.type))
    sdp, typ = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=typ))
    agree_sack_frequency(pc.sctp, offer, sdp)
    await asyncio.wait_for(opened.wait(), 30)

    msg = args.msg_kib * 1024
    total = args.mib * MIB
    high = max(4 * msg, 1 * MIB)
    ch.bufferedAmountLowThreshold = high // 2
    payload = os.urandom(msg)
    digest = hashlib.sha256()
    await asyncio.sleep(0.2)
    t0, c0 = time.perf_counter(), time.process_time()
    sent = 0
    while sent < total:
        n = min(msg, total - sent)
        chunk = payload[:n]
        ch.send(chunk)
        digest.update(chunk)
        sent += n
        if ch.bufferedAmount > high:
            low.clear()
            await asyncio.wait_for(low.wait(), 120)
    c1 = time.process_time()
    ack = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    t1 = time.perf_counter()
    await pc.close()
    from engine.p2p.patches import transport_stats

    sctp = transport_stats(pc.sctp) if pc.sctp else {}
    return {
        "wall": t1 - t0,
        "cpu_sender_send": c1 - c0,
        "sha_ok": ack["sha"] == digest.hexdigest(),
        "sctp": {k: v for k, v in sctp.items() if k in _SCTP_SHOWN},
        **ack,
    }


async def _receiver(conn: Connection, args: argparse.Namespace) -> None:
    from aiortc import RTCPeerConnection, RTCSessionDescription

    from engine.p2p.patches import advertise_sack_frequency, agree_sack_frequency

    pc = RTCPeerConnection(_config())
    total = args.mib * MIB
    done = asyncio.Event()
    state: dict[str, Any] = {"got": 0, "sha": hashlib.sha256(), "c0": None, "t0": None}

    @pc.on("datachannel")
    def _on_dc(ch: Any) -> None:
        @ch.on("message")
        def _on_msg(m: bytes) -> None:
            if state["c0"] is None:
                state["c0"], state["t0"] = time.process_time(), time.perf_counter()
            state["got"] += len(m)
            state["sha"].update(m)
            if state["got"] >= total:
                done.set()

    sdp, typ = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=typ))
    await pc.setLocalDescription(await pc.createAnswer())
    answer = advertise_sack_frequency(pc.localDescription.sdp)
    agree_sack_frequency(pc.sctp, answer, sdp)
    conn.send((answer, pc.localDescription.type))
    await asyncio.wait_for(done.wait(), 600)
    c1, t1 = time.process_time(), time.perf_counter()
    conn.send(
        {"sha": state["sha"].hexdigest(), "cpu_receiver": c1 - state["c0"], "recv_wall": t1 - state["t0"]}
    )
    await asyncio.sleep(0.5)
    await pc.close()


def _run_profiled(loop: asyncio.AbstractEventLoop, coro: Any, path: str | None) -> Any:
    if not path:
        return loop.run_until_complete(coro)
    import cProfile

    prof = cProfile.Profile()
    try:
        return prof.runcall(loop.run_until_complete, coro)
    finally:
        prof.dump_stats(path)


def _receiver_main(conn: Connection, args: argparse.Namespace) -> None:
    loop = _setup(args.patched, args.uvloop, args.sender_fast, args.cc, args.stock_group)
    path = f"{args.profile}.receiver.prof" if args.profile else None
    _run_profiled(loop, _receiver(conn, args), path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--patched", dest="patched", action="store_true", default=True)
    p.add_argument("--stock", dest="patched", action="store_false")
    p.add_argument("--uvloop", dest="uvloop", action="store_true", default=True)
    p.add_argument("--asyncio", dest="uvloop", action="store_false")
    p.add_argument("--msg-kib", type=int, default=256)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument(
        "--no-sender-fast",
        dest="sender_fast",
        action="store_false",
        help="A/B: patched receiver, stock sender",
    )
    p.add_argument("--cc", choices=["bbr", "cubic"], help="the patched sender's congestion controller")
    p.add_argument(
        "--stock-group",
        action="append",
        default=[],
        choices=["sctp", "ice", "dtls"],
        help="A/B: leave this patch group stock (repeatable)",
    )
    p.add_argument("--profile", metavar="PREFIX", help="cProfile both sides to PREFIX.{sender,receiver}.prof")
    args = p.parse_args()

    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    proc = ctx.Process(target=_receiver_main, args=(b, args))
    proc.start()
    loop = _setup(args.patched, args.uvloop, args.sender_fast, args.cc, args.stock_group)
    try:
        path = f"{args.profile}.sender.prof" if args.profile else None
        res = _run_profiled(loop, _sender(a, args), path)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    mb = args.mib * MIB / 1e6
    cpu = res["cpu_sender_send"] + res["cpu_receiver"]
    out = {
        "patched": args.patched,
        "uvloop": args.uvloop,
        "sender_fast": args.patched and args.sender_fast,
        "cc": args.cc,
        "stock_groups": args.stock_group,
        "msg_kib": args.msg_kib,
        "mib": args.mib,
        "mb_s": round(mb / res["wall"], 2),
        "cpu_sender_s": round(res["cpu_sender_send"], 3),
        "cpu_receiver_s": round(res["cpu_receiver"], 3),
        "cpu_ms_per_mib": round(1000 * cpu / args.mib, 1),
        "intact": res["sha_ok"],
        "sctp": res["sctp"],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
