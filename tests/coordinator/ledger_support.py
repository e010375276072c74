"""Shared setup for the ledger tests: accounts, teams and hosts with identities, and the assignments
a host must have held for its receipts to be credited."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from coordinator.db.models import Account, AssignmentSpan, Host, Team
from engine.p2p.identity import Identity

ALWAYS = (0.0, 4.0e9)  # a span covering every time a test uses
#: The experts the tests' receipts name: a volunteer made by ``make_host`` held them all, always.
TEST_EXPERTS = tuple(
    uid
    for name in ("m", "mnist", "ffn", "blobs", "other", "cnn", "big", "cifar")
    for i in range(5)
    for uid in (f"{name}.{i}", *(f"{name}.{i}.{j}" for j in range(5)))
)


async def hold(
    sessions: async_sessionmaker[AsyncSession],
    peer_id: str,
    uids: Iterable[str],
    span: tuple[float, float] = ALWAYS,
    device: str = "cpu",
) -> None:
    """Record that ``peer_id`` held these experts over ``span`` (what ``/api/assignment`` writes)."""
    rows = [
        {
            "host_peer_id": peer_id,
            "expert_uid": uid,
            "held_from": span[0],
            "held_until": span[1],
            "device": device,
            "memory_bytes": 1 << 30,
        }
        for uid in uids
    ]
    if rows:
        async with sessions() as s, s.begin():
            await s.execute(insert(AssignmentSpan), rows)


async def make_host(
    sessions: async_sessionmaker[AsyncSession],
    name: str,
    role: str = "volunteer",
    team: str | None = None,
    holds: Iterable[str] | None = None,
) -> tuple[Identity, int]:
    """A new account (in ``team``, created if needed) with one host; returns (host identity, account id).
    A volunteer's host held ``holds`` (default: ``TEST_EXPERTS``) at every time."""
    ident = Identity.generate()
    async with sessions() as s, s.begin():
        team_row = None
        if team is not None:
            team_row = (await s.execute(select(Team).where(Team.name == team))).scalar_one_or_none()
            if team_row is None:
                team_row = Team(name=team)
                s.add(team_row)
        account = Account(name=name, role=role, team=team_row)
        s.add(account)
        await s.flush()
        s.add(Host(peer_id=ident.peer_id, public_key=ident.public_key, account_id=account.id))
    if role == "volunteer":
        await hold(sessions, ident.peer_id, TEST_EXPERTS if holds is None else holds)
    return ident, account.id
