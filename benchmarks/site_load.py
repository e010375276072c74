"""``coordinator_load.py --site``: the project site's finders on the loaded database (search, range
leaderboards, find-my-rank) and the daily dump, with leaderboard pages timed before and during it.

Imported by coordinator_load.py (benchmarks/ is first on a script's sys.path); ``now`` is the time the
loaded rows were generated around.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from figures import log, p99
from sqlalchemy import text

from coordinator.credit.ledger import DAY_S
from coordinator.site import exports as site_exports
from coordinator.site import queries as site_queries
from coordinator.site import ranges as site_ranges
from coordinator.site import rank as site_rank
from coordinator.site import search as site_search


async def bench_site(
    sessions: Any,
    accounts: int,
    calls: int,
    dump_dir: Path,
    url: str,
    search_path: str | None,
    now: float,
) -> dict[str, Any]:
    """The site's finders: name search, range leaderboards (from ``credit_ranges``), find-my-rank, and
    the daily dump (in a child process, as the coordinator's job writes it), with leaderboard pages
    timed before it (the baseline) and while it is written."""
    rng = random.Random(11)
    t0 = time.perf_counter()
    await site_ranges.refresh(sessions, now)
    refresh_s = time.perf_counter() - t0
    log(f"  ranges refreshed in {refresh_s:.2f} s")

    def query() -> tuple[str, str]:
        scope = rng.choice(("users", "users", "teams", "hosts"))
        if scope == "users":
            return scope, "User" + str(rng.randrange(accounts))[: rng.randrange(1, 4)]
        if scope == "teams":
            return scope, "team" + str(rng.randrange(max(1, accounts // 100)))[:2]
        return scope, rng.randbytes(2).hex()[: rng.randrange(1, 5)]

    async def search_once() -> None:
        scope, q = query()
        async with sessions() as session:
            await site_search.search(session, q, scope, page=rng.choice((1, 1, 2, 5)), per_page=25)  # type: ignore[arg-type]

    async def range_once() -> None:
        kind = rng.choice(("users", "users", "hosts", "teams"))
        rng_name = rng.choice(("day", "week", "month"))
        page = rng.choice((1, 1, 1, 2, 3, rng.randrange(1, 21)))
        await site_queries.range_leaderboard_page(sessions, kind, rng_name, page, 25)  # type: ignore[arg-type]

    async def rank_once() -> None:
        name = f"user{rng.randrange(accounts)}"
        order = rng.choice(("total", "week", "month"))
        async with sessions() as session:
            found = await site_rank.resolve(session, "users", name)
            assert found is not None
            await site_rank.position(session, "users", order, found[0], now)

    async def lat(work: Callable[[], Awaitable[None]], n: int) -> list[float]:
        for _ in range(5):
            await work()  # warm-up
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await work()
            out.append((time.perf_counter() - t) * 1000)
        return out

    async def naive_range_once() -> None:
        """The baseline: one page summed from the rollups per view (what ``credit_ranges`` avoids)."""
        today = int(now // DAY_S)
        days = rng.choice((1, 7, 30))
        q = text(
            "SELECT subject_id, SUM(credit) AS c FROM credit_days WHERE subject_kind = 'account'"
            " AND day > :lo AND day <= :hi GROUP BY subject_id ORDER BY c DESC LIMIT 26"
        )
        async with sessions() as session:
            await session.execute(q, {"lo": today - days, "hi": today})

    search_ms = await lat(search_once, calls)
    range_ms = await lat(range_once, calls)
    naive_ms = await lat(naive_range_once, 10)
    rank_ms = await lat(rank_once, max(20, calls // 4))

    # The dump, with leaderboard pages requested all along (the page p99 it causes), against the same
    # pages without it.
    async def page_once() -> None:
        await site_queries.leaderboard_page(sessions, "users", "total", rng.randrange(1, 21), 25, now)

    baseline = await lat(page_once, max(50, calls // 2))
    during: list[float] = []
    done = asyncio.Event()

    async def pages() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await page_once()
            during.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.01)

    reader = asyncio.create_task(pages())
    t0 = time.perf_counter()
    await site_exports.write_in_child(url, dump_dir, now, search_path=search_path)
    dump_s = time.perf_counter() - t0
    done.set()
    await reader
    size = sum(d.size for d in site_exports.listing(dump_dir))
    out = {
        "search_p99_ms": round(p99(search_ms), 2),
        "search_median_ms": round(statistics.median(search_ms), 2),
        "search_spread_ms": [round(min(search_ms), 2), round(max(search_ms), 2)],
        "range_p99_ms": round(p99(range_ms), 2),
        "range_median_ms": round(statistics.median(range_ms), 2),
        "range_spread_ms": [round(min(range_ms), 2), round(max(range_ms), 2)],
        "naive_range_median_ms": round(statistics.median(naive_ms), 2),
        "naive_range_p99_ms": round(p99(naive_ms), 2),
        "rank_p99_ms": round(p99(rank_ms), 2),
        "ranges_refresh_s": round(refresh_s, 2),
        "dump_s": round(dump_s, 2),
        "dump_bytes": size,
        "page_p99_ms": round(p99(baseline), 2),
        "page_p99_during_dump_ms": round(p99(during), 2),
        "pages_during_dump": len(during),
    }
    log(f"  site: {out}")
    return out
