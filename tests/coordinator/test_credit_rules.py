"""The ledger's rules beyond signatures, on both databases: a receipt earns only for an enabled
volunteer's host that held the expert when it served, within the hourly caps by its declared device;
every refusal has its reason code, is counted, and changes nobody's credit."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from coordinator.credit import rules
from coordinator.credit.ledger import ingest
from coordinator.credit.receipts import sign_receipt
from coordinator.db.models import Account, AssignmentSpan, Host, Receipt
from coordinator.db.session import session_factory
from engine.p2p.identity import Identity

from .ledger_support import hold, make_host

NOW = 1_800_000_000.0
HOUR = 3600.0


async def credit_total(sessions: async_sessionmaker[AsyncSession], host: Identity) -> float:
    async with sessions() as s:
        row = await s.get(Host, host.peer_id)
        assert row is not None
        return row.credit_total


async def refused(sessions: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    return {r["reason"]: r["count"] for r in await rules.refusals(sessions, 1, NOW) if r["kind"] == "receipt"}


@pytest.fixture
async def world(db: AsyncEngine):  # type: ignore[no-untyped-def]
    sessions = session_factory(db)
    trainer, _ = await make_host(sessions, "trainer", role="trainer")
    second, _ = await make_host(sessions, "second", role="trainer")
    return sessions, trainer, second


async def test_a_host_that_never_held_the_expert_earns_nothing(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, _ = world
    friend, _ = await make_host(sessions, "friend", holds=())
    result = await ingest(sessions, [sign_receipt(trainer, friend, "m.0", 10, False, NOW)], now=NOW)
    assert result.rejected[0][1] == "not_assigned" and result.accepted == 0
    assert await credit_total(sessions, friend) == 0.0
    assert (await refused(sessions))["not_assigned"] == 1
    async with sessions() as s:
        assert (await s.execute(select(Receipt))).first() is None  # refused: nothing stored


async def test_credit_only_within_the_span_held_give_or_take_the_grace(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, _ = world
    host, _ = await make_host(sessions, "alice", holds=())
    await hold(sessions, host.peer_id, ["m.0"], (NOW - HOUR, NOW - HOUR / 2))
    grace = rules.HOLD_GRACE_S
    cases = {
        NOW - HOUR - grace - 1: "not_assigned",
        NOW - HOUR - grace: None,
        NOW - 0.75 * HOUR: None,
        NOW - HOUR / 2 + grace: None,
        NOW - HOUR / 2 + grace + 1: "not_assigned",
    }
    for served_at, want in cases.items():
        result = await ingest(sessions, [sign_receipt(trainer, host, "m.0", 1, False, served_at)], now=NOW)
        assert (result.rejected[0][1] if result.rejected else None) == want, served_at
    other_expert = await ingest(
        sessions, [sign_receipt(trainer, host, "m.1", 1, False, NOW - 0.75 * HOUR)], now=NOW
    )
    assert other_expert.rejected[0][1] == "not_assigned"
    assert await credit_total(sessions, host) == 3.0


async def test_disabled_hosts_and_trainer_accounts_hosting_are_refused(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, second = world
    host, account_id = await make_host(sessions, "mallory")
    async with sessions() as s, s.begin():
        account = await s.get(Account, account_id)
        assert account is not None
        account.disabled = True
    await hold(sessions, second.peer_id, ["m.0"])  # even with a span: a trainer's key does not host
    result = await ingest(
        sessions,
        [
            sign_receipt(trainer, host, "m.0", 10, False, NOW),
            sign_receipt(trainer, second, "m.0", 10, False, NOW),
        ],
        now=NOW,
    )
    assert sorted(why for _, why in result.rejected) == ["host_disabled", "host_is_trainer"]
    assert await credit_total(sessions, host) == 0.0 and await credit_total(sessions, second) == 0.0
    assert await refused(sessions) == {"host_disabled": 1, "host_is_trainer": 1}


async def test_hourly_caps_per_pair_and_per_host(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, second = world
    host, _ = await make_host(sessions, "alice")
    caps = rules.CreditCaps({"cpu": 100.0, "cuda": 1000.0}, pair_share=0.6)  # pair cap 60 on a cpu

    async def post(signer: Identity, samples: int, at: float) -> list[str]:
        r = await ingest(
            sessions, [sign_receipt(signer, host, "m.0", samples, False, at)], now=NOW, caps=caps
        )
        return [why for _, why in r.rejected]

    hour = (NOW // HOUR) * HOUR
    assert await post(trainer, 40, hour + 1) == []
    assert await post(trainer, 21, hour + 2) == ["over_pair_cap"]  # 61 > 60 from one trainer account
    assert await post(trainer, 20, hour + 3) == []  # exactly 60
    assert await post(second, 41, hour + 4) == ["over_host_cap"]  # 101 > 100 on the host
    assert await post(second, 40, hour + 5) == []  # exactly 100
    assert await post(second, 1, hour + 6) == ["over_host_cap"]
    assert await post(trainer, 40, hour - 10) == []  # the hour before has its own cap
    assert await credit_total(sessions, host) == 140.0
    assert await refused(sessions) == {"over_pair_cap": 1, "over_host_cap": 2}

    # Inside one batch too, and by the device the host declared with its latest assignment.
    gpu, _ = await make_host(sessions, "gpu", holds=())
    await hold(sessions, gpu.peer_id, ["m.0"], device="cuda")
    batch = [sign_receipt(trainer, gpu, "m.0", 500, False, hour + i) for i in range(3)]
    result = await ingest(sessions, batch, now=NOW, caps=caps)
    assert result.accepted == 1 and [why for _, why in result.rejected] == ["over_pair_cap"] * 2
    assert await credit_total(sessions, gpu) == 500.0


async def test_concurrent_batches_cannot_both_spend_one_hour(world) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    sessions, trainer, _ = world
    host, _ = await make_host(sessions, "alice")
    caps = rules.CreditCaps({"cpu": 1000.0}, pair_share=1.0)
    hour = (NOW // HOUR - 1) * HOUR  # a whole hour, all of it in the past
    batches = [
        [sign_receipt(trainer, host, "m.0", 10, False, hour + 100 * b + i) for i in range(30)]
        for b in range(4)
    ]
    results = await asyncio.gather(*(ingest(sessions, b, now=NOW, caps=caps) for b in batches))
    assert sum(r.accepted for r in results) == 100
    assert await credit_total(sessions, host) == 1000.0


def test_admit_is_pure_and_ordered() -> None:
    caps = rules.CreditCaps({"cpu": 10.0}, pair_share=0.5)
    claims = [
        rules.Claim("h", 1, 0, 4.0, "cpu"),
        rules.Claim("h", 1, 0, 2.0, "cpu"),
        rules.Claim("h", 2, 0, 6.0, "cpu"),
    ]
    reasons, spent = rules.admit(claims, {("h", 0, 0): 1.0}, caps)
    assert reasons == [None, "over_pair_cap", "over_host_cap"]  # 4+2 > 5 for account 1; 1+4+6 > 10
    assert spent == {("h", 0, 0): 4.0, ("h", 1, 0): 4.0}
    assert caps.host_cap("tpu") == 10.0  # an unknown device is capped as a CPU


async def test_spans_are_extended_opened_and_closed_by_assignment(db: AsyncEngine) -> None:
    from coordinator.config import ExperimentConfig
    from coordinator.swarm.assignment import Capacity, TrainerCannotHost, assign_host, expert_bytes

    exp = ExperimentConfig(name="m", expert_type="ffn", grid=[4])
    sessions = session_factory(db)
    host, _ = await make_host(sessions, "alice", holds=())
    big = Capacity("cuda", 2 * expert_bytes(exp))
    first = await assign_host(sessions, [exp], host.peer_id, big, now=1000.0, ttl_s=60)
    await assign_host(sessions, [exp], host.peer_id, big, now=1030.0, ttl_s=60)  # renewed: extended
    small = await assign_host(sessions, [exp], host.peer_id, Capacity("cpu", expert_bytes(exp)), 1050.0, 60)
    async with sessions() as s:
        spans = {
            (r.expert_uid, r.held_from, r.held_until, r.device)
            for r in (await s.execute(select(AssignmentSpan))).scalars()
        }
    (kept,) = [uid for _, uid in small]
    (dropped,) = [uid for _, uid in first if uid != kept]
    assert spans == {(kept, 1000.0, 1110.0, "cuda"), (dropped, 1000.0, 1050.0, "cuda")}
    # After a lapse, holding again opens a new span: the gap earns nothing.
    (again,) = await assign_host(
        sessions, [exp], host.peer_id, Capacity("cpu", expert_bytes(exp)), 5000.0, 60
    )
    async with sessions() as s:
        rows = (await s.execute(select(AssignmentSpan))).scalars().all()
        assert (again[1], 5000.0, 5060.0, "cpu") in {
            (r.expert_uid, r.held_from, r.held_until, r.device) for r in rows
        }
        assert len(rows) == 3

    trainer, _ = await make_host(sessions, "trainer", role="trainer")
    with pytest.raises(TrainerCannotHost):
        await assign_host(sessions, [exp], trainer.peer_id, big, now=1000.0, ttl_s=60)
    # A trainer asks with no memory for the DHT's peers and the proofs' key: nothing to host.
    assert await assign_host(sessions, [exp], trainer.peer_id, Capacity("cpu", 0), now=1000.0, ttl_s=60) == []


async def test_trainer_accounts_are_off_the_contributors_board(world) -> None:  # type: ignore[no-untyped-def]
    from coordinator.credit.leaderboard import leaderboard

    sessions, trainer, _ = world
    host, volunteer = await make_host(sessions, "alice")
    await ingest(sessions, [sign_receipt(trainer, host, "m.0", 10, False, NOW)], now=NOW)
    async with sessions() as s, s.begin():  # credit earned before the role was granted, say
        for account in (await s.execute(select(Account))).scalars():
            if account.role == "trainer":
                account.credit_total, account.credit_recent, account.credit_recent_at = 1e6, 1e6, NOW
    for sort in ("total", "recent"):
        page = await leaderboard(sessions, "users", sort, now=NOW)  # type: ignore[arg-type]
        assert [e.id for e in page.entries] == [str(volunteer)]


async def test_the_assignment_api_refuses_a_trainer_that_offers_memory(db: AsyncEngine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from coordinator.config import CoordinatorConfig, ExperimentConfig
    from coordinator.services import SERVICES, open_services
    from coordinator.swarm.api_swarm import setup_routes

    exp = ExperimentConfig(name="m", expert_type="ffn", grid=[4])
    config = CoordinatorConfig(token_key_path=str(tmp_path / "token.key"), experiments=[exp])
    services = await open_services(config, engine=db)
    trainer, account = await make_host(services.sessions, "trainer", role="trainer")
    app = web.Application()
    app[SERVICES] = services
    setup_routes(app)
    headers = {"Authorization": f"Bearer {services.tokens.issue(account, 'trainer')}"}
    try:
        async with TestClient(TestServer(app), headers=headers) as client:
            r = await client.post(
                "/api/assignment", json={"peer_id": trainer.peer_id, "memory_bytes": 1 << 30}
            )
            assert r.status == 403 and (await r.json())["error"] == "trainer_cannot_host"
            r = await client.post("/api/assignment", json={"peer_id": trainer.peer_id, "memory_bytes": 0})
            assert r.status == 200 and (await r.json())["experts"] == []
    finally:
        await services.close()
