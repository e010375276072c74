"""Butterfly all-reduce among 4 peers on loopback: seconds per round against the bandwidth bound.

Each peer is its own spawned process (a Peer on the coordinator's signaling, real aiortc links), so
its peak RSS is its own. In the same run, before averaging, every peer measures its bandwidth: all four
send a probe to their ring successor at once (each peer sending and receiving, as in a round). The
parts come from those bandwidths (``balance_parts``), and the bound is the load-balancing LP's optimum:
the seconds the slowest peer needs to move its traffic at its measured rate
(``round_time_bound``). ``ratio = seconds / bound_seconds``. Then rounds without compression and with
8-bit blockwise compression (error feedback on), each repeated; median and spread printed.

``peak_rss_mib`` is each peer's peak resident memory over the whole run (Python, torch and aiortc
included); ``rss_over_baseline_mib`` is that minus the peak before the vector was allocated, and
``rss_vs_vector`` the latter over the vector's size (target <= 2.5).

    .venv/bin/python benchmarks/allreduce.py --quick    # 500k parameters, within 60 s unloaded
    .venv/bin/python benchmarks/allreduce.py            # 25M parameters
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MIB = 1 << 20
PEERS = 4
PROBE = "bench.probe"
SAMPLE = 4096


def _values(i: int, n: int) -> Any:
    import torch

    v = torch.arange(n, dtype=torch.float32)  # in place from here on: one buffer, no temporaries
    return v.mul_(0.37 * (i + 1)).sin_().mul_(i + 1)


def _sample_indices(n: int) -> Any:
    import torch

    return torch.linspace(0, n - 1, SAMPLE, dtype=torch.float64).long()  # float32 cannot hold 25M - 1


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _recv(ctl: Connection) -> Any:
    """The pipe's recv blocks: off the loop, so this peer keeps answering offers and chunks meanwhile."""
    return await asyncio.to_thread(ctl.recv)


async def _worker_main(
    index: int, ctl: Connection, url: str, n: int, probe_bytes: int, tuning: dict[str, int]
) -> None:
    import torch

    from engine.collab import AllReduceConfig, AllReduceService
    from engine.collab.codec import ErrorFeedback
    from engine.p2p import CallContext, Identity, LinkConfig, Peer
    from engine.wire import Compression, Kind, Message

    peer = Peer(Identity.generate(), url, config=LinkConfig(connect_timeout=60))

    async def probe(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0)

    peer.handlers.add_unary(PROBE, probe)
    await peer.start()
    service = AllReduceService(
        peer, AllReduceConfig(stall_timeout=60, round_timeout=1800, register_wait=60, **tuning)
    )
    ctl.send(peer.peer_id)
    ids: list[str] = await _recv(ctl)
    await asyncio.gather(*(peer.connect(o) for o in ids if o > peer.peer_id))
    ctl.send("connected")
    assert await _recv(ctl) == "probe"
    succ = ids[(ids.index(peer.peer_id) + 1) % len(ids)]
    block = torch.zeros(1 << 18)  # 1 MiB per call
    calls = max(1, probe_bytes // MIB)
    window = asyncio.Semaphore(4)

    async def send_one() -> None:
        async with window:
            await peer.call(succ, PROBE, {}, [block], timeout=600)

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(send_one() for _ in range(calls)))
    ctl.send((calls * MIB / (time.monotonic() - started), (time.process_time() - cpu) / (calls * MIB / 1e6)))
    baseline = _peak_rss_mib()
    feedback: dict[Compression, ErrorFeedback] = {}
    sample = _sample_indices(n)
    while True:
        cmd = await _recv(ctl)
        if cmd == "stop":
            break
        group = cmd
        vector = _values(index, n)
        fb = feedback.setdefault(group.compression, ErrorFeedback(n, group.compression))
        t0, cpu = time.monotonic(), time.process_time()
        report = await service.all_reduce(group, vector, 1.0, fb)
        seconds = time.monotonic() - t0
        cpu = time.process_time() - cpu
        ctl.send(
            {
                "seconds": seconds,
                "cpu_s": cpu,
                "complete": report.complete,
                "sample": vector[sample].tolist(),
                "peak_rss_mib": _peak_rss_mib(),
                "baseline_mib": baseline,
            }
        )
        del vector
    await peer.stop()


