"""A swarm of DHTNodes on one MemoryNetwork: for tests and the scale benchmark.

Nodes join ``parallel`` at a time, each through a few random nodes that joined before it, as they
would through the coordinator's bootstrap list.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from engine.p2p.identity import Identity

from .memory import MemoryNetwork
from .node import DHTNode


def make_node(network: MemoryNetwork, *, signed: bool = True, **kwargs: Any) -> DHTNode:
    """A node whose peer id comes from a fresh identity (so it can sign), or a random one."""
    if signed:
        identity = Identity.generate()
        return DHTNode(network.add(identity.peer_id), signer=identity, **kwargs)
    return DHTNode(network.add(), **kwargs)


async def join(
    nodes: list[DHTNode], newcomers: list[DHTNode], rng: random.Random, *, fanout: int = 3, parallel: int = 32
) -> None:
    """Bootstrap ``newcomers`` through random members of ``nodes`` (all live); appended to it."""
    gate = asyncio.Semaphore(parallel)

    async def one(node: DHTNode, seeds: list[str]) -> None:
        async with gate:
            await node.bootstrap(seeds, refresh=False)

    pending = []
    for node in newcomers:
        if nodes:
            pending.append(one(node, [n.peer_id for n in rng.sample(nodes, min(fanout, len(nodes)))]))
        nodes.append(node)
        if len(pending) >= parallel:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


async def make_swarm(
    network: MemoryNetwork, n: int, *, seed: int = 0, signed: bool = True, parallel: int = 32, **kwargs: Any
) -> list[DHTNode]:
    rng = random.Random(seed)
    nodes: list[DHTNode] = []
    first = [make_node(network, signed=signed, **kwargs)]
    await join(nodes, first, rng)
    # Grow in waves so early joiners are not bootstrapped only from each other's empty tables.
    while len(nodes) < n:
        wave = [make_node(network, signed=signed, **kwargs) for _ in range(min(n - len(nodes), len(nodes)))]
        await join(nodes, wave, rng, parallel=parallel)
    return nodes
