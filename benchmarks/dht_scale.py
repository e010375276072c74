"""DHT at scale: thousands of Kademlia nodes in one process over the in-memory transport.

Builds a swarm (10,000 nodes; 1,000 with --quick), stores signed records, replaces 20% of the nodes in
four waves (killed nodes go silent: callers wait out their timeout, as on a real network) while it keeps
storing, then gets every record from a random live node. Baseline, in the same run and swarm: the same
gets with alpha=1 (one request in flight, no parallelism); the ratio of mean latencies is printed.

Last line: one JSON object with nodes, store_success, get_success, hops_mean, hops_p99 and the baseline.
Targets: both successes >= 0.99 and hops_p99 <= log2(nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.dht import DHTNode, GetResult, MemoryNetwork, StoreResult
from engine.dht.swarm import join, make_node, make_swarm

T = TypeVar("T")
RPC_TIMEOUT = 0.25
DELAY = (0.002, 0.010)  # one way, seconds
TTL = 3600.0


async def bounded(jobs: list[Callable[[], Awaitable[T]]], parallel: int) -> list[T]:
    gate = asyncio.Semaphore(parallel)

    async def run(job: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(run(j) for j in jobs)))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def timed_get(node: DHTNode, key: str, alpha: int) -> tuple[GetResult, float]:
    start = time.perf_counter()
    result = await node.get(key, alpha=alpha)
    return result, time.perf_counter() - start


async def main(n: int, records: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    network = MemoryNetwork(delay=DELAY, seed=seed)
    t0 = time.perf_counter()
    nodes = await make_swarm(network, n, seed=seed, rpc_timeout=RPC_TIMEOUT)
    build_s = time.perf_counter() - t0
    table = statistics.mean(len(x.table) for x in nodes)
    print(f"built {n} nodes in {build_s:.1f} s; mean table size {table:.0f}")
    live = list(nodes)
    values: dict[str, bytes] = {}
    stores: list[StoreResult] = []

    async def store_batch(count: int) -> None:
        jobs = []
        for _ in range(count):
            i = len(values)
            key, value = f"ffn.{i % 97}.{i}", b"host-%d" % i
            values[key] = value
            owner = rng.choice(live)
            jobs.append(lambda o=owner, k=key, v=value: o.store(k, v, time.time() + TTL))
        stores.extend(await bounded(jobs, 32))

    t0 = time.perf_counter()
    await store_batch(records // 2)
    waves, per_wave = 4, n // 20  # 4 waves of 5% = 20% of the nodes replaced
    for _ in range(waves):
        for node in rng.sample(live, per_wave):
            network.kill(node.peer_id)
            live.remove(node)
        newcomers = [make_node(network, rpc_timeout=RPC_TIMEOUT) for _ in range(per_wave)]
        await join(live, newcomers, rng)
        await store_batch((records - records // 2) // waves)
    churn_s = time.perf_counter() - t0
    print(f"stored {len(stores)} records while replacing {waves * per_wave} nodes in {churn_s:.1f} s")

    keys = list(values)
    t0 = time.perf_counter()
    readers = [rng.choice(live) for _ in keys]
    gets = await bounded(
        [lambda r=r, k=k: timed_get(r, k, 3) for r, k in zip(readers, keys, strict=True)], 32
    )
    get_s = time.perf_counter() - t0

    def found(result: GetResult, key: str) -> bool:
        return any(r.value == values[key] for r in result.records.values())

    store_success = sum(s.ok for s in stores) / len(stores)
    get_success = sum(found(g, k) for (g, _), k in zip(gets, keys, strict=True)) / len(keys)
    hops = [float(g.hops) for g, _ in gets]
    latency = [t for _, t in gets]
    rpcs = [g.rpcs for g, _ in gets]

    sample = rng.sample(range(len(keys)), min(100, len(keys)))  # baseline: same gets, one in flight
    fast = await bounded([lambda i=i: timed_get(readers[i], keys[i], 3) for i in sample], 16)
    slow = await bounded([lambda i=i: timed_get(readers[i], keys[i], 1) for i in sample], 16)
    fast_ms = 1000 * statistics.mean(t for _, t in fast)
    slow_ms = 1000 * statistics.mean(t for _, t in slow)
    slow_success = sum(found(g, keys[i]) for (g, _), i in zip(slow, sample, strict=True)) / len(sample)

    print(
        f"gets: {len(keys)} in {get_s:.1f} s; latency mean {1000 * statistics.mean(latency):.0f} ms, "
        f"p99 {1000 * p99(latency):.0f} ms; rpcs/get {statistics.mean(rpcs):.1f}"
    )
    replicas = statistics.mean(s.replicas for s in stores)
    print(f"store success {store_success:.4f}, mean replicas {replicas:.1f}")
    print(
        f"get success {get_success:.4f}; hops mean {statistics.mean(hops):.2f}, p99 {p99(hops):.0f} "
        f"(target <= log2(n) = {math.log2(n):.1f})"
    )
    print(f"network: {network.stats}")
    print(
        f"baseline alpha=1 vs alpha=3 on {len(sample)} gets: {slow_ms:.0f} ms vs {fast_ms:.0f} ms "
        f"mean latency -> alpha=3 is {slow_ms / fast_ms:.2f}x faster (alpha=1 success {slow_success:.3f})"
    )
    return {
        "nodes": n,
        "store_success": round(store_success, 4),
        "get_success": round(get_success, 4),
        "hops_mean": round(statistics.mean(hops), 3),
        "hops_p99": p99(hops),
        "replaced": waves * per_wave,
        "records": len(keys),
        "get_ms_mean": round(1000 * statistics.mean(latency), 1),
        "baseline_alpha1_ms": round(slow_ms, 1),
        "alpha3_ms": round(fast_ms, 1),
        "speedup_vs_alpha1": round(slow_ms / fast_ms, 2),
        "seconds": 0.0,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 nodes (under 60 s on 2 cores)")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    nodes = args.nodes or (1000 if args.quick else 10_000)
    start = time.perf_counter()
    summary = asyncio.run(main(nodes, records=max(200, nodes // 4), seed=args.seed))
    summary["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(summary))
