"""A swarm on an in-memory network, with a shared fake wall clock for expiry."""

from dataclasses import dataclass

import pytest

from engine.dht import DHTNode, MemoryNetwork
from engine.dht.swarm import make_swarm


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def swarm(
    n: int, clock: Clock, *, seed: int = 0, rpc_timeout: float = 0.05, **net: object
) -> tuple[MemoryNetwork, list[DHTNode]]:
    network = MemoryNetwork(seed=seed, **net)  # type: ignore[arg-type]
    nodes = await make_swarm(network, n, seed=seed, rpc_timeout=rpc_timeout, clock=clock)
    return network, nodes
