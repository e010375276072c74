"""Offer relay latency across coordinator replicas (PostgreSQL LISTEN/NOTIFY) against the same relay
inside one replica (the hub's in-memory path), in one run on the same database and machine.

Two full coordinators share a fresh schema of the PostgreSQL at ``--database-url`` (default
``LAH_TEST_POSTGRES_URL``). ``--pairs`` peer pairs join: for ``same`` both peers of a pair are on
replica A, for ``cross`` the recipient is on replica B. Each round every pair's sender sends one signed
offer at once; latency is send to arrival at the recipient's client (after two warm-up rounds).
Everything runs in this one process (both replicas and every client share its loop), so the figures
include that contention.
Prints median, p10-p90 spread and p99 per mode; the last line is the JSON figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from figures import log, p99  # benchmarks/ is this script's folder, first on sys.path
from sqlalchemy import text

from coordinator.accounts.accounts import bind_message
from coordinator.config import CoordinatorConfig
from coordinator.db.migrations import migrate
from coordinator.db.session import make_engine
from coordinator.server.app import RunningCoordinator, start_full
from coordinator.services import open_services
from engine.p2p import signaling_protocol as sp
from engine.p2p.descriptions import new_session_id, sign_description
from engine.p2p.identity import Identity
from engine.p2p.signaling import SignalingClient

DEFAULT_URL = "postgresql+asyncpg://lah:lah@127.0.0.1:5432/lah_test"
SDP = "v=0\r\n" + "a=candidate:1 1 udp 2130706431 192.0.2.1 50000 typ host\r\n" * 20  # ~1.2 KiB


async def replica(url: str, schema: str, tmp: str) -> RunningCoordinator:
    config = CoordinatorConfig(
        port=0,
        database_url=url,
        token_key_path=f"{tmp}/token.key",
        exports_dir=f"{tmp}/exports",
        verify_workers=0,
        max_ws_per_ip=100_000,
        offer_burst=1_000_000,
        offers_per_minute=60_000_000,
    )
    services = await open_services(config, search_path=schema, run_migrations=False)
    return await start_full(config, services)


class Arrivals:
    """When each offer (by session) reached its recipient; ``all_in`` is set once none is awaited."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.awaited: set[str] = set()
        self.all_in = asyncio.Event()

    def expect(self, sessions: set[str]) -> None:
        self.awaited = sessions - set(self.at)
        self.all_in.clear()
        if not self.awaited:
            self.all_in.set()

    def on_signal(self, s: sp.Signal) -> None:
        self.at[s.description.session] = time.perf_counter()
        self.awaited.discard(s.description.session)
        if not self.awaited:
            self.all_in.set()


async def join(r: RunningCoordinator, name: str, arrived: Arrivals) -> tuple[Identity, SignalingClient]:
    accounts = r.services.accounts
    account = await accounts.register(name)
    identity = Identity.generate()
    await accounts.bind_host(account.id, identity.public_key, identity.sign(bind_message(account.id)))
    token = r.services.tokens.issue(account.id, account.role)

    client = SignalingClient(r.signaling_url, identity, arrived.on_signal, token=token)
    await client.connect()
    return identity, client


async def measure(
    pairs: list[tuple[tuple[Identity, SignalingClient], tuple[Identity, SignalingClient]]],
    arrived: Arrivals,
    rounds: int,
) -> list[float]:
    latencies: list[float] = []
    for _ in range(rounds):
        offers = [(a, client, b, new_session_id()) for (a, client), (b, _) in pairs]
        arrived.expect({session for *_, session in offers})
        sent: dict[str, float] = {}
        for a, client, b, session in offers:
            desc = sign_description(a, "offer", SDP, b.peer_id, session)
            sent[session] = time.perf_counter()
            await client.send(b.peer_id, desc)
        await asyncio.wait_for(arrived.all_in.wait(), 60)  # none lost
        latencies += [(arrived.at[s] - t) * 1000 for s, t in sent.items()]
        await asyncio.sleep(0.05)
    return latencies


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=10)
    return {
        "median_ms": round(statistics.median(values), 2),
        "p10_ms": round(q[0], 2),
        "p90_ms": round(q[-1], 2),
        "p99_ms": round(p99(values), 2),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = make_engine(args.database_url)
    async with admin.begin() as c:
        await c.execute(text(f"CREATE SCHEMA {schema}"))
    clients: list[SignalingClient] = []
    replicas: list[RunningCoordinator] = []
    try:
        await migrate(args.database_url, search_path=schema)
        tmp = tempfile.mkdtemp()
        replicas = [await replica(args.database_url, schema, tmp) for _ in range(2)]
        arrived = Arrivals()
        results: dict[str, Any] = {}
        for mode in ("same", "cross"):
            pairs = []
            for i in range(args.pairs):
                sender = await join(replicas[0], f"{mode}s{i}", arrived)
                recipient = await join(replicas[0 if mode == "same" else 1], f"{mode}r{i}", arrived)
                clients += [sender[1], recipient[1]]
                pairs.append((sender, recipient))
            await measure(pairs, arrived, 2)  # warm-up: pools open their connections
            values = await measure(pairs, arrived, args.rounds)
            results[mode] = summary(values)
            log(f"{mode:5s} relay: {results[mode]} over {len(values)} offers")
        return {
            "pairs": args.pairs,
            "rounds": args.rounds,
            "relay_median_ms_same": results["same"]["median_ms"],
            "relay_median_ms_cross": results["cross"]["median_ms"],
            "relay_p99_ms_same": results["same"]["p99_ms"],
            "relay_p99_ms_cross": results["cross"]["p99_ms"],
            "spread_ms_cross": [results["cross"]["p10_ms"], results["cross"]["p90_ms"]],
            "load": os.getloadavg()[0],
        }
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        for r in replicas:
            await r.stop()
        async with admin.begin() as c:
            await c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        await admin.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("LAH_TEST_POSTGRES_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true", help="10 pairs, 10 rounds")
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    args.pairs = args.pairs or (10 if args.quick else 50)
    args.rounds = args.rounds or (10 if args.quick else 40)
    print(json.dumps(asyncio.run(main(args))))
