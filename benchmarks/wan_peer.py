"""One end of a benchmarks/wan.py case, run inside a network namespace; JSON lines on stdin/stdout.

Roles: ``aiortc-send`` / ``aiortc-recv`` (a data channel, stock aiortc or with the project's patches and
a chosen congestion controller) and ``tcp-send`` / ``tcp-recv`` (a plain TCP stream with the controller
pinned per socket by ``TCP_CONGESTION``). Receivers count goodput over ``[first byte + warmup, first byte
+ duration]``, and also every byte in bins of :data:`BIN_S` on the system-wide monotonic clock (the same
in every namespace), so two flows that shared a bottleneck can be compared over the seconds both ran,
whatever their own start-ups took. Every process reports the CPU it used over its active period
(fraction of one core). An aiortc sender says ``{"open": true}`` when its channel opens, so a competitor
can be started with it rather than a connection set-up earlier.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import sys
import time
import types
from pathlib import Path
from typing import Any


def _light_engine_import() -> None:
    """Let ``engine.p2p.patches`` and ``engine.p2p.eventloop`` import without ``engine.p2p``'s package
    init, which pulls in torch through the wire codecs: 12 s per process on a loaded 2-core box, 1 s
    without. Neither module needs anything else from the package."""
    root = Path(__file__).resolve().parents[1]
    for name, path in (("engine", root / "engine"), ("engine.p2p", root / "engine" / "p2p")):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]
            sys.modules[name] = module


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sched() -> tuple[float, float]:
    """(CPU seconds, seconds spent runnable but waiting for a core) of this process. The second shows a
    CPU-starved process on an oversubscribed box, which CPU time alone hides (it gets a third of a core
    and looks idle)."""
    try:
        run, wait, _ = Path("/proc/self/schedstat").read_text().split()
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return _cpu(), 0.0


def _demand(since: tuple[float, float], wall: float) -> float:
    """Fraction of one core the process wanted over ``wall`` s: used plus waited for."""
    now = _sched()
    return (now[0] - since[0] + now[1] - since[1]) / wall if wall > 0 else 0.0


def _say(msg: dict[str, Any]) -> None:
    print(json.dumps(msg), flush=True)


async def _read_line() -> dict[str, Any]:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line:
        raise SystemExit(0)
    return json.loads(line)  # type: ignore[no-any-return]


BIN_S = 0.25  # the receivers' byte bins (benchmarks/wan.py computes shares per second from them)


class Meter:
    """Bytes received inside the measuring window, and CPU over it; every byte also in time bins."""

    def __init__(self, duration: float, warmup: float) -> None:
        self.duration, self.warmup = duration, warmup
        self.first: float | None = None
        self.bins: dict[int, int] = {}
        self.bytes = 0
        self.total = 0
        self.cpu0 = 0.0
        self.sched0 = (0.0, 0.0)
        self.done = asyncio.Event()

    def add(self, n: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.total += n
        elapsed = now - self.first
        if elapsed <= self.duration:
            k = int(now / BIN_S)
            self.bins[k] = self.bins.get(k, 0) + n
        if elapsed >= self.warmup and not self.cpu0:
            self.cpu0 = _cpu()
            self.sched0 = _sched()
        if self.warmup <= elapsed <= self.duration:
            self.bytes += n

    async def wait(self) -> None:
        """Until the window closes: the first byte plus ``duration`` (whether or not more arrives)."""
        while self.first is None:  # noqa: ASYNC110  (polling a counter the message callback sets)
            await asyncio.sleep(0.05)
        await asyncio.sleep(max(0.0, self.first + self.duration - time.monotonic()))
        self.done.set()

    def result(self) -> dict[str, Any]:
        window = self.duration - self.warmup
        return {
            "MBps": self.bytes / window / 1e6,
            "bytes": self.total,
            "cpu": (_cpu() - self.cpu0) / window if self.cpu0 else None,
            "demand": _demand(self.sched0, window) if self.cpu0 else None,
            "bin_s": BIN_S,
            "bins": sorted(self.bins.items()),
        }


_TRACED = (
    "cwnd",
    "flight",
    "srtt_ms",
    "min_rtt_ms",
    "pacing_rate",
    "btl_bw",
    "inflight_hi",
    "bbr_state",
    "coexist",
    "peer_rwnd",
    "in_recovery",
    "retransmissions",
    "recoveries",
    "rto_expiries",
    "w_max",
)


def _spawn_tracer(transport: Any, trace: list[dict[str, Any]], duration: float) -> None:
    """Every 0.25 s the sender's congestion state, and the delivery rate since the last sample."""
    from engine.p2p import patches

    async def sample() -> None:
        t0 = time.monotonic()
        last = (t0, 0)
        while time.monotonic() - t0 < duration:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            st = patches.transport_stats(transport)
            delivered = int(getattr(transport, "_delivered", 0))
            row = {k: st.get(k) for k in _TRACED if k in st}
            row["t"] = round(now - t0, 2)
            row["delivery_MBps"] = round((delivered - last[1]) / (now - last[0]) / 1e6, 3)
            last = (now, delivered)
            trace.append(row)

    task = asyncio.ensure_future(sample())
    _TASKS.add(task)


_TASKS: set[asyncio.Future[Any]] = set()

# struct tcp_info (linux/tcp.h): byte offsets of the u32 fields a TCP sender's trace reads.
_TCPI = {"rtt_us": 68, "ssthresh": 76, "cwnd": 80, "total_retrans": 100, "unacked": 24, "lost": 32}


