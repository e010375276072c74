import math
import random

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.credit.leaderboard import (
    HALF_LIFE_S,
    LeaderboardError,
    contributor,
    leaderboard,
    recent_key,
    swarm_stats,
)
from coordinator.credit.ledger import DAY_S, decay, ingest
from coordinator.credit.receipts import sign_receipt
from coordinator.db.models import Account, Host, Team
from coordinator.db.session import session_factory

from .ledger_support import make_host

NOW = 1_800_000_000.0


async def seed(db: AsyncEngine, n: int = 60) -> list[tuple[int, float, float, float]]:
    """n accounts with random totals and recent credit stamped at different times; one disabled."""
    rng = random.Random(7)
    sessions = session_factory(db)
    rows = []
    async with sessions() as s, s.begin():
        team = Team(name="blue", credit_total=5.0, credit_recent=1.0, credit_recent_at=NOW)
        s.add(team)
        for i in range(n):
            total = float(rng.randrange(0, 50))  # many ties
            recent = rng.uniform(0, 1000)
            at = NOW - rng.uniform(0, 4 * HALF_LIFE_S)
            s.add(
                Account(
                    id=i + 1,
                    name=f"u{i}",
                    team=team if i % 2 else None,
                    credit_total=total,
                    credit_recent=recent,
                    credit_recent_at=at,
                    disabled=(i == 5),
                )
            )
            if i != 5:
                rows.append((i + 1, total, recent, at))
    return rows


async def test_users_by_total_are_ordered_and_paginated(db: AsyncEngine) -> None:
    rows = await seed(db)
    sessions = session_factory(db)
    expected = [r[0] for r in sorted(rows, key=lambda r: (-r[1], -r[0]))]
    got: list[int] = []
    page = 1
    while True:
        p = await leaderboard(sessions, "users", "total", page=page, per_page=7, now=NOW)
        got += [int(e.id) for e in p.entries]
        assert [e.rank for e in p.entries] == list(
            range((page - 1) * 7 + 1, (page - 1) * 7 + 1 + len(p.entries))
        )
        if not p.has_more:
            break
        page += 1
    assert got == expected
    first = (await leaderboard(sessions, "users", "total", page=1, per_page=3, now=NOW)).entries[0]
    assert first.name == f"u{first.id and int(first.id) - 1}"
    assert (first.team == "blue") == (int(first.id) % 2 == 0)


async def test_users_by_recent_are_ordered_by_decayed_value(db: AsyncEngine) -> None:
    rows = await seed(db)
    sessions = session_factory(db)
    expected = sorted(rows, key=lambda r: (-decay(r[2], r[3], NOW), -r[0]))
    # The stored order is not the decayed order (that is the point of the test).
    assert [r[0] for r in sorted(rows, key=lambda r: -r[2])] != [r[0] for r in expected]
    for per_page in (1, 5, 100):
        got = []
        page = 1
        while True:
            p = await leaderboard(sessions, "users", "recent", page=page, per_page=per_page, now=NOW)
            got += p.entries
            if not p.has_more:
                break
            page += 1
        assert [int(e.id) for e in got] == [r[0] for r in expected]
        assert got[0].credit_recent == pytest.approx(decay(expected[0][2], expected[0][3], NOW))
        assert got[0].rac_per_day == pytest.approx(got[0].credit_recent * math.log(2) / 7)


def test_recent_key_orders_like_decayed_values() -> None:
    rng = random.Random(1)
    rows = [(rng.uniform(0, 1e6), NOW - rng.uniform(0, 1e7)) for _ in range(200)] + [(0.0, NOW)]
    by_key = sorted(rows, key=lambda r: -recent_key(*r))
    by_value = sorted(rows, key=lambda r: -decay(r[0], r[1], NOW + 1e6))
    assert by_key == by_value


