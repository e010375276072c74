"""Trainers' evaluation reports and the experiments' pages, on the real coordinator routes and database
(SQLite and PostgreSQL): one curve per trainer account, the newest sample as text, every bad input
refused with nothing stored, the per-account rate, and the bounded history."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator import site
from coordinator.config import CoordinatorConfig, ExperimentConfig, LanguageModel
from coordinator.db.models import Account, Assignment, ExperimentProgress
from coordinator.http.ratelimit import RateLimiter
from coordinator.services import SERVICES, Services, open_services
from coordinator.swarm import api_progress
from coordinator.swarm.progress import MAX_SAMPLE_BYTES, ProgressReport, record

from .ledger_support import make_host

LM = ExperimentConfig(
    name="tiny",
    kind="lm",
    expert_type="ffn",
    grid=[2, 4],
    lm=LanguageModel(vocab_size=65, context=32, layers=4, heads=2, dim=32, moe_every=2),
)
CLASSIFIER = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2])
XSS_SAMPLE = 'ROMEO:\n<script>alert("x")</script> & <b>bold</b>'


@dataclass
class World:
    client: TestClient  # type: ignore[type-arg]
    services: Services
    tess: int
    otto: int
    vera: int  # a volunteer

    def auth(self, account: int, role: str = "trainer") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.services.tokens.issue(account, role)}"}


@pytest.fixture
async def world(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[World]:
    config = CoordinatorConfig(token_key_path=str(tmp_path / "token.key"), experiments=[LM, CLASSIFIER])
    services = await open_services(config, engine=db)
    app = web.Application()
    app[SERVICES] = services
    # A stopped clock: the bucket does not refill while a test posts (no timing in the tests).
    api_progress.setup_routes(app, RateLimiter.per_minute(api_progress.REPORTS_PER_MINUTE, clock=lambda: 0.0))
    site.setup_routes(app, get_online=None)
    _, tess = await make_host(services.sessions, "tess <i>lab</i>", role="trainer")
    _, otto = await make_host(services.sessions, "otto", role="trainer")
    _, vera = await make_host(services.sessions, "vera")
    async with TestClient(TestServer(app)) as client:
        yield World(client, services, tess, otto, vera)


def row(step: int, loss: float, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"step": step, "train_tokens": step * 384, "val_loss": loss, "tokens_per_s": 950.5}
    body.update(kw)
    return body


async def post(
    w: World, body: Any, account: int | None = None, experiment: str = "tiny"
) -> tuple[int, dict[str, Any]]:
    headers = w.auth(w.tess if account is None else account)
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    resp = await w.client.post(f"/api/experiments/{experiment}/progress", data=data, headers=headers)
    return resp.status, await resp.json()


async def stored(w: World) -> tuple[int, int]:
    """(rows, rows with a sample)."""
    async with w.services.sessions() as s:
        rows = (await s.execute(select(func.count()).select_from(ExperimentProgress))).scalar_one()
        samples = (
            await s.execute(
                select(func.count())
                .select_from(ExperimentProgress)
                .where(ExperimentProgress.sample.is_not(None))
            )
        ).scalar_one()
    return int(rows), int(samples)


async def test_each_trainer_draws_its_own_curve_and_the_newest_sample_is_shown_as_text(world: World) -> None:
    w = world
    for step, loss in ((100, 3.2), (200, 2.7), (300, 2.41)):
        assert (await post(w, row(step, loss)))[0] == 200
    assert await post(w, row(100, 3.0, sample="otto's words"), w.otto) == (
        200,
        {"experiment": "tiny", "account_id": w.otto, "kept": 1},
    )
    assert (await post(w, row(400, 2.2, sample=XSS_SAMPLE)))[1]["kept"] == 4
    data = await (await w.client.get("/api/site/experiments/tiny")).json()
    curves = {c["account_name"]: c for c in data["curves"]}
    assert list(curves) == ["tess <i>lab</i>", "otto"]  # the one that reported last first
    assert [(p["step"], p["val_loss"]) for p in curves["tess <i>lab</i>"]["points"]] == [
        (100, 3.2),
        (200, 2.7),
        (300, 2.41),
        (400, 2.2),
    ]
    assert [p["train_tokens"] for p in curves["otto"]["points"]] == [38_400]
    assert data["trainers_reporting"] == 2
    sample = data["sample"]
    assert (sample["text"], sample["step"], sample["val_loss"], sample["account_id"]) == (
        XSS_SAMPLE,
        400,
        2.2,
        w.tess,
    )
    shape = data["experiment"]
    assert (shape["kind"], shape["layers"], shape["dim"], shape["experts_per_grid"]) == ("lm", 4, 32, 8)
    assert [g["name"] for g in shape["grids"]] == ["tiny_b1", "tiny_b3"]
    assert shape["mixture_blocks"] == [2, 4]

    page = await (await w.client.get("/experiments/tiny")).text()
    # The sample and the names are text: escaped, never markup.
    assert "<script>" not in page and "<b>bold</b>" not in page and "<i>lab</i>" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    assert "tess &lt;i&gt;lab&lt;/i&gt;" in page
    assert "at step 400" in page and "validation loss 2.200" in page
    assert page.count('<polyline class="line s') == 2  # one line per trainer
    assert "2.410" in page and "3.000" in page  # the table beside the chart
    listing = await (await w.client.get("/experiments")).text()
    assert 'href="/experiments/tiny"' in listing and 'href="/experiments/ffn"' in listing
    assert "validation loss 2.200 at step 400" in listing
    latest = (await (await w.client.get("/api/site/experiments")).json())["experiments"]
    assert [(e["name"], (e["latest"] or {}).get("val_loss")) for e in latest] == [
        ("tiny", 2.2),
        ("ffn", None),
    ]


async def test_the_shape_counts_the_hosts_serving_each_grid_now(world: World) -> None:
    w = world
    now = time.time()
    hosts = [(await make_host(w.services.sessions, f"host{i}"))[0].peer_id for i in range(3)]
    async with w.services.sessions() as s, s.begin():
        for host, grid, uid, expires in (
            (hosts[0], "tiny_b1", "tiny_b1.0.0", now + 600),
            (hosts[0], "tiny_b3", "tiny_b3.0.0", now + 600),
            (hosts[1], "tiny_b1", "tiny_b1.0.0", now + 600),
            (hosts[1], "tiny_b1", "tiny_b1.1.3", now + 600),
            (hosts[2], "tiny_b3", "tiny_b3.1.1", now - 1),  # lapsed: serves nothing now
        ):
            s.add(
                Assignment(
                    host_peer_id=host, experiment=grid, expert_uid=uid, assigned_at=now, expires_at=expires
                )
            )
    shape = (await (await w.client.get("/api/site/experiments/tiny")).json())["experiment"]
    assert [(g["name"], g["experts"], g["hosts"], g["covered"]) for g in shape["grids"]] == [
        ("tiny_b1", 8, 2, 2),
        ("tiny_b3", 8, 1, 1),
    ]
    assert (shape["hosts"], shape["experts"], shape["covered"]) == (2, 16, 3)  # host 0 serves both
    page = await (await w.client.get("/experiments/tiny")).text()
    assert "No trainer has reported" in page and "No sample of generated text yet" in page
    swarm = await (await w.client.get("/swarm")).text()
    assert swarm.count('href="/experiments/tiny"') == 2  # each layer's grid links to its model's page
    assert 'href="/experiments/ffn"' in swarm
    classifier = await (await w.client.get("/experiments/ffn")).text()
    assert "A classifier around one grid of 4 ffn experts" in classifier and "ffn</code>" in classifier


async def test_an_unknown_experiment_is_a_404_page_and_json(world: World) -> None:
    resp = await world.client.get("/experiments/nope")
    assert resp.status == 404 and "There is no experiment with this name" in await resp.text()
    resp = await world.client.get("/api/site/experiments/nope")
    assert resp.status == 404 and (await resp.json())["error"] == "no such experiment"


async def test_who_may_report(world: World) -> None:
    w = world
    resp = await w.client.post("/api/experiments/tiny/progress", json=row(100, 3.0))
    assert resp.status == 401 and (await resp.json())["error"] == "token_required"
    assert (await post(w, row(100, 3.0), w.vera))[1]["error"] == "not_a_trainer"
    status, body = await post(w, row(100, 3.0), experiment="nope")
    assert (status, body["error"]) == (404, "unknown_experiment")
    status, body = await post(w, row(100, 3.0), experiment="tiny_b1")  # a layer, not an experiment
    assert (status, body["error"]) == (404, "unknown_experiment")
    async with w.services.sessions() as s, s.begin():
        await s.execute(update(Account).where(Account.id == w.otto).values(disabled=True))
    assert (await post(w, row(100, 3.0), w.otto))[1]["error"] == "account_disabled"
    assert await stored(w) == (0, 0)


BAD_BODIES: list[tuple[str, Any, int, str]] = [
    ("not json", b"{nope", 400, "malformed_json"),
    ("a list", b"[1, 2]", 422, "invalid_request"),
    ("unknown field", {"extra": 1}, 422, "invalid_request"),
    ("missing field", {"val_loss": None}, 422, "invalid_request"),
    ("nan", b"NAN", 400, "malformed_json"),
    ("infinite loss", b"INF", 422, "invalid_request"),
    ("negative loss", {"val_loss": -0.1}, 422, "invalid_request"),
    ("absurd loss", {"val_loss": 1e6}, 422, "invalid_request"),
    ("absurd rate", {"tokens_per_s": 1e12}, 422, "invalid_request"),
    ("negative step", {"step": -1}, 422, "invalid_request"),
    ("huge tokens", {"train_tokens": 2**62}, 422, "invalid_request"),
    ("float step", {"step": 1.5}, 422, "invalid_request"),
    ("string loss", {"val_loss": "low"}, 422, "invalid_request"),
    ("sample not a string", {"sample": ["a"]}, 422, "invalid_request"),
    ("sample too large", {"sample": "é" * (MAX_SAMPLE_BYTES // 2 + 1)}, 413, "sample_too_large"),
    ("control characters", {"sample": "a\x1b[31mred"}, 422, "sample_not_text"),
    ("lone surrogate", b"SURROGATE", 400, "malformed_json"),
    ("body too large", b" " * 17_000, 413, "too_large"),
]


def _raw(spec: Any) -> Any:
    if spec == b"NAN":
        return msgspec.json.encode(row(100, 2.5)).replace(b"2.5", b"NaN")
    if spec == b"INF":
        return msgspec.json.encode(row(100, 2.5)).replace(b"2.5", b"1e999")
    if spec == b"SURROGATE":
        return msgspec.json.encode(row(100, 2.5, sample="x")).replace(b'"x"', b'"\\ud800"')
    if isinstance(spec, bytes):
        return spec
    body = row(100, 2.5)
    body.update({k: v for k, v in spec.items() if k != "extra"})
    if "extra" in spec:
        body["extra"] = 1
    if spec == {"val_loss": None}:
        del body["val_loss"]
    return body


@pytest.mark.parametrize("name,spec,status,code", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
async def test_bad_reports_are_refused_and_store_nothing(
    world: World, name: str, spec: Any, status: int, code: str
) -> None:
    got = await post(world, _raw(spec))
    assert got[0] == status and got[1]["error"] == code, (name, got)
    assert set(got[1]) == {"error", "message"} and got[1]["message"]
    assert await stored(world) == (0, 0)


async def test_a_sample_at_the_limit_is_taken(world: World) -> None:
    text = "é" * (MAX_SAMPLE_BYTES // 2)  # two bytes each: exactly the limit
    assert (await post(world, row(100, 2.5, sample=text)))[0] == 200
    assert await stored(world) == (1, 1)


async def test_reports_are_rate_limited_per_account(world: World) -> None:
    w = world
    n = api_progress.REPORTS_PER_MINUTE
    statuses = [(await post(w, row(100 * (i + 1), 3.0)))[0] for i in range(n)]
    assert statuses == [200] * n
    resp = await w.client.post(
        "/api/experiments/tiny/progress", json=row(99_999, 1.0), headers=w.auth(w.tess)
    )
    assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
    assert (await resp.json())["error"] == "rate_limited"
    assert await stored(w) == (n, 0)
    assert (await post(w, row(100, 3.0), w.otto))[0] == 200  # another account has its own bucket


async def test_a_restarted_run_replaces_its_curve_and_only_the_newest_sample_is_kept(world: World) -> None:
    w = world
    for step in (100, 200, 300, 400):
        assert (await post(w, row(step, 4.0 - step / 200, sample=f"at {step}")))[0] == 200
    assert (await post(w, row(100, 3.0), w.otto))[0] == 200
    assert await stored(w) == (5, 1)  # one sample per trainer: the newest
    # tess resumed from the checkpoint of step 200: what came after it is replaced, otto's curve stays
    assert (await post(w, row(300, 2.9)))[1]["kept"] == 3
    data = await (await w.client.get("/api/site/experiments/tiny")).json()
    curves = {c["account_name"]: [p["step"] for p in c["points"]] for c in data["curves"]}
    assert curves == {"tess <i>lab</i>": [100, 200, 300], "otto": [100]}
    assert data["sample"] is None  # the sample was the replaced step 400's
    assert (await post(w, row(50, 4.5)))[1]["kept"] == 1  # a fresh run starts a fresh curve


async def test_a_long_history_is_thinned_not_cut(world: World) -> None:
    w = world
    sessions = w.services.sessions
    for step in range(1, 41):
        report = ProgressReport(step, step * 1000, 5.0 - step / 10, 100.0)
        sample = "first" if step == 2 else None
        kept = await record(sessions, "tiny", w.tess, report, sample, 1000.0 + step, max_history=16)
        assert kept <= 16
    await record(sessions, "tiny", w.otto, ProgressReport(1, 1000, 5.0, 1.0), None, 2000.0, max_history=16)
    async with sessions() as s:
        steps = (
            (
                await s.execute(
                    select(ExperimentProgress.step)
                    .where(ExperimentProgress.account_id == w.tess)
                    .order_by(ExperimentProgress.train_tokens)
                )
            )
            .scalars()
            .all()
        )
    assert len(steps) <= 16
    assert steps[0] == 1 and steps[-4:] == [37, 38, 39, 40]  # the start and the newest quarter stay
    assert 2 in steps  # the row holding the sample is never thinned
    assert sorted(steps) == steps and len(set(steps)) == len(steps)
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert max(gaps) > 1  # coarser in the past, the whole run still drawn
    page = await (await w.client.get("/experiments/tiny")).text()
    assert page.count('<polyline class="line s') == 2
