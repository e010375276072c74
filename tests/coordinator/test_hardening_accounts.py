"""Issue 13 on the account side, over a real full coordinator app and a real database (SQLite and
PostgreSQL): invitation codes, disabled accounts refused everywhere at once, look-alike names, the
peer list behind a token, trusted proxies, and what a node may claim (memory, energy)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.accounts import BadInvite, Conflict, bind_message, code_hash
from coordinator.config import ExperimentConfig
from coordinator.db.models import Host, Invite, Team
from coordinator.hub.signaling import HUB_KEY
from coordinator.server.app import create_full_app
from coordinator.services import Services
from engine.p2p.identity import Identity
from engine.p2p.signaling import SignalingClient

from . import accounts_helpers as h

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2], hyperparams={"d_model": 16, "hidden": 32})


class Full:
    """A whole coordinator app on a test server, over the ``db`` fixture's database."""

    def __init__(self, client: TestClient[Any, Any], services: Services, clock: h.FakeClock) -> None:
        self.client, self.services, self.clock = client, services, clock

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, **kw: Any
    ) -> tuple[int, Any]:
        headers = dict(kw.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with self.client.request(method, path, json=body, headers=headers, **kw) as r:
            return r.status, await r.json()

    async def register(self, name: str, **extra: Any) -> tuple[int, str]:
        status, body = await self.call("POST", "/api/accounts", {"name": name, **extra})
        assert status == 201, body
        return int(body["account"]["id"]), str(body["token"])

    async def bind(self, account_id: int, token: str) -> Identity:
        host = Identity.generate()
        body = {
            "public_key": base64.b64encode(host.public_key).decode(),
            "signature": base64.b64encode(host.sign(bind_message(account_id))).decode(),
        }
        status, answer = await self.call("POST", "/api/hosts", body, token)
        assert status == 201, answer
        return host

    async def admin(self, name: str = "root") -> str:
        account_id, _ = await self.register(name)
        await self.services.accounts.set_role(name, "admin", by=None)
        return self.services.tokens.issue(account_id, "admin")


async def _full(db: AsyncEngine, tmp_path: Path, **overrides: Any) -> AsyncIterator[Full]:
    clock = h.FakeClock(time.time())
    overrides.setdefault("register_per_ip_per_minute", 1000)
    services = await h.services(db, tmp_path, clock, verify_workers=0, experiments=[EXP], **overrides)
    app = await create_full_app(services.config, services)
    async with TestClient(TestServer(app)) as client:
        yield Full(client, services, clock)


@pytest.fixture
async def full(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[Full]:
    async for f in _full(db, tmp_path):
        yield f


# -- invitations ------------------------------------------------------------------------------------


async def test_allowlisted_name_needs_its_invitation_code(db: AsyncEngine, tmp_path: Path) -> None:
    async for f in _full(db, tmp_path, allowlist_mode=True, invite_ttl_s=3600):
        root = await f.services.accounts.invite("root", by=None)
        root_id, _ = await f.register("root", invite=root[0])
        await f.services.accounts.set_role("root", "admin", by=None)
        admin = f.services.tokens.issue(root_id, "admin")
        # The admin invites Ada over the API; the code is shown once.
        status, body = await f.call("POST", "/api/admin/invites", {"name": "Ada"}, admin)
        assert status == 201 and body["name"] == "Ada" and len(body["code"]) >= 24
        code = body["code"]
        # An outsider who knows the name only (today's attack) is refused, and so is a wrong code.
        for extra in ({}, {"invite": "guess"}, {"invite": code[:-1] + ("A" if code[-1] != "A" else "B")}):
            status, answer = await f.call("POST", "/api/accounts", {"name": "Ada", "team": "Gang", **extra})
            assert status == 403 and answer["error"] == "invite_invalid", (extra, answer)
        async with f.services.sessions() as session:  # and they left nothing behind, no team either
            assert await session.scalar(select(func.count()).select_from(Team)) == 0
        # The code is for Ada only: on the allowlist's other names it is no good either.
        await f.services.accounts.update_allowlist(["Bob"], by=None)
        status, answer = await f.call("POST", "/api/accounts", {"name": "Bob", "invite": code})
        assert status == 403 and answer["error"] == "invite_invalid"
        ada_id, _ = await f.register("Ada", invite=code)
        # Single use: a second use of the code is refused.
        status, answer = await f.call("POST", "/api/accounts", {"name": "Ada", "invite": code})
        assert (status, answer["error"]) == (403, "invite_invalid")
        # A volunteer cannot invite.
        _, volunteer = await f.call(
            "POST", "/api/admin/invites", {"name": "Eve"}, f.services.tokens.issue(ada_id, "volunteer")
        )
        assert volunteer["error"] == "forbidden"


async def test_invitation_codes_expire_and_are_single_use(db: AsyncEngine, tmp_path: Path) -> None:
    clock = h.FakeClock()
    s = await h.services(db, tmp_path, clock, allowlist_mode=True)
    code, expires_at = await s.accounts.invite("ada", by=None, ttl_s=60)
    assert expires_at == clock() + 60
    clock.advance(61)
    with pytest.raises(BadInvite):
        await s.accounts.register("ada", invite=code)
    code, _ = await s.accounts.invite("ada", by=None, ttl_s=60)
    ada = await s.accounts.register("ada", invite=code)
    async with s.sessions() as session:
        invite = await session.get(Invite, code_hash(code))
        assert invite is not None and invite.used_at == clock() and invite.used_by == ada.id
    # Used: even for a name that is free again (nobody else may take Ada's invitation twice).
    await s.accounts.update_allowlist(["bob"], by=None)
    with pytest.raises(BadInvite):
        await s.accounts.register("bob", invite=code)


# -- disabled accounts ------------------------------------------------------------------------------


async def test_disabled_account_is_refused_everywhere_at_once(full: Full) -> None:
    admin = await full.admin()
    ada_id, ada = await full.register("Ada")
    host = await full.bind(ada_id, ada)
    hub = full.client.app[HUB_KEY]
    url = str(full.client.make_url("/ws/signal"))
    signaling = SignalingClient(url, host, lambda _: None, token=ada, max_backoff=1.0)
    await signaling.connect()
    try:
        assignment = {"peer_id": host.peer_id, "memory_bytes": 1 << 30}
        assert (await full.call("GET", "/api/me", token=ada))[0] == 200
        assert (await full.call("POST", "/api/assignment", assignment, ada))[0] == 200
        assert host.peer_id in hub.online()

        status, body = await full.call("POST", "/api/admin/disable", {"name": "Ada", "disabled": True}, admin)
        assert status == 200 and body["disabled"] is True
        # The same, still unexpired token: refused on every route, and the socket is gone.
        energy = {"peer_id": host.peer_id, "kwh_delta": 0.0}
        for method, path, payload in (
            ("GET", "/api/me", None),
            ("POST", "/api/assignment", assignment),
            ("POST", "/api/hosts/energy", energy),
            ("POST", "/api/tokens/refresh", None),
            ("POST", "/api/receipts", {"receipts": []}),
            ("GET", "/api/peers", None),
        ):
            status, answer = await full.call(method, path, payload, ada)
            assert (status, answer["error"]) == (403, "account_disabled"), path
        async with asyncio.timeout(20):
            while host.peer_id in hub.online():
                await asyncio.sleep(0.05)
        # Re-enabled: the same token works again, and the node rejoins by itself.
        status, _ = await full.call("POST", "/api/admin/disable", {"name": "Ada", "disabled": False}, admin)
        assert status == 200
        assert (await full.call("GET", "/api/me", token=ada))[0] == 200
        async with asyncio.timeout(20):
            while host.peer_id not in hub.online():
                await asyncio.sleep(0.05)
        # Only admins disable.
        status, answer = await full.call(
            "POST", "/api/admin/disable", {"name": "root", "disabled": True}, ada
        )
        assert (status, answer["error"]) == (403, "forbidden")
    finally:
        await signaling.close()


async def test_disabling_elsewhere_reaches_open_sockets(full: Full) -> None:
    """The operator's command writes the database from another process: the hub's sweep notices."""
    hub = full.client.app[HUB_KEY]
    hub.recheck_s = 0.2
    ada_id, ada = await full.register("Ada")
    host = await full.bind(ada_id, ada)
    signaling = SignalingClient(str(full.client.make_url("/ws/signal")), host, lambda _: None, token=ada)
    await signaling.connect()
    try:
        assert host.peer_id in hub.online()
        await full.services.accounts.set_disabled("Ada", True, by=None)  # as `lah coordinator disable`
        async with asyncio.timeout(20):
            while host.peer_id in hub.online():
                await asyncio.sleep(0.05)
    finally:
        await signaling.close()


def test_lah_coordinator_invite_disable_enable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lah.cli import main

    config = tmp_path / "coordinator.toml"
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}"
    config.write_text(
        f'database_url = "{db_url}"\ntoken_key_path = "{tmp_path / "k"}"\nallowlist_mode = true\n'
    )
    assert main(["coordinator", "--config", str(config), "invite", "Ada", "--ttl-days", "1"]) in (0, None)
    out = capsys.readouterr().out
    code = out.split("code ")[1].split()[0]

    async def register_and_check() -> tuple[bool, bool]:
        from coordinator.config import load_config
        from coordinator.services import open_services

        services = await open_services(load_config(config))
        try:
            await services.accounts.register("Ada", invite=code)
            return (await services.accounts.by_name("Ada")).disabled, True
        finally:
            await services.close()

    assert asyncio.run(register_and_check()) == (False, True)
    assert main(["coordinator", "--config", str(config), "disable", "Ada"]) in (0, None)
    assert "Ada is disabled" in capsys.readouterr().out

    async def disabled() -> bool:
        from coordinator.config import load_config
        from coordinator.services import open_services

        services = await open_services(load_config(config))
        try:
            return (await services.accounts.by_name("Ada")).disabled
        finally:
            await services.close()

    assert asyncio.run(disabled()) is True
    assert main(["coordinator", "--config", str(config), "enable", "Ada"]) in (0, None)
    assert "Ada is enabled" in capsys.readouterr().out
    assert asyncio.run(disabled()) is False


# -- look-alike names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("ada", "\u0430da"),  # Cyrillic a
        ("Paypal", "P\u0430yp\u0430l"),
        ("bill", "biII"),  # capital i for small L
        ("modern", "rnodern"),
        ("ADA", "\uff21\uff24\uff21"),  # full-width
        ("Ada", "ADA"),
    ],
)
async def test_look_alike_names_are_taken(db: AsyncEngine, tmp_path: Path, first: str, second: str) -> None:
    s = await h.services(db, tmp_path)
    await s.accounts.register(first)
    with pytest.raises(Conflict) as e:
        await s.accounts.register(second)
    assert e.value.code == "name_taken"


