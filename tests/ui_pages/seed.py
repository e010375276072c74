"""Seed data for the site's tests: accounts, teams, hosts, daily credit and assignments.

``seed_small`` is exact (the HTTP tests assert ranks and orders on it); ``seed_realistic`` is a few
dozen contributors with 60 days of history, for screenshots.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from coordinator.config import ExperimentConfig
from coordinator.db.models import Account, Assignment, CreditDay, Host, Team

NOW = 1_750_000_000.0  # 2025-06-15
TODAY = int(NOW // 86400)
XSS = "<script>alert('x')</script>"
XSS_TEAM = '<b onmouseover="x()">bold</b>'


def peer_id(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:40]


def _host(owner: Account, seed: str, **kw: object) -> Host:
    return Host(peer_id=peer_id(seed), public_key=hashlib.sha256(seed.encode()).digest(), account=owner, **kw)


@dataclass
class Small:
    ids: dict[str, int]  # account name -> id
    experiment: ExperimentConfig


async def seed_small(sessions: async_sessionmaker[AsyncSession]) -> Small:
    """12 users ``u00``..``u11``: total credit falls with the index, recent credit rises with it.

    Also: a user named like a script tag, in a team named like markup; a disabled account with the most
    credit (never shown); an experiment ``ffn`` with a 2x3 grid and replication 2.
    """
    exp = ExperimentConfig(name="ffn", expert_type="ffn", grid=[2, 3], replication=2)
    async with sessions() as s, s.begin():
        red, blue, evil = Team(name="red"), Team(name="blue"), Team(name=XSS_TEAM)
        red.credit_total, red.credit_recent, red.credit_recent_at = 5000.0, 10.0, NOW
        blue.credit_total, blue.credit_recent, blue.credit_recent_at = 3000.0, 90.0, NOW
        evil.credit_total = 1.0
        accounts = []
        for i in range(12):
            a = Account(name=f"u{i:02d}", team=red if i % 2 == 0 else blue)
            a.credit_total = (12 - i) * 100.0
            a.credit_recent, a.credit_recent_at = (i + 1) * 10.0, NOW
            accounts.append(a)
        # The largest stored recent credit, but written 10 weeks ago: decayed (1e5 / 2**10 = 97.7), it
        # falls between u09 (100) and u08 (90).
        stale = Account(name="stale", credit_total=0.5, credit_recent=1e5, credit_recent_at=NOW - 70 * 86400)
        xss = Account(name=XSS, team=evil, credit_total=0.25)
        banned = Account(
            name="banned", disabled=True, credit_total=1e9, credit_recent=1e9, credit_recent_at=NOW
        )
        s.add_all([*accounts, stale, xss, banned])
        for i, a in enumerate(accounts):
            s.add(
                _host(
                    a,
                    f"h{i}",
                    credit_total=a.credit_total,
                    credit_recent=a.credit_recent,
                    credit_recent_at=NOW,
                    requests_served=1000 * (i + 1),
                    last_seen=NOW - 60 * i,
                    flagged=i == 3,
                )
            )
        s.add(_host(xss, "hx"))
        await s.flush()
        ids = {a.name: a.id for a in [*accounts, stale, xss, banned]}
        for d in range(10):
            s.add(
                CreditDay(subject_kind="account", subject_id=str(ids["u00"]), day=TODAY - d, credit=10.0 * d)
            )
        s.add(CreditDay(subject_kind="account", subject_id=str(ids["u00"]), day=TODAY - 400, credit=1e6))
        live, dead = NOW + 600, NOW - 1
        for uid, hosts, expires in (
            ("ffn.0.0", ("h0", "h1"), live),
            ("ffn.0.1", ("h2",), live),
            ("ffn.1.0", ("h3",), dead),
            ("other.0", ("h4",), live),
        ):
            for h in hosts:
                s.add(
                    Assignment(
                        host_peer_id=peer_id(h),
                        experiment=uid.split(".")[0],
                        expert_uid=uid,
                        assigned_at=NOW - 100,
                        expires_at=expires,
                    )
                )
    return Small(ids, exp)


FIRST = [
    "Ada",
    "Amir",
    "Bea",
    "Chen",
    "Dara",
    "Emeka",
    "Fatima",
    "Goran",
    "Hana",
    "Ines",
    "Jonas",
    "Kaito",
    "Lena",
    "Mateo",
    "Nadia",
    "Omar",
    "Priya",
    "Quinn",
]
LAST = [
    "Lovelace",
    "Okafor",
    "Silva",
    "Novak",
    "Tanaka",
    "Haddad",
    "Berg",
    "Rossi",
    "Kowalski",
    "Mendes",
    "Ivanova",
    "Dubois",
]
LONG_NAME = "Supercalifragilisticexpialidocious_GPU_Cluster_Of_The_North_42"
TEAMS = ["Team Tensor", "GPU Collective", "Night Owls", "Gradient Descenders", "Uni Lab 42", "Solo Miners"]


async def seed_realistic(sessions: async_sessionmaker[AsyncSession], n_accounts: int = 48) -> dict[str, int]:
    """A few dozen accounts in six teams, 1-3 hosts each, 60 days of credit, one 8x8 experiment."""
    rng = random.Random(7)
    ids: dict[str, int] = {}
    async with sessions() as s, s.begin():
        teams = [
            Team(name=t, created_at=datetime.fromtimestamp(NOW - (90 + 30 * k) * 86400, UTC))
            for k, t in enumerate(TEAMS)
        ]
        s.add_all(teams)
        hosts: list[Host] = []
        plans: list[tuple[Account, list[float]]] = []
        for i in range(n_accounts):
            name = f"{FIRST[i % len(FIRST)]} {LAST[(i * 7) % len(LAST)]}"
            if i == 5:
                name = XSS
            if i == 7:
                name = LONG_NAME  # one unbroken word as long as names go: must wrap, not widen the page
            a = Account(name=name if i < len(FIRST) * 2 else f"{name} {i}", team=rng.choice([*teams, None]))
            scale = rng.lognormvariate(6.0, 1.0)
            start = rng.randrange(0, 50)
            daily = []
            for d in range(60):
                t = d - start
                v = 0.0 if t < 0 else scale * (0.6 + 0.4 * math.sin(d / 5 + i)) * rng.uniform(0.5, 1.2)
                if rng.random() < 0.08:
                    v = 0.0  # a day off
                daily.append(max(0.0, v))
            if i % 9 == 4:
                daily[-14:] = [0.0] * 14  # stopped two weeks ago: recent credit decays
            a.created_at = datetime.fromtimestamp(NOW - (60 - start) * 86400 - 3600, UTC)
            plans.append((a, daily))
            s.add(a)
            for k in range(rng.choice([1, 1, 2, 3])):
                hosts.append(
                    _host(
                        a,
                        f"r{i}-{k}",
                        requests_served=int(sum(daily) * rng.uniform(5, 20)),
                        last_seen=NOW - rng.choice([5, 30, 120, 900, 7200, 86400 * 3]),
                        flagged=rng.random() < 0.05,
                    )
                )
        s.add_all(hosts)
        await s.flush()
        team_days: dict[tuple[int, int], float] = {}
        for a, daily in plans:
            ids[a.name] = a.id
            total = sum(daily)
            recent = sum(v * 0.5 ** ((59 - d) / 7) for d, v in enumerate(daily))
            a.credit_total, a.credit_recent, a.credit_recent_at = total, recent, NOW
            if a.team is not None:
                t = a.team
                t.credit_total = (t.credit_total or 0.0) + total
                t.credit_recent = (t.credit_recent or 0.0) + recent
                t.credit_recent_at = NOW
            for d, v in enumerate(daily):
                if v > 0:
                    s.add(
                        CreditDay(subject_kind="account", subject_id=str(a.id), day=TODAY - 59 + d, credit=v)
                    )
                    if a.team_id is not None:
                        key = (a.team_id, d)
                        team_days[key] = team_days.get(key, 0.0) + v
            mine = [h for h in hosts if h.account is a]
            for h in mine:
                h.credit_total, h.credit_recent, h.credit_recent_at = (
                    total / len(mine),
                    recent / len(mine),
                    NOW,
                )
                for d, v in enumerate(daily):
                    if v > 0:
                        s.add(
                            CreditDay(
                                subject_kind="host",
                                subject_id=h.peer_id,
                                day=TODAY - 59 + d,
                                credit=v / len(mine),
                            )
                        )
        for (tid, d), v in team_days.items():
            s.add(CreditDay(subject_kind="team", subject_id=str(tid), day=TODAY - 59 + d, credit=v))
        live = [h for h in hosts if NOW - h.last_seen < 3600]
        for i in range(8):
            for j in range(8):
                if (i * 8 + j) % 11 == 5:
                    continue  # a few experts nobody hosts
                for h in rng.sample(live, k=rng.choice([1, 2, 2, 3])):
                    s.add(
                        Assignment(
                            host_peer_id=h.peer_id,
                            experiment="transformer_moe",
                            expert_uid=f"transformer_moe.{i}.{j}",
                            assigned_at=NOW - 600,
                            expires_at=NOW + 3000,
                        )
                    )
    return ids


REALISTIC_EXPERIMENTS = [
    ExperimentConfig(name="transformer_moe", expert_type="ffn", grid=[8, 8], replication=2),
    ExperimentConfig(name="small_ffn", expert_type="ffn", grid=[32], replication=2),
    ExperimentConfig(name="wide_ffn", expert_type="ffn", grid=[2, 30], replication=2),  # drawn dense
]
