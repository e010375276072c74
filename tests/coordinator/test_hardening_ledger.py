"""Issue 13 on the ledger side, over real aiohttp and a real database (SQLite and PostgreSQL):
receipts need a trainer's token before any signature is checked and pass a per-account rate; receipts
for experts outside the grid or over the credit ceiling are refused; a spot check takes back exactly
the recent credit that ingestion granted."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.credit.api_ledger import LedgerDeps, setup_routes
from coordinator.credit.ledger import decay, ingest
from coordinator.credit.receipts import SignedReceipt, Verifier, sign_receipt, sign_spot_check
from coordinator.credit.spot_checks import report_spot_check
from coordinator.db.models import Account, Host
from coordinator.services import SERVICES, Services, open_services
from engine.p2p.identity import Identity

from .accounts_helpers import FakeClock
from .ledger_support import make_host

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 2])
NOW = 1_800_000_000.0


class CountingVerifier(Verifier):
    """The real in-process verifier, counting the signatures it was asked to check."""

    def __init__(self) -> None:
        super().__init__(workers=0)
        self.checked = 0

    async def reasons(self, receipts: list[SignedReceipt]) -> list[str | None]:
        self.checked += len(receipts)
        return await super().reasons(receipts)


class Env:
    def __init__(self, client: TestClient[Any, Any], services: Services, verifier: CountingVerifier) -> None:
        self.client, self.services, self.verifier = client, services, verifier

    async def post(self, receipts: list[SignedReceipt], token: str | None) -> tuple[int, Any, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = msgspec.json.encode({"receipts": receipts})
        async with self.client.post("/api/receipts", data=body, headers=headers) as r:
            return r.status, await r.json(), r.headers


@pytest.fixture
async def env(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[Env]:
    config = CoordinatorConfig(
        token_key_path=str(tmp_path / "token.key"),
        experiments=[EXP],
        receipts_per_account_per_minute=1500,
        max_receipt_credit=100.0,
    )
    clock = FakeClock()
    services = await open_services(config, engine=db, monotonic=clock)
    verifier = CountingVerifier()
    app = web.Application()
    app[SERVICES] = services
    setup_routes(app, LedgerDeps.of(config, services.sessions, verifier))
    async with TestClient(TestServer(app)) as client:
        yield Env(client, services, verifier)


def throwaway_receipts(host: str, n: int) -> list[SignedReceipt]:
    now = time.time()
    return [sign_receipt(Identity.generate(), host, "ffn.0.0", 8, False, now) for _ in range(n)]


async def test_receipts_need_a_trainer_token_before_any_signature_is_checked(env: Env) -> None:
    host, _ = await make_host(env.services.sessions, "alice")
    _, volunteer_id = await make_host(env.services.sessions, "vol")
    trainer, trainer_id = await make_host(env.services.sessions, "tom", role="trainer")
    flood = throwaway_receipts(host.peer_id, 1000)

    # Today's attack: 1,000 receipts signed by throwaway keys, no token. Refused unread.
    status, body, headers = await env.post(flood, None)
    assert (status, body["error"]) == (401, "token_required") and "Bearer" in headers["WWW-Authenticate"]
    status, body, _ = await env.post(flood, "not-a-token")
    assert (status, body["error"]) == (401, "token_invalid")
    # A volunteer's token is not a trainer's.
    status, body, _ = await env.post(flood, env.services.tokens.issue(volunteer_id, "volunteer"))
    assert (status, body["error"]) == (403, "not_a_trainer")
    # A trainer's token, but keys that are not its own: refused by one read, still no signature checked.
    tom = env.services.tokens.issue(trainer_id, "trainer")
    status, body, _ = await env.post(flood[:500], tom)
    assert status == 200 and body["accepted"] == 0
    assert {r["reason"] for r in body["rejected"]} == {"not_your_key"} and len(body["rejected"]) == 500
    assert env.verifier.checked == 0
    # The trainer's own receipts are checked and credited.
    mine = [sign_receipt(trainer, host, "ffn.1.1", 4, False, time.time() - i) for i in range(3)]
    status, body, _ = await env.post(mine, tom)
    assert (status, body["accepted"], body["credit"]) == (200, 3, 12.0)
    assert env.verifier.checked == 3


async def test_receipts_are_rate_limited_per_account(env: Env) -> None:
    host, _ = await make_host(env.services.sessions, "alice")
    tom, tom_id = await make_host(env.services.sessions, "tom", role="trainer")
    ann, ann_id = await make_host(env.services.sessions, "ann", role="trainer")
    now = time.time()
    batch = [sign_receipt(tom, host, "ffn.0.1", 1, False, now - i * 0.001) for i in range(1000)]
    token = env.services.tokens.issue(tom_id, "trainer")
    status, body, _ = await env.post(batch, token)
    assert status == 200 and body["accepted"] == 1000
    checked = env.verifier.checked
    status, body, headers = await env.post(batch, token)  # 1,000 more within the minute: over 1,500
    assert (status, body["error"]) == (429, "rate_limited") and int(headers["Retry-After"]) >= 1
    assert env.verifier.checked == checked  # refused before any signature was checked
    # Another trainer account has its own allowance.
    theirs = [sign_receipt(ann, host, "ffn.0.1", 1, False, now)]
    status, body, _ = await env.post(theirs, env.services.tokens.issue(ann_id, "trainer"))
    assert status == 200 and body["accepted"] == 1


async def test_receipts_outside_the_grid_or_over_the_ceiling_are_refused(env: Env) -> None:
    host, _ = await make_host(env.services.sessions, "alice")
    tom, tom_id = await make_host(env.services.sessions, "tom", role="trainer")
    now = time.time()
    cases = {
        "ffn.2.0": "unknown_expert",  # row 2 of a 2x2 grid
        "ffn.0": "unknown_expert",
        "ffn.0.0.0": "unknown_expert",
        "ffn.01.1": "unknown_expert",
        "ffn.-1.1": "unknown_expert",
        "ffn.1.x": "unknown_expert",
        "cnn.0.0": "unknown_expert",
    }
    receipts = [sign_receipt(tom, host, uid, 1, False, now) for uid in cases]
    too_much = sign_receipt(tom, host, "ffn.1.1", 51, True, now)  # 102 credit > 100
    fine = sign_receipt(tom, host, "ffn.1.1", 50, True, now)  # 100 credit
    status, body, _ = await env.post(
        [*receipts, too_much, fine], env.services.tokens.issue(tom_id, "trainer")
    )
    assert status == 200
    reasons = {r["receipt_id"]: r["reason"] for r in body["rejected"]}
    assert [reasons[r.receipt_id] for r in receipts] == list(cases.values())
    assert reasons[too_much.receipt_id] == "over_ceiling"
    assert (body["accepted"], body["credit"]) == (1, 100.0)


async def test_spot_check_reverses_exactly_what_was_granted(db: AsyncEngine, tmp_path: Path) -> None:
    services = await open_services(CoordinatorConfig(token_key_path=str(tmp_path / "k")), engine=db)
    sessions = services.sessions
    trainer, _ = await make_host(sessions, "tom", role="trainer")
    host, account_id = await make_host(sessions, "alice")
    # Served a day before the trainer posted them (an offline trainer catching up): ingestion adds
    # their full credit to the recent sum at NOW.
    receipts = [sign_receipt(trainer, host, "m.0", 10, False, NOW - 86400 + i) for i in range(10)]
    await ingest(sessions, receipts, now=NOW)
    report = sign_spot_check(trainer, host.peer_id, "m.0", NOW - 2 * 86400, NOW, "outputs differ")
    later = NOW + 3600
    result = await report_spot_check(sessions, report, now=later)
    assert (result.withheld_receipts, result.reversed_credit) == (10, 100.0)
    async with sessions() as s:
        h = await s.get(Host, host.peer_id)
        a = await s.get(Account, account_id)
        assert h is not None and a is not None
        # Before the fix about 9 of the 100 stayed: the grant decays from NOW, the reversal assumed it
        # had decayed from a day earlier.
        assert abs(decay(h.credit_recent, h.credit_recent_at, later)) < 1e-9
        assert abs(decay(a.credit_recent, a.credit_recent_at, later)) < 1e-9
        assert h.credit_total == 0.0 and a.credit_total == 0.0
    await services.close()
