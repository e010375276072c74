"""``lah train``'s side of the trainers' API against a real coordinator (SQLite and PostgreSQL): the
login kept where the store says, a token near its end refreshed and stored before use (the old one is
revoked), a grant made after the login picked up, and each usage error a sentence with exit status 2."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.trainers import grant_trainer
from coordinator.config import ExperimentConfig
from coordinator.server.app import create_full_app
from coordinator.services import Services
from engine.account.coordinator_api import CoordinatorApi
from engine.account.errors import CoordinatorError
from engine.account.tokens import Credentials
from lah.train import login_command, run_train
from lah.train_credentials import TrainerCredentials, fresh
from lah.trainer_session import prepare

from . import accounts_helpers as h

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2], hyperparams={"d_model": 16, "hidden": 32})


class Server:
    def __init__(self, client: TestClient[Any, Any], services: Services) -> None:
        self.client, self.services = client, services
        self.url = str(client.make_url("")).rstrip("/")


@pytest.fixture
async def server(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[Server]:
    # Tokens live an hour: under lah train's start margin, so every start refreshes.
    services = await h.services(
        db, tmp_path, h.FakeClock(time.time()), verify_workers=0, experiments=[EXP], token_ttl_s=3600
    )
    app = await create_full_app(services.config, services)
    async with TestClient(TestServer(app)) as client:
        yield Server(client, services)


async def test_login_then_a_start_refreshes_and_keeps_the_new_token(server: Server, tmp_path: Path) -> None:
    _, code, _ = await grant_trainer(server.services.accounts, "ada", by=None)
    store = TrainerCredentials(tmp_path, tmp_path / "token.json")
    assert "token.json" in await login_command(server.url, "ada", code, store)
    first = store.load(server.url)
    assert first is not None and server.services.tokens.decode(first.token).role == "trainer"
    api = CoordinatorApi(server.url)
    try:
        second = await fresh(api, store, first)
        assert second.token != first.token and store.load(server.url) == second
        with pytest.raises(CoordinatorError) as refused:  # refreshing revoked the old one
            await api.experiment(first.token, "ffn")
        assert (refused.value.status, refused.value.code) == (401, "token_revoked")
        assert (await api.experiment(second.token, "ffn"))["grid"] == [2, 2]
    finally:
        await api.close()


async def test_a_grant_after_the_login_gives_a_token_with_the_trainer_role(
    server: Server, tmp_path: Path
) -> None:
    account = await server.services.accounts.register("ada")
    token = server.services.tokens.issue(account.id, "volunteer")  # e.g. the volunteer's own
    claims = server.services.tokens.decode(token)
    creds = Credentials(account.id, token, claims.exp + 86400)  # as if far from its end: no refresh for that
    store = TrainerCredentials(tmp_path, tmp_path / "token.json")
    await grant_trainer(server.services.accounts, "ada", by=None)
    got, name, spec = await prepare(CoordinatorApi(server.url), store, creds, "ffn")
    assert name == "ada" and spec["name"] == "ffn"
    assert server.services.tokens.decode(got.token).role == "trainer" and store.load(server.url) == got


async def test_usage_errors_are_sentences_with_status_2(server: Server, tmp_path: Path) -> None:
    said: list[str] = []
    store_file = tmp_path / "token.json"

    def train(experiment: str = "ffn") -> int:
        return run_train(
            server.url, experiment, steps=1, data_dir=tmp_path, token_file=store_file, say=said.append
        )

    # no login yet
    assert await asyncio.to_thread(train) == 2
    assert "lah train login" in said[-1]
    # an unknown experiment
    _, code, _ = await grant_trainer(server.services.accounts, "ada", by=None)
    await login_command(server.url, "ada", code, TrainerCredentials(tmp_path, store_file))
    assert await asyncio.to_thread(train, "nope") == 2
    assert "no experiment called 'nope'" in said[-1]
    # the role taken back
    await server.services.accounts.set_role("ada", "volunteer", by=None)
    assert await asyncio.to_thread(train) == 2
    assert "not a trainer" in said[-1] and "grant-trainer" in said[-1]
    # disabled
    await server.services.accounts.set_role("ada", "trainer", by=None)
    await server.services.accounts.set_disabled("ada", True, by=None)
    assert await asyncio.to_thread(train) == 2
    assert "account_disabled" in said[-1]
    stored = TrainerCredentials(tmp_path, store_file).load(server.url)
    assert stored is not None and all(stored.token not in line for line in said)


async def test_data_that_is_not_an_npz_of_numbers_is_a_sentence_with_status_2(
    server: Server, tmp_path: Path
) -> None:
    """An empty file was an EOFError traceback; a text file was diagnosed as "pickled data" with
    numpy's advice to allow_pickle, which would run a stranger's code: neither, ever again."""
    import numpy as np

    said: list[str] = []
    store_file = tmp_path / "token.json"
    _, code, _ = await grant_trainer(server.services.accounts, "ada", by=None)
    await login_command(server.url, "ada", code, TrainerCredentials(tmp_path, store_file))
    empty, text, objects, no_y = (tmp_path / n for n in ("empty.npz", "data.csv", "objects.npz", "x.npz"))
    empty.write_bytes(b"")
    text.write_text("0.1,0.2,0.3,1\n0.4,0.5,0.6,0\n")
    np.savez(objects, x=np.array([{"a": 1}, None], dtype=object), y=np.array([0, 1]))
    np.savez(no_y, x=np.zeros((4, 64), dtype=np.float32))
    cut = tmp_path / "cut.npz"
    cut.write_bytes(no_y.read_bytes()[:40])

    def train(data: Path) -> int:
        return run_train(
            server.url, "ffn", steps=1, data=data, data_dir=tmp_path, token_file=store_file, say=said.append
        )

    for data, words in (
        (empty, f"cannot read {empty}: the file is empty"),
        (text, f"cannot read {text}: it is a text file, not an .npz with arrays x and y"),
        (objects, f"cannot read {objects}: it holds Python objects rather than numbers"),
        (no_y, f"{no_y} holds x, not the arrays x and y"),
        (cut, f"cannot read {cut}: a damaged or cut-short .npz"),
    ):
        assert await asyncio.to_thread(train, data) == 2, said[-1]
        assert said[-1].startswith(f"lah train: {words}"), said[-1]
        assert "numpy.savez" in said[-1] or "cut-short" in said[-1]
    assert not any("pickle" in line.lower() for line in said), said  # never an invitation to unpickle


async def test_a_wrong_coordinator_url_is_unreachable_not_a_missing_login(
    server: Server, tmp_path: Path
) -> None:
    said: list[str] = []
    store_file = tmp_path / "token.json"
    _, code, _ = await grant_trainer(server.services.accounts, "ada", by=None)
    await login_command(server.url, "ada", code, TrainerCredentials(tmp_path, store_file))
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"

    def train(url: str) -> int:
        return run_train(url, "ffn", steps=1, data_dir=tmp_path, token_file=store_file, say=said.append)

    assert await asyncio.to_thread(train, closed) == 2
    assert f"the coordinator at {closed} is unreachable" in said[-1] and "check --coordinator" in said[-1]
    assert "lah train login" not in said[-1]
    assert await asyncio.to_thread(train, server.url + "/elsewhere") == 2  # a web server, not a coordinator
    assert "answers, but not as a Learning@home coordinator" in said[-1]


async def test_a_grant_with_a_bad_lifetime_is_refused_before_anything_changes(server: Server) -> None:
    from coordinator.accounts.accounts import InvalidName, NotFound

    with pytest.raises(InvalidName):
        await grant_trainer(server.services.accounts, "newcomer", by=None, ttl_s=0)
    with pytest.raises(NotFound):  # it was refused before the account was made
        await server.services.accounts.by_name("newcomer")
