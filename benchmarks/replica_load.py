"""``coordinator_load.py --replicas N``: N ``lah coordinator`` replicas on one PostgreSQL behind HAProxy
(``tests/cluster.py``, the configuration of docs/deploy.md), against one coordinator process alone.

1. Data: ``--accounts`` accounts and ``--receipts`` receipts bulk-loaded (COPY, as coordinator_load
   does), plus one account with a bound host for every signaling peer; tokens are issued with the
   group's key, as any replica would.
2. Signaling: ``--peers`` WebSockets (challenge, signed hello with token, welcome) spread by the proxy,
   then a wait until every one is in the presence table (``presence_settle_s``: the burst's claims);
   offers at ``--rate`` per second between random pairs on *different* replicas (relayed through
   PostgreSQL), in ``ROUNDS`` rounds: ``relay_p99_ms_cross`` (median of the rounds' p99, with min and
   max) and ``relay_lost_cross`` (in those rounds, one offer in four goes between peers on the same
   replica: ``relay_p99_ms_same_replica``, the proxy without the database hop). The baseline is
   coordinator_load's own signaling part: one process, no proxy, no database, no tokens, the same
   peers and rate (``relay_p99_ms_single``).
3. Failover: receipts posted through the proxy in batches, each retried until it is answered (as a
   trainer retries), while one replica is killed with SIGKILL. Its peers reconnect like the engine's
   client (after 1 s, doubling) through the proxy; a peer counts as back when an offer from a peer on
   another replica reaches it: ``failover_s_p99`` (from the kill; median over ``KILLS`` kills, each
   of another replica, the previous one restarted and presence settled in between).
   ``receipts_lost``: posted receipts not in the ledger; ``receipts_double``: credit beyond one
   receipt's worth each, in receipts (both summed over the kills).
4. Leaderboard: ``GET /api/leaderboard`` pages through the proxy (any replica, each with its page
   cache, as deployed) vs straight to one replica (``leaderboard_p99_ms_one``).

The peers and the bench that times their offers are ``benchmarks/replica_peers.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import msgspec
from figures import log, p99
from load_rows import COLUMNS, rows_for
from replica_peers import Peer, SignalingBench

from coordinator.accounts.tokens import TokenAuthority, load_signing_key
from coordinator.credit.receipts import ReceiptBatch, sign_receipt
from engine.p2p.identity import Identity
from tests.cluster import Cluster, _dsn

ROUNDS = 3
KILLS = 3  # replicas killed one after another (each brought back before the next): failover's spread
SAME_EVERY = 4  # one offer in four between peers on the same replica, for comparison
RECEIPT_SAMPLES = 10  # every failover receipt is worth the same credit: double credit shows as a count
BATCH = 100
POSTERS = 2


async def seed(
    cluster: Cluster, accounts: int, receipts: int, peers: int
) -> tuple[list[Identity], list[str]]:
    """Bulk-load the ledger and one account (with a bound host) per signaling peer; returns those
    identities (the first is also the receipts' trainer) and tokens for them."""
    identities = [Identity.generate() for _ in range(peers + 1)]
    t0 = time.perf_counter()
    data = rows_for(accounts + peers + 1, receipts, identities)
    conn = await asyncpg.connect(_dsn(cluster.database_url))
    try:
        for table, cols in COLUMNS.items():
            await conn.copy_records_to_table(table, records=data[table], columns=cols)
        for table in ("accounts", "teams"):  # COPY with explicit ids leaves the sequences behind
            await conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    log(
        f"replicas: {accounts} accounts, {receipts} receipts, {peers} peers"
        f" loaded in {time.perf_counter() - t0:.1f} s"
    )
    authority = TokenAuthority(load_signing_key(cluster.workdir / "token.key"), None)  # type: ignore[arg-type]
    tokens = [authority.issue(a + 1, "trainer") for a in range(len(identities))]
    return identities, tokens


async def relay_rounds(
    bench: SignalingBench, peers: list[Peer], rate: float, seconds: float
) -> dict[str, Any]:
    """Offers between peers on different replicas; one in ``SAME_EVERY`` between two on the same
    replica (through the proxy, no database hop): what the relay across replicas adds."""
    rng = random.Random(7)
    p99s, same, lost, sent = [], [], 0, 0
    for _ in range(ROUNDS):
        bench.latencies = []
        same_ids: set[int] = set()
        n = int(rate * seconds / ROUNDS)
        start = time.perf_counter()
        for k in range(n):
            a, b = rng.sample(peers, 2)
            want_same = k % SAME_EVERY == 0
            while (a.replica == b.replica) != want_same:
                a, b = rng.sample(peers, 2)
            msg_id = next(bench.ids)
            if want_same:
                same_ids.add(msg_id)
            bench.sent_at[msg_id] = time.perf_counter()
            await a.offer(msg_id, b)
            delay = start + (k + 1) / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        with contextlib.suppress(TimeoutError):  # late is slow, not lost: wait for stragglers a while
            async with asyncio.timeout(10.0):
                while len(bench.latencies) < n:  # noqa: ASYNC110 (a counter, no event to wait on)
                    await asyncio.sleep(0.1)
        cross = [ms for i, ms in bench.latencies if i not in same_ids]
        same += [ms for i, ms in bench.latencies if i in same_ids]
        lost += n - len(bench.latencies)
        sent += n
        bench.sent_at.clear()
        p99s.append(p99(cross))
        log(f"replicas: {n} offers: cross-replica p99 {p99s[-1]:.1f} ms, lost {n - len(bench.latencies)}")
    return {
        "relay_offers_cross": sent,
        "relay_lost_cross": lost,
        "relay_p99_ms_cross": round(statistics.median(p99s), 2),
        "relay_p99_ms_cross_min": round(min(p99s), 2),
        "relay_p99_ms_cross_max": round(max(p99s), 2),
        "relay_p99_ms_same_replica": round(p99(same), 2),
    }


async def post_receipts(
    url: str, token: str, trainer: Identity, hosts: list[str], stop: asyncio.Event, posted: list[str]
) -> int:
    """Batches until ``stop``; each retried until a replica answers 200 (retries counted)."""
    rng = random.Random()
    retries = 0
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            batch = [
                sign_receipt(
                    trainer, rng.choice(hosts), "bench.0.0", RECEIPT_SAMPLES, False, time.time() - 60
                )
                for _ in range(BATCH)
            ]
            body = msgspec.json.encode(ReceiptBatch(receipts=batch))
            posted.extend(r.receipt_id for r in batch)
            while True:
                try:
                    async with session.post(f"{url}/api/receipts", data=body, headers=headers) as r:
                        if r.status == 200:
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                retries += 1
                await asyncio.sleep(0.2)
    return retries


async def failover(
    cluster: Cluster,
    bench: SignalingBench,
    peers: list[Peer],
    identities: list[Identity],
    tokens: list[str],
    index: int,
) -> dict[str, Any]:
    conn = await asyncpg.connect(_dsn(cluster.database_url))
    hosts = [r["peer_id"] for r in await conn.fetch("SELECT peer_id FROM hosts ORDER BY peer_id LIMIT 200")]
    before = float(await conn.fetchval("SELECT sum(credit_total) FROM hosts WHERE peer_id = ANY($1)", hosts))
    stop = asyncio.Event()
    posted: list[str] = []
    posters = [
        asyncio.create_task(post_receipts(cluster.url, tokens[0], identities[0], hosts, stop, posted))
        for _ in range(POSTERS)
    ]
    await asyncio.sleep(2.0)
    victim = cluster.replicas[index].name
    orphans = [p for p in peers if p.replica == victim]
    bench.back_at = {}
    bench.joined_at = {}
    bench.join_failures = {}
    bench.errors = {}
    killed_at = time.perf_counter()
    cluster.kill(index)
    log(f"replicas: killed {victim} ({len(orphans)} peers on it) with {len(posted)} receipts posted so far")
    rng = random.Random(11)
    async with asyncio.timeout(120):
        while len(bench.back_at) < len(orphans):
            for p in orphans:
                if p.id in bench.back_at or p.ws is None or p.replica == victim:
                    continue
                sender = rng.choice(peers)
                if sender.ws is None or sender.replica in (victim, p.replica):
                    continue
                msg_id = next(bench.ids)
                bench.on_arrival[msg_id] = p
                await sender.offer(msg_id, p)
            await asyncio.sleep(0.5)
            if time.perf_counter() - killed_at > 3.0:
                stop.set()
    stop.set()
    retries = sum(await asyncio.gather(*posters))
    failover_s = [t - killed_at for t in bench.back_at.values()]
    # Welcomed again (admission) vs reachable again (presence claimed, a probe relayed): which one the
    # tail is made of.
    rejoin_s = [bench.joined_at[p.id] - killed_at for p in orphans if p.id in bench.joined_at]
    rows = await conn.fetchval("SELECT count(*) FROM receipts WHERE receipt_id = ANY($1)", posted)
    after = float(await conn.fetchval("SELECT sum(credit_total) FROM hosts WHERE peer_id = ANY($1)", hosts))
    await conn.close()
    extra = (after - before) - rows * RECEIPT_SAMPLES
    return {
        "failover_peers": len(orphans),
        "failover_s_p50": round(statistics.median(failover_s), 2) if failover_s else None,
        "failover_s_p99": round(p99(failover_s), 2),
        "failover_rejoin_s_p50": round(statistics.median(rejoin_s), 2) if rejoin_s else None,
        "failover_rejoin_s_p99": round(p99(rejoin_s), 2),
        "failover_receipts": len(posted),
        "failover_post_retries": retries,
        "receipts_lost": len(posted) - rows,
        "receipts_double": round(extra / RECEIPT_SAMPLES),
        "failed_reconnects": dict(bench.join_failures),
        "hub_errors": dict(bench.errors),
    }


async def settle(cluster: Cluster, peers: int, timeout: float = 120.0) -> float:
    """Seconds until the presence table lists every peer (then 2 s more for the replicas to idle)."""
    t0 = time.perf_counter()
    conn = await asyncpg.connect(_dsn(cluster.database_url))
    try:
        async with asyncio.timeout(timeout):
            while await conn.fetchval("SELECT count(*) FROM presence") < peers:  # noqa: ASYNC110 (a table)
                await asyncio.sleep(0.5)
    finally:
        await conn.close()
    took = time.perf_counter() - t0
    await asyncio.sleep(2.0)
    return took


async def leaderboard_p99(url: str, calls: int) -> float:
    rng = random.Random(3)
    latencies = []
    async with aiohttp.ClientSession() as session:
        for _ in range(calls):
            kind = rng.choice(("users", "users", "hosts", "teams"))
            sort = rng.choice(("total", "recent"))
            page = rng.choice((1, 1, 1, 2, 3, rng.randrange(1, 21)))
            t0 = time.perf_counter()
            async with session.get(f"{url}/api/leaderboard?kind={kind}&sort={sort}&page={page}") as r:
                assert r.status == 200, await r.text()
                await r.read()
            latencies.append((time.perf_counter() - t0) * 1000)
    return round(p99(latencies), 2)


async def bench_replicas(
    replicas: int, peers: int, rate: float, seconds: float, accounts: int, receipts: int, calls: int
) -> dict[str, Any]:
    config = {
        "max_ws_per_ip": 4 * peers + 100,
        "offers_per_minute": 1_000_000,
        "offer_burst": 100_000,
        "receipts_per_account_per_minute": 100_000_000,
    }
    with tempfile.TemporaryDirectory() as tmp:
        async with Cluster(replicas, Path(tmp), config=config, maxconn=peers + 2000) as cluster:
            identities, tokens = await seed(cluster, accounts, receipts, peers)
            bench = SignalingBench(cluster.signaling_url)
            all_peers = [Peer(bench, i, t) for i, t in zip(identities[1:], tokens[1:], strict=True)]
            t0 = time.perf_counter()
            sem = asyncio.Semaphore(64)

            async def join(p: Peer) -> None:
                backoff = 1.0
                for _ in range(6):  # as the engine's client: a refused or failed join is tried again
                    try:
                        async with sem:
                            await p.join()
                        break
                    except (aiohttp.ClientError, AssertionError, TimeoutError, msgspec.DecodeError):
                        await asyncio.sleep(backoff)
                        backoff *= 2
                else:
                    await p.join()
                # Read at once, as a client does: a socket nobody reads answers no heartbeat ping, and
                # the hub closes it 30 s later (the first joins would be dropped before the last one).
                p.task = asyncio.create_task(p.run())

            await asyncio.gather(*(join(p) for p in all_peers))
            connect_s = time.perf_counter() - t0
            spread = {r.name: sum(p.replica == r.name for p in all_peers) for r in cluster.replicas}
            log(
                f"replicas: {len(all_peers)} sockets in {connect_s:.1f} s, spread {spread},"
                f" refusals {bench.errors}"
            )
            out_join_errors = dict(bench.errors)
            bench.errors.clear()
            # Steady state first: every socket's presence row written (the connect burst's claims done).
            out_settle_s = await settle(cluster, len(all_peers))
            log(f"replicas: presence complete {out_settle_s:.1f} s after the last join")
            out: dict[str, Any] = {"replicas": replicas, "ws_peers_replicas": len(all_peers)}
            out["ws_connect_s_replicas"] = round(connect_s, 2)
            out["ws_spread"] = sorted(spread.values())
            out["ws_join_refusals"] = out_join_errors  # the hub's Error codes met while joining
            out["presence_settle_s"] = round(out_settle_s, 2)
            out.update(await relay_rounds(bench, all_peers, rate, seconds))
            out["ws_drops_during_relay"] = dict(bench.drops)
            out["hub_errors_during_relay"] = dict(bench.errors)
            log(f"replicas: sockets dropped during relay {bench.drops}, hub errors {bench.errors}")
            up = await cluster.wait_servers(lambda up: len(up) == replicas, 60)
            log(f"replicas: proxy sees {sorted(up)} up")
            lb_proxy = await leaderboard_p99(cluster.url, calls)
            lb_one = await leaderboard_p99(cluster.replicas[-1].url, calls)
            kills = []
            for k in range(KILLS):  # kill, measure, bring back, let presence settle; the next one
                if k:
                    await cluster.restart(k - 1)
                    await cluster.wait_servers(lambda up: len(up) == replicas, 60)
                    await settle(cluster, len(all_peers))
                kills.append(await failover(cluster, bench, all_peers, identities, tokens, k % replicas))
                log(f"replicas: kill {k + 1}: {kills[-1]}")
            p99s = [f["failover_s_p99"] for f in kills]
            out["failover_peers"] = [f["failover_peers"] for f in kills]
            out["failover_s_p50"] = statistics.median(f["failover_s_p50"] for f in kills)
            out["failover_s_p99"] = statistics.median(p99s)
            out["failover_s_p99_min"], out["failover_s_p99_max"] = min(p99s), max(p99s)
            out["failover_s_p99_each"] = p99s
            out["failover_rejoin_s_p99_each"] = [f["failover_rejoin_s_p99"] for f in kills]
            for key in ("failover_receipts", "failover_post_retries", "receipts_lost", "receipts_double"):
                out[key] = sum(f[key] for f in kills)
            out["failover_failed_reconnects"] = [f["failed_reconnects"] for f in kills]
            out["failover_hub_errors"] = [f["hub_errors"] for f in kills]
            await bench.close(all_peers)
            out["leaderboard_p99_ms_replicas"] = lb_proxy
            out["leaderboard_p99_ms_one"] = lb_one
            out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    sys.exit("run benchmarks/coordinator_load.py --replicas N")
