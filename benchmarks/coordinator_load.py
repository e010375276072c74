"""Coordinator load: signaling WebSockets, leaderboard latency on both databases, receipt ingestion.

(a) signaling (benchmarks/signaling_load.py): the coordinator (a hub without tokens) in a child process;
    this process opens ``--peers`` raw WebSockets (challenge, signed hello, welcome), keeps them all
    open, and sends offers between random pairs at ``--rate`` per second (each recipient answers).
    ``relay_p99_ms``: offer sent -> offer received at the other peer, through the hub.
(b) leaderboard: ``--accounts`` accounts (one host each, 1% as many teams) and ``--receipts`` receipts,
    bulk-loaded (sqlite3 executemany; PostgreSQL COPY), then ``leaderboard()`` for users, teams and hosts,
    by total and recent, on random pages 1-20. p99 per database.
(d) site: name search (``coordinator.site.search``), range leaderboards (``credit_ranges``, summed from
    rollups built for those receipts), find-my-rank, and the daily dump of every user, team and host
    while leaderboard pages are timed: ``search_p99_ms``, ``range_p99_ms``, ``dump_s``,
    ``page_p99_during_dump_ms`` per database. ``--site`` runs only this part.
(c) ingestion: signed receipts for 1,000 active hosts of that database through ``ledger.ingest`` in
    batches of 1000 (verify, dedupe, credit), two posters at once, signatures checked in a pool of
    ``--workers`` spawned processes; the baseline is one receipt per call (one transaction each).

    .venv/bin/python benchmarks/coordinator_load.py --quick    # within 60 s
    .venv/bin/python benchmarks/coordinator_load.py            # 2,000 peers, 100k accounts, 1M receipts
    .venv/bin/python benchmarks/coordinator_load.py --site --databases sqlite   # the site's figures only
    .venv/bin/python benchmarks/coordinator_load.py --replicas 3 [--quick]      # replicas behind HAProxy

``--replicas N`` runs benchmarks/replica_load.py instead of (b)-(d): N ``lah coordinator`` processes on
one PostgreSQL behind HAProxy, against (a) run in the same process as the single-process baseline.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import asyncpg
from figures import log, p99  # benchmarks/ is this script's folder, first on sys.path
from load_rows import COLUMNS, NOW, rows_for
from signaling_load import bench_signaling, raise_fd_limit
from site_load import bench_site
from sqlalchemy import text

from coordinator.credit.leaderboard import leaderboard
from coordinator.credit.ledger import ingest
from coordinator.credit.receipts import Verifier, sign_receipt
from coordinator.db.session import create_all, make_engine, session_factory
from engine.p2p import eventloop
from engine.p2p.identity import Identity

POSTGRES_URL = os.environ.get("LAH_TEST_POSTGRES_URL", "postgresql+asyncpg://lah:lah@127.0.0.1:5432/lah_test")
TRAINERS = 8
STREAMS = 2  # concurrent batch posters in the ingestion benchmark
ACTIVE_HOSTS = 1000  # hosts receipts go to: those serving the experts the trainers use
SITE_FIGURES = (
    "search_p99_ms",
    "range_p99_ms",
    "naive_range_p99_ms",
    "rank_p99_ms",
    "ranges_refresh_s",
    "dump_s",
    "page_p99_ms",
    "page_p99_during_dump_ms",
)


# ---------------------------------------------------------------- (b) bulk data


def load_sqlite(path: Path, data: dict[str, list[tuple[Any, ...]]]) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    with conn:
        for table, cols in COLUMNS.items():
            marks = ", ".join("?" for _ in cols)
            conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", data[table])
    conn.execute("ANALYZE")
    conn.close()


async def load_postgres(schema: str, data: dict[str, list[tuple[Any, ...]]]) -> None:
    conn = await asyncpg.connect(
        POSTGRES_URL.replace("+asyncpg", ""), server_settings={"search_path": schema}
    )
    try:
        for table, cols in COLUMNS.items():
            await conn.copy_records_to_table(table, records=data[table], columns=cols, schema_name=schema)
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


# ---------------------------------------------------------------- (b) leaderboard, (c) ingestion


async def bench_leaderboard(sessions: Any, calls: int) -> float:
    rng = random.Random(3)
    latencies = []
    by_case: dict[str, list[float]] = {}
    for kind in ("users", "teams", "hosts"):  # warm-up
        for sort in ("total", "recent"):
            await leaderboard(sessions, kind, sort)  # type: ignore[arg-type]
    for _ in range(calls):
        kind = rng.choice(("users", "users", "hosts", "teams"))
        sort = rng.choice(("total", "recent"))
        page = rng.choice((1, 1, 1, 2, 3, rng.randrange(1, 21)))
        t0 = time.perf_counter()
        await leaderboard(sessions, kind, sort, page=page, per_page=50)  # type: ignore[arg-type]
        latencies.append((time.perf_counter() - t0) * 1000)
        by_case.setdefault(f"{kind}/{sort}", []).append(latencies[-1])
    log("leaderboard p99 by case (ms):", {k: round(p99(v), 1) for k, v in sorted(by_case.items())})
    return round(p99(latencies), 2)


async def bench_ingest(
    sessions: Any, trainers: list[Identity], host_ids: list[str], batched: int, single: int, workers: int
) -> dict[str, float]:
    rng = random.Random(5)
    active = host_ids[:ACTIVE_HOSTS]

    def make(n: int) -> list[Any]:
        return [
            sign_receipt(
                trainers[i % len(trainers)],
                active[rng.randrange(len(active))],
                f"bench.{rng.randrange(16)}.{rng.randrange(16)}",
                rng.randrange(1, 512),
                rng.random() < 0.5,
                NOW - rng.uniform(0, 3600),
            )
            for i in range(n)
        ]

    receipts = make(batched)
    t0 = time.perf_counter()
    await Verifier().check(receipts[:2000])
    verify_rate = min(2000, len(receipts)) / (time.perf_counter() - t0)
    verifier = Verifier(workers=workers)
    await ingest(sessions, make(1000), now=NOW, verifier=verifier)  # warm-up: spawns the pool
    t0 = time.perf_counter()
    batches = [receipts[i : i + 1000] for i in range(0, len(receipts), 1000)]

    async def poster(mine: list[list[Any]]) -> int:
        n = 0
        for batch in mine:
            n += (await ingest(sessions, batch, now=NOW, verifier=verifier)).accepted
        return n

    # STREAMS trainers posting at once: one batch's signatures are checked while another's is written.
    accepted = sum(await asyncio.gather(*(poster(batches[i::STREAMS]) for i in range(STREAMS))))
    batched_s = time.perf_counter() - t0
    assert accepted == len(receipts), accepted
    again = await ingest(sessions, receipts[:1000], now=NOW, verifier=verifier)  # all duplicates now
    assert again.duplicates == min(1000, len(receipts)) and again.accepted == 0

    singles = make(single)
    t0 = time.perf_counter()
    for r in singles:
        await ingest(sessions, [r], now=NOW, verifier=verifier)
    single_s = time.perf_counter() - t0
    verifier.close()
    batched_rate = len(receipts) / batched_s
    single_rate = len(singles) / single_s
    return {
        "receipts_per_s": round(batched_rate),
        "single_receipts_per_s": round(single_rate),
        "batch_speedup": round(batched_rate / single_rate, 1),
        "verify_only_per_s_one_core": round(verify_rate),
    }


async def bench_database(
    which: str,
    accounts: int,
    receipts: int,
    calls: int,
    batched: int,
    single: int,
    workers: int,
    site_only: bool = False,
) -> dict[str, Any]:
    trainers = [Identity.generate() for _ in range(TRAINERS)]
    t0 = time.perf_counter()
    data = rows_for(accounts, receipts, trainers)
    host_ids = [h[0] for h in data["hosts"][TRAINERS:]]
    tmp = tempfile.TemporaryDirectory()
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    if which == "sqlite":
        path = Path(tmp.name) / "coordinator.sqlite3"
        engine = make_engine(f"sqlite+aiosqlite:///{path}")
        await create_all(engine)
        await engine.dispose()
        await asyncio.to_thread(load_sqlite, path, data)
        engine = make_engine(f"sqlite+aiosqlite:///{path}")
    else:
        admin = make_engine(POSTGRES_URL)
        async with admin.begin() as conn:
            await conn.execute(text(f"CREATE SCHEMA {schema}"))
        await admin.dispose()
        engine = make_engine(POSTGRES_URL, search_path=schema)
        await create_all(engine)
        await load_postgres(schema, data)
    del data
    # As a long-running server would after start-up: the bulk-load leftovers and the modules loaded
    # so far are moved out of the collector's way, or a full collection costs ~100 ms mid-request.
    gc.collect()
    gc.freeze()
    load_s = time.perf_counter() - t0
    log(f"{which}: {accounts} accounts, {receipts} receipts loaded in {load_s:.1f} s")
    try:
        sessions = session_factory(engine)
        url = (
            f"sqlite+aiosqlite:///{Path(tmp.name) / 'coordinator.sqlite3'}"
            if which == "sqlite"
            else POSTGRES_URL
        )
        site = await bench_site(
            sessions,
            accounts,
            calls,
            Path(tmp.name) / "exports",
            url,
            schema if which == "postgres" else None,
            NOW,
        )
        if site_only:
            return {"load_s": round(load_s, 1), **site}
        lb = await bench_leaderboard(sessions, calls)
        log(f"{which}: leaderboard p99 {lb} ms")
        ing = await bench_ingest(sessions, trainers, host_ids, batched, single, workers)
        log(f"{which}: ingest {ing}")
    finally:
        await engine.dispose()
        if which == "postgres":
            admin = make_engine(POSTGRES_URL)
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            await admin.dispose()
        tmp.cleanup()
    return {"load_s": round(load_s, 1), "leaderboard_p99_ms": lb, **ing, **site}


async def timed(what: str, coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = await coro
    log(f"{what}: {time.perf_counter() - t0:.1f} s")
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit()
    quick = args.quick
    peers = args.peers or (300 if quick else 2000)
    accounts = args.accounts or (10_000 if quick else 100_000)
    receipts = args.receipts or (100_000 if quick else 1_000_000)
    calls = 100 if quick else 400
    batched, single = (5000, 300) if quick else (20_000, 1000)
    result: dict[str, Any] = {"quick": quick, "accounts": accounts, "receipts": receipts}
    if args.replicas:
        from replica_load import bench_replicas

        peers = args.peers or (300 if quick else 3000)
        rate = args.rate if args.rate else 100.0
        seconds = 6.0 if quick else 15.0
        single = await timed("signaling, one process", bench_signaling(peers, rate, seconds))
        result.update({f"{k}_single": v for k, v in single.items()})
        result.update(
            await timed(
                f"{args.replicas} replicas",
                bench_replicas(args.replicas, peers, rate, seconds, accounts, receipts, calls),
            )
        )
        return result
    if not args.site:
        sig = await timed("signaling", bench_signaling(peers, args.rate or 500.0, 3.0 if quick else 10.0))
        result.update(sig)
    runs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "sqlite": lambda: bench_database(
            "sqlite", accounts, receipts, calls, batched, single, args.workers, args.site
        ),
        "postgres": lambda: bench_database(
            "postgres", accounts, receipts, calls, batched, single, args.workers, args.site
        ),
    }
    for which in args.databases.split(","):
        out = await timed(which, runs[which]())
        for key in SITE_FIGURES:
            result[f"{key}_{which}"] = out[key]
        result[f"load_s_{which}"] = out["load_s"]
        if args.site:
            continue
        result[f"leaderboard_p99_ms_{which}"] = out["leaderboard_p99_ms"]
        suffix = "" if which == "sqlite" else "_postgres"
        result[f"receipts_per_s{suffix}"] = out["receipts_per_s"]
        result[f"single_receipts_per_s{suffix}"] = out["single_receipts_per_s"]
        result[f"batch_speedup{suffix}"] = out["batch_speedup"]
        result["verify_only_per_s_one_core"] = out["verify_only_per_s_one_core"]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peers", type=int, default=0)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="offers per second (default 500; 100 with --replicas)"
    )
    parser.add_argument("--accounts", type=int, default=0)
    parser.add_argument("--receipts", type=int, default=0)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="signature-checking processes (0: in-process)",
    )
    parser.add_argument(
        "--site",
        action="store_true",
        help="only the site's figures (search, ranges, dump): no signaling, ingestion",
    )
    parser.add_argument(
        "--replicas", type=int, default=0, help="N coordinator replicas behind HAProxy (replica_load.py)"
    )
    parser.add_argument("--databases", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    args = parser.parse_args()
    t0 = time.perf_counter()
    # --replicas: thousands of fake peers in this one process; on uvloop, as the engine's nodes run
    # (engine.p2p.eventloop), so the peers' own CPU is less of what a failover here measures.
    out = eventloop.run(main(args)) if args.replicas else asyncio.run(main(args))
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
