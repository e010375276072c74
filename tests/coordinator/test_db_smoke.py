from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.db.models import Account, Team
from coordinator.db.session import session_factory


async def test_tables_work_on_both_databases(db: AsyncEngine) -> None:
    sessions = session_factory(db)
    async with sessions() as s, s.begin():
        team = Team(name="red")
        s.add(Account(name="ada", team=team, role="volunteer"))
    async with sessions() as s:
        account = (await s.execute(select(Account).where(Account.name == "ada"))).scalar_one()
        assert account.team_id is not None and account.credit_total == 0.0
