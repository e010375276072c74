"""The trainers' API over a real full coordinator app and a real database (SQLite and PostgreSQL):
experiments for trainer accounts only, the admin's trainer grant, the login code exchanged for a
trainer token, and every refusal with its status and code; plus ``lah coordinator grant-trainer``."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.accounts import NotFound
from coordinator.accounts.trainers import grant_trainer
from coordinator.config import DenseModel, ExperimentConfig, load_config
from coordinator.server.app import create_full_app
from coordinator.services import Services, open_services
from lah.cli import main as lah_main

from . import accounts_helpers as h

EXP = ExperimentConfig(
    name="ffn",
    expert_type="ffn",
    grid=[2, 2],
    hyperparams={"d_model": 16, "hidden": 32},
    target_batch_size=256,
    dense=DenseModel(in_features=64, classes=10, batch_size=32, lr=0.01),
)
OTHER = ExperimentConfig(name="big", expert_type="ffn", grid=[8, 8], hyperparams={"d_model": 64})


class Api:
    def __init__(self, client: TestClient[Any, Any], services: Services, clock: h.FakeClock) -> None:
        self.client, self.services, self.clock = client, services, clock

    async def call(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with self.client.request(method, path, json=body, headers=headers) as r:
            return r.status, await r.json()

    async def account(self, name: str, role: str = "volunteer") -> tuple[int, str]:
        accounts = self.services.accounts
        code = (await accounts.invite(name, by=None))[0] if accounts.allowlist_mode else None
        account = await accounts.register(name, None, code)
        if role != "volunteer":
            await self.services.accounts.set_role(name, role, by=None)
        return account.id, self.services.tokens.issue(account.id, role)


async def _api(db: AsyncEngine, tmp_path: Path, **overrides: Any) -> AsyncIterator[Api]:
    clock = h.FakeClock(time.time())
    services = await h.services(db, tmp_path, clock, verify_workers=0, experiments=[EXP, OTHER], **overrides)
    app = await create_full_app(services.config, services)
    async with TestClient(TestServer(app)) as client:
        yield Api(client, services, clock)


@pytest.fixture
async def api(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[Api]:
    async for a in _api(db, tmp_path):
        yield a


# -- experiments ------------------------------------------------------------------------------------


async def test_a_trainer_lists_the_experiments_and_reads_one_config(api: Api) -> None:
    _, token = await api.account("ada", "trainer")
    status, body = await api.call("GET", "/api/experiments", token=token)
    assert status == 200
    assert body["experiments"] == [
        {
            "name": "ffn",
            "kind": "classifier",
            "expert_type": "ffn",
            "grid": [2, 2],
            "grids": ["ffn"],
            "target_batch_size": 256,
        },
        {
            "name": "big",
            "kind": "classifier",
            "expert_type": "ffn",
            "grid": [8, 8],
            "grids": ["big"],
            "target_batch_size": 0,
        },
    ]
    status, body = await api.call("GET", "/api/experiments/ffn", token=token)
    assert status == 200
    config = body["experiment"]
    assert config["target_batch_size"] == 256 and config["hyperparams"] == {"d_model": 16, "hidden": 32}
    assert config["dense"] == {
        "in_features": 64,
        "classes": 10,
        "k_best": 4,
        "batch_size": 32,
        "lr": 0.01,
        "dataset": "digits",
    }
    # admins train too
    _, admin = await api.account("root", "admin")
    status, body = await api.call("GET", "/api/experiments/big", token=admin)
    assert status == 200 and body["experiment"]["dense"]["in_features"] == 64


@pytest.mark.parametrize("name", ["nope", "FFN", "ffn.0", "%00", "x" * 300])
async def test_an_unknown_experiment_is_404(api: Api, name: str) -> None:
    _, token = await api.account("ada", "trainer")
    status, body = await api.call("GET", f"/api/experiments/{name}", token=token)
    assert status == 404 and body["error"] == "unknown_experiment" and "no experiment" in body["message"]


async def test_experiments_are_refused_to_volunteers_and_without_a_valid_token(api: Api) -> None:
    ada_id, volunteer = await api.account("ada")
    for path in ("/api/experiments", "/api/experiments/ffn", "/api/experiments/nope"):
        status, body = await api.call("GET", path, token=volunteer)
        assert (status, body["error"]) == (403, "not_a_trainer"), path
        status, body = await api.call("GET", path)
        assert (status, body["error"]) == (401, "token_required"), path
        status, body = await api.call("GET", path, token="not.a-token")
        assert (status, body["error"]) == (401, "token_invalid"), path
    await api.services.accounts.set_role("ada", "trainer", by=None)
    trainer = api.services.tokens.issue(ada_id, "trainer")
    assert (await api.call("GET", "/api/experiments/ffn", token=trainer))[0] == 200
    # expired
    api.clock.advance(api.services.tokens.ttl_s + 1)
    status, body = await api.call("GET", "/api/experiments/ffn", token=trainer)
    assert (status, body["error"]) == (401, "token_expired")
    # revoked
    fresh = api.services.tokens.issue(ada_id, "trainer")
    await api.services.tokens.revoke(api.services.tokens.decode(fresh).jti)
    status, body = await api.call("GET", "/api/experiments", token=fresh)
    assert (status, body["error"]) == (401, "token_revoked")
    # disabled
    other = api.services.tokens.issue(ada_id, "trainer")
    await api.services.accounts.set_disabled("ada", True, by=None)
    status, body = await api.call("GET", "/api/experiments/ffn", token=other)
    assert (status, body["error"]) == (403, "account_disabled")


# -- grant and login --------------------------------------------------------------------------------


async def test_the_admin_grants_and_the_researcher_logs_in_with_the_code_once(api: Api) -> None:
    _, admin = await api.account("root", "admin")
    status, body = await api.call("POST", "/api/admin/trainers", {"name": "grace"}, admin)
    assert status == 201 and body["account"]["role"] == "trainer" and len(body["code"]) >= 24
    code = body["code"]
    status, login = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": code})
    assert status == 200 and login["account"]["name"] == "grace"
    claims = api.services.tokens.decode(login["token"])
    assert claims.role == "trainer" and claims.exp == login["expires_at"]
    assert (await api.call("GET", "/api/experiments/ffn", token=login["token"]))[0] == 200
    # refreshing keeps the role; the code is single use
    status, refreshed = await api.call("POST", "/api/tokens/refresh", None, login["token"])
    assert status == 200 and api.services.tokens.decode(refreshed["token"]).role == "trainer"
    status, again = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": code})
    assert (status, again["error"]) == (403, "invite_invalid")


async def test_a_grant_makes_an_existing_volunteer_a_trainer_and_its_refreshed_token_says_so(
    api: Api,
) -> None:
    _, volunteer = await api.account("ada")
    _, admin = await api.account("root", "admin")
    status, body = await api.call("POST", "/api/admin/trainers", {"name": "ada"}, admin)
    assert status == 201 and body["account"]["role"] == "trainer"
    status, refreshed = await api.call("POST", "/api/tokens/refresh", None, volunteer)
    assert status == 200 and api.services.tokens.decode(refreshed["token"]).role == "trainer"
    # granting an admin keeps it an admin
    status, body = await api.call("POST", "/api/admin/trainers", {"name": "root"}, admin)
    assert status == 201 and body["account"]["role"] == "admin"


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"name": "grace", "code": "wrong"}, 403, "invite_invalid"),
        ({"name": "nobody", "code": "CODE"}, 403, "invite_invalid"),  # CODE: grace's real code
        ({"name": "Grace", "code": "CODE"}, 403, "invite_invalid"),
        ({"name": "grace"}, 400, "invalid_request"),
        ({"name": "grace", "code": "CODE", "extra": 1}, 400, "invalid_request"),
        ({"name": "grace", "code": "x" * 200}, 400, "invalid_request"),
        ({"name": "\u0000", "code": "CODE"}, 403, "invite_invalid"),
    ],
)
async def test_a_bad_login_is_refused_and_leaves_the_code_usable(
    api: Api, body: dict[str, Any], status: int, code: str
) -> None:
    _, admin = await api.account("root", "admin")
    _, granted = await api.call("POST", "/api/admin/trainers", {"name": "grace"}, admin)
    sent = {k: (granted["code"] if v == "CODE" else v) for k, v in body.items()}
    got, answer = await api.call("POST", "/api/trainers/login", sent)
    assert (got, answer["error"]) == (status, code)
    ok, _ = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": granted["code"]})
    assert ok == 200


async def test_a_login_code_expires_and_is_refused_once_the_role_is_taken_back(api: Api) -> None:
    _, admin = await api.account("root", "admin")
    _, first = await api.call("POST", "/api/admin/trainers", {"name": "grace", "ttl_s": 60}, admin)
    api.clock.advance(61)
    status, body = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": first["code"]})
    assert (status, body["error"]) == (403, "invite_invalid")
    _, second = await api.call("POST", "/api/admin/trainers", {"name": "grace"}, admin)
    await api.services.accounts.set_role("grace", "volunteer", by=None)
    status, body = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": second["code"]})
    assert (status, body["error"]) == (403, "forbidden")
    _, third = await api.call("POST", "/api/admin/trainers", {"name": "grace"}, admin)
    await api.services.accounts.set_disabled("grace", True, by=None)
    status, body = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": third["code"]})
    assert (status, body["error"]) == (403, "account_disabled")


async def test_only_an_admin_grants_and_bad_grants_are_refused(api: Api) -> None:
    _, trainer = await api.account("ada", "trainer")
    status, body = await api.call("POST", "/api/admin/trainers", {"name": "eve"}, trainer)
    assert (status, body["error"]) == (403, "forbidden")
    status, body = await api.call("POST", "/api/admin/trainers", {"name": "eve"})
    assert (status, body["error"]) == (401, "token_required")
    _, admin = await api.account("root", "admin")
    for bad, code in (
        ({"name": ""}, "invalid_name"),
        ({"name": "x", "ttl_s": -1}, "invalid_name"),
        ({}, "invalid_request"),
    ):
        status, body = await api.call("POST", "/api/admin/trainers", bad, admin)
        assert (status, body["error"]) == (400, code), bad
    with pytest.raises(Exception, match="no such account"):
        await api.services.accounts.by_name("eve")  # nothing was created by the refused grants


async def test_in_allowlist_mode_a_grant_creates_the_account(db: AsyncEngine, tmp_path: Path) -> None:
    async for api in _api(db, tmp_path, allowlist_mode=True):
        _, admin = await api.account("root", "admin")
        status, body = await api.call("POST", "/api/admin/trainers", {"name": "grace"}, admin)
        assert status == 201 and body["account"]["role"] == "trainer"
        status, login = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": body["code"]})
        assert status == 200 and api.services.tokens.decode(login["token"]).role == "trainer"


async def test_logins_share_the_per_address_budget_of_registrations(db: AsyncEngine, tmp_path: Path) -> None:
    async for api in _api(db, tmp_path, register_per_ip_per_minute=3):
        _, code, _ = await grant_trainer(api.services.accounts, "grace", by=None)
        for _ in range(3):
            status, body = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": "guess"})
            assert (status, body["error"]) == (403, "invite_invalid")
        async with api.client.post("/api/trainers/login", json={"name": "grace", "code": code}) as r:
            assert r.status == 429 and (await r.json())["error"] == "rate_limited"
            assert int(r.headers["Retry-After"]) >= 1
        api.clock.advance(61)
        status, _ = await api.call("POST", "/api/trainers/login", {"name": "grace", "code": code})
        assert status == 200  # the refused attempts did not use the code up


# -- the operator's command -------------------------------------------------------------------------


def test_lah_coordinator_grant_trainer_prints_a_code_that_logs_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = tmp_path / "coordinator.toml"
    config_path.write_text(
        f'database_url = "sqlite+aiosqlite:///{tmp_path / "c.sqlite3"}"\n'
        f'token_key_path = "{tmp_path / "token.key"}"\n'
        "verify_workers = 0\n"
    )
    assert lah_main(["coordinator", "--config", str(config_path), "grant-trainer", "grace"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"grace is a trainer; login code (\S+) .* --code=(\S+)$", out.strip())
    assert found is not None and found[1] == found[2], out
    code = found[1]
    # when it lapses as a date and time (not a unix time), and a command that reaches this coordinator
    assert re.search(r"valid until \d{4}-\d\d-\d\d \d\d:\d\d UTC", out), out
    assert "lah train login --coordinator http://127.0.0.1:8470 --name grace --code=" in out

    async def log_in() -> None:
        services = await open_services(load_config(config_path))
        app = await create_full_app(services.config, services)  # its cleanup closes the services
        async with (
            TestClient(TestServer(app)) as client,
            client.post("/api/trainers/login", json={"name": "grace", "code": code}) as r,
        ):
            assert r.status == 200
            assert services.tokens.decode((await r.json())["token"]).role == "trainer"

    asyncio.run(log_in())


def test_lah_coordinator_refuses_bad_input_with_a_sentence_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_path = tmp_path / "coordinator.toml"
    config_path.write_text(
        f'database_url = "sqlite+aiosqlite:///{tmp_path / "c.sqlite3"}"\n'
        f'token_key_path = "{tmp_path / "token.key"}"\n'
        "verify_workers = 0\n"
    )
    base = ["coordinator", "--config", str(config_path)]
    for days in ("0", "-1", "400", "soon"):  # --ttl-days 0 was an InvalidName traceback
        with pytest.raises(SystemExit) as exited:
            lah_main([*base, "grant-trainer", "grace", "--ttl-days", days])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "argument --ttl-days" in err and "Traceback" not in err, err
    assert "more than 0 and at most 366 days, not 0" in _last_error(capsys, base, "invite", "0")
    assert lah_main([*base, "grant-trainer", " grace"]) == 2  # a name the coordinator refuses
    err = capsys.readouterr().err
    assert err.startswith("lah coordinator grant-trainer: ") and "whitespace" in err

    async def grace_exists() -> bool:
        services = await open_services(load_config(config_path))
        try:
            await services.accounts.by_name("grace")
            return True
        except NotFound:
            return False
        finally:
            await services.close()

    assert not asyncio.run(grace_exists())  # no account was made on the way to a refusal


def _last_error(capsys: pytest.CaptureFixture[str], base: list[str], action: str, days: str) -> str:
    with pytest.raises(SystemExit):
        lah_main([*base, action, "grace", "--ttl-days", days])
    return capsys.readouterr().err