def _spawn_tcp_tracer(sock: socket.socket, trace: list[dict[str, Any]], duration: float) -> None:
    """Every 0.25 s the kernel's view of a TCP sender (cwnd and ssthresh in segments, RTT, losses),
    so a shared case shows both flows' windows side by side."""

    async def sample() -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration:
            await asyncio.sleep(0.25)
            with contextlib.suppress(OSError):
                raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                row: dict[str, Any] = {
                    k: int.from_bytes(raw[o : o + 4], sys.byteorder) for k, o in _TCPI.items()
                }
                row["t"] = round(time.monotonic() - t0, 2)
                trace.append(row)

    task = asyncio.ensure_future(sample())
    _TASKS.add(task)


async def aiortc_side(args: argparse.Namespace) -> None:
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc import rtcsctptransport as sctp

    from engine.p2p import patches

    patches.pin_host_addresses([args.host])
    if args.mode == "ours":
        patches.install(strict=True)
        patches.set_default_congestion_control(args.cc)
    rtx = [0]
    send_chunk = sctp.RTCSctpTransport._send_chunk

    async def counting_send_chunk(self: Any, chunk: Any) -> None:  # both modes pay the same cost
        if isinstance(chunk, sctp.DataChunk) and chunk._sent_count > 1:
            rtx[0] += 1
        await send_chunk(self, chunk)

    sctp.RTCSctpTransport._send_chunk = counting_send_chunk  # type: ignore[method-assign]
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if args.role == "aiortc-send":
        ch = pc.createDataChannel("bulk")
        opened = asyncio.Event()
        ch.on("open", opened.set)
        await pc.setLocalDescription(await pc.createOffer())
        offer = patches.advertise_sack_frequency(pc.localDescription.sdp)  # as a node's link does
        _say({"offer": offer})
        answer = await _read_line()
        await pc.setRemoteDescription(RTCSessionDescription(answer["answer"], "answer"))
        patches.agree_sack_frequency(pc.sctp, offer, answer["answer"])
        await asyncio.wait_for(opened.wait(), 30)
        _say({"open": True})
        ch.bufferedAmountLowThreshold = 256 << 10
        low = asyncio.Event()
        ch.on("bufferedamountlow", low.set)
        message = os.urandom(64 << 10)
        trace: list[dict[str, Any]] = []
        if args.trace and pc.sctp is not None:
            _spawn_tracer(pc.sctp, trace, args.duration)
        cpu0, t0, sched0 = _cpu(), time.monotonic(), _sched()
        end = t0 + args.duration
        while time.monotonic() < end:
            while ch.bufferedAmount < (1 << 20):
                ch.send(message)
            low.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(low.wait(), 0.5)
        wall = time.monotonic() - t0
        stats = patches.transport_stats(pc.sctp) if pc.sctp else {}
        demand = _demand(sched0, wall)
        _say({"sender": True, "cpu": (_cpu() - cpu0) / wall, "demand": demand, "rtx": rtx[0], "stats": stats,
              "trace": trace})  # fmt: skip
        await _read_line()  # the parent closes stdin when the case is over
    else:
        meter = Meter(args.duration, args.warmup)

        @pc.on("datachannel")
        def _on_channel(channel: Any) -> None:
            channel.on("message", lambda m: meter.add(len(m)))

        offered = await _read_line()
        await pc.setRemoteDescription(RTCSessionDescription(offered["offer"], "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        answer_sdp = patches.advertise_sack_frequency(pc.localDescription.sdp)
        patches.agree_sack_frequency(pc.sctp, answer_sdp, offered["offer"])
        _say({"answer": answer_sdp})
        await asyncio.wait_for(meter.wait(), args.duration + 60)
        _say(meter.result())
        await _read_line()
    await pc.close()


async def tcp_side(args: argparse.Namespace) -> None:
    if args.role == "tcp-recv":
        meter = Meter(args.duration, args.warmup)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while not meter.done.is_set():
                data = await reader.read(1 << 16)
                if not data:
                    break
                meter.add(len(data))
            writer.close()

        server = await asyncio.start_server(serve, args.host, args.port)
        _say({"ready": args.port})
        await asyncio.wait_for(meter.wait(), args.duration + 60)
        _say(meter.result())
        server.close()
        await _read_line()
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, args.cc.encode())
    chosen = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
    sock.connect((args.peer, args.port))
    sock.setblocking(False)
    _, writer = await asyncio.open_connection(sock=sock)
    block = os.urandom(1 << 16)
    trace: list[dict[str, Any]] = []
    if args.trace:
        _spawn_tcp_tracer(sock, trace, args.duration)
    cpu0, t0 = _cpu(), time.monotonic()
    end = t0 + args.duration
    try:
        while time.monotonic() < end:
            writer.write(block)
            await writer.drain()
    except ConnectionError:
        pass
    wall = time.monotonic() - t0
    _say({"sender": True, "cpu": (_cpu() - cpu0) / wall, "cc": chosen, "trace": trace})
    await _read_line()
    writer.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--role", required=True)
    p.add_argument("--mode", default="ours", choices=["ours", "stock"])
    p.add_argument("--cc", default="bbr")
    p.add_argument("--host", required=True)
    p.add_argument("--peer", default="")
    p.add_argument("--port", type=int, default=9500)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--trace", type=int, default=0, help="1: the sender samples its congestion state")
    args = p.parse_args()
    if args.role.startswith("aiortc"):
        _light_engine_import()
        from engine.p2p import eventloop  # the node's loop (uvloop where present), ours and stock alike

        eventloop.run(aiortc_side(args))
    else:
        asyncio.run(tcp_side(args))  # the kernel does TCP's work: the loop does not matter


if __name__ == "__main__":
    main()
