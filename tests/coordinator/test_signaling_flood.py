"""Offer floods at the hub: a sender's offers pass a token bucket, replays are dropped, and the sender
is told why (real hub, real WebSockets, real signed descriptions)."""

from __future__ import annotations

import asyncio

import msgspec
from aiohttp.test_utils import TestClient, TestServer

from coordinator.hub.offer_gate import RATE_LIMITED, OfferGate
from coordinator.hub.signaling import HUB_KEY, SignalingHub
from coordinator.server.app import create_app
from engine.p2p import signaling_protocol as sp
from engine.p2p.descriptions import new_session_id, sign_description
from engine.p2p.identity import Identity
from engine.p2p.signaling import SignalingClient

from .accounts_helpers import FakeClock


async def _join(url: str, identity: Identity, inbox: list[sp.Signal]) -> SignalingClient:
    client = SignalingClient(url, identity, inbox.append, connect_timeout=10.0)
    await client.connect()
    return client


async def _settle(hub: SignalingHub, expect: int) -> None:
    """Wait (generously) until the hub has looked at ``expect`` signals."""
    async with asyncio.timeout(20):
        while hub.stats.relayed + hub.stats.offers_limited + hub.stats.duplicates < expect:
            await asyncio.sleep(0.02)


async def test_offer_flood_is_rate_limited_per_sender_and_told() -> None:
    clock = FakeClock()
    hub = SignalingHub(offers=OfferGate(rate=1.0, burst=32, clock=clock))
    async with TestClient(TestServer(create_app(hub=hub))) as http:
        url = str(http.make_url("/ws/signal"))
        attacker, victim, bystander = Identity.generate(), Identity.generate(), Identity.generate()
        got: list[sp.Signal] = []
        errors: list[sp.Error] = []
        a = await _join(url, attacker, [])
        v = await _join(url, victim, got)
        b = await _join(url, bystander, [])
        try:
            for _ in range(600):
                desc = sign_description(attacker, "offer", "v=0", victim.peer_id, new_session_id())
                await a.send(victim.peer_id, desc, errors.append)
            await _settle(hub, 600)
            async with asyncio.timeout(20):
                while len(errors) < 600 - 32 or len(got) < 32:
                    await asyncio.sleep(0.02)
            assert len(got) == 32  # the burst, no more
            assert hub.stats.offers_limited == 600 - 32
            assert {e.code for e in errors} == {RATE_LIMITED}
            assert "retry in" in errors[0].message
            # Another sender is not affected by the attacker's bucket.
            desc = sign_description(bystander, "offer", "v=0", victim.peer_id, new_session_id())
            await b.send(victim.peer_id, desc)
            async with asyncio.timeout(20):
                while len(got) < 33:
                    await asyncio.sleep(0.02)
            # The bucket refills with time.
            clock.advance(2.0)
            desc = sign_description(attacker, "offer", "v=0", victim.peer_id, new_session_id())
            await a.send(victim.peer_id, desc)
            async with asyncio.timeout(20):
                while len(got) < 34:
                    await asyncio.sleep(0.02)
            assert len(got) == 34
        finally:
            for c in (a, v, b):
                await c.close()


async def test_replayed_offer_is_relayed_once_and_answers_are_not_limited() -> None:
    hub = SignalingHub(offers=OfferGate(rate=1.0, burst=4))
    async with TestClient(TestServer(create_app(hub=hub))) as http:
        assert http.app[HUB_KEY] is hub
        url = str(http.make_url("/ws/signal"))
        alice, bob = Identity.generate(), Identity.generate()
        at_bob: list[sp.Signal] = []
        at_alice: list[sp.Signal] = []
        a = await _join(url, alice, at_alice)
        b = await _join(url, bob, at_bob)
        try:
            offer = sign_description(alice, "offer", "v=0", bob.peer_id, new_session_id())
            for _ in range(10):
                await a.send(bob.peer_id, offer)
            await _settle(hub, 10)
            assert len(at_bob) == 1
            assert hub.stats.duplicates == 9
            assert at_bob[0].sender == alice.peer_id
            assert msgspec.json.encode(at_bob[0].description) == msgspec.json.encode(offer)
            # Answers are replies to offers the hub already let through: not counted against the bucket.
            for _ in range(10):
                answer = sign_description(bob, "answer", "v=0", alice.peer_id, new_session_id())
                await b.send(alice.peer_id, answer)
            await _settle(hub, 20)
            assert len(at_alice) == 10
        finally:
            await a.close()
            await b.close()


def test_offer_gate_memory_forgets_old_offers() -> None:
    clock = FakeClock()
    gate = OfferGate(rate=100.0, burst=100, window_s=10.0, clock=clock)
    alice, bob = Identity.generate(), Identity.generate()
    desc = sign_description(alice, "offer", "v=0", bob.peer_id, new_session_id())
    signal = sp.Signal(id=1, to=bob.peer_id, description=desc)
    assert gate.check(alice.peer_id, signal) is None
    assert gate.check(alice.peer_id, signal) == "duplicate"
    clock.advance(11.0)
    assert gate.check(alice.peer_id, signal) is None  # the recipient refuses it as stale anyway
