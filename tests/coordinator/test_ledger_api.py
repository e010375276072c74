from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig
from coordinator.credit.api_ledger import LedgerDeps, setup_routes
from coordinator.credit.receipts import MAX_BATCH, ReceiptBatch, sign_receipt, sign_spot_check
from coordinator.services import SERVICES, Services, open_services
from engine.p2p.identity import Identity

from .ledger_support import make_host


async def ledger_app(db: AsyncEngine, tmp_path: Path) -> tuple[web.Application, Services]:
    """The ledger's routes on an app with services (the tokens that posting receipts needs)."""
    services = await open_services(CoordinatorConfig(token_key_path=str(tmp_path / "token.key")), engine=db)
    app = web.Application()
    app[SERVICES] = services
    return app, services


def auth(services: Services, account_id: int, role: str = "trainer") -> dict[str, str]:
    return {"Authorization": f"Bearer {services.tokens.issue(account_id, role)}"}


@pytest.fixture
async def api(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[tuple[TestClient, Identity, Identity, int]]:  # type: ignore[type-arg]
    app, services = await ledger_app(db, tmp_path)
    sessions = services.sessions
    trainer, trainer_account = await make_host(sessions, "trainer", role="trainer")
    host, account_id = await make_host(sessions, "alice", team="red")
    setup_routes(app, LedgerDeps(sessions, expert_costs={"mnist": 2.0}))
    async with TestClient(TestServer(app), headers=auth(services, trainer_account)) as client:
        yield client, trainer, host, account_id


def body(receipts: list) -> bytes:  # type: ignore[type-arg]
    return msgspec.json.encode(ReceiptBatch(receipts))


async def test_receipts_roundtrip_and_boards(api) -> None:  # type: ignore[no-untyped-def]
    client, trainer, host, account_id = api
    import time

    now = time.time()
    r = sign_receipt(trainer, host, "mnist.0.0", 10, True, now - 5)
    resp = await client.post("/api/receipts", data=body([r, r]))
    assert resp.status == 200
    assert await resp.json() == {
        "accepted": 1,
        "duplicates": 1,
        "withheld": 0,
        "credit": 40.0,
        "rejected": [],
    }
    resp = await client.post(
        "/api/receipts", data=body([r, sign_receipt(host, host, "mnist.0", 1, False, now)])
    )
    data = await resp.json()
    assert data["duplicates"] == 1 and data["rejected"][0]["reason"] == "self_receipt"

    board = await (await client.get("/api/leaderboard?kind=users&sort=total&page=1")).json()
    assert board["entries"][0]["name"] == "alice" and board["entries"][0]["credit_total"] == 40.0
    board = await (await client.get("/api/leaderboard", params={"kind": "hosts", "sort": "recent"})).json()
    assert board["entries"][0]["id"] == host.peer_id and board["has_more"] is False
    info = await (await client.get(f"/api/contributors/{account_id}")).json()
    assert info["account"]["credit_total"] == 40.0 and info["history"][0]["credit"] == 40.0
    stats = await (await client.get("/api/stats")).json()
    assert stats["requests_served"] == 1

    report = sign_spot_check(trainer, host.peer_id, "mnist.0.0", now - 60, now, "mismatch")
    resp = await client.post("/api/spot-checks", data=msgspec.json.encode(report))
    assert resp.status == 201
    assert (await resp.json())["reversed_credit"] == 40.0
    resp = await client.post("/api/spot-checks", data=msgspec.json.encode(report))
    assert resp.status == 409 and (await resp.json())["error"] == "replayed"  # a replay changes nothing
    forged = msgspec.structs.replace(report, period_start=now - 3600)
    resp = await client.post("/api/spot-checks", data=msgspec.json.encode(forged))
    assert resp.status == 403 and (await resp.json())["error"] == "bad_signature"


async def test_errors(api) -> None:  # type: ignore[no-untyped-def]
    client, trainer, host, _ = api

    async def error(method: str, path: str, status: int, **kw) -> str:  # type: ignore[no-untyped-def]
        resp = await client.request(method, path, **kw)
        assert resp.status == status, await resp.text()
        data = await resp.json()
        assert set(data) == {"error", "message"}
        return str(data["error"])

    assert await error("POST", "/api/receipts", 400, data=b"{not json") == "malformed_json"
    assert (
        await error("POST", "/api/receipts", 422, data=b'{"receipts": [{"receipt_id": 1}]}')
        == "invalid_request"
    )
    assert (
        await error("POST", "/api/receipts", 422, data=b'{"receipts": [], "extra": 1}') == "invalid_request"
    )
    assert await error("POST", "/api/receipts", 413, data=b" " * (1024 * 1024 + 1)) == "too_large"

    async def chunked():  # type: ignore[no-untyped-def]
        for _ in range(20):
            yield b" " * 65536

    assert await error("POST", "/api/receipts", 413, data=chunked()) == "too_large"
    r = sign_receipt(trainer, host, "mnist.0.0", 1, False, 1e9)
    too_many = msgspec.json.encode({"receipts": [r] * (MAX_BATCH + 1)})
    assert len(too_many) < 1024 * 1024
    assert await error("POST", "/api/receipts", 422, data=too_many) == "invalid_request"
    assert await error("POST", "/api/spot-checks", 400, data=b'{"a') == "malformed_json"
    assert await error("GET", "/api/leaderboard?kind=planets", 400) == "bad_kind"
    assert await error("GET", "/api/leaderboard?sort=x", 400) == "bad_sort"
    assert await error("GET", "/api/leaderboard?page=x", 400) == "bad_query"
    assert await error("GET", "/api/leaderboard?page=0", 400) == "bad_page"
    assert await error("GET", "/api/leaderboard?per_page=1000", 400) == "bad_per_page"
    assert await error("GET", "/api/contributors/abc", 400) == "bad_account_id"
    assert await error("GET", "/api/contributors/999", 404) == "not_found"
    assert await error("GET", "/api/contributors/99999999999999", 404) == "not_found"
    unknown = sign_spot_check(trainer, Identity.generate().peer_id, "m.0", 0, 1, "x")
    assert await error("POST", "/api/spot-checks", 404, data=msgspec.json.encode(unknown)) == "unknown_host"


async def test_routes_use_the_app_services(db: AsyncEngine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    from coordinator.config import CoordinatorConfig, ExperimentConfig
    from coordinator.services import SERVICES, open_services

    config = CoordinatorConfig(
        token_key_path=str(tmp_path / "token.key"),
        experiments=[ExperimentConfig(name="mnist", expert_type="ffn", grid=[2], expert_cost=3.0)],
    )
    services = await open_services(config, engine=db)
    trainer, trainer_account = await make_host(services.sessions, "trainer", role="trainer")
    host, _ = await make_host(services.sessions, "alice")
    app = web.Application()
    app[SERVICES] = services
    setup_routes(app)
    now = time.time()
    receipts = [
        sign_receipt(trainer, host, "mnist.0", 2, False, now),
        sign_receipt(trainer, host, "cifar.0", 2, False, now),
    ]
    async with TestClient(TestServer(app), headers=auth(services, trainer_account)) as client:
        data = await (await client.post("/api/receipts", data=body(receipts))).json()
    assert data["credit"] == 6.0 and data["rejected"][0]["reason"] == "unknown_expert"
    await services.close()


@pytest.mark.parametrize("cache_s", [0.0, 60.0])
async def test_leaderboard_page_cache(db: AsyncEngine, tmp_path: Path, cache_s: float) -> None:
    import time

    app, services = await ledger_app(db, tmp_path)
    sessions = services.sessions
    trainer, trainer_account = await make_host(sessions, "trainer", role="trainer")
    host, _ = await make_host(sessions, "alice")
    setup_routes(app, LedgerDeps(sessions), page_cache_s=cache_s)
    async with TestClient(TestServer(app), headers=auth(services, trainer_account)) as client:
        totals = []
        for _ in range(2):
            r = sign_receipt(trainer, host, "m.0", 5, False, time.time())
            assert (await (await client.post("/api/receipts", data=body([r]))).json())["accepted"] == 1
            board = await (await client.get("/api/leaderboard?kind=hosts")).json()
            totals.append(board["entries"][0]["credit_total"])
    assert totals == ([5.0, 5.0] if cache_s else [5.0, 10.0])
