"""Why a volunteer serves nothing, and the credit it is shown, against a real coordinator and a trainer's
real aiortc peer: its status says assigned, then reachable once a trainer connects, then chosen once the
trainer calls; the credit the coordinator grants for the trainer's receipts is shown as soon as someone
looks (``refresh_credit``), not a minute later, with the time it was read."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from coordinator.server.app import RunningCoordinator
from engine.account import CoordinatorApi
from engine.control import NodeControl
from engine.control.credit import describe_credit
from engine.dht import DHTNode
from engine.dht.p2p_transport import PeerTransport
from engine.node import join_local
from engine.node.volunteer import CREDIT_MIN_AGE_S
from engine.p2p import Identity, LinkConfig, Peer
from engine.trainer import sign_receipt
from tests.integration.test_node_swarm import SETTINGS, forward, full_coordinator

pytestmark = pytest.mark.integration
__all__ = ["full_coordinator"]


@pytest.mark.timeout(180)
async def test_assigned_reachable_chosen_and_the_credit_of_its_receipts(
    full_coordinator: RunningCoordinator, tmp_path: Path
) -> None:
    v = await join_local(full_coordinator.url, "Ada", tmp_path / "v", SETTINGS)
    control = NodeControl(v)
    api = CoordinatorApi(full_coordinator.url)
    peer: Peer | None = None
    dht: DHTNode | None = None
    try:
        seen = v.status()["participation"]
        assert (seen["assigned"], seen["reachable"], seen["chosen"]) == (True, False, False)
        assert "no other computer has connected to this node yet" in seen["summary"]

        # a trainer's account, with the role that may sign receipts
        identity = Identity.generate()
        creds = await api.register("Trainer")
        await full_coordinator.services.accounts.set_role("Trainer", "trainer", by=None)
        creds = await api.refresh(creds)  # a token that carries the role
        await api.bind_host(creds, identity)
        peer = Peer(
            identity, full_coordinator.signaling_url, config=LinkConfig(connect_timeout=10), token=creds.token
        )
        await peer.start()
        dht = DHTNode(PeerTransport(peer), signer=identity, rpc_timeout=10)
        await dht.bootstrap([v.peer_id])  # the trainer connects to the volunteer
        seen = v.status()["participation"]
        assert (seen["reachable"], seen["chosen"]) == (True, False), seen
        assert "no trainer has called its experts yet" in seen["summary"]

        uid = v.hosted_uids[0]
        assert (await forward(peer, v.peer_id, uid)).shape == (3, 16)
        seen = v.status()["participation"]
        assert seen["chosen"] and seen["summary"].startswith("Chosen: trainers called its")

        # the node's first reading (at start) found no credit; the receipt credits it now
        async with asyncio.timeout(10):
            while v.credit_at is None:
                await asyncio.sleep(0.05)
        assert v.credit == 0.0
        answer = await api.post_receipts(
            creds.token, [sign_receipt(identity, v.identity, uid, 32, False, time.time())]
        )
        assert answer["accepted"] == 1, answer
        before = v.credit_at
        assert control.refresh_credit()["reading"] is False  # read moments ago: not again so soon
        async with asyncio.timeout(10):
            while time.time() - before < CREDIT_MIN_AGE_S:
                await asyncio.sleep(0.05)
        assert control.refresh_credit()["reading"] is True  # someone opened the status window
        async with asyncio.timeout(15):
            while v.credit_at == before:
                await asyncio.sleep(0.05)
        status = control.status()
        assert status["credit"] > 0 and status["credit_error"] is None
        assert describe_credit(status).startswith(f"{status['credit']:,.1f} (rank #1), read at ")
    finally:
        if dht is not None:
            await dht.stop()
        if peer is not None:
            await peer.stop()
        await api.close()
        await v.stop()
