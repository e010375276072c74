"""The figures of ``benchmarks/expert_throughput.py``, from the raw measurements of its runs: median and
spread, what bound the run, the per-run summary and the py-spy breakdown per layer. Kept apart from
the processes and windows that measure, so each file holds one concept.

Imported by that script (``benchmarks/`` is its folder, first on ``sys.path``).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any


def stats(values: list[float], digits: int = 1) -> dict[str, float]:
    med = statistics.median(values)
    return {
        "median": round(med, digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "spread": round((max(values) - min(values)) / med, 3) if med else 0.0,
    }


def bound(runs: list[dict[str, Any]], device: str) -> str:
    """The tightest of: an event loop at one core, the machine's cores, else latency/compute."""
    host = statistics.median([r["loop_busy"].get("host", 0.0) for r in runs])
    trainer = statistics.median([r["loop_busy"].get("trainer", 0.0) for r in runs])
    machine = statistics.median([r["machine_busy"] for r in runs])
    if max(host, trainer) >= 0.85:
        side = "host" if host >= trainer else "trainer"
        return f"the {side}'s event loop (one core of Python transport work: {max(host, trainer):.2f} busy)"
    ours = statistics.median([sum(r["cores_busy"].values()) for r in runs]) / (os.cpu_count() or 1)
    if machine >= 0.9:
        return (
            f"the machine's {os.cpu_count()} cores ({machine:.2f} busy, this benchmark's processes "
            f"{ours:.2f} of them: compute and transport share them with whatever else runs)"
        )
    if device == "cpu":
        return "host compute and request latency (no loop or core saturated)"
    return "request latency / in-flight depth (no loop or core saturated)"


def summarize(runs: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    sps = [r["sps"] for r in runs]
    out: dict[str, Any] = {
        "remote_sps": stats(sps),
        "cpu_ms_per_sample": stats([r["cpu_ms_per_sample"] for r in runs], 3),
        "cores_busy": {
            k: statistics.median([r["cores_busy"][k] for r in runs]) for k in runs[0]["cores_busy"]
        },
        "loop_busy": {k: statistics.median([r["loop_busy"][k] for r in runs]) for k in runs[0]["loop_busy"]},
        "machine_busy": statistics.median([r["machine_busy"] for r in runs]),
    }
    samples = sum(r["samples"] for r in runs)
    total = sum(r["samples_total"] for r in runs)
    out["wire_bytes_per_sample"] = round(sum(r["wire_total"] for r in runs) / max(1, total), 1)
    out["udp_packets_per_sample"] = round(sum(r["records"] for r in runs) / max(1, samples), 2)
    out["wire_MBps"] = round(statistics.median(sps) * out["wire_bytes_per_sample"] / 1e6, 2)
    # The event loop threads do the transport's work (compute runs on worker threads): their CPU per
    # UDP packet is the per-packet price of the Python stack, both sides together.
    loop_s = sum(sum(r["loop_cpu_s"].values()) for r in runs)
    out["loop_cpu_us_per_packet"] = round(loop_s * 1e6 / max(1, sum(r["records"] for r in runs)), 1)
    out["loop_cpu_ms_per_sample"] = round(loop_s * 1e3 / max(1, samples), 3)
    kernel_s = sum(sum(r["loop_kernel_s"].values()) for r in runs)
    out["loop_kernel_share"] = round(kernel_s / max(1e-9, loop_s), 3)  # syscalls: UDP send/receive, epoll
    out["inputs_resent"] = sum(r["resends"] for r in runs)
    return out


def profile_figures(folder: Path, run: dict[str, Any]) -> dict[str, Any]:
    """Per layer: share of each event loop thread's samples, and microseconds of that thread's CPU per
    UDP packet (DTLS record, both directions: each side handles every packet once)."""
    from cpu_breakdown import breakdown  # benchmarks/ is this script's folder, first on sys.path

    out: dict[str, Any] = {"dir": str(folder), "samples": run["samples"], "packets": run["records"]}
    for side, thread in (("host", "MainThread"), ("trainer", "trainer-loop")):
        path = folder / f"{side}.txt"
        if not path.exists():
            continue
        shares = breakdown(path, thread)
        loop_cpu = run["loop_cpu_s"].get(side, 0.0)
        per_packet = {
            layer: round(share * loop_cpu * 1e6 / max(1, run["records"]), 1)
            for layer, share in shares.items()
            if layer != "samples"
        }
        out[side] = {
            "loop_thread_share": shares,
            "loop_thread_us_per_packet": per_packet,
            "loop_cpu_ms_per_sample": round(loop_cpu * 1000 / max(1, run["samples"]), 3),
            "loop_kernel_share": round(run["loop_kernel_s"].get(side, 0.0) / max(1e-9, loop_cpu), 3),
            "process_cpu_ms_per_sample": round(run["cpu_s"][side] * 1000 / max(1, run["samples"]), 3),
            "whole_process_share": breakdown(path),
        }
    return out
