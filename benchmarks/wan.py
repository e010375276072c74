"""Data channels across an emulated home link: ours vs stock aiortc vs TCP CUBIC vs TCP BBR (root).

Path (``benchmarks/wan_path.py``): namespaces ``a`` - ``r`` - ``b``; the router ``r`` adds half the RTT
each way (NFQUEUE to ``tests.nat.delay``: this kernel has no netem), drops packets at random in both
directions (iptables ``statistic``; the counter of the a->b rule gives the data packets lost), and for the
bottleneck cases shapes r->b with ``tbf`` (4 MB/s by default, see :data:`BOTTLENECK_MBPS`; about one BDP
of buffer). Offloads are off, so every packet is MTU-sized.

Cases, interleaved per repetition: for each loss rate, ours with each controller, stock aiortc (both
ends), TCP with ``TCP_CONGESTION`` cubic and bbr; then, without random loss, ours alone through the
bottleneck (utilisation) and ours beside one TCP CUBIC flow (``fair_share``: our share of the two flows'
bytes, see :func:`shared_window_share`); then a 64 KiB call
whose last DATA packet is dropped (in memory, same RTT), p99 completion of its round trip. Goodput is
counted at the receiver after a warm-up; CPU per process is a fraction of one core and a case whose
process sits above 0.9 is flagged ``cpu_bound``; ``machine_overloaded`` says the load average exceeded
the core count (then every aiortc figure is CPU-starved). Lost packets are counted on the path: random
drops plus datagrams the receiving namespace's UDP sockets dropped.

Usage: ``.venv/bin/python -m benchmarks.wan [--quick] [--duration 60] [--repeat 1] [--cases
loss,bottleneck,tail] [--trace FILE]``; ``--trace`` writes our senders' cwnd, flight, srtt, pacing rate,
bandwidth estimate and in-flight bound every 0.25 s (and, in the shared case, the TCP CUBIC sender's cwnd,
ssthresh, RTT and retransmissions from ``TCP_INFO``). A process is ``cpu_bound`` when the CPU it used
plus the time it waited in the run queue exceed 0.9 of a core (on an oversubscribed box a starved
process uses little CPU yet is limited by it). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.wan_path import A_IP, B_IP, Path3
from tests.nat.topology import PYTHON, Proc

CONTROLLERS = ("bbr", "cubic")
DEFAULT_CC = "bbr"
# The bottleneck's rate. Not the 8 MB/s: one aiortc flow through the delayer costs this 2-core box
# ~0.31 core-seconds per MB (sender ~0.12, receiver ~0.12, delayer ~0.06; ``cpu_ceiling_MBps`` in the
# output), so 8 MB/s would need more than both cores with nothing else running and the case would
# measure the CPU, not the controller. 4 MB/s needs about 1.3 cores.
BOTTLENECK_MBPS = 4.0
# The shared case. The TCP CUBIC flow starts JOIN_LEAD_S before ours (a download already filling the
# link when a volunteer's transfer begins; 0: ours first, TCP when our channel opens), and the share
# counts only the seconds both ran, after SHARE_SETTLE_S of the later one's start. With a one-BDP buffer
# at 4 MB/s and 50 ms, CUBIC's epoch (K = cbrt(W_max (1 - beta) / C)) is about 5 s: the share over a 5 s
# case's 3.75 s, each receiver on its own window, measured whose start-up won (0.185 beside a TCP flow
# that started while our connection was still being set up), not the sharing; SHARED_S holds several
# epochs. The receivers' clocks are one clock (CLOCK_MONOTONIC is not per network namespace).
SHARE_SETTLE_S = 5.0
SHARED_S = 60.0
SHARED_QUICK_S = 25.0
JOIN_LEAD_S = 2.0


def _peer(path: Path3, name: str, ns: str, role: str, host: str, duration: float, **extra: Any) -> Proc:
    args = [PYTHON, "-m", "benchmarks.wan_peer", "--role", role, "--host", host, "--duration", str(duration)]
    args += ["--warmup", str(min(2.0, duration / 4))]
    for key, value in extra.items():
        args += [f"--{key}", str(value)]
    return Proc(name, ns, args, path.log_dir)


def start_aiortc(path: Path3, mode: str, cc: str, duration: float, trace: bool = False) -> tuple[Proc, Proc]:
    send = _peer(path, f"{mode}-{cc}-send", path.a, "aiortc-send", A_IP, duration, mode=mode, cc=cc,
                 trace=int(trace))  # fmt: skip
    recv = _peer(path, f"{mode}-{cc}-recv", path.b, "aiortc-recv", B_IP, duration, mode=mode, cc=cc)
    offer = send.event(timeout=60)
    recv.proc.stdin.write(json.dumps(offer) + "\n")  # type: ignore[union-attr]
    recv.proc.stdin.flush()  # type: ignore[union-attr]
    answer = recv.event(timeout=60)
    send.proc.stdin.write(json.dumps(answer) + "\n")  # type: ignore[union-attr]
    send.proc.stdin.flush()  # type: ignore[union-attr]
    return send, recv


def start_tcp(
    path: Path3, cc: str, duration: float, port: int = 9500, trace: bool = False
) -> tuple[Proc, Proc]:
    recv = _peer(path, f"tcp-{cc}-recv", path.b, "tcp-recv", B_IP, duration, port=port)
    recv.event(timeout=30)
    send = _peer(path, f"tcp-{cc}-send", path.a, "tcp-send", A_IP, duration, cc=cc, peer=B_IP, port=port,
                 trace=int(trace))  # fmt: skip
    return send, recv


def finish(pair: tuple[Proc, Proc], duration: float) -> dict[str, Any]:
    send, recv = pair
    try:
        s = send.event(timeout=duration + 90)
        while "sender" not in s:  # {"open": true}, unless a caller already waited for it
            s = send.event(timeout=duration + 90)
        r = recv.event(timeout=duration + 90)
    finally:
        send.stop()
        recv.stop()
    return {
        "MBps": round(r["MBps"], 3),
        "cpu_send": s.get("cpu"),
        "cpu_recv": r.get("cpu"),
        "demand_send": _r(s.get("demand")),
        "demand_recv": _r(r.get("demand")),
        "cpu_bound": cpu_bound(s, r),
        "rtx": s.get("rtx"),
        "stats": s.get("stats"),
        "tcp_cc": s.get("cc"),
        "trace": s.get("trace"),
        "bin_s": r.get("bin_s"),
        "bins": r.get("bins"),
    }


def shared_window_share(
    ours: list[list[int]], other: list[list[int]], bin_s: float, settle_s: float = SHARE_SETTLE_S
) -> dict[str, Any]:
    """Our share of two flows' bytes over the seconds both were running, and per second.

    ``ours``/``other``: a receiver's ``[bin index, bytes]`` on one clock. The window opens ``settle_s``
    after the later flow's first byte (its start-up, and the other's answer to it, left out) and
    closes with the earlier flow's last bin (neither has stopped sending inside it). The share is the
    window's bytes, not a mean of per-second shares (a second in which both moved little would weigh as
    much as a full one). Per-second shares, for the reader, show whether the split held or oscillated.
    """
    a, b = dict((k, n) for k, n in ours), dict((k, n) for k, n in other)
    if not a or not b:
        return {"share": None, "window_s": 0.0, "join_share": None, "per_s": []}
    start = max(min(a), min(b)) + round(settle_s / bin_s)
    end = min(max(a), max(b))  # inclusive; the last bin may be partial for one flow: dropped
    bins = range(start, end)
    mine = sum(a.get(k, 0) for k in bins)
    both = mine + sum(b.get(k, 0) for k in bins)
    per = max(1, round(1.0 / bin_s))
    first = start - round(settle_s / bin_s)
    join_mine = sum(a.get(k, 0) for k in range(first, start))
    join_both = join_mine + sum(b.get(k, 0) for k in range(first, start))
    per_s = []
    for k0 in range(first, end - per + 1, per):
        m = sum(a.get(k, 0) for k in range(k0, k0 + per))
        t = m + sum(b.get(k, 0) for k in range(k0, k0 + per))
        per_s.append(round(m / t, 2) if t else None)
    return {
        "share": round(mine / both, 3) if both and len(bins) else None,
        "window_s": round(max(0, len(bins)) * bin_s, 2),
        "join_share": round(join_mine / join_both, 3) if join_both else None,
        "per_s": per_s,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _proc_sched(pid: int) -> tuple[float, float]:
    try:
        run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def cpu_bound(*sides: dict[str, Any]) -> bool:
    """A process that used, or waited in the run queue for, more than 0.9 of a core was CPU-bound: on
    an oversubscribed box it gets a fraction of a core, and its CPU time alone would hide that."""
    wanted = [side.get(k) for side in sides for k in ("demand", "cpu")]
    return max((c for c in wanted if c is not None), default=0.0) > 0.9


def run_case(path: Path3, kind: str, cc: str, duration: float, trace: bool = False) -> dict[str, Any]:
    drops0 = path.data_drops()
    d0, t0 = _proc_sched(path.delay.proc.pid), time.monotonic()
    pair = start_tcp(path, cc, duration) if kind == "tcp" else start_aiortc(path, kind, cc, duration, trace)
    out = finish(pair, duration)
    drops1 = path.data_drops()
    out["drops_by_source"] = {k: drops1[k] - drops0[k] for k in drops1}
    out["data_drops"] = sum(out["drops_by_source"].values())
    d1, wall = _proc_sched(path.delay.proc.pid), time.monotonic() - t0
    # The delayer is a Python process too: if it wants a whole core, the path, not the flow, is the limit.
    out["delay_cpu"] = round((d1[0] - d0[0]) / wall, 2)
    out["delay_demand"] = round((d1[0] - d0[0] + d1[1] - d0[1]) / wall, 2)
    return out


def tail_calls(n: int, rtt_ms: float) -> dict[str, float]:
    """p99 round trip of a 64 KiB call whose last DATA packet is dropped (in memory), ours vs stock."""
    import asyncio

    from benchmarks.wan_tail import tail_call_times

    return asyncio.run(tail_call_times(n, rtt_ms / 2000))


_SHOWN = ("fast_retransmits", "rack_losses", "tlp_probes", "rto_expiries", "recoveries", "srtt_ms", "cwnd",
          "sack_every")  # fmt: skip


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _cpu_text(r: dict[str, Any]) -> str:
    """CPU used / wanted (used + waited for a core) per side, and the delayer's."""
    bound = " CPU-BOUND" if r["cpu_bound"] else ""
    wanted = f"{_f(r['demand_send'])}/{_f(r['demand_recv'])}{bound}"
    text = f"cpu {_f(r['cpu_send'])}/{_f(r['cpu_recv'])} wanted {wanted}"
    if "delay_cpu" in r:
        text += f" delayer {_f(r['delay_cpu'])}/{_f(r['delay_demand'])}"
    return text


