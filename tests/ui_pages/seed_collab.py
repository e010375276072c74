"""Collaborative training for the page tests: trainer accounts, their status reports (the swarm page's
panel) and their work (the leaderboard's Trainers tab), around ``seed.NOW``."""

from __future__ import annotations

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from coordinator.db.models import Account, CollabStatus, Team, TrainerWork

from .seed import NOW, REALISTIC_EXPERIMENTS, XSS_TEAM, _host

#: The realistic experiments, the first trained collaboratively.
COLLAB_EXPERIMENTS = [
    msgspec.structs.replace(REALISTIC_EXPERIMENTS[0], target_batch_size=4096),
    *REALISTIC_EXPERIMENTS[1:],
]
TRAINERS = [
    # name, samples/s, epoch, accumulated, last round (epoch, s, outcome), claimed, receipt samples
    ("Lab GPU trainer", 412.5, 57, 1210, (57, 1.84, "ok"), 2_350_000, 9_400_000),
    ("Dense Dave", 233.0, 57, 688, (57, 2.31, "ok"), 1_100_000, 800_000),
    ("Relay Rita (behind NAT)", 61.2, 57, 190, (57, None, "local"), 240_000, 960_000),
    ("Late Larry", 95.0, 56, 0, (None, None, "skipped"), 31_000, 120_000),
]


async def seed_collab(sessions: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    """Four trainers online in ``transformer_moe``'s collaboration (one an epoch behind), one silent
    trainer whose report is too old to show; returns the trainer accounts' ids by name."""
    ids: dict[str, int] = {}
    async with sessions() as s, s.begin():
        team = Team(name="Dense Crew " + XSS_TEAM, credit_recent_at=NOW)
        s.add(team)
        rows = [*TRAINERS, ("Gone Gary", 80.0, 40, 10, (40, 3.0, "timed_out"), 5_000, 4_000)]
        for i, (name, rate, epoch, acc, (r_epoch, r_s, outcome), claimed, proven) in enumerate(rows):
            account = Account(name=name, role="trainer", team=team if i % 2 == 0 else None)
            s.add(account)
            host = _host(account, f"trainer-{i}", last_seen=NOW - 3)
            s.add(host)
            await s.flush()
            ids[name] = account.id
            s.add(
                CollabStatus(
                    experiment="transformer_moe",
                    peer_id=host.peer_id,
                    account_id=account.id,
                    epoch=epoch,
                    samples_accumulated=acc,
                    samples_per_s=rate,
                    peers=4,
                    last_round_epoch=r_epoch,
                    last_round_s=r_s,
                    last_round_outcome=outcome,
                    reported_at=NOW - (300 if name == "Gone Gary" else 2 + i),
                )
            )
            s.add(
                TrainerWork(
                    peer_id=host.peer_id,
                    experiment="transformer_moe",
                    receipt_samples=proven,
                    samples_claimed=claimed,
                    run_id="00aa11bb22cc33dd",
                    run_samples=claimed,
                    updated_at=NOW,
                )
            )
    return ids
