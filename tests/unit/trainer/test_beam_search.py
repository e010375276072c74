"""DHTExpertFinder's beam search against brute force (StaticExpertFinder), on an in-memory DHT."""

import asyncio
import random
import time

import pytest

from engine.dht import MemoryNetwork, declare_experts
from engine.dht.swarm import make_swarm
from engine.moe import StaticExpertFinder
from engine.moe.dht_finder import Children, DHTExpertFinder

GRID = (4, 5)


def _scores(rng: random.Random, batch: int) -> list[list[list[float]]]:
    return [[[rng.gauss(0, 1) for _ in range(n)] for n in GRID] for _ in range(batch)]


async def _declared_swarm(uids_by_host: int, fraction: float, seed: int) -> tuple[list, dict[str, str]]:
    rng = random.Random(seed)
    nodes = await make_swarm(MemoryNetwork(seed=seed), 12, seed=seed)
    cells = [f"ffn.{i}.{j}" for i in range(GRID[0]) for j in range(GRID[1])]
    alive = [u for u in cells if rng.random() < fraction]
    table: dict[str, str] = {}
    for n, node in enumerate(nodes[:uids_by_host]):
        mine = alive[n::uids_by_host]
        if mine:
            await declare_experts(node, mine, node.peer_id, time.time() + 60)
            table.update(dict.fromkeys(mine, node.peer_id))
    return nodes, table


@pytest.mark.parametrize("k", [1, 3, 6])
async def test_full_grid_matches_brute_force(k: int) -> None:
    nodes, table = await _declared_swarm(4, 1.0, seed=k)
    finder = DHTExpertFinder(nodes[-1])
    brute = StaticExpertFinder(table)
    batch = _scores(random.Random(k), 16)
    got = await finder.find_batch("ffn", batch, k)
    for scores, found in zip(batch, got, strict=True):
        assert found == await brute.find("ffn", scores, k)


async def test_sparse_grid_exhaustive_beam_matches_brute_force_and_lists_only_live_experts() -> None:
    nodes, table = await _declared_swarm(3, 0.5, seed=7)
    finder = DHTExpertFinder(nodes[-1], beam_size=max(GRID))
    brute = StaticExpertFinder(table)
    for scores in _scores(random.Random(3), 8):
        found = await finder.find("ffn", scores, 4)
        assert found == await brute.find("ffn", scores, 4)
        assert all(table[uid] == host for uid, host in found)
    narrow = DHTExpertFinder(nodes[-1], beam_size=1)
    for scores in _scores(random.Random(4), 8):
        found = await narrow.find("ffn", scores, 2)
        assert found and all(uid in table for uid, _ in found)
        totals = [sum(s[int(c)] for s, c in zip(scores, uid.split(".")[1:], strict=True)) for uid, _ in found]
        assert totals == sorted(totals, reverse=True)


class CountingLookup:
    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, prefix: str) -> Children:
        self.calls.append(prefix)
        out: Children = {}
        for uid, host in self.table.items():
            if uid.startswith(prefix):
                coord = int(uid[len(prefix) :].split(".")[0])
                hosts = (host,) if prefix.count(".") == 2 else ()
                out[coord] = (prefix + str(coord), hosts)
        return out


async def test_one_lookup_per_prefix_per_step_and_cache() -> None:
    table = {f"ffn.{i}.{j}": "h" * 40 for i in range(GRID[0]) for j in range(GRID[1])}
    now = [0.0]
    lookup = CountingLookup(table)
    finder = DHTExpertFinder(lookup, ttl_s=10, clock=lambda: now[0])
    batch = _scores(random.Random(0), 64)
    await finder.find_batch("ffn", batch, 4)
    # root + at most one per first coordinate, however many samples: O(k · dims · dim_size) bound
    assert len(lookup.calls) == len(set(lookup.calls)) <= 1 + GRID[0]
    first = len(lookup.calls)
    await finder.find_batch("ffn", batch, 4)
    assert len(lookup.calls) == first  # fresh: all from the cache
    now[0] = 11.0
    await finder.find_batch("ffn", batch, 4)  # stale: answered from cache, refreshed in background
    await finder.close()
    assert first <= len(lookup.calls) <= 2 * first


