"""One FFN expert (d=1024, hidden 4096): forward+backward samples/s in process vs through the whole stack.

In process (``inprocess_sps``): the module's forward, backward and Adam step on batches of ``--batch``
float32 samples, in a process of its own, on ``--device``. Remote (``remote_sps``): the trainer side's
``RemoteExpert.call_forward`` / ``call_backward`` (float16 on the wire, the backward sends only the output
gradient) -> Peer -> WebRTC data channel on loopback -> ExpertServer (batching, a worker thread on the
device, the host's Adam step), ``--in-flight`` requests at once, the project's aiortc patches and loop.
``--wire int8`` sends the calls in 8-bit (about half of float16's bytes and packets).

Layouts (``--layout``):

* ``split`` (default, the reported figures): the host in its own process, as a volunteer's node is, and
  the trainer in another; the parent only runs the signaling hub and measures.
* ``inprocess``: host and trainer peers in one process on one event loop (the earlier layout), sharing
  that loop and its CPU with each other.
* ``both``: each, interleaved.

Every figure comes from a fixed window (``--seconds``: 30 s, ``--quick`` 8 s) after a warm-up (link up,
batching, allocator), repeated ``--repeat`` times (3) with the cases interleaved in every round, and
reported as median with min and max. CPU time is every process's (host, trainer, parent; psutil) over the
window: ``cpu_ms_per_sample``. ``wire_bytes_per_sample`` counts every byte both ways on the channel
(headers, tensors, frames) over all calls once every one has completed; float16 inputs, outputs and
gradients are 4 x 2 KiB = 8 KiB for d=1024.
``udp_packets_per_sample`` counts DTLS records both ways (about one SCTP packet each);
``loop_cpu_us_per_packet`` is both event loop threads' CPU per packet (they carry the transport; compute
runs on worker threads) and ``loop_kernel_share`` the part of it spent in the kernel (UDP syscalls, epoll).

What bounds the remote figure is printed as ``bound``, from the busy fraction of each event loop thread
(``host_loop_busy``, ``trainer_loop_busy``: CPU seconds per wall second), the host's compute threads and
the whole machine's (``machine_busy``, every process on the box, since it is shared): a loop near 1.0 is
the transport's Python bound; a machine near 1.0 is the cores.

``--device auto`` (default) picks CUDA when there is one; the JSON names the device. ``--profile DIR``
records both processes of one extra split run with py-spy (when installed) into DIR and prints a CPU
breakdown by layer (SCTP, DTLS, ICE, event loop, framing, torch); see ``benchmarks/cpu_breakdown.py``.

The spawned processes (baseline, host, trainer) are ``benchmarks/expert_sides.py``; the figures' summary
is ``benchmarks/expert_figures.py``; this script starts, measures and reports.

    .venv/bin/python benchmarks/expert_throughput.py --quick          # about two minutes
    .venv/bin/python benchmarks/expert_throughput.py --device cuda    # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
from expert_figures import bound, profile_figures, stats, summarize  # benchmarks/ is first on sys.path
from expert_sides import compute_main, host_main, trainer_main

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# -- the parent: spawn, window, CPU -----------------------------------------------------------------


def _thread_cpu(pid: int, tid: int | None) -> tuple[float, float]:
    """(user, system) CPU seconds of one thread; system time is the kernel's (UDP syscalls, epoll)."""
    if tid is None:
        return 0.0, 0.0
    for t in psutil.Process(pid).threads():
        if t.id == tid:
            return float(t.user_time), float(t.system_time)
    return 0.0, 0.0


def _proc_cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


class Window:
    """CPU of named processes (and one loop thread each) and the machine's, between two marks."""

    def __init__(self, procs: dict[str, tuple[int, int | None]]) -> None:
        self.procs = procs

    def read(self) -> dict[str, Any]:
        sys_cpu = psutil.cpu_times()
        return {
            "wall": time.perf_counter(),
            "proc": {name: _proc_cpu(pid) for name, (pid, _) in self.procs.items()},
            "loop": {name: _thread_cpu(pid, tid) for name, (pid, tid) in self.procs.items()},
            "sys_busy": sum(sys_cpu) - sys_cpu.idle - getattr(sys_cpu, "iowait", 0.0),
            "sys_total": sum(sys_cpu),
        }


