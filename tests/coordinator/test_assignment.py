from collections import Counter

from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import ExperimentConfig
from coordinator.db.models import Account, Host
from coordinator.db.session import session_factory
from coordinator.swarm.assignment import Capacity, assign_host, expert_bytes, expert_uids, plan

EXP = ExperimentConfig(name="ffn", expert_type="ffn", grid=[4, 4], hyperparams={"d_model": 64, "hidden": 256})


def test_uids_cover_the_grid() -> None:
    uids = expert_uids(EXP)
    assert len(uids) == 16 and uids[0] == "ffn.0.0" and uids[-1] == "ffn.3.3"


def test_plan_prefers_least_covered_and_spreads_hosts() -> None:
    uids = expert_uids(EXP)
    cover = {u: 2 for u in uids} | {"ffn.1.1": 0, "ffn.2.2": 1}
    assert plan(uids, cover, "h1", 2) == ["ffn.1.1", "ffn.2.2"]
    # with no coverage at all, different hosts start on different experts
    firsts = {plan(uids, {}, f"host{i}", 1)[0] for i in range(8)}
    assert len(firsts) > 3


def test_plan_skips_what_the_host_has() -> None:
    assert "ffn.0.0" not in plan(expert_uids(EXP), {}, "h", 16, already=["ffn.0.0"])


def test_replication_reached_with_enough_hosts() -> None:
    uids = expert_uids(EXP)
    cover: Counter[str] = Counter()
    for i in range(8):  # 8 hosts x 4 experts = 32 = 16 experts x replication 2
        for uid in plan(uids, cover, f"h{i}", 4):
            cover[uid] += 1
    assert [u for u in uids if cover[u] < 2] == []


async def _hosts(db: AsyncEngine, n: int) -> None:
    async with session_factory(db)() as s, s.begin():
        acc = Account(name="v")
        s.add(acc)
        for i in range(n):
            s.add(Host(peer_id=f"{i:040d}", public_key=bytes(32), account=acc))


async def test_assign_host_covers_grid_and_renews(db: AsyncEngine) -> None:
    await _hosts(db, 8)
    sessions = session_factory(db)
    cap = Capacity(device="cpu", memory_bytes=4 * expert_bytes(EXP))
    got = {}
    for i in range(8):
        got[i] = await assign_host(sessions, [EXP], f"{i:040d}", cap, now=1000.0, ttl_s=60)
        assert len(got[i]) == 4
    counts = Counter(uid for pairs in got.values() for _, uid in pairs)
    assert set(counts) == set(expert_uids(EXP)) and min(counts.values()) == 2
    # the same host asking again keeps its experts (renewed), nothing new
    again = await assign_host(sessions, [EXP], f"{0:040d}", cap, now=1030.0, ttl_s=60)
    assert sorted(again) == sorted(got[0])
    # after expiry the others' assignments are gone and host 0 gets the whole budget anew
    later = await assign_host(sessions, [EXP], f"{1:040d}", cap, now=5000.0, ttl_s=60)
    assert len(later) == 4
    # a smaller budget gives experts back
    small = await assign_host(sessions, [EXP], f"{1:040d}", Capacity("cpu", expert_bytes(EXP)), 5001.0, 60)
    assert len(small) == 1 and small[0] in later