def _worker(index: int, ctl: Connection, url: str, n: int, probe_bytes: int, tuning: dict[str, int]) -> None:
    import torch

    from engine.p2p import eventloop, patches

    torch.set_num_threads(1)  # four peers on few cores: intra-op threads would only spin against each other
    patches.pin_host_addresses(["127.0.0.1"])
    patches.install(strict=True)
    eventloop.run(_worker_main(index, ctl, url, n, probe_bytes, tuning))


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="500k parameters, 2 repeats")
    parser.add_argument("--params", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--window", type=int, default=None, help="chunk calls in flight per reducer")
    parser.add_argument("--chunk", type=int, default=None, help="elements per chunk call")
    args = parser.parse_args()
    n = args.params or (500_000 if args.quick else 25_000_000)
    repeats = args.repeats or (2 if args.quick else 3)
    probe_bytes = 4 * MIB if args.quick else 32 * MIB
    tuning = {k: v for k, v in (("window", args.window), ("chunk", args.chunk)) if v is not None}

    import torch
    from hub import signaling_hub_thread  # benchmarks/ is this script's folder, first on sys.path

    from engine.collab import AllReduceConfig, Group, balance_parts, peer_traffic, round_time_bound
    from engine.collab.codec import bytes_per_element
    from engine.wire import Compression

    url, stop = signaling_hub_thread()
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for i in range(PEERS):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(i, child, url, n, probe_bytes, tuning), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        ids = [p.recv() for p in pipes]
        for p in pipes:
            p.send(ids)
        assert all(p.recv() == "connected" for p in pipes)
        for p in pipes:
            p.send("probe")
        probes = [p.recv() for p in pipes]
        bandwidths = [float(b) for b, _ in probes]
        probe_cpu = [float(c) for _, c in probes]  # CPU seconds per MB sent (and as much received)
        parts = balance_parts(n, bandwidths)
        print(
            f"{n:,} float32 parameters among {PEERS} peers; bandwidths (MB/s each way): "
            f"{[round(b / 1e6, 1) for b in bandwidths]}; parts {parts}"
        )

        sample = _sample_indices(n)
        expected = torch.stack([_values(i, n)[sample] for i in range(PEERS)]).mean(0)
        figures: dict[str, Any] = {
            "params": n,
            "peers": PEERS,
            "bandwidths_MBps": [b / 1e6 for b in bandwidths],
            "probe_cpu_s_per_MB": statistics.median(probe_cpu),
            "window": tuning.get("window", AllReduceConfig.window),
            "chunk": tuning.get("chunk", AllReduceConfig.chunk),
        }
        rss: list[float] = []
        over: list[float] = []
        for comp, name in ((Compression.NONE, "float32"), (Compression.INT8, "int8")):
            bound = round_time_bound(parts, bandwidths, bytes_per_element(comp))
            times: list[float] = []
            cpu_per_mb: list[float] = []  # CPU seconds per MB a peer sends (and receives) in a round
            for r in range(repeats):
                group = Group(f"bench/{name}/{r}", tuple(ids), parts, comp)
                for p in pipes:
                    p.send(group)
                results = [p.recv() for p in pipes]
                times.append(max(res["seconds"] for res in results))
                cpu_per_mb += [
                    res["cpu_s"] / (elements * bytes_per_element(comp) / 1e6)
                    for res, elements in zip(results, peer_traffic(parts), strict=True)
                ]
                assert all(res["complete"] for res in results), "a round did not complete"
                got = torch.tensor(results[0]["sample"])
                assert all(res["sample"] == results[0]["sample"] for res in results), "members disagree"
                err = float((got - expected).abs().max())
                tolerance = 1e-5 if comp == Compression.NONE else float(expected.abs().max()) / 50
                assert err <= tolerance, f"{name}: error {err} over {tolerance}"
                rss = [res["peak_rss_mib"] for res in results]
                over = [res["peak_rss_mib"] - res["baseline_mib"] for res in results]
            seconds = statistics.median(times)
            suffix = "" if comp == Compression.NONE else "_int8"
            figures[f"seconds{suffix}"] = seconds
            figures[f"seconds{suffix}_min"] = min(times)
            figures[f"seconds{suffix}_max"] = max(times)
            figures[f"bound_seconds{suffix}"] = bound
            figures[f"ratio{suffix}"] = seconds / bound
            figures[f"cpu_s_per_MB{suffix}"] = statistics.median(cpu_per_mb)
            print(
                f"{name}: {_spread(times)}; bound {bound:.2f} s; ratio {seconds / bound:.2f}; "
                f"CPU {statistics.median(cpu_per_mb) * 1e3:.0f} ms per MB sent (probe "
                f"{statistics.median(probe_cpu) * 1e3:.0f})"
            )
        vector_mib = n * 4 / MIB
        figures["peak_rss_mib"] = rss
        figures["rss_over_baseline_mib"] = over
        figures["rss_vs_vector"] = max(over) / vector_mib
        figures["vector_mib"] = vector_mib
        figures["load_avg_1m"] = os.getloadavg()[0]
        print(
            f"peak RSS per peer (MiB): {[round(x) for x in rss]}; over baseline {[round(x) for x in over]} "
            f"= {max(over) / vector_mib:.2f}x the {vector_mib:.0f} MiB vector; load {os.getloadavg()[0]:.1f}"
        )
        for p in pipes:
            p.send("stop")
        for proc in procs:
            proc.join(60)
    finally:  # a failed check must not leave the hub thread and four peers running
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        stop.set()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