async def test_different_names_stay_free(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path)
    for name in ("ada", "ana", "Zoë", "Zoe", "bob", "b0b2"):
        await s.accounts.register(name)


# -- the peer list, proxies, and what a node may claim ----------------------------------------------


async def test_peer_list_needs_a_token(full: Full) -> None:
    status, body = await full.call("GET", "/api/peers")
    assert (status, body["error"]) == (401, "token_required")
    _, token = await full.register("Ada")
    status, body = await full.call("GET", "/api/peers", token=token)
    assert status == 200 and body["online"] == []


async def test_forwarded_for_counts_only_from_trusted_proxies(db: AsyncEngine, tmp_path: Path) -> None:
    for trusted, spoofed_allowed in ((["127.0.0.1"], True), ([], False)):
        async for f in _full(db, tmp_path, register_per_ip_per_minute=2, trusted_proxies=trusted):
            statuses = []
            for i in range(4):
                forwarded = {"X-Forwarded-For": f"203.0.113.{i % 2 * 0}, 198.51.100.{i}"}
                status, _ = await f.call(
                    "POST", "/api/accounts", {"name": f"u{trusted!r}{i}"}, headers=forwarded
                )
                statuses.append(status)
            # Behind a trusted proxy each forwarded client has its own bucket; from anyone else the
            # header is ignored and all four share the caller's.
            assert statuses == ([201] * 4 if spoofed_allowed else [201, 201, 429, 429])