def _measure(ctl: Connection, window: Window, seconds: float) -> dict[str, Any]:
    """Mark, wait ``seconds``, mark: the snapshots of the measured process and the CPU between."""
    c0 = window.read()
    ctl.send("mark")
    m0 = ctl.recv()
    time.sleep(seconds)
    c1 = window.read()
    ctl.send("mark")
    m1 = ctl.recv()
    elapsed = m1["t"] - m0["t"]
    wall = c1["wall"] - c0["wall"]
    samples = m1["done"] - m0["done"]
    cpu = {name: c1["proc"][name] - c0["proc"][name] for name in c0["proc"]}
    loop_s = {name: sum(c1["loop"][name]) - sum(c0["loop"][name]) for name in c0["loop"]}
    out: dict[str, Any] = {
        "sps": samples / elapsed,
        "samples": samples,
        "cpu_ms_per_sample": sum(cpu.values()) * 1000 / max(1, samples),
        "cores_busy": {name: round(v / wall, 2) for name, v in cpu.items()},
        "cpu_s": cpu,
        "loop_busy": {name: round(loop_s[name] / wall, 2) for name in loop_s},
        "loop_cpu_s": loop_s,
        "loop_kernel_s": {name: c1["loop"][name][1] - c0["loop"][name][1] for name in c0["loop"]},
        "wall_s": wall,
        "machine_busy": round(
            (c1["sys_busy"] - c0["sys_busy"]) / max(1e-9, c1["sys_total"] - c0["sys_total"]), 2
        ),
    }
    for key in ("wire", "records", "resends"):
        if key in m0:
            out[key] = m1[key] - m0[key]
    return out


def _spawn(ctx: Any, target: Any, *args: Any) -> tuple[Any, Connection]:
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args))
    proc.start()
    return proc, parent


def _finish(procs: list[Any]) -> None:
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()


def run_compute(ctx: Any, args: dict[str, Any], seconds: float) -> dict[str, Any]:
    proc, ctl = _spawn(ctx, compute_main, args)
    try:
        assert ctl.poll(300), "in-process baseline never warmed up"
        ctl.recv()
        m = _measure(ctl, Window({"compute": (proc.pid, None), "parent": (os.getpid(), None)}), seconds)
        ctl.send("stop")
    finally:
        _finish([proc])
    return m


def run_remote(
    ctx: Any,
    url: str,
    layout: str,
    args: dict[str, Any],
    seconds: float,
    profile: Path | None = None,
    native: bool = False,
) -> dict[str, Any]:
    procs = []
    host_ctl = None
    window: dict[str, tuple[int, int | None]] = {"parent": (os.getpid(), None)}
    try:
        host_id = None
        if layout == "split":
            host, host_ctl = _spawn(ctx, host_main, url, args)
            procs.append(host)
            assert host_ctl.poll(300), "host process did not start"
            hello = host_ctl.recv()
            host_id = hello["peer_id"]
            window["host"] = (host.pid, hello["loop_tid"])
        trainer, ctl = _spawn(ctx, trainer_main, url, host_id, args)
        procs.append(trainer)
        assert ctl.poll(600), "trainer never warmed up"
        info = ctl.recv()
        window["trainer"] = (trainer.pid, info["loop_tid"])
        spies = _start_profilers(window, seconds, profile, native) if profile is not None else []
        m = _measure(ctl, Window(window), seconds)
        for spy in spies:
            spy.wait(seconds + 60)
        ctl.send("stop")
        assert ctl.poll(240), "trainer did not stop"
        bye = ctl.recv()
        m["wire_total"], m["samples_total"] = bye["wire_total"], bye["samples_total"]
        if host_ctl is not None:
            host_ctl.send("stop")
    finally:
        _finish(procs)
    return m


