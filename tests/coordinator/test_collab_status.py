"""Collaborative trainers' status reports on the real coordinator routes and database (SQLite and
PostgreSQL): the swarm panel's JSON, training samples bounded by receipts, and every bad input refused
with nothing stored."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator import site
from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.credit import api_ledger
from coordinator.credit.receipts import ReceiptBatch, sign_receipt
from coordinator.db.models import CollabStatus, TrainerWork
from coordinator.http.ratelimit import RateLimiter
from coordinator.services import SERVICES, Services, open_services
from coordinator.swarm import api_collab
from coordinator.swarm.collab_status import EXPIRE_S, ONLINE_S, StatusReport, collaborations, expire, record
from engine.p2p.identity import Identity

from .ledger_support import make_host

EXPERIMENTS = [
    ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2], target_batch_size=256),
    ExperimentConfig(name="solo", expert_type="ffn", grid=[2], target_batch_size=0),
]


@dataclass
class World:
    client: TestClient  # type: ignore[type-arg]
    services: Services
    trainer: Identity
    trainer_account: int
    other: Identity
    other_account: int
    volunteer: Identity
    volunteer_account: int

    def auth(self, account: int, role: str = "trainer") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.services.tokens.issue(account, role)}"}


@pytest.fixture
async def world(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[World]:
    config = CoordinatorConfig(token_key_path=str(tmp_path / "token.key"), experiments=EXPERIMENTS)
    services = await open_services(config, engine=db)
    app = web.Application()
    app[SERVICES] = services
    api_ledger.setup_routes(app, api_ledger.LedgerDeps.of(config, services.sessions, None), page_cache_s=0)
    # A stopped clock: the bucket does not refill while a test posts (no timing in the tests).
    api_collab.setup_routes(app, RateLimiter.per_minute(api_collab.REPORTS_PER_MINUTE, clock=lambda: 0.0))
    site.setup_routes(app, get_online=None)
    trainer, trainer_account = await make_host(services.sessions, "tess", role="trainer", team="dense")
    other, other_account = await make_host(services.sessions, "otto", role="trainer")
    volunteer, volunteer_account = await make_host(services.sessions, "vera")
    async with TestClient(TestServer(app)) as client:
        yield World(
            client, services, trainer, trainer_account, other, other_account, volunteer, volunteer_account
        )


def report(peer: Identity, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "experiment": "ffn",
        "peer_id": peer.peer_id,
        "run_id": "00112233aabbccdd",
        "epoch": 3,
        "samples_accumulated": 40,
        "samples_per_s": 21.5,
        "peers": 2,
        "samples_processed": 300,
        "last_round_outcome": "ok",
        "last_round_epoch": 3,
        "last_round_s": 0.75,
    }
    body.update(kw)
    return body


async def post(w: World, body: Any, account: int | None = None, **kw: Any) -> tuple[int, dict[str, Any]]:
    headers = w.auth(w.trainer_account if account is None else account)
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    resp = await w.client.post("/api/collab/status", data=data, headers=headers, **kw)
    return resp.status, await resp.json()


async def receipts(w: World, trainer: Identity, account: int, samples: int, backward: bool = False) -> None:
    batch = ReceiptBatch(
        [sign_receipt(trainer, w.volunteer, "ffn.0.1", samples, backward, time.time())]
    )
    resp = await w.client.post("/api/receipts", data=msgspec.json.encode(batch), headers=w.auth(account))
    assert resp.status == 200 and (await resp.json())["accepted"] == 1, await resp.text()


async def test_reports_make_the_panel_and_training_samples_are_bounded_by_receipts(world: World) -> None:
    w = world
    assert await post(w, report(w.trainer)) == (
        200,
        {"experiment": "ffn", "peer_id": w.trainer.peer_id, "claimed_added": 300},
    )
    body = report(
        w.other,
        epoch=3,
        samples_accumulated=60,
        samples_per_s=10.0,
        samples_processed=60,
        last_round_outcome="timed_out",
        last_round_s=2.5,
    )
    assert (await post(w, body, w.other_account))[0] == 200
    panel = await (await w.client.get("/api/collab")).json()
    (c,) = panel["collaborations"]  # the non-collaborative experiment has no panel
    assert c["experiment"] == "ffn" and c["target"] == 256 and c["epoch"] == 3
    assert c["samples"] == 100 and c["progress"] == pytest.approx(100 / 256)
    assert c["samples_per_s"] == pytest.approx(31.5)
    assert [t["peer_id"] for t in c["trainers"]] == [w.trainer.peer_id, w.other.peer_id]  # fastest first
    assert c["last_round_epoch"] == 3 and c["last_round_s"] == 2.5 and c["last_round_outcome"] == "timed_out"

    # Claimed 300 samples with no receipts: nothing credited yet. Receipts prove 120 forward samples
    # (backward ones prove nothing more): credited 120; more receipts lift it up to the claim.
    board = await (await w.client.get("/api/collab/trainers")).json()
    assert [(t["account_name"], t["samples"], t["claimed"]) for t in board["trainers"]] == [
        ("otto", 0, 60),  # a tie at 0: the newer account first, as the other boards break ties
        ("tess", 0, 300),
    ]
    await receipts(w, w.trainer, w.trainer_account, 120)
    await receipts(w, w.trainer, w.trainer_account, 500, backward=True)
    board = await (await w.client.get("/api/collab/trainers")).json()
    assert board["count"] == 2
    top = board["trainers"][0]
    assert (
        top["account_name"],
        top["team_name"],
        top["samples"],
        top["claimed"],
        top["receipt_samples"],
    ) == ("tess", "dense", 120, 300, 120)
    await receipts(w, w.trainer, w.trainer_account, 1000)
    assert (await (await w.client.get("/api/collab/trainers")).json())["trainers"][0]["samples"] == 300

    # The counter grows within a run: only the increase is claimed; a new run counts from zero.
    assert (await post(w, report(w.trainer, samples_processed=350)))[1]["claimed_added"] == 50
    assert (
        await post(
            w, report(w.trainer, run_id="ffffffffffffffff", samples_processed=20, samples_accumulated=0)
        )
    )[1]["claimed_added"] == 20
    top = (await (await w.client.get("/api/collab/trainers")).json())["trainers"][0]
    assert top["claimed"] == 370 and top["samples"] == 370

    # Volunteers' credit is untouched by training samples, and the trainers' tab renders them.
    users = await (await w.client.get("/api/leaderboard?kind=users")).json()
    top_user = users["entries"][0]
    assert (top_user["name"], top_user["credit_total"]) == ("vera", 1120 + 2 * 500)
    page = await (await w.client.get("/leaderboard?kind=trainers")).text()
    assert "tess" in page and "370" in page and 'aria-current="page">Trainers' in page
    swarm = await (await w.client.get("/swarm")).text()
    assert "Collaborative training" in swarm and w.trainer.peer_id[:12] in swarm and "timed out" in swarm


async def stored(w: World) -> tuple[int, int, int]:
    async with w.services.sessions() as s:
        statuses = (await s.execute(select(func.count()).select_from(CollabStatus))).scalar_one()
        work = (await s.execute(select(func.count()).select_from(TrainerWork))).scalar_one()
        claimed = (
            await s.execute(select(func.coalesce(func.sum(TrainerWork.samples_claimed), 0)))
        ).scalar_one()
    return int(statuses), int(work), int(claimed)


BAD_BODIES: list[tuple[str, Any, int, str]] = [
    ("not json", b"{nope", 400, "malformed_json"),
    ("a list", b"[1, 2]", 422, "invalid_request"),
    ("unknown field", {"extra": 1}, 422, "invalid_request"),
    ("missing field", {"epoch": None}, 422, "invalid_request"),
    ("nan", b"NAN", 400, "malformed_json"),
    ("infinite rate", b"INF", 422, "invalid_request"),
    ("negative rate", {"samples_per_s": -1.0}, 422, "invalid_request"),
    ("absurd rate", {"samples_per_s": 1e12}, 422, "invalid_request"),
    ("negative epoch", {"epoch": -1}, 422, "invalid_request"),
    ("huge epoch", {"epoch": 2**62}, 422, "invalid_request"),
    ("zero peers", {"peers": 0}, 422, "invalid_request"),
    ("float samples", {"samples_processed": 1.5}, 422, "invalid_request"),
    ("string rate", {"samples_per_s": "fast"}, 422, "invalid_request"),
    ("long experiment", {"experiment": "x" * 65}, 422, "invalid_request"),
    ("bad peer id", {"peer_id": "Z" * 40}, 422, "invalid_request"),
    ("short run id", {"run_id": "abc"}, 422, "invalid_request"),
    ("upper-case run id", {"run_id": "ABCDEF0123"}, 422, "invalid_request"),
    ("unknown outcome", {"last_round_outcome": "great"}, 422, "invalid_request"),
    ("round without epoch", {"last_round_epoch": None}, 422, "invalid_request"),
    ("no round but an epoch", {"last_round_outcome": "none", "last_round_s": None}, 422, "invalid_request"),
    ("local step with a time", {"last_round_outcome": "local"}, 422, "invalid_request"),
    ("round after epoch", {"last_round_epoch": 4}, 422, "invalid_request"),
    ("round too long", {"last_round_s": 1e6}, 422, "invalid_request"),
    ("more accumulated than processed", {"samples_accumulated": 301}, 422, "invalid_request"),
    ("unknown experiment", {"experiment": "nope"}, 404, "unknown_experiment"),
    ("not collaborative", {"experiment": "solo"}, 422, "not_collaborative"),
    ("too large", b" " * 5000, 413, "too_large"),
]


def _raw(w: World, spec: Any) -> Any:
    if spec == b"NAN":
        return msgspec.json.encode(report(w.trainer)).replace(b"21.5", b"NaN")
    if spec == b"INF":
        return msgspec.json.encode(report(w.trainer)).replace(b"21.5", b"1e999")
    if isinstance(spec, bytes):
        return spec
    body = report(w.trainer, **{k: v for k, v in spec.items() if k != "extra"})
    if "extra" in spec:
        body["extra"] = 1
    if spec == {"epoch": None}:
        del body["epoch"]
    return body


@pytest.mark.parametrize("name,spec,status,code", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
async def test_bad_reports_are_refused_and_store_nothing(
    world: World, name: str, spec: Any, status: int, code: str
) -> None:
    got = await post(world, _raw(world, spec))
    assert got[0] == status and got[1]["error"] == code, (name, got)
    assert set(got[1]) == {"error", "message"}
    assert await stored(world) == (0, 0, 0)


async def test_who_may_report(world: World) -> None:
    w = world
    resp = await w.client.post("/api/collab/status", json=report(w.trainer))
    assert resp.status == 401
    status, body = await post(w, report(w.volunteer), w.volunteer_account)
    assert (status, body["error"]) == (403, "not_a_trainer")
    status, body = await post(w, report(w.other))  # otto's key, tess's token
    assert (status, body["error"]) == (403, "not_your_key")
    assert await stored(w) == (0, 0, 0)


async def test_a_counter_going_backwards_is_refused_and_changes_nothing(world: World) -> None:
    w = world
    assert (await post(w, report(w.trainer, samples_processed=300)))[0] == 200
    before = await stored(w)
    status, body = await post(w, report(w.trainer, samples_processed=299, epoch=9, last_round_epoch=9))
    assert (status, body["error"]) == (422, "samples_went_backwards")
    assert await stored(w) == before
    (c,) = (await (await w.client.get("/api/collab")).json())["collaborations"]
    assert c["epoch"] == 3  # the refused report did not replace the stored one


async def test_reports_are_rate_limited_per_account(world: World) -> None:
    w = world
    statuses = [
        (await post(w, report(w.trainer, samples_processed=300 + i)))[0]
        for i in range(api_collab.REPORTS_PER_MINUTE)
    ]
    assert statuses == [200] * api_collab.REPORTS_PER_MINUTE
    resp = await w.client.post(
        "/api/collab/status", json=report(w.trainer, samples_processed=999), headers=w.auth(w.trainer_account)
    )
    assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
    assert (await post(w, report(w.other), w.other_account))[0] == 200  # another account has its own bucket


async def test_silent_trainers_leave_the_panel_and_old_rows_are_deleted(world: World) -> None:
    w = world
    sessions = w.services.sessions
    t0 = 1_800_000_000.0
    await record(sessions, w.trainer_account, msgspec.convert(report(w.trainer), StatusReport), t0)
    (c,) = await collaborations(sessions, EXPERIMENTS, t0 + ONLINE_S - 1)
    assert [t.peer_id for t in c.trainers] == [w.trainer.peer_id]
    (c,) = await collaborations(sessions, EXPERIMENTS, t0 + ONLINE_S + 1)
    assert c.trainers == [] and c.epoch == 0
    later = msgspec.convert(report(w.other, samples_processed=5, samples_accumulated=5), StatusReport)
    await record(sessions, w.other_account, later, t0 + EXPIRE_S + 1)
    async with sessions() as s:
        peers = (await s.execute(select(CollabStatus.peer_id))).scalars().all()
    assert peers == [w.other.peer_id]
    # and without any further report, the periodic expiry deletes it in time
    assert await expire(sessions, t0 + EXPIRE_S) == 0
    assert await expire(sessions, t0 + 2 * EXPIRE_S + 2) == 1
    assert await stored(w) == (0, 2, 305)  # the trainers' work stays: it is their record
    assert (await w.client.get("/api/collab/trainers?page=0")).status == 400
