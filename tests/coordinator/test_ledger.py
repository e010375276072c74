import asyncio

import msgspec
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.credit.ledger import DAY_S, HALF_LIFE_S, decay, ingest
from coordinator.credit.receipts import ReceiptBatch, sign_receipt, sign_spot_check
from coordinator.credit.spot_checks import SpotCheckRejected, report_spot_check
from coordinator.db.models import Account, CreditDay, Host, Receipt, Team
from coordinator.db.session import session_factory
from engine.p2p.identity import Identity

from .ledger_support import make_host

NOW = 1_800_000_000.0


@pytest.fixture
async def world(db: AsyncEngine):  # type: ignore[no-untyped-def]
    sessions = session_factory(db)
    trainer, _ = await make_host(sessions, "trainer", role="trainer")
    host, host_account = await make_host(sessions, "alice", team="red")
    other, other_account = await make_host(sessions, "bob", team="red")
    return sessions, trainer, host, host_account, other, other_account


async def credit_of(sessions, model, key):  # type: ignore[no-untyped-def]
    async with sessions() as s:
        return await s.get(model, key)


async def test_credits_host_account_team_and_days(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, account_id, other, other_account = world
    receipts = [
        sign_receipt(trainer, host, "mnist.0.1", 10, False, NOW - 60),
        sign_receipt(trainer, host, "mnist.0.2", 5, True, NOW - 30),
        sign_receipt(trainer, other, "mnist.0.1", 7, False, NOW - DAY_S),
    ]
    result = await ingest(sessions, ReceiptBatch(receipts), now=NOW, expert_costs={"mnist": 2.0})
    assert (result.accepted, result.duplicates, result.rejected) == (3, 0, [])
    assert result.credit == pytest.approx(20 + 20 + 14)
    h = await credit_of(sessions, Host, host.peer_id)
    assert (h.credit_total, h.credit_recent, h.credit_recent_at, h.requests_served) == (40.0, 40.0, NOW, 2)
    a = await credit_of(sessions, Account, account_id)
    assert a.credit_total == 40.0
    async with sessions() as s:
        team = (await s.execute(select(Team).where(Team.name == "red"))).scalar_one()
        assert team.credit_total == 54.0 and team.credit_recent == 54.0
        days = {
            (d.subject_kind, d.subject_id, d.day): d.credit
            for d in (await s.execute(select(CreditDay))).scalars()
        }
    today, yesterday = int(NOW // DAY_S), int((NOW - DAY_S) // DAY_S)
    assert days[("host", host.peer_id, today)] == 40.0
    assert days[("account", str(other_account), yesterday)] == 14.0
    assert days[("team", str(team.id), today)] == 40.0 and days[("team", str(team.id), yesterday)] == 14.0

    # A week later: the recent credit has halved before the new grant is added.
    later = NOW + HALF_LIFE_S
    await ingest(sessions, [sign_receipt(trainer, host, "mnist.0.1", 1, False, later)], now=later)
    h = await credit_of(sessions, Host, host.peer_id)
    assert h.credit_total == 41.0 and h.credit_recent == pytest.approx(21.0) and h.credit_recent_at == later


async def test_forged_and_misattributed_signatures_are_rejected(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, *_ = world
    good = sign_receipt(trainer, host, "mnist.0.1", 10, False, NOW)
    inflated = msgspec.structs.replace(good, samples=10_000)  # signed for 10
    stranger = Identity.generate()
    foreign_key = msgspec.structs.replace(
        sign_receipt(stranger, host, "mnist.0.1", 10, False, NOW), trainer_peer_id=trainer.peer_id
    )
    result = await ingest(sessions, [inflated, foreign_key], now=NOW)
    assert result.accepted == 0
    assert sorted(reason for _, reason in result.rejected) == ["bad_signature", "bad_signature"]
    h = await credit_of(sessions, Host, host.peer_id)
    assert h.credit_total == 0.0


async def test_only_trainers_and_known_hosts(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, _, other, _ = world
    unbound = Identity.generate()
    result = await ingest(
        sessions,
        [
            sign_receipt(other, host, "mnist.0.1", 10, False, NOW),  # a volunteer, not a trainer
            sign_receipt(unbound, host, "mnist.0.1", 10, False, NOW),  # no account at all
            sign_receipt(trainer, Identity.generate(), "mnist.0.1", 10, False, NOW),
            sign_receipt(trainer, host, "mnist.0.1", 0, False, NOW),
            sign_receipt(trainer, host, "mnist.0.1", 10, False, NOW + 3600),
            sign_receipt(trainer, host, "other.0.1", 10, False, NOW),
            sign_receipt(trainer, trainer, "mnist.0.1", 10, False, NOW),
        ],
        now=NOW,
        expert_costs={"mnist": 1.0},
    )
    assert result.accepted == 0
    assert [reason for _, reason in result.rejected] == [
        "bad_samples",
        "future",
        "unknown_expert",
        "self_receipt",
        "not_a_trainer",
        "not_a_trainer",
        "unknown_host",
    ]


async def test_disabled_trainer_is_refused(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, *_ = world
    async with sessions() as s, s.begin():
        t = await s.get(Host, trainer.peer_id)
        account = await s.get(Account, t.account_id)
        account.disabled = True
    result = await ingest(
        sessions, [sign_receipt(trainer, host, "mnist.0.1", 1, False, NOW)], now=NOW
    )
    assert result.rejected[0][1] == "not_a_trainer"


async def test_duplicates_in_batch_and_across_batches_credit_once(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, *_ = world
    r1 = sign_receipt(trainer, host, "mnist.0.1", 10, False, NOW)
    r2 = sign_receipt(trainer, host, "mnist.0.1", 20, False, NOW)
    result = await ingest(sessions, [r1, r1, r2], now=NOW)
    assert (result.accepted, result.duplicates) == (2, 1)
    result = await ingest(sessions, [r2, r1, r1], now=NOW + 1)
    assert (result.accepted, result.duplicates) == (0, 3)
    h = await credit_of(sessions, Host, host.peer_id)
    assert h.credit_total == 30.0 and h.requests_served == 2
    async with sessions() as s:
        assert len((await s.execute(select(Receipt))).all()) == 2


async def test_spot_check_withholds_and_reverses(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, account_id, other, _ = world
    early = sign_receipt(trainer, host, "mnist.0.1", 100, False, NOW - 7200)
    inside = [sign_receipt(trainer, host, "mnist.0.1", 10, False, NOW - 1800 + i) for i in range(3)]
    bystander = sign_receipt(trainer, other, "mnist.0.1", 5, False, NOW - 1800)
    await ingest(sessions, [early, *inside, bystander], now=NOW)
    async with sessions() as s:
        team_before = (await s.execute(select(Team).where(Team.name == "red"))).scalar_one().credit_total
    assert team_before == 135.0

    later = NOW + DAY_S
    report = sign_spot_check(trainer, host.peer_id, "mnist.0.1", NOW - 3600, NOW, "outputs differ")
    result = await report_spot_check(sessions, report, now=later)
    # The reporter's own grants are taken back; one reporter alone does not flag the host for everyone.
    assert (result.withheld_receipts, result.reversed_credit, result.corroborated) == (3, 30.0, False)
    with pytest.raises(SpotCheckRejected) as replay:
        await report_spot_check(sessions, report, now=later)
    assert replay.value.code == "replayed"

    h = await credit_of(sessions, Host, host.peer_id)
    assert not h.flagged and h.credit_total == 100.0 and h.requests_served == 1
    # Exactly what was granted comes back out: the 30 were added at NOW (ingestion), so what is left of
    # them at ``later`` is decay(30, NOW, later), whenever they were served.
    assert h.credit_recent == pytest.approx(decay(100.0, NOW, later))
    a = await credit_of(sessions, Account, account_id)
    assert a.credit_total == 100.0
    async with sessions() as s:
        assert (await s.execute(select(Team).where(Team.name == "red"))).scalar_one().credit_total == 105.0
        withheld = (await s.execute(select(Receipt).where(Receipt.withheld.is_(True)))).scalars().all()
        assert {r.receipt_id for r in withheld} == {r.receipt_id for r in inside}
        assert all(r.credit == 0.0 for r in withheld)
        day = (
            await s.execute(
                select(CreditDay).where(
                    CreditDay.subject_kind == "host", CreditDay.subject_id == host.peer_id
                )
            )
        ).scalar_one()
        assert day.credit == 100.0

    # New receipts in the flagged period are stored, withheld, and credit nothing; outside it, credit.
    late = sign_receipt(trainer, host, "mnist.0.1", 10, False, NOW - 60)
    fresh = sign_receipt(trainer, host, "mnist.0.1", 10, False, later)
    result = await ingest(sessions, [late, fresh], now=later)
    assert (result.accepted, result.withheld, result.credit) == (2, 1, 10.0)
    h = await credit_of(sessions, Host, host.peer_id)
    assert h.credit_total == 110.0


async def test_spot_check_refusals(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, _, other, _ = world
    cases = [
        (sign_spot_check(other, host.peer_id, "m.0", NOW - 60, NOW, "x"), "not_a_trainer"),
        (sign_spot_check(trainer, Identity.generate().peer_id, "m.0", NOW - 60, NOW, "x"), "unknown_host"),
        (sign_spot_check(trainer, host.peer_id, "m.0", NOW, NOW - 60, "x"), "bad_period"),
        (
            msgspec.structs.replace(
                sign_spot_check(trainer, host.peer_id, "m.0", NOW - 60, NOW, "x"), reason="y"
            ),
            "bad_signature",
        ),
    ]
    for report, code in cases:
        with pytest.raises(SpotCheckRejected) as e:
            await report_spot_check(sessions, report, now=NOW)
        assert e.value.code == code
    h = await credit_of(sessions, Host, host.peer_id)
    assert not h.flagged


async def test_a_batch_is_not_held_up_by_another_transactions_receipt_for_the_same_host(world, db) -> None:  # type: ignore[no-untyped-def]
    """Inserting a receipt takes FOR KEY SHARE on its host's row (the foreign key). A batch that then
    locked the host FOR UPDATE waited for every such transaction, and two overlapping batches, each
    holding KEY SHARE and wanting FOR UPDATE, deadlocked on PostgreSQL (seen in CI). The host lock is
    FOR NO KEY UPDATE, which KEY SHARE does not block. SQLite has one writer: there the batch waits."""
    sessions, trainer, host, _, _, _ = world
    first = sign_receipt(trainer, host, "mnist.0.1", 3, False, NOW - 5)
    second = sign_receipt(trainer, host, "mnist.0.1", 4, False, NOW - 4)
    async with sessions() as other, other.begin():
        other.add(
            Receipt(
                receipt_id=first.receipt_id,
                trainer_peer_id=trainer.peer_id,
                host_peer_id=host.peer_id,
                expert_uid="mnist.0.1",
                samples=3,
                backward=False,
                served_at=NOW - 5,
                credit=3.0,
                withheld=False,
                credited_at=NOW,
            )
        )
        await other.flush()  # the row is in, the transaction open: KEY SHARE held on the host
        batch = asyncio.ensure_future(ingest(sessions, [second], now=NOW))
        if db.dialect.name == "postgresql":
            result = await asyncio.wait_for(asyncio.shield(batch), 20)
            assert result.accepted == 1
        else:
            await asyncio.sleep(0.2)
            assert not batch.done()
    result = await asyncio.wait_for(batch, 20)
    assert result.accepted == 1
    assert (await credit_of(sessions, Host, host.peer_id)).requests_served == 1


async def test_concurrent_overlapping_batches_credit_each_receipt_once(world) -> None:  # type: ignore[no-untyped-def]
    sessions, trainer, host, _, other, _ = world
    receipts = [
        sign_receipt(trainer, (host, other)[i % 2], "mnist.0.1", 1 + i % 5, False, NOW - i)
        for i in range(300)
    ]
    batches = [receipts[0:200], receipts[100:300], receipts[50:250], receipts[::-1]]
    results = await asyncio.gather(*(ingest(sessions, b, now=NOW) for b in batches))
    assert sum(r.accepted for r in results) == 300
    assert sum(r.duplicates for r in results) == sum(len(b) for b in batches) - 300
    expected = sum(r.samples for r in receipts)
    h1 = await credit_of(sessions, Host, host.peer_id)
    h2 = await credit_of(sessions, Host, other.peer_id)
    assert h1.credit_total + h2.credit_total == expected
    assert h1.requests_served + h2.requests_served == 300
    async with sessions() as s:
        team = (await s.execute(select(Team).where(Team.name == "red"))).scalar_one()
    assert team.credit_total == expected and team.credit_recent == pytest.approx(expected)
