"""Spot-check reports on both databases: one trainer reverses only its own grants, two trainer
accounts that agree reverse everyone's, reports are capped per reporter and host per day, impossible
or replayed reports are refused with their reason and counted, and an operator's undo gives back
exactly what was taken."""

from __future__ import annotations

import msgspec
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from coordinator.credit import rules
from coordinator.credit.ledger import DAY_S, decay, ingest
from coordinator.credit.receipts import sign_receipt, sign_spot_check
from coordinator.credit.review import ReviewError, list_flags, undo_flag
from coordinator.credit.spot_checks import MAX_REPORTS_PER_DAY, SpotCheckRejected, report_spot_check
from coordinator.db.models import Account, CreditDay, Host, Receipt
from coordinator.db.session import session_factory
from engine.p2p.identity import Identity

from .ledger_support import make_host

NOW = 1_800_000_000.0


async def host_row(sessions: async_sessionmaker[AsyncSession], host: Identity) -> Host:
    async with sessions() as s:
        row = await s.get(Host, host.peer_id)
        assert row is not None
        return row


@pytest.fixture
async def world(db: AsyncEngine):  # type: ignore[no-untyped-def]
    """Two trainer accounts (a and b), an honest host paid by a, and a third trainer account c."""
    sessions = session_factory(db)
    a, _ = await make_host(sessions, "trainer-a", role="trainer")
    b, _ = await make_host(sessions, "trainer-b", role="trainer")
    c, _ = await make_host(sessions, "trainer-c", role="trainer")
    host, account_id = await make_host(sessions, "honest")
    async with sessions() as s, s.begin():  # the host was bound long before the periods reported
        row = await s.get(Host, host.peer_id)
        assert row is not None
        row.bound_at = row.bound_at.replace(year=2020)
    return sessions, a, b, c, host, account_id


