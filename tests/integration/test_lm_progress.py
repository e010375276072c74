"""A trainer's evaluations reach the experiment's page: the engine's client (``post_progress``,
``progress_report``) and ``lah.lm_progress.ProgressPoster`` against a real coordinator on 127.0.0.1,
from a loop thread of their own as a trainer node's; a coordinator that is away costs a warning, and
the training thread never waits for it."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig, ExperimentConfig, LanguageModel
from coordinator.server.app import RunningCoordinator, start_full
from coordinator.swarm.progress import MAX_SAMPLE_BYTES
from engine.account.coordinator_api import PROGRESS_SAMPLE_BYTES, CoordinatorApi, progress_report
from engine.lm import Metrics
from engine.moe import LoopThread
from lah.lm_progress import ProgressPoster

pytestmark = pytest.mark.integration

LM = ExperimentConfig(
    name="tiny", kind="lm", expert_type="ffn", grid=[2, 2], lm=LanguageModel(vocab_size=65, dim=32, heads=2)
)


@dataclass
class World:
    running: RunningCoordinator
    server: LoopThread
    client: LoopThread
    token: str

    def page(self) -> dict[str, Any]:
        api = CoordinatorApi(self.running.url)
        try:
            data: dict[str, Any] = self.client.run(api.get("/api/site/experiments/tiny"), 15)
        finally:
            self.client.run(api.close(), 5)
        return data


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    server, client = LoopThread("coordinator"), LoopThread("trainer")
    config = CoordinatorConfig(
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[LM],
        verify_workers=0,
    )
    running = server.run(start_full(config), 30)
    accounts = running.services.accounts
    account = server.run(accounts.register("ada"), 10)
    server.run(accounts.set_role("ada", "trainer", by=None), 10)
    token = running.services.tokens.issue(account.id, "trainer")
    try:
        yield World(running, server, client, token)
    finally:
        server.run(running.stop(), 15)
        client.close()
        server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def row(step: int, loss: float | None) -> Metrics:
    return Metrics(step, step * 256, 3.0, loss, None, 1234.5, 1.0)


def test_the_limits_agree() -> None:
    assert PROGRESS_SAMPLE_BYTES == MAX_SAMPLE_BYTES


def test_a_report_is_cleaned_and_cut_rather_than_refused(world: World) -> None:
    noisy = "ROMEO:\tay\x1b[31m\x00 " + "é" * 3000  # controls, and 6,000 bytes of UTF-8
    body = progress_report(100, 25_600, 2.5, float("nan"), noisy)
    assert body is not None and body["tokens_per_s"] == 0.0
    assert body["sample"].startswith("ROMEO:\tay\ufffd[31m\ufffd é")
    assert len(body["sample"].encode()) <= PROGRESS_SAMPLE_BYTES  # cut on a character's boundary
    assert progress_report(100, 25_600, float("nan"), 1.0) is None
    assert progress_report(100, 25_600, None, 1.0) is None
    api = CoordinatorApi(world.running.url, timeout=10)
    try:
        answer = world.client.run(api.post_progress(world.token, "tiny", body), 15)
    finally:
        world.client.run(api.close(), 5)
    assert answer["kept"] == 1
    assert world.page()["sample"]["text"] == body["sample"]


def test_the_poster_sends_in_order_in_the_background_and_makes_samples_only_when_sending(
    world: World,
) -> None:
    api = CoordinatorApi(world.running.url, timeout=10)

    async def token() -> str:
        return world.token

    poster = ProgressPoster(api, token, world.client, "tiny")
    made: list[int] = []

    def sample_of(step: int) -> Callable[[], str]:
        def make() -> str:
            made.append(step)
            return f"text at {step}"

        return make

    try:
        assert not poster.post(row(50, None), sample_of(50))  # nothing to draw: no sample made either
        for step, loss in ((100, 3.1), (200, 2.6), (300, 2.2)):
            assert poster.post(row(step, loss), sample_of(step))
        poster.flush(15)
    finally:
        world.client.run(api.close(), 5)
    assert made == [100, 200, 300] and (poster.sent, poster.failed) == (3, 0)
    data = world.page()
    (curve,) = data["curves"]
    assert curve["account_name"] == "ada"
    # in order: a later row arriving first would have been replaced by an earlier one
    assert [(p["step"], p["val_loss"]) for p in curve["points"]] == [(100, 3.1), (200, 2.6), (300, 2.2)]
    assert data["sample"]["text"] == "text at 300" and data["sample"]["step"] == 300


def test_a_coordinator_that_is_away_costs_a_warning_not_a_wait(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    api = CoordinatorApi(f"http://127.0.0.1:{free_port()}", timeout=5)  # nobody listens there

    async def token() -> str:
        return world.token

    poster = ProgressPoster(api, token, world.client, "tiny", timeout_s=5)
    try:
        with caplog.at_level(logging.WARNING, logger="lah.lm_progress"):
            started = time.monotonic()
            assert poster.post(row(100, 3.0), "x")
            assert time.monotonic() - started < 0.5  # the training thread went on at once
            poster.flush(10)
    finally:
        world.client.run(api.close(), 5)
    assert (poster.sent, poster.failed) == (0, 1)
    assert any("step 100 not posted" in r.getMessage() for r in caplog.records), caplog.text
