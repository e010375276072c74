"""The account API over HTTP (aiohttp test server): status codes, error bodies, nothing changed on error."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.accounts import bind_message
from coordinator.db.models import Account, AllowlistEntry, Host, RevokedToken, Team
from coordinator.http.framework import MAX_BODY_BYTES
from coordinator.services import Services
from engine.p2p.identity import Identity

from . import accounts_helpers as h
from .test_accounts import INJECTIONS


class Api:
    def __init__(self, client: TestClient[Any, Any], services: Services, clock: h.FakeClock) -> None:
        self.client = client
        self.services = services
        self.clock = clock

    async def post(self, path: str, body: Any = None, token: str | None = None, **kw: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        if body is not None and "data" not in kw:
            kw["json"] = body
        async with self.client.post(path, headers=headers, **kw) as r:
            return r.status, await r.json()

    async def get(self, path: str, token: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with self.client.get(path, headers=headers) as r:
            return r.status, await r.json()

    async def register(self, name: str, team: str | None = None, invite: str | None = None) -> str:
        status, body = await self.post("/api/accounts", {"name": name, "team": team, "invite": invite})
        assert status == 201, body
        return str(body["token"])

    async def counts(self) -> tuple[int, ...]:
        async with self.services.sessions() as s:
            return tuple(
                [
                    int(await s.scalar(select(func.count()).select_from(t)) or 0)
                    for t in (Account, Team, Host, AllowlistEntry, RevokedToken)
                ]
            )


@pytest.fixture
async def api(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[Api]:
    clock = h.FakeClock()
    services = await h.services(db, tmp_path, clock, register_per_ip_per_minute=1000)
    async with TestClient(TestServer(h.app(services, hub=False))) as client:
        yield Api(client, services, clock)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_register_me_bind_refresh_revoke(api: Api) -> None:
    status, body = await api.post("/api/accounts", {"name": "<b>Ada</b>", "team": "Red"})
    assert status == 201
    assert body["account"]["name"] == "<b>Ada</b>" and body["account"]["role"] == "volunteer"
    token, account_id = body["token"], body["account"]["id"]
    status, me = await api.get("/api/me", token)
    assert status == 200 and me["account"]["team"] == "Red" and me["hosts"] == []
    assert me["credit"]["rank"] >= 1  # the tray shows it; ties share a rank

    host = Identity.generate()
    bind = {"public_key": _b64(host.public_key), "signature": _b64(host.sign(bind_message(account_id)))}
    assert await api.post("/api/hosts", bind, token) == (201, {"peer_id": host.peer_id})
    assert await api.post("/api/hosts", bind, token) == (200, {"peer_id": host.peer_id})
    assert (await api.get("/api/me", token))[1]["hosts"] == [host.peer_id]

    status, refreshed = await api.post("/api/tokens/refresh", token=token)
    assert status == 200
    new = refreshed["token"]
    status, body = await api.get("/api/me", token)
    assert (status, body["error"]) == (401, "token_revoked")
    assert (await api.post("/api/tokens/refresh", token=token))[1]["error"] == "token_revoked"
    jti = (await api.get("/api/me", new))[1]["token"]["jti"]
    assert await api.post("/api/tokens/revoke", {}, new) == (200, {"revoked": jti})
    assert (await api.get("/api/me", new))[1]["error"] == "token_revoked"


async def test_token_failures_are_401(api: Api) -> None:
    token = await api.register("ada")
    other_key = Identity.generate().private_key
    from coordinator.accounts.tokens import TokenAuthority

    forged = TokenAuthority(other_key, api.services.sessions, clock=api.clock).issue(1, "admin")
    cases = {
        None: "token_required",
        "": "token_required",
        forged: "token_invalid",
        token[:-2] + ("AA" if token[-2:] != "AA" else "BB"): "token_invalid",
        "' OR 1=1 --": "token_invalid",
        "x" * 3000: "token_invalid",
    }
    for bad, code in cases.items():
        headers = {} if bad is None else {"Authorization": f"Bearer {bad}"}
        async with api.client.get("/api/me", headers=headers) as r:
            assert r.status == 401 and (await r.json())["error"] == code, bad
            assert "Bearer" in r.headers["WWW-Authenticate"]
    async with api.client.get("/api/me", headers={"Authorization": f"Basic {token}"}) as r:
        assert r.status == 401
    api.clock.advance(api.services.config.token_ttl_s + 1)
    assert await api.get("/api/me", token) == (
        401,
        {"error": "token_expired", "message": "token has expired"},
    )
    assert (await api.post("/api/tokens/refresh", token=token))[0] == 401


async def test_bad_bodies_change_nothing(api: Api) -> None:
    token = await api.register("ada")
    before = await api.counts()
    bad_requests: list[tuple[str, dict[str, Any], int, str]] = [
        ("/api/accounts", {"data": b"{not json"}, 400, "malformed_json"),
        ("/api/accounts", {"data": b"\xff\xfe"}, 400, "malformed_json"),
        ("/api/accounts", {"json": []}, 400, "invalid_request"),
        ("/api/accounts", {"json": {"name": 5}}, 400, "invalid_request"),
        ("/api/accounts", {"json": {"name": "x", "role": "admin"}}, 400, "invalid_request"),
        ("/api/accounts", {"json": {}}, 400, "invalid_request"),
        ("/api/accounts", {"json": {"name": "a" * 300}}, 400, "invalid_request"),
        ("/api/accounts", {"json": {"name": "a" * 65}}, 400, "invalid_name"),
        ("/api/accounts", {"json": {"name": "ctl\x07"}}, 400, "invalid_name"),
        ("/api/accounts", {"json": {"name": "ok", "team": "\u202e"}}, 400, "invalid_name"),
        ("/api/accounts", {"json": {"name": "ADA"}}, 409, "name_taken"),
        ("/api/accounts", {"data": b'{"name": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}'}, 413, "too_large"),
        ("/api/hosts", {"json": {"public_key": "!!", "signature": ""}}, 400, "invalid_request"),
        (
            "/api/hosts",
            {"json": {"public_key": _b64(b"k" * 32), "signature": _b64(b"s" * 64)}},
            403,
            "bad_proof",
        ),
        (
            "/api/hosts",
            {"json": {"public_key": _b64(b"k" * 5), "signature": _b64(b"s" * 64)}},
            400,
            "invalid_key",
        ),
        ("/api/tokens/refresh", {"json": {"extra": 1}}, 400, "invalid_request"),
        (
            "/api/tokens/revoke",
            {"json": {"jti": "'; DELETE FROM revoked_tokens; --"}},
            400,
            "invalid_request",
        ),
        ("/api/tokens/revoke", {"json": {"jti": "ab" * 16}}, 403, "forbidden"),
        ("/api/admin/role", {"json": {"name": "ada", "role": "admin"}}, 403, "forbidden"),
        ("/api/admin/allowlist", {"json": {"add": ["x"]}}, 403, "forbidden"),
    ]
    for path, kw, status, code in bad_requests:
        headers = {"Authorization": f"Bearer {token}"}
        if "data" in kw:
            headers["Content-Type"] = "application/json"
        async with api.client.post(path, headers=headers, **kw) as r:
            body = await r.json()
            assert (r.status, body["error"]) == (status, code), (path, kw, body)
            assert isinstance(body["message"], str)
    assert await api.counts() == before
    # A chunked body without Content-Length is cut off at the limit too.

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 1024 + 2):
            yield b" " * 1024

    async with api.client.post("/api/accounts", data=chunks()) as r:
        assert r.status == 413
    assert await api.counts() == before


async def test_sql_injection_through_every_parameter(api: Api) -> None:
    admin = await api.register("root")
    await api.services.accounts.set_role("root", "admin", by=None)
    for text in INJECTIONS:
        token = await api.register(text, text)
        _, me = await api.get("/api/me", token)
        assert me["account"]["name"] == text and me["account"]["team"] == text
        assert (await api.post("/api/admin/role", {"name": text, "role": "trainer"}, admin))[0] == 200
        assert (await api.post("/api/admin/role", {"name": "root", "role": text}, admin))[1]["error"] == (
            "invalid_role"
        )
        assert (await api.post("/api/admin/allowlist", {"add": [text], "remove": [text + "x"]}, admin)) == (
            200,
            {"added": 1, "removed": 0},
        )
    assert (await api.post("/api/admin/role", {"name": "' OR '1'='1", "role": "admin"}, admin))[0] == 404
    counts = await api.counts()
    assert counts[:4] == (len(INJECTIONS) + 1, len(INJECTIONS), 0, len(INJECTIONS))
    async with api.services.sessions() as s:
        roles = sorted((await s.execute(select(Account.role))).scalars())
    assert roles == ["admin"] + ["trainer"] * len(INJECTIONS)


async def test_admin_endpoints(api: Api) -> None:
    admin = await api.register("root")
    user = await api.register("bob")
    await api.services.accounts.set_role("root", "admin", by=None)
    status, body = await api.post("/api/admin/role", {"name": "bob", "role": "trainer"}, admin)
    assert status == 200 and body["account"]["role"] == "trainer"
    # The refreshed token carries the new role.
    status, body = await api.post("/api/tokens/refresh", token=user)
    assert api.services.tokens.decode(body["token"]).role == "trainer"
    assert await api.post("/api/admin/allowlist", {"add": ["carol", "dan"]}, admin) == (
        200,
        {"added": 2, "removed": 0},
    )
    # An admin revokes someone else's token by its id.
    victim = await api.register("eve")
    jti = api.services.tokens.decode(victim).jti
    assert await api.post("/api/tokens/revoke", {"jti": jti}, admin) == (200, {"revoked": jti})
    assert (await api.get("/api/me", victim))[1]["error"] == "token_revoked"


async def test_registration_rate_limit(db: AsyncEngine, tmp_path: Path) -> None:
    clock = h.FakeClock()
    services = await h.services(db, tmp_path, clock, register_per_ip_per_minute=3)
    async with TestClient(TestServer(h.app(services, hub=False))) as client:
        api = Api(client, services, clock)
        for i in range(3):
            await api.register(f"user{i}")
        async with client.post("/api/accounts", json={"name": "user3"}) as r:
            assert r.status == 429 and (await r.json())["error"] == "rate_limited"
            assert int(r.headers["Retry-After"]) >= 1
        assert (await api.counts())[0] == 3
        clock.advance(20)  # a minute refills 3: 20 s refill one
        await api.register("user3")


async def test_allowlist_mode_over_http(db: AsyncEngine, tmp_path: Path) -> None:
    services = await h.services(db, tmp_path, allowlist_mode=True)
    await services.accounts.update_allowlist(["ada"], by=None)
    async with TestClient(TestServer(h.app(services, hub=False))) as client:
        api = Api(client, services, h.FakeClock())
        assert (await api.post("/api/accounts", {"name": "eve"}))[:1] == (403,)
        assert (await api.post("/api/accounts", {"name": "eve"}))[1]["error"] == "not_allowlisted"
        code, _ = await services.accounts.invite("ada", by=None)
        await api.register("ada", invite=code)
        assert (await api.counts())[0] == 1
