"""The bulk data the coordinator load benchmarks seed a ledger with: teams, accounts (one host each),
receipts and the daily rollups ingestion would have written for them, as rows in ``COLUMNS``' order for
sqlite3 executemany or PostgreSQL COPY.

Its own module so that coordinator_load.py, replica_load.py and admission_load.py share it without
importing one another (the scripts run with benchmarks/ on sys.path and import it by its bare name).
``NOW`` is the one clock of a run: the rows' times are drawn around it and coordinator_load ingests at it.
"""

from __future__ import annotations

import random
import time
from typing import Any

from coordinator.credit.ledger import DAY_S
from engine.p2p.identity import Identity

NOW = time.time()


def rows_for(accounts: int, receipts: int, trainers: list[Identity]) -> dict[str, list[tuple[Any, ...]]]:
    rng = random.Random(42)
    teams = max(1, accounts // 100)

    def credit() -> tuple[float, float, float]:
        total = rng.lognormvariate(8, 2)
        return total, total * rng.uniform(0.001, 0.3), NOW - rng.uniform(0, 14 * DAY_S)

    team_rows = [(t + 1, f"team{t}", *credit()) for t in range(teams)]
    account_rows = []
    host_rows = []
    for a in range(accounts):
        role = "trainer" if a < len(trainers) else "volunteer"
        account_rows.append((a + 1, f"user{a}", rng.randrange(1, teams + 1), role, False, *credit()))
        if a < len(trainers):
            peer_id, key = trainers[a].peer_id, trainers[a].public_key
        else:
            peer_id, key = rng.randbytes(20).hex(), rng.randbytes(32)
        host_rows.append((peer_id, key, a + 1, NOW, rng.randrange(0, 10_000), False, *credit()))
    host_ids = [h[0] for h in host_rows]
    receipt_rows = []
    for _ in range(receipts):
        samples = rng.randrange(1, 512)
        receipt_rows.append(
            (
                rng.randbytes(16).hex(),
                trainers[0].peer_id,
                host_ids[rng.randrange(len(trainers), len(host_ids))],
                f"bench.{rng.randrange(16)}.{rng.randrange(16)}",
                samples,
                False,
                NOW - rng.uniform(0, 30 * DAY_S),
                float(samples),
                False,
            )
        )
    return {
        "teams": team_rows,
        "accounts": account_rows,
        "hosts": host_rows,
        "receipts": receipt_rows,
        "credit_days": rollups_for(account_rows, host_rows, receipt_rows),
    }


def rollups_for(
    account_rows: list[tuple[Any, ...]], host_rows: list[tuple[Any, ...]], receipt_rows: list[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """The daily rollups ingestion would have written for these receipts (host, account, team days)."""
    owner = {h[0]: h[2] for h in host_rows}
    team = {a[0]: a[2] for a in account_rows}
    days: dict[tuple[str, str, int], float] = {}
    for r in receipt_rows:
        day = int(r[6] // DAY_S)
        account = owner[r[2]]
        for key in (("host", r[2], day), ("account", str(account), day), ("team", str(team[account]), day)):
            days[key] = days.get(key, 0.0) + r[7]
    return [(k, s, d, c) for (k, s, d), c in days.items()]


COLUMNS = {
    "teams": ["id", "name", "credit_total", "credit_recent", "credit_recent_at"],
    "accounts": [
        "id",
        "name",
        "team_id",
        "role",
        "disabled",
        "credit_total",
        "credit_recent",
        "credit_recent_at",
    ],
    "hosts": [
        "peer_id",
        "public_key",
        "account_id",
        "last_seen",
        "requests_served",
        "flagged",
        "credit_total",
        "credit_recent",
        "credit_recent_at",
    ],
    "credit_days": ["subject_kind", "subject_id", "day", "credit"],
    "receipts": [
        "receipt_id",
        "trainer_peer_id",
        "host_peer_id",
        "expert_uid",
        "samples",
        "backward",
        "served_at",
        "credit",
        "withheld",
    ],
}
