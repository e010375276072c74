"""Signaling with accounts: a real WebSocket hub that admits a peer only with a valid token of an
account its key is bound to; every refusal has its own code and close code, and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.tokens import TokenAuthority
from coordinator.hub.signaling import CLOSE_FORBIDDEN, CLOSE_UNAUTHORIZED, SignalingHub
from engine.p2p import signaling_protocol as sp
from engine.p2p.identity import Identity
from engine.p2p.signaling import SignalingClient, SignalingRefused

from . import accounts_helpers as h


class Env:
    def __init__(self, client: TestClient[Any, Any], services: Any, clock: h.FakeClock) -> None:
        self.client = client
        self.services = services
        self.clock = clock
        self.url = str(client.make_url("/ws/signal"))

    async def join(self, identity: Identity, token: str | None = None, **kw: Any) -> SignalingClient:
        client = SignalingClient(self.url, identity, lambda s: None, connect_timeout=5.0, token=token, **kw)
        try:
            await client.connect()
        except BaseException:
            await client.close()
            raise
        return client

    async def refused(self, identity: Identity, token: str | None) -> str:
        with pytest.raises(SignalingRefused) as e:
            await self.join(identity, token)
        return e.value.code


@pytest.fixture
async def env(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[Env]:
    clock = h.FakeClock()
    services = await h.services(db, tmp_path, clock, max_ws_per_ip=16)
    async with TestClient(TestServer(h.app(services))) as client:
        yield Env(client, services, clock)


async def test_bound_host_with_valid_token_joins(env: Env) -> None:
    _, token, identity = await h.volunteer_with_host(env.services, "ada")
    client = await env.join(identity, token)
    try:
        assert client.connected.is_set()
    finally:
        await client.close()


async def test_refusals_have_clear_codes(env: Env) -> None:
    ada_id, ada_token, ada_host = await h.volunteer_with_host(env.services, "ada")
    eve_id, eve_token, eve_host = await h.volunteer_with_host(env.services, "eve")
    tokens = env.services.tokens
    forged = TokenAuthority(Identity.generate().private_key, tokens.sessions, clock=env.clock)
    assert await env.refused(ada_host, None) == sp.TOKEN_REQUIRED
    assert await env.refused(ada_host, forged.issue(ada_id, "admin")) == sp.TOKEN_INVALID
    assert await env.refused(ada_host, ada_token[:-3] + "AAA") == sp.TOKEN_INVALID
    assert await env.refused(ada_host, "'; DROP TABLE hosts; --") == sp.TOKEN_INVALID
    # Someone else's host, or a key bound to nobody: not this account's host.
    assert await env.refused(eve_host, ada_token) == sp.HOST_NOT_BOUND
    assert await env.refused(Identity.generate(), ada_token) == sp.HOST_NOT_BOUND
    # A token pinned to another peer.
    pinned = tokens.issue(ada_id, "volunteer", peer=eve_host.peer_id)
    assert await env.refused(ada_host, pinned) == sp.TOKEN_INVALID
    # Revoked, then expired.
    await tokens.revoke(tokens.decode(eve_token).jti)
    assert await env.refused(eve_host, eve_token) == sp.TOKEN_REVOKED
    await env.services.accounts.set_disabled("eve", True, by=None)
    assert await env.refused(eve_host, tokens.issue(eve_id, "volunteer")) == sp.ACCOUNT_DISABLED
    env.clock.advance(env.services.config.token_ttl_s + 1)
    assert await env.refused(ada_host, ada_token) == sp.TOKEN_EXPIRED
    # An oversized token is a malformed hello.
    assert await env.refused(ada_host, "x" * (sp.MAX_TOKEN_CHARS + 1)) == sp.AUTH_FAILED


async def _raw_hello(env: Env, identity: Identity, token: str | None) -> tuple[dict[str, Any], int | None]:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(env.url) as ws,
    ):
        challenge = sp.client_decoder.decode(await ws.receive_str())
        assert isinstance(challenge, sp.Challenge)
        hello = sp.Hello(identity.public_key, identity.sign(sp.DOMAIN + challenge.nonce), token)
        await ws.send_str(sp.encode(hello))
        reply = await ws.receive_json()
        msg = await ws.receive()
        assert msg.type == aiohttp.WSMsgType.CLOSE
        return reply, ws.close_code


async def test_close_codes(env: Env) -> None:
    _, ada_token, ada_host = await h.volunteer_with_host(env.services, "ada")
    reply, code = await _raw_hello(env, ada_host, "garbage")
    assert (reply["code"], code) == (sp.TOKEN_INVALID, CLOSE_UNAUTHORIZED)
    reply, code = await _raw_hello(env, Identity.generate(), ada_token)
    assert (reply["code"], code) == (sp.HOST_NOT_BOUND, CLOSE_FORBIDDEN)


async def test_token_provider_refreshes_before_reconnect(env: Env) -> None:
    _, token, identity = await h.volunteer_with_host(env.services, "ada")
    current = [token]
    calls = 0

    async def provider() -> str:
        nonlocal calls
        calls += 1
        if calls > 1:  # every reconnect refreshes; the previous token is revoked on the way
            current[0] = await env.services.tokens.refresh(current[0])
        return current[0]

    client = await env.join(identity, token_provider=provider)
    try:
        hub_side = list(_hub(env.client).peers.values())
        assert len(hub_side) == 1
        client.connected.clear()
        await hub_side[0].close()
        await asyncio.wait_for(client.connected.wait(), 10)
        assert calls == 2
        assert identity.peer_id in _hub(env.client).peers
    finally:
        await client.close()


def _hub(client: TestClient[Any, Any]) -> SignalingHub:
    assert client.app is not None
    hub: SignalingHub = client.app[h.HUB]
    return hub


async def test_connection_flood_from_one_address(db: AsyncEngine, tmp_path: Path) -> None:
    clock = h.FakeClock()
    services = await h.services(db, tmp_path, clock, max_ws_per_ip=3)
    async with TestClient(TestServer(h.app(services))) as client:
        env = Env(client, services, clock)
        _, token, identity = await h.volunteer_with_host(services, "ada")
        sockets = [await client.ws_connect("/ws/signal") for _ in range(3)]
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await client.ws_connect("/ws/signal")
        assert e.value.status == 429
        for ws in sockets:
            await ws.close()
        await asyncio.sleep(0.05)
        # Closed sockets free their slots, but the rate of new ones is spent until the clock moves.
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await client.ws_connect("/ws/signal")
        clock.advance(60)
        joined = await env.join(identity, token)
        await joined.close()
        assert _hub(client).stats.rate_limited == 2


async def test_hub_without_accounts_needs_no_token() -> None:
    with pytest.raises(ValueError):
        SignalingHub(require_token=True)
    hub = SignalingHub()
    assert hub.require_token is False
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/ws/signal", hub.handle)
    async with TestClient(TestServer(app)) as client:
        url = str(client.make_url("/ws/signal"))
        for token in (None, "ignored-by-a-hub-without-accounts"):
            c = SignalingClient(url, Identity.generate(), lambda s: None, token=token)
            await c.connect()
            await c.close()


async def test_turn_credentials_are_renewed_by_reconnecting() -> None:
    from coordinator.hub.turn import TurnConfig
    from coordinator.server.app import start
    from engine.p2p.identity import Identity
    from engine.p2p.signaling import SignalingClient, turn_expiry

    # A 61 s credential: the client reconnects ~1 s after joining (a minute before expiry).
    turn = TurnConfig(urls=("turn:127.0.0.1:3478",), secret="s", ttl_s=61)
    running = await start("127.0.0.1", 0, turn=turn)
    client = SignalingClient(running.signaling_url, Identity.generate(), lambda _: None)
    try:
        await client.connect()
        first = client.ice_servers[-1].username
        assert turn_expiry(client.ice_servers) is not None
        async with asyncio.timeout(10):
            while client.ice_servers[-1].username == first:
                await asyncio.sleep(0.1)
        joins = client.joins
        client.refresh()  # and on demand, e.g. after TURN refused a credential
        async with asyncio.timeout(10):
            while client.joins == joins:
                await asyncio.sleep(0.05)
        assert client.connected.is_set()
    finally:
        await client.close()
        await running.stop()
