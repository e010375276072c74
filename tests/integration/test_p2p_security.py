"""Nobody in the middle, the coordinator included, can impersonate a peer; bad signaling input is refused."""

import asyncio
import json

import aiohttp
import msgspec
import pytest
from aiohttp import web

from coordinator.hub.signaling import SignalingHub
from engine.p2p import ConnectError, Handlers, Identity, LinkConfig, Peer, PeerMismatch
from engine.p2p import signaling_protocol as sp
from engine.p2p.connection import check_fingerprint, remote_certificate_fingerprint
from engine.p2p.descriptions import sdp_fingerprints
from tests.integration.conftest import MakePeer
from tests.integration.test_p2p_loopback import echo_handlers


class LyingHub(SignalingHub):
    """A compromised coordinator: it relays under whatever id the message claims, and can edit SDP."""

    tamper_sdp = False

    def stamp(self, signal: sp.Signal, sender: str) -> sp.Signal:
        desc = signal.description
        if self.tamper_sdp:
            desc = msgspec.structs.replace(
                desc, sdp=desc.sdp.replace("a=setup:", "a=x-edited\r\na=setup:", 1)
            )
        return msgspec.structs.replace(signal, sender=desc.sender, description=desc)


async def start_hub(hub: SignalingHub) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/ws/signal", hub.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"ws://127.0.0.1:{port}/ws/signal"


async def peers_on(url: str, n: int) -> list[Peer]:
    peers = [
        Peer(Identity.generate(), url, handlers=echo_handlers(), config=LinkConfig(connect_timeout=2))
        for _ in range(n)
    ]
    for p in peers:
        await p.start()
    return peers


@pytest.mark.parametrize("tamper", [False, True])
async def test_hostile_hub_cannot_impersonate(tamper: bool) -> None:
    hub = LyingHub()
    hub.tamper_sdp = tamper
    runner, url = await start_hub(hub)
    alice, bob, mallory = await peers_on(url, 3)
    try:
        if tamper:
            # The hub edits the SDP of a genuine offer from alice: bob must refuse it.
            with pytest.raises(ConnectError):
                await alice.call(bob.peer_id, "echo", timeout=5)
        else:
            # mallory signs with her own key but claims alice's id; the hub vouches for the claim.
            forged = Peer(mallory.identity, url, config=LinkConfig(connect_timeout=2))
            forged.identity = mallory.identity
            await mallory.stop()
            await forged.start()
            real_id = forged.identity.peer_id
            object.__setattr__(forged, "identity", _Claiming(forged.identity, alice.peer_id))
            with pytest.raises((ConnectError, PeerMismatch)):
                await forged.call(bob.peer_id, "echo", timeout=5)
            assert real_id != alice.peer_id
            await forged.stop()
        assert bob.rejected_offers >= 1
        assert not bob.links
    finally:
        for p in (alice, bob, mallory):
            await p.stop()
        await runner.cleanup()


class _Claiming:
    """An identity that signs with one key but says it is someone else."""

    def __init__(self, real: Identity, claimed_id: str) -> None:
        self._real = real
        self.peer_id = claimed_id
        self.public_key = real.public_key

    def sign(self, data: bytes) -> bytes:
        return self._real.sign(data)


async def test_dtls_fingerprint_is_checked_against_the_signed_one(make_peer: MakePeer) -> None:
    server = await make_peer(echo_handlers())
    client = await make_peer()
    await client.call(server.peer_id, "echo", timeout=20)
    pc = client.links[server.peer_id].pc
    actual = remote_certificate_fingerprint(pc)
    assert ("sha-256", actual) in sdp_fingerprints(pc.remoteDescription.sdp)
    check_fingerprint(pc, [("sha-256", actual)], server.peer_id)
    with pytest.raises(PeerMismatch):
        check_fingerprint(pc, [("sha-256", "00:" * 31 + "00")], server.peer_id)


async def test_signaling_refuses_bad_hello_and_malformed_frames(coordinator, make_peer: MakePeer) -> None:  # type: ignore[no-untyped-def]
    honest = await make_peer(Handlers())
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(coordinator.signaling_url)
        await ws.receive_str()  # challenge
        await ws.send_str(
            sp.encode(sp.Hello(public_key=Identity.generate().public_key, signature=b"\x00" * 64))
        )
        reply = json.loads(await asyncio.wait_for(ws.receive_str(), 5))
        assert reply["type"] == "error" and reply["code"] == "auth_failed"
        await ws.close()

        me = Identity.generate()
        ws = await session.ws_connect(coordinator.signaling_url)
        challenge = sp.client_decoder.decode(await ws.receive_str())
        assert isinstance(challenge, sp.Challenge)
        await ws.send_str(
            sp.encode(sp.Hello(public_key=me.public_key, signature=me.sign(sp.DOMAIN + challenge.nonce)))
        )
        assert json.loads(await asyncio.wait_for(ws.receive_str(), 5))["type"] == "welcome"
        await ws.send_str('{"type": "signal", "id": 1, "to": 5}')
        reply = json.loads(await asyncio.wait_for(ws.receive_str(), 5))
        assert reply["code"] == "malformed"
        closed = await asyncio.wait_for(ws.receive(), 5)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert coordinator.hub.stats.auth_failed == 1 and coordinator.hub.stats.malformed == 1
    assert honest.peer_id in coordinator.hub.online()  # the hub goes on serving the others