async def test_failed_host_is_avoided_when_a_replica_exists() -> None:
    async def lookup(prefix: str) -> Children:
        if prefix == "ffn.":
            return {0: ("ffn.0", ())}
        return {0: ("ffn.0.0", ("a" * 40, "b" * 40))}

    finder = DHTExpertFinder(lookup)
    scores = [[1.0], [1.0]]
    [(uid, first)] = await finder.find("ffn", scores, 1)
    finder.report_failure(uid, first)
    [(_, second)] = await finder.find("ffn", scores, 1)
    assert second != first and {first, second} == {"a" * 40, "b" * 40}


async def test_wait_for_hosts_looks_up_afresh_until_every_uid_has_a_host() -> None:
    """A swarm still declaring: the first answers are partial, and a cache fresh for ``ttl_s`` would
    keep them; waiting looks up again until every expert has a host, and says how many do at the end."""
    declared = ["ffn.0.0"]
    calls: list[str] = []

    async def lookup(prefix: str) -> Children:
        calls.append(prefix)
        return {int(u.rsplit(".", 1)[1]): (u, ("h" * 40,)) for u in declared if u.startswith(prefix)}

    finder = DHTExpertFinder(lookup, ttl_s=3600)
    uids = ["ffn.0.0", "ffn.0.1", "ffn.0.2"]
    assert await finder.wait_for_hosts(uids, timeout=0.05, poll_s=0.01) == 1
    declared.extend(["ffn.0.1", "ffn.0.2"])
    assert await finder.wait_for_hosts(uids, timeout=5, poll_s=0.01) == 3
    assert all(finder.hosts_of(u) for u in uids)
    assert set(calls) == {"ffn.0."} and len(calls) >= 3


async def test_every_refresh_and_every_trainer_call_the_same_replica() -> None:
    """The DHT answers an expert's hosts latest declared first, an order each re-declaration changes:
    the replica called must not follow it (replicas are not averaged; alternating trained two copies
    with half the updates each), and two trainers must agree on it."""
    hosts = tuple(chr(ord("a") + i) * 40 for i in range(3))
    cells = range(5)
    flips = [0]

    async def lookup(prefix: str) -> Children:
        order = hosts if flips[0] % 2 == 0 else hosts[::-1]
        flips[0] += 1
        if prefix == "ffn.":
            return {0: ("ffn.0", ())}
        return {j: (f"ffn.0.{j}", order[j % 2 :] + order[: j % 2]) for j in cells}

    now = [0.0]
    trainers = [DHTExpertFinder(lookup, ttl_s=1, clock=lambda: now[0]) for _ in range(2)]
    scores = [[1.0], [float(j == 4) for j in cells]]
    picks = []
    for step in range(6):
        now[0] = step * 2.0  # past the TTL: every step refreshes, with the hosts in the other order
        for _ in range(2):  # the first find starts a refresh, the second is answered by it
            for f in trainers:
                await f.find_batch("ffn", [scores], 5)
            await asyncio.sleep(0)
        picks.append([dict(await f.find("ffn", scores, 5)) for f in trainers])
    assert flips[0] >= 6
    first = picks[0][0]
    assert all(p == [first, first] for p in picks)
    assert len(set(first.values())) > 1  # the grid's experts still spread over the hosts
    for finder in trainers:
        await finder.close()


async def test_slow_or_failing_first_lookup_is_bounded() -> None:
    import asyncio

    async def slow(prefix: str) -> Children:
        await asyncio.sleep(5)
        return {}

    finder = DHTExpertFinder(slow, first_timeout=0.05)
    t0 = time.monotonic()
    assert await finder.find("ffn", [[1.0], [1.0]], 1) == []
    assert time.monotonic() - t0 < 1.0 and finder.failed_lookups == 1