def _cpu_ceiling(runs: list[dict[str, Any]]) -> float | None:
    """The rate at which one flow and the delayer would use every core of this box (from the cases
    through the bottleneck): above it, a case measures the CPU, not the controller."""
    per_mb = [
        (r["cpu_send"] + r["cpu_recv"] + r["delay_cpu"]) / r["MBps"]
        for r in runs
        if r.get("cpu_send") and r.get("cpu_recv") and r.get("MBps")
    ]
    return round((os.cpu_count() or 1) / statistics.median(per_mb), 1) if per_mb else None


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def _strip(r: dict[str, Any]) -> dict[str, Any]:
    if "ours" in r:
        return {side: v if side == "share" else _strip(v) for side, v in r.items()}
    return {k: v for k, v in r.items() if k not in ("stats", "trace", "bins")}


def _traces(r: dict[str, Any]) -> Any:
    if "ours" in r:  # the shared case: each sender's trace (TCP has none), the share, both flows' bins
        out = {side: v.get("trace") if side != "share" else v for side, v in r.items()}
        out["bins"] = {side: v.get("bins") for side, v in r.items() if side != "share"}
        return out
    return r.get("trace")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short cases: the whole run within about 2 minutes")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rtt-ms", type=float, default=50.0)
    ap.add_argument("--losses", default="0.001,0.01")
    ap.add_argument("--bottleneck-MBps", type=float, default=BOTTLENECK_MBPS)
    ap.add_argument("--cases", default="loss,bottleneck,tail", help="which groups to run (comma-separated)")
    ap.add_argument("--cc", default=DEFAULT_CC, help="our controller in the bottleneck cases")
    ap.add_argument("--join-lead", type=float, default=JOIN_LEAD_S,
                    help=f"start the TCP CUBIC flow this many seconds before ours ({JOIN_LEAD_S:g}; 0: ours "
                    "first, TCP when our channel opens)")  # fmt: skip
    ap.add_argument("--shared-duration", type=float, default=None,
                    help=f"seconds of the case beside TCP CUBIC ({SHARED_S:g}; --quick {SHARED_QUICK_S:g}): "
                    f"the share counts from {SHARE_SETTLE_S:g} s after the later flow's start")  # fmt: skip
    ap.add_argument("--trace", default="", help="a file: our senders' congestion state every 0.25 s (JSON)")
    ap.add_argument("--autogroup-nice", type=int, default=None,
                    help="set this session's scheduler autogroup to this nice value while running (e.g. -10 "
                    "on a box shared with other work: the aiortc figures then measure the transport, not "
                    "the neighbours); said in the JSON")  # fmt: skip
    args = ap.parse_args()
    groups = set(args.cases.split(","))
    if args.autogroup_nice is not None:
        Path("/proc/self/autogroup").write_text(str(args.autogroup_nice))
    if os.geteuid() != 0 or shutil.which("tc") is None:
        print("benchmarks/wan.py needs root, iproute2 (tc) and iptables", file=sys.stderr)
        return 2
    duration = 5.0 if args.quick else args.duration
    shared_s = args.shared_duration or (SHARED_QUICK_S if args.quick else max(SHARED_S, duration))
    controllers = (DEFAULT_CC,) if args.quick else CONTROLLERS
    losses = [float(x) for x in args.losses.split(",")]
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    path = Path3(args.rtt_ms)
    t0 = time.monotonic()
    try:
        for rep in range(args.repeat):
            for loss in losses if "loss" in groups else ():
                path.set_loss(loss)
                cases = [("ours", cc) for cc in controllers] + [
                    ("stock", "reno"),
                    ("tcp", "cubic"),
                    ("tcp", "bbr"),
                ]
                for kind, cc in cases:
                    key = f"{kind}_{cc}_loss_{loss}"
                    r = run_case(path, kind, cc, duration, trace=bool(args.trace))
                    results.setdefault(key, []).append(r)
                    st = {k: v for k, v in (r["stats"] or {}).items() if k in _SHOWN}
                    print(f"[{rep}] {key}: {r['MBps']:.3f} MB/s {_cpu_text(r)} drops {r['data_drops']} "
                          f"{r['drops_by_source']} rtx {r['rtx']} {st}", flush=True)  # fmt: skip
            path.set_loss(0.0)
            if "bottleneck" not in groups:
                continue
            bdp = int(args.bottleneck_MBps * 1e6 * args.rtt_ms / 1000)
            with path.bottleneck(args.bottleneck_MBps, bdp):
                alone = run_case(path, "ours", args.cc, duration, trace=bool(args.trace))
                results.setdefault("bottleneck_alone", []).append(alone)
                if args.join_lead > 0:  # TCP's download runs first; ours joins it
                    tcp_s = shared_s + args.join_lead + 3  # still sending when ours stops (connect: ~1 s)
                    tcp = start_tcp(path, "cubic", tcp_s, port=9501, trace=bool(args.trace))
                    time.sleep(args.join_lead)
                ours = start_aiortc(path, "ours", args.cc, shared_s, trace=bool(args.trace))
                ours[0].event(timeout=60)  # our channel is open: from here ours sends for shared_s
                if args.join_lead <= 0:
                    tcp = start_tcp(path, "cubic", shared_s, port=9501, trace=bool(args.trace))
                o, t = finish(ours, shared_s), finish(tcp, shared_s)
                share = shared_window_share(o["bins"] or [], t["bins"] or [], o["bin_s"] or 0.25)
                results.setdefault("bottleneck_shared", []).append({"ours": o, "tcp": t, "share": share})
                print(f"[{rep}] bottleneck: alone {alone['MBps']:.2f} ({_cpu_text(alone)}), "
                      f"shared ours {o['MBps']:.2f} ({_cpu_text(o)}) tcp cubic {t['MBps']:.2f} MB/s, "
                      f"our share {share['share']} over {share['window_s']} s (first {SHARE_SETTLE_S:g} s "
                      f"{share['join_share']}), per second {share['per_s']}",
                      flush=True)  # fmt: skip
    finally:
        path.close()
    tail = tail_calls(12 if args.quick else 100, args.rtt_ms) if "tail" in groups else {}
    print(f"tail calls (in memory): {tail}", flush=True)

    def med(key: str) -> float | None:
        return _median([r["MBps"] for r in results.get(key, [])])

    summary: dict[str, Any] = {"duration_s": duration, "repeat": args.repeat, "rtt_ms": args.rtt_ms,
                               "default_cc": DEFAULT_CC, "bottleneck_cc": args.cc,
                               "load_avg": round(load[0], 1)}  # fmt: skip
    for loss in losses:
        tag = f"0p{str(loss).split('.')[1]}" if loss < 1 else str(loss)
        tag = {"0p001": "0p1", "0p01": "1"}.get(tag, tag)
        summary[f"wan_MBps_loss_{tag}"] = med(f"ours_{DEFAULT_CC}_loss_{loss}")
        for cc in controllers:
            summary[f"wan_{cc}_MBps_loss_{tag}"] = med(f"ours_{cc}_loss_{loss}")
        summary[f"stock_MBps_loss_{tag}"] = med(f"stock_reno_loss_{loss}")
        summary[f"tcp_cubic_MBps_loss_{tag}"] = med(f"tcp_cubic_loss_{loss}")
        summary[f"tcp_bbr_MBps_loss_{tag}"] = med(f"tcp_bbr_loss_{loss}")
        spread = [r["MBps"] for r in results.get(f"ours_{DEFAULT_CC}_loss_{loss}", [])]
        summary[f"wan_MBps_loss_{tag}_spread"] = [min(spread), max(spread)] if spread else None
    ours_runs = [r for k, rs in results.items() if k.startswith(f"ours_{DEFAULT_CC}_loss") for r in rs]
    stock_runs = [r for k, rs in results.items() if k.startswith("stock_") for r in rs]
    for name, runs in (("rtx_per_loss", ours_runs), ("stock_rtx_per_loss", stock_runs)):
        drops = sum(r["data_drops"] for r in runs)
        summary[name] = round(sum(r["rtx"] or 0 for r in runs) / drops, 2) if drops else None
    alone_rates = [r["MBps"] for r in results.get("bottleneck_alone", [])]
    summary["bottleneck_utilisation"] = (
        round(statistics.median(alone_rates) / args.bottleneck_MBps, 3) if alone_rates else None
    )
    shares = [s["share"]["share"] for s in results.get("bottleneck_shared", [])]
    shares = [x for x in shares if x is not None]
    summary["fair_share"] = round(statistics.median(shares), 3) if shares else None
    summary["fair_share_spread"] = [min(shares), max(shares)] if shares else None
    summary["shared_duration_s"] = shared_s
    summary["join_lead_s"] = args.join_lead
    joins = [s["share"]["join_share"] for s in results.get("bottleneck_shared", [])]
    summary["join_share"] = _median([x for x in joins if x is not None])
    summary["bottleneck_MBps"] = args.bottleneck_MBps
    summary["cpu_ceiling_MBps"] = _cpu_ceiling(results.get("bottleneck_alone", []))
    summary["tail_call_ms_p99"] = tail.get("ours_p99_ms")
    summary["stock_tail_call_ms_p99"] = tail.get("stock_p99_ms")
    summary["cpu_bound"] = sorted(
        k for k, rs in results.items() if any(r.get("cpu_bound") for r in rs if "cpu_bound" in r)
    )
    # Processes on an oversubscribed box get a fraction of a core each: not cpu_bound by the 0.9 rule,
    # yet every aiortc figure is then CPU-starved (TCP runs in the kernel and is not).
    end_load = os.getloadavg()[0]
    summary["load_avg_end"] = round(end_load, 1)
    summary["machine_overloaded"] = max(load[0], end_load) > (os.cpu_count() or 1)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    summary["autogroup_nice"] = args.autogroup_nice
    if args.autogroup_nice is not None:
        Path("/proc/self/autogroup").write_text("0")
    if args.trace:
        Path(args.trace).write_text(json.dumps({k: [_traces(r) for r in rs] for k, rs in results.items()}))
    summary["cases"] = {k: [_strip(r) for r in rs] for k, rs in results.items()}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
