"""A peer that floods another with valid signed offers gets a bounded number of attempts.

Through the real coordinator's hub: mallory is an authenticated peer and signs every offer herself,
so each one verifies; before the fix bob started an RTCPeerConnection for every one of them.
"""

import asyncio
import re

from aiortc import RTCPeerConnection

from engine.p2p import LinkConfig
from engine.p2p.connection import RPC_LABEL, RPC_PROTOCOL
from engine.p2p.descriptions import new_session_id, sign_description
from tests.integration.conftest import MakePeer
from tests.integration.test_p2p_loopback import echo_handlers


async def real_offer_sdp() -> str:
    pc = RTCPeerConnection()
    try:
        pc.createDataChannel(RPC_LABEL, protocol=RPC_PROTOCOL)
        await pc.setLocalDescription(await pc.createOffer())
        return str(pc.localDescription.sdp)
    finally:
        await pc.close()


def accept_tasks() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_name().startswith("accept-") and not t.done())


async def test_an_offer_flood_starts_a_bounded_number_of_attempts(make_peer: MakePeer) -> None:
    bob = await make_peer(echo_handlers(), config=LinkConfig(connect_timeout=3))
    mallory = await make_peer()
    alice = await make_peer()
    sdp = await real_offer_sdp()
    offers = [
        sign_description(
            mallory.identity,
            "offer",
            re.sub(r"a=ice-ufrag:\S+", f"a=ice-ufrag:flood{i:04d}", sdp),
            bob.peer_id,
            new_session_id(),
        )
        for i in range(40)
    ]
    peak = 0
    watching = True

    async def watch() -> None:
        nonlocal peak
        while watching:
            peak = max(peak, accept_tasks())
            await asyncio.sleep(0.002)

    watcher = asyncio.ensure_future(watch())
    # The same offer again under a new session: the hub relays it (its bytes differ from any it has
    # seen), bob recognises the ICE credentials it already answered. Early, so no hub limit drops it.
    again = sign_description(mallory.identity, "offer", offers[0].sdp, bob.peer_id, new_session_id())
    await mallory.signaling.send(bob.peer_id, offers[0])
    await mallory.signaling.send(bob.peer_id, again)
    for offer in offers[1:]:
        await mallory.signaling.send(bob.peer_id, offer)
    async with asyncio.timeout(20):
        while peak < 1:
            await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)
    # An honest peer still gets through while mallory's attempts are in flight.
    assert (await alice.call(bob.peer_id, "echo", {"ok": 1}, timeout=20)).fields["ok"] == 1
    watching = False
    await watcher
    assert peak <= 2 + 1, f"{peak} connection attempts at once"  # mallory's two, alice's one
    stats = bob.offer_stats
    assert stats.duplicate == 1
    assert stats.answered <= 3 and stats.peer_busy >= 1
    async with asyncio.timeout(20):  # mallory's attempts end at bob's connect timeout
        while bob.admission.in_flight:
            await asyncio.sleep(0.05)