async def test_memory_claims_are_bounded_by_a_real_machine(full: Full) -> None:
    ada_id, ada = await full.register("Ada")
    host = await full.bind(ada_id, ada)
    for device, memory, status in (
        ("cpu", 1 << 44, 400),  # 16 TiB of RAM: allowed by today's bound, won the whole grid
        ("cuda", 1 << 40, 400),  # a 1 TiB GPU
        ("cuda", 80 << 30, 200),
        ("cpu", 512 << 30, 200),
    ):
        body = {"peer_id": host.peer_id, "device": device, "memory_bytes": memory}
        got, answer = await full.call("POST", "/api/assignment", body, ada)
        assert got == status, (device, memory, answer)


async def test_energy_reports_are_bounded_by_power_and_time(full: Full) -> None:
    ada_id, ada = await full.register("Ada")
    host = await full.bind(ada_id, ada)

    async def report_at(last: float, kwh: float) -> tuple[int, Any]:
        async with full.services.sessions() as session, session.begin():
            await session.execute(
                update(Host).where(Host.peer_id == host.peer_id).values(energy_reported_at=last)
            )
        return await full.call("POST", "/api/hosts/energy", {"peer_id": host.peer_id, "kwh_delta": kwh}, ada)

    # Just bound: 5 kWh now is a 3 kW machine running for hours, which it has not.
    status, body = await full.call(
        "POST", "/api/hosts/energy", {"peer_id": host.peer_id, "kwh_delta": 5.0}, ada
    )
    assert (status, body["error"]) == (422, "implausible_energy")
    status, _ = await report_at(time.time() - 3600, 2.0)  # 2 kWh in an hour: a 2 kW machine
    assert status == 200
    status, body = await report_at(time.time() - 60, 1.0)  # 1 kWh in a minute: 60 kW
    assert (status, body["error"]) == (422, "implausible_energy")
    status, body = await report_at(time.time() - 60, 0.01)
    assert status == 200 and body["energy_kwh"] == pytest.approx(2.01)