async def test_hosts_and_teams_boards_contributor_and_stats(db: AsyncEngine) -> None:
    sessions = session_factory(db)
    trainer, _ = await make_host(sessions, "trainer", role="trainer")
    host, account_id = await make_host(sessions, "alice", team="red")
    other, _ = await make_host(sessions, "bob", team="green")
    await ingest(
        sessions,
        [
            sign_receipt(trainer, host, "m.0", 30, False, NOW - DAY_S),
            sign_receipt(trainer, host, "m.0", 10, False, NOW),
            sign_receipt(trainer, other, "m.0", 20, False, NOW),
        ],
        now=NOW,
    )
    hosts = await leaderboard(sessions, "hosts", "total", now=NOW)
    assert [e.id for e in hosts.entries[:2]] == [host.peer_id, other.peer_id]
    assert hosts.entries[0].account == "alice" and hosts.entries[0].requests_served == 2
    assert hosts.entries[0].team == "red" and hosts.entries[0].flagged is False
    recent_hosts = await leaderboard(sessions, "hosts", "recent", now=NOW)
    assert [e.id for e in recent_hosts.entries[:2]] == [host.peer_id, other.peer_id]
    teams = await leaderboard(sessions, "teams", "recent", now=NOW + DAY_S)
    assert [e.name for e in teams.entries] == ["red", "green"]
    assert teams.entries[0].credit_recent == pytest.approx(decay(40.0, NOW, NOW + DAY_S))

    info = await contributor(sessions, account_id, now=NOW)
    assert info is not None
    assert info["account"]["name"] == "alice" and info["account"]["team"] == "red"
    assert [h["peer_id"] for h in info["hosts"]] == [host.peer_id]
    assert [(d["day"], d["credit"]) for d in info["history"]] == [
        (int(NOW // DAY_S) - 1, 30.0),
        (int(NOW // DAY_S), 10.0),
    ]
    assert await contributor(sessions, 9999, now=NOW) is None

    async with sessions() as s, s.begin():
        (await s.get(Host, other.peer_id)).flagged = True  # type: ignore[union-attr]
    stats = await swarm_stats(sessions)
    assert stats == {
        "hosts": 3,
        "requests_served": 3,
        "credit_total": 60.0,
        "flagged_hosts": 1,
        "accounts": 3,
        "teams": 2,
    }


async def test_bad_arguments(db: AsyncEngine) -> None:
    sessions = session_factory(db)
    for kwargs, code in [
        ({"kind": "planets"}, "bad_kind"),
        ({"kind": "users", "sort": "name"}, "bad_sort"),
        ({"kind": "users", "per_page": 101}, "bad_per_page"),
        ({"kind": "users", "page": 0}, "bad_page"),
        ({"kind": "users", "page": 10_000, "per_page": 100}, "bad_page"),
    ]:
        with pytest.raises(LeaderboardError) as e:
            await leaderboard(sessions, **kwargs)  # type: ignore[arg-type]
        assert e.value.code == code


@pytest.mark.parametrize("max_scan", [3, 50_000])
async def test_recent_with_idle_accounts_and_the_database_fallback(
    db: AsyncEngine, monkeypatch: pytest.MonkeyPatch, max_scan: int
) -> None:
    import coordinator.credit.leaderboard as lb

    monkeypatch.setattr(lb, "MAX_SCAN", max_scan)
    rows = await seed(db, n=30)
    sessions = session_factory(db)
    async with sessions() as s, s.begin():
        for i in range(100, 120):  # idle: no recent credit
            s.add(Account(id=i, name=f"idle{i}", credit_total=1.0))
    rows += [(i, 1.0, 0.0, 0.0) for i in range(100, 120)]
    expected = [r[0] for r in sorted(rows, key=lambda r: (-decay(r[2], r[3], NOW), -r[0]))]
    got = []
    for page in range(1, 20):
        p = await leaderboard(sessions, "users", "recent", page=page, per_page=4, now=NOW)
        got += [int(e.id) for e in p.entries]
        if not p.has_more:
            break
    assert got == expected