async def test_another_trainers_report_reverses_nothing_of_others_grants(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, b, _, host, _ = world
    granted = [sign_receipt(a, host, "m.0", 100, False, NOW - 3600 * (i + 1)) for i in range(5)]
    assert (await ingest(sessions, granted, now=NOW)).credit == 500.0
    for days in range(3):  # b never talked to the host: its reports cover a's whole period
        report = sign_spot_check(b, host.peer_id, "m.0", NOW - DAY_S * (days + 1), NOW - DAY_S * days, "x")
        result = await report_spot_check(sessions, report, now=NOW + days)
        assert (result.withheld_receipts, result.reversed_credit, result.corroborated) == (0, 0.0, False)
    h = await host_row(sessions, host)
    assert h.credit_total == 500.0 and not h.flagged
    # a's later receipts in those periods still earn; b's own are withheld.
    later = [
        sign_receipt(a, host, "m.0", 10, False, NOW - 60),
        sign_receipt(b, host, "m.0", 10, False, NOW - 61),
    ]
    result = await ingest(sessions, later, now=NOW)
    assert (result.accepted, result.withheld, result.credit) == (2, 1, 10.0)


async def test_the_reporters_own_grants_are_taken_back_exactly(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, b, _, host, account_id = world
    await ingest(
        sessions,
        [
            sign_receipt(a, host, "m.0", 30, False, NOW - 1800),
            sign_receipt(b, host, "m.0", 20, False, NOW - 1700),
        ],
        now=NOW,
    )
    later = NOW + DAY_S
    result = await report_spot_check(
        sessions, sign_spot_check(a, host.peer_id, "m.0", NOW - 3600, NOW, "x"), now=later
    )
    assert (result.withheld_receipts, result.reversed_credit) == (1, 30.0)
    h = await host_row(sessions, host)
    assert h.credit_total == 20.0 and h.requests_served == 1
    assert h.credit_recent == pytest.approx(decay(20.0, NOW, later))
    async with sessions() as s:
        account = await s.get(Account, account_id)
        assert account is not None and account.credit_total == 20.0


async def test_two_accounts_that_agree_withhold_everyones_receipts_where_they_overlap(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, b, c, host, _ = world
    receipts = [
        sign_receipt(c, host, "m.0", 10, False, NOW - 5000),  # only a's period: c's grant stays
        sign_receipt(c, host, "m.0", 10, False, NOW - 2500),  # a's and b's: everyone's withheld
        sign_receipt(c, host, "m.0", 10, False, NOW - 500),  # only b's period: c's grant stays
    ]
    await ingest(sessions, receipts, now=NOW)
    first = await report_spot_check(
        sessions, sign_spot_check(a, host.peer_id, "m.0", NOW - 6000, NOW - 2000, "x"), now=NOW
    )
    assert (first.withheld_receipts, first.corroborated) == (0, False)
    second = await report_spot_check(
        sessions, sign_spot_check(b, host.peer_id, "m.0", NOW - 3000, NOW, "x"), now=NOW
    )
    assert (second.withheld_receipts, second.reversed_credit, second.corroborated) == (1, 10.0, True)
    h = await host_row(sessions, host)
    assert h.flagged and h.credit_total == 20.0
    async with sessions() as s:
        withheld = {
            r.receipt_id
            for r in (await s.execute(select(Receipt).where(Receipt.withheld.is_(True)))).scalars()
        }
    assert withheld == {receipts[1].receipt_id}
    # New receipts from anyone inside the overlap are withheld; outside it they earn.
    new = [
        sign_receipt(c, host, "m.0", 5, False, NOW - 2400),
        sign_receipt(c, host, "m.0", 5, False, NOW - 100),
    ]
    result = await ingest(sessions, new, now=NOW)
    assert (result.withheld, result.credit) == (1, 5.0)


async def test_bad_reports_are_refused_counted_and_change_nothing(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, b, _, host, _ = world
    await ingest(sessions, [sign_receipt(a, host, "m.0", 50, False, NOW - 100)], now=NOW)
    fresh, _ = await make_host(sessions, "newcomer")  # bound now: nothing before it can be judged
    report = sign_spot_check(a, host.peer_id, "m.0", NOW - 3600, NOW, "x")
    cases = [
        (sign_spot_check(a, host.peer_id, "m.0", NOW - 60, NOW + 3600, "x"), "future_period"),
        (sign_spot_check(a, fresh.peer_id, "m.0", 1_000_000_000.0, 1_000_000_100.0, "x"), "before_host"),
        (sign_spot_check(a, host.peer_id, "m.0", NOW - 8 * DAY_S, NOW, "x"), "bad_period"),
        (sign_spot_check(b, Identity.generate().peer_id, "m.0", NOW - 60, NOW, "x"), "unknown_host"),
        (msgspec.structs.replace(report, reason="y"), "bad_signature"),
    ]
    for bad, code in cases:
        with pytest.raises(SpotCheckRejected) as e:
            await report_spot_check(sessions, bad, now=NOW)
        assert e.value.code == code
    first = await report_spot_check(sessions, report, now=NOW)
    assert first.reversed_credit == 50.0
    # The same report again, and the same claim under a new id: replays.
    for replay in (report, sign_spot_check(a, host.peer_id, "m.0", NOW - 3600, NOW, "x")):
        with pytest.raises(SpotCheckRejected) as e:
            await report_spot_check(sessions, replay, now=NOW + 1)
        assert e.value.code == "replayed"
    counts = {
        r["reason"]: r["count"] for r in await rules.refusals(sessions, 1, NOW) if r["kind"] == "report"
    }
    assert counts == {
        "future_period": 1,
        "before_host": 1,
        "bad_period": 1,
        "unknown_host": 1,
        "bad_signature": 1,
        "replayed": 2,
    }
    assert (await host_row(sessions, host)).credit_total == 0.0  # only the one good report acted
    assert len(await list_flags(sessions)) == 1


async def test_reports_per_reporter_and_host_are_capped_per_day(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, b, _, host, _ = world
    for i in range(MAX_REPORTS_PER_DAY):
        await report_spot_check(
            sessions, sign_spot_check(a, host.peer_id, "m.0", NOW - 100 - i, NOW, "x"), now=NOW
        )
    with pytest.raises(SpotCheckRejected) as e:
        await report_spot_check(
            sessions, sign_spot_check(a, host.peer_id, "m.0", NOW - 50, NOW, "x"), now=NOW
        )
    assert e.value.code == "too_many_reports"
    await report_spot_check(
        sessions, sign_spot_check(b, host.peer_id, "m.0", NOW - 50, NOW, "x"), now=NOW
    )  # b's own
    # A day later the reporter may report again.
    later = NOW + DAY_S + 1
    await report_spot_check(sessions, sign_spot_check(a, host.peer_id, "m.0", NOW - 10, NOW, "x"), now=later)


async def test_an_operator_undoes_a_reversal(world) -> None:  # type: ignore[no-untyped-def]
    sessions, a, b, c, host, _ = world
    receipts = [sign_receipt(c, host, "m.0", 10, False, NOW - 100 * (i + 1)) for i in range(3)]
    await ingest(sessions, receipts, now=NOW)
    await report_spot_check(sessions, sign_spot_check(a, host.peer_id, "m.0", NOW - 3600, NOW, "x"), now=NOW)
    second = await report_spot_check(
        sessions, sign_spot_check(b, host.peer_id, "m.0", NOW - 3600, NOW, "x"), now=NOW
    )
    assert second.reversed_credit == 30.0
    later = NOW + DAY_S
    undone = await undo_flag(sessions, second.flag_id, now=later)
    assert (undone.restored_receipts, undone.restored_credit) == (3, 30.0)
    h = await host_row(sessions, host)
    assert h.credit_total == 30.0 and h.requests_served == 3 and not h.flagged
    assert h.credit_recent == pytest.approx(decay(30.0, NOW, later))
    async with sessions() as s:
        day = (
            await s.execute(
                select(CreditDay).where(
                    CreditDay.subject_kind == "host", CreditDay.subject_id == host.peer_id
                )
            )
        ).scalar_one()
        assert day.credit == 30.0
        assert not (await s.execute(select(Receipt).where(Receipt.withheld.is_(True)))).first()
    with pytest.raises(ReviewError):
        await undo_flag(sessions, second.flag_id, now=later)
    with pytest.raises(ReviewError):
        await undo_flag(sessions, 10_000, now=later)
    flags = {f["id"]: f for f in await list_flags(sessions, host.peer_id)}
    assert flags[second.flag_id]["undone_at"] == later and len(flags) == 2


def test_lah_coordinator_flags_undo_flag_and_refusals(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import asyncio
    import time

    from coordinator.config import load_config
    from coordinator.services import open_services
    from lah.cli import main

    config = tmp_path / "coordinator.toml"
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}"
    config.write_text(f'database_url = "{db_url}"\ntoken_key_path = "{tmp_path / "k"}"\n')
    now = time.time()

    async def seed() -> tuple[int, str]:
        services = await open_services(load_config(config))
        try:
            sessions = services.sessions
            a, _ = await make_host(sessions, "trainer-a", role="trainer")
            b, _ = await make_host(sessions, "trainer-b", role="trainer")
            host, _ = await make_host(sessions, "honest")
            await ingest(sessions, [sign_receipt(a, host, "m.0", 7, False, now - 30)], now=now)
            await report_spot_check(
                sessions, sign_spot_check(a, host.peer_id, "m.0", now - 60, now, "x"), now=now
            )
            with pytest.raises(SpotCheckRejected):
                await report_spot_check(
                    sessions, sign_spot_check(b, host.peer_id, "m.0", now, now + 3600, "x")
                )
            flag = await list_flags(sessions)
            return int(flag[0]["id"]), host.peer_id
        finally:
            await services.close()

    async def credit(peer_id: str) -> float:
        services = await open_services(load_config(config))
        try:
            async with services.sessions() as s:
                row = await s.get(Host, peer_id)
                assert row is not None
                return row.credit_total
        finally:
            await services.close()

    flag_id, host = asyncio.run(seed())
    assert asyncio.run(credit(host)) == 0.0
    assert main(["coordinator", "--config", str(config), "flags", "--host", host]) in (0, None)
    out = capsys.readouterr().out
    assert f"flag {flag_id}: host {host}" in out and "[active]" in out
    assert main(["coordinator", "--config", str(config), "refusals", "--days", "1"]) in (0, None)
    assert "future_period" in capsys.readouterr().out
    assert main(["coordinator", "--config", str(config), "undo-flag", str(flag_id)]) in (0, None)
    assert "1 receipts" in capsys.readouterr().out
    assert asyncio.run(credit(host)) == 7.0
    assert main(["coordinator", "--config", str(config), "undo-flag", str(flag_id)]) == 2  # undone already
    assert "undone already" in capsys.readouterr().err
