"""Volunteers against the whole coordinator on loopback: assigned, hosting, declared, found, called."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.server.app import RunningCoordinator, start_full
from engine.account import CoordinatorApi
from engine.dht import DHTNode, get_experts
from engine.dht.p2p_transport import PeerTransport
from engine.node import VolunteerConfig, join_local
from engine.p2p import Identity, LinkConfig, Peer
from engine.resources import Settings

pytestmark = pytest.mark.integration

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2], hyperparams={"d_model": 16, "hidden": 32})
SETTINGS = Settings(use_gpu=False, ram_budget_mib=1024)


@pytest.fixture
async def full_coordinator(tmp_path: Path) -> AsyncIterator[RunningCoordinator]:
    config = CoordinatorConfig(
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[EXP],
    )
    running = await start_full(config)
    yield running
    await running.stop()


async def trainer_peer(coordinator: RunningCoordinator, bootstrap: list[str]) -> tuple[Peer, DHTNode]:
    """A trainer-side peer (an account of its own) with a DHT node joined through the volunteers."""
    identity = Identity.generate()
    api = CoordinatorApi(coordinator.url)
    try:
        creds = await api.register("Trainer")
        await api.bind_host(creds, identity)
    finally:
        await api.close()
    peer = Peer(identity, coordinator.signaling_url, config=LinkConfig(connect_timeout=10), token=creds.token)
    await peer.start()
    dht = DHTNode(PeerTransport(peer), signer=peer.identity, rpc_timeout=10)
    await dht.bootstrap(bootstrap)
    return peer, dht


async def forward(peer: Peer, host: str, uid: str) -> torch.Tensor:
    reply = await peer.call(
        host, "moe.forward", {"uid": uid, "aid": f"a{time.monotonic_ns()}"}, [torch.randn(3, 16)], timeout=20
    )
    return reply.tensors[0]


async def test_two_volunteers_host_declare_and_serve(
    full_coordinator: RunningCoordinator, tmp_path: Path
) -> None:
    a = await join_local(
        full_coordinator.url,
        "Ada",
        tmp_path / "a",
        SETTINGS,
        config=VolunteerConfig(declare_period=2, declare_ttl=10),
    )
    b = await join_local(
        full_coordinator.url,
        "Bob",
        tmp_path / "b",
        SETTINGS,
        config=VolunteerConfig(declare_period=2, declare_ttl=10),
    )
    try:
        assert a.hosted_uids and b.hosted_uids
        assert set(a.hosted_uids) | set(b.hosted_uids) == {"ffn.0.0", "ffn.0.1", "ffn.1.0", "ffn.1.1"}
        peer, dht = await trainer_peer(full_coordinator, [a.peer_id, b.peer_id])
        try:
            async with asyncio.timeout(20):
                while True:
                    infos = await get_experts(dht, ["ffn.0.0", "ffn.1.1"])
                    if all(i is not None for i in infos):
                        break
                    await asyncio.sleep(0.5)
            # Their declarations carry the coordinator's assignment proofs, which hold for its key.
            key = full_coordinator.services.tokens.public_key_bytes
            checked = await get_experts(dht, ["ffn.0.0", "ffn.1.1"], coordinator_key=key)
            for info in checked:
                assert info is not None and info.assigned and set(info.assigned) == set(info.hosts)
            for info in infos:
                assert info is not None
                host = info.hosts[0]
                assert host in (a.peer_id, b.peer_id)
                out = await forward(peer, host, info.uid)
                assert out.shape == (3, 16)
            assert a.status()["requests_served"] + b.status()["requests_served"] >= 2
            async with asyncio.timeout(10):  # upkeep reads the account's credit from the coordinator
                while a.status()["credit"] is None:
                    await asyncio.sleep(0.2)
            assert a.status()["credit"] == 0.0  # nobody has signed receipts for it in this test
        finally:
            await dht.stop()
            await peer.stop()
    finally:
        await a.stop()
        await b.stop()
