"""Shared setup for the ledger tests: accounts, teams and hosts with identities."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from coordinator.db.models import Account, Host, Team
from engine.p2p.identity import Identity


async def make_host(
    sessions: async_sessionmaker[AsyncSession], name: str, role: str = "volunteer", team: str | None = None
) -> tuple[Identity, int]:
    """A new account (in ``team``, created if needed) with one host; returns (host identity, account id)."""
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
        return ident, account.id
