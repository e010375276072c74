"""Real servers on loopback: an in-process coordinator and real aiortc peers pinned to 127.0.0.1."""

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from coordinator.server.app import RunningCoordinator, start
from engine.p2p import Handlers, Identity, LinkConfig, Peer
from engine.p2p.patches import pin_host_addresses

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _loopback_only() -> None:
    pin_host_addresses(["127.0.0.1"])


@pytest.fixture
async def coordinator() -> AsyncIterator[RunningCoordinator]:
    running = await start("127.0.0.1", 0)
    yield running
    await running.stop()


MakePeer = Callable[..., Awaitable[Peer]]


@pytest.fixture
async def make_peer(coordinator: RunningCoordinator) -> AsyncIterator[MakePeer]:
    peers: list[Peer] = []

    async def make(handlers: Handlers | None = None, **kwargs: object) -> Peer:
        config = kwargs.pop("config", LinkConfig(connect_timeout=10))
        peer = Peer(
            Identity.generate(), coordinator.signaling_url, handlers=handlers, config=config, **kwargs
        )  # type: ignore[arg-type]
        await peer.start()
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        await peer.stop()