async def test_assignment_carries_the_coordinators_proofs(full: Full) -> None:
    from engine.account.coordinator_api import parse_assignment
    from engine.p2p.errors import IdentityError
    from engine.p2p.identity import verify
    from engine.wire.statements import assignment_signed_bytes

    ada_id, ada = await full.register("Ada")
    host = await full.bind(ada_id, ada)
    status, raw = await full.call(
        "POST", "/api/assignment", {"peer_id": host.peer_id, "memory_bytes": 1 << 30}, ada
    )
    assert status == 200
    got = parse_assignment(raw)
    assert got.coordinator_key == full.services.tokens.public_key_bytes and len(got.experts) == 4
    for e in got.experts:
        verify(
            got.coordinator_key, assignment_signed_bytes(host.public_key, e.uid, "ffn", e.expires_at), e.proof
        )
    # The proof is for this host's key only.
    other = Identity.generate()
    with pytest.raises(IdentityError):
        e = got.experts[0]
        verify(
            got.coordinator_key,
            assignment_signed_bytes(other.public_key, e.uid, "ffn", e.expires_at),
            e.proof,
        )


async def test_housekeeping_forgets_expired_revocations_and_idle_buckets(full: Full) -> None:
    services = full.services
    _, ada = await full.register("Ada")
    claims = services.tokens.decode(ada)
    await services.tokens.revoke(claims.jti, expires_at=full.clock() - 1)  # expired anyway
    await services.tokens.revoke("f" * 32)  # still in force
    assert await services.housekeep() == (1, 0)  # the registration's bucket is still in use
    full.clock.advance(120)
    assert await services.housekeep() == (0, 1)  # now it is full again: forgotten
    assert await services.tokens.is_revoked("f" * 32)
    hooks = [ctx.__func__ for ctx in full.client.app.cleanup_ctx if hasattr(ctx, "__func__")]
    assert Services.housekeeping in hooks  # the app runs it


async def test_the_full_hub_limits_offers_and_addresses_as_configured(
    db: AsyncEngine, tmp_path: Path
) -> None:
    async for f in _full(db, tmp_path, offers_per_minute=30, offer_burst=5, trusted_proxies=["10.0.0.0/8"]):
        hub = f.client.app[HUB_KEY]
        assert hub.offers is f.services.offer_gate
        assert (hub.offers.limiter.burst, hub.offers.limiter.rate) == (5.0, 0.5)
        assert hub.address_of is f.services.client_address and hub.recheck is not None


async def test_look_alike_team_names_are_the_same_team(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path)
    first = await s.accounts.register("ada", team="Night Owls")
    second = await s.accounts.register("bob", team="N\u0456ght Owls")  # Cyrillic i
    third = await s.accounts.register("cy", team="Early Birds")
    assert first.team == second.team == "Night Owls" and third.team == "Early Birds"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_migration_gives_existing_names_their_skeletons(tmp_path: Path, backend: str) -> None:
    import uuid

    from sqlalchemy import text

    from coordinator.config import CoordinatorConfig
    from coordinator.db.migrations import migrate
    from coordinator.db.session import make_engine
    from coordinator.services import open_services
    from tests.dbs import POSTGRES_URL

    url, schema = f"sqlite+aiosqlite:///{tmp_path / 'old.sqlite3'}", None
    if backend == "postgres":
        url, schema = POSTGRES_URL, f"m_{uuid.uuid4().hex[:12]}"
        admin = make_engine(url)
        async with admin.begin() as conn:
            await conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        await migrate(url, search_path=schema, revision="0002")  # a database of the previous release
        engine = make_engine(url, search_path=schema)
        async with engine.begin() as conn:
            credit = "credit_total, credit_recent, credit_recent_at"
            await conn.execute(text(f"INSERT INTO teams (name, {credit}) VALUES ('Owls', 0, 0, 0)"))
            await conn.execute(
                text(
                    f"INSERT INTO accounts (name, role, disabled, {credit})"
                    " VALUES ('ada', 'volunteer', false, 0, 0, 0)"
                )
            )
        await engine.dispose()
        await migrate(url, search_path=schema)
        config = CoordinatorConfig(database_url=url, token_key_path=str(tmp_path / "k"))
        services = await open_services(config, search_path=schema)
        try:
            with pytest.raises(Conflict):
                await services.accounts.register("\u0430da")
            bob = await services.accounts.register("bob", team="\u041ewls")  # Cyrillic O
            assert bob.team == "Owls"
        finally:
            await services.close()
    finally:
        if schema is not None:
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            await admin.dispose()