def _start_profilers(
    window: dict[str, tuple[int, int | None]], seconds: float, out: Path, native: bool = False
) -> list[Any]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("py-spy is not installed (pip install py-spy): no profile", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    started = []
    for name in ("host", "trainer"):
        if name not in window:
            continue
        pid = window[name][0]
        cmd = [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--threads"]
        cmd += ["--format", "raw", "--output", str(out / f"{name}.txt")]
        # --native shows C frames too (OpenSSL, uvloop, torch kernels: what is per byte, what per call)
        # but must stop the process for every sample, so it samples less often and slows the run.
        cmd += ["--native", "--rate", "100"] if native else ["--nonblocking", "--rate", "200"]
        started.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return started


def _device(name: str) -> tuple[str, str]:
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device")
        return str(dev), torch.cuda.get_device_name(dev)
    return "cpu", f"CPU ({os.cpu_count()} cores)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 s windows (about two minutes in all)")
    parser.add_argument("--seconds", type=float, help="window per run (default 30, or 8 with --quick)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, cases interleaved in each (default 3)")
    parser.add_argument("--layout", choices=("split", "inprocess", "both"), default="split")
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu, cuda, cuda:N")
    parser.add_argument(
        "--wire", choices=("float16", "int8"), default="float16", help="expert calls' wire format (float16)"
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--profile", type=Path, metavar="DIR", help="one more split run under py-spy, to DIR")
    parser.add_argument("--native", action="store_true", help="with --profile: C frames too (slower)")
    opts = parser.parse_args()
    seconds = opts.seconds or (8.0 if opts.quick else 30.0)
    device, device_name = _device(opts.device)
    args = {
        "d": opts.d,
        "hidden": opts.hidden,
        "batch": opts.batch,
        "in_flight": opts.in_flight,
        "device": device,
        "wire": opts.wire,
    }
    layouts = ["split", "inprocess"] if opts.layout == "both" else [opts.layout]
    ctx = mp.get_context("spawn")
    from hub import signaling_hub_thread  # benchmarks/ is this script's folder, first on sys.path

    url, stop = signaling_hub_thread()
    from engine.p2p.eventloop import loop_name

    loads = [round(os.getloadavg()[0], 2)]
    local: list[dict[str, Any]] = []
    remote: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    try:
        for r in range(opts.repeat):
            cases = ["inprocess_compute", *layouts]
            for case in cases[r % len(cases) :] + cases[: r % len(cases)]:  # rotate: load drift hits all
                if case == "inprocess_compute":
                    local.append(run_compute(ctx, args, seconds))
                    got = local[-1]
                else:
                    remote[case].append(run_remote(ctx, url, case, args, seconds))
                    got = remote[case][-1]
                print(
                    f"  round {r + 1}/{opts.repeat} {case}: {got['sps']:.0f} samples/s, "
                    f"{got['cpu_ms_per_sample']:.2f} CPU ms/sample, cores {got['cores_busy']}, "
                    f"loops {got['loop_busy']}, machine {got['machine_busy']} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
            loads.append(round(os.getloadavg()[0], 2))
        profile = None
        if opts.profile is not None:
            profile = run_remote(ctx, url, "split", args, seconds, profile=opts.profile, native=opts.native)
    finally:
        stop.set()
    inproc = stats([x["sps"] for x in local])
    result: dict[str, Any] = {
        "device": device,
        "device_name": device_name,
        "layout": layouts[0],
        "d": opts.d,
        "hidden": opts.hidden,
        "batch": opts.batch,
        "in_flight": opts.in_flight,
        "wire": opts.wire,
        "window_s": seconds,
        "repeat": opts.repeat,
        "inprocess_sps": inproc["median"],
        "inprocess_sps_stats": inproc,
        "inprocess_cpu_ms_per_sample": stats([x["cpu_ms_per_sample"] for x in local], 3)["median"],
    }
    for i, layout in enumerate(layouts):
        s = summarize(remote[layout], opts.batch)
        paired = [m["sps"] / c["sps"] for m, c in zip(remote[layout], local, strict=True)]
        s["ratio"] = round(s["remote_sps"]["median"] / inproc["median"], 3)
        s["ratio_paired"] = stats(paired, 3)
        s["bound"] = bound(remote[layout], device)
        if i == 0:  # the headline figures: the first layout's (split by default)
            result.update(
                {
                    "remote_sps": s["remote_sps"]["median"],
                    "remote_sps_stats": s["remote_sps"],
                    "ratio": s["ratio"],
                    "cpu_ms_per_sample": s["cpu_ms_per_sample"]["median"],
                    "wire_bytes_per_sample": s["wire_bytes_per_sample"],
                    "bound": s["bound"],
                }
            )
        result[f"{layout}_layout"] = s
    if profile is not None:
        result["profile"] = profile_figures(opts.profile, profile)
    result.update({"loop": loop_name(), "load_avg_1m": loads, "cpus": os.cpu_count()})
    print(
        f"in process {inproc['median']:.0f} samples/s ({inproc['min']:.0f}-{inproc['max']:.0f}); "
        + "; ".join(
            f"{layout}: {result[f'{layout}_layout']['remote_sps']['median']:.0f} "
            f"({result[f'{layout}_layout']['remote_sps']['min']:.0f}-"
            f"{result[f'{layout}_layout']['remote_sps']['max']:.0f}), "
            f"ratio {result[f'{layout}_layout']['ratio']}, "
            f"{result[f'{layout}_layout']['cpu_ms_per_sample']['median']} CPU ms/sample; "
            f"bound: {result[f'{layout}_layout']['bound']}"
            for layout in layouts
        ),
        flush=True,
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
