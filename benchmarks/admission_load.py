"""What admitting a signaling peer costs one coordinator replica on PostgreSQL: hellos per second and
database transactions per hello, for a burst like a failover's (every peer of a dead replica at once).

One full coordinator (``lah coordinator`` as a replica: PostgreSQL, relay group, revocation listener)
in a child process; ``--peers`` accounts with a bound host each (COPY), a token each; then all of them
send their hello at once (at most ``--concurrency`` in flight), straight to the replica (no proxy).
``hellos_per_s``: peers / (first upgrade -> last welcome). ``xacts_per_hello``: the database's committed
and rolled-back transactions during the burst (``pg_stat_database``), per hello.

The baseline is the same replica admitting one hello at a time as it did before batching: revocation
read per token (its per-jti cache is cold for tokens it has never seen), the account and the host
binding read separately through SQLAlchemy, and the presence claim as a transaction of its own. Both
run in one invocation, alternating, ``--rounds`` times each; the figures are medians with min and max.

    .venv/bin/python benchmarks/admission_load.py --quick
    .venv/bin/python benchmarks/admission_load.py --peers 1000 --rounds 3

The last line printed is one JSON object.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aiohttp
import asyncpg
from figures import log

from coordinator.accounts.tokens import TokenAuthority, load_signing_key
from engine.p2p import signaling_protocol as sp
from engine.p2p.identity import Identity

POSTGRES_URL = os.environ.get("LAH_TEST_POSTGRES_URL", "postgresql+asyncpg://lah:lah@127.0.0.1:5432/lah_test")
SCRIPT = os.path.abspath(__file__)


def _dsn() -> str:
    return POSTGRES_URL.replace("+asyncpg", "")


async def serve(mode: str, schema: str, key_path: str, exports: str) -> None:
    """Child: one replica, admitting as ``mode`` says ("batched": the project; "one_by_one": before)."""
    from coordinator.config import CoordinatorConfig
    from coordinator.server.app import start_full
    from coordinator.services import open_services

    config = CoordinatorConfig(
        port=0,
        database_url=POSTGRES_URL,
        token_key_path=key_path,
        exports_dir=exports,
        verify_workers=0,
        max_ws_per_ip=1_000_000,
    )
    services = await open_services(config, search_path=schema, run_migrations=False)
    running = await start_full(config, services)
    if mode == "one_by_one":
        one_by_one(running)
    async with asyncio.timeout(60):  # the listener up and the revocation list loaded, as in service
        while mode == "batched" and not services.tokens.revocations_complete():  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.05)
    print(running.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await running.stop()


def one_by_one(running: Any) -> None:
    """The admission path before batching, on this replica: every read and claim of its own."""
    from coordinator.accounts.accounts import NotFound
    from coordinator.accounts.tokens import TokenError
    from coordinator.hub import relay
    from coordinator.hub.signaling import PeerRefused

    services, group = running.services, running.hub.group
    services.tokens.revocations_complete = lambda: False

    async def authorize(token: str | None, peer_id: str) -> None:
        if token is None:
            raise PeerRefused(sp.TOKEN_REQUIRED, "send a token")
        try:
            claims = await services.tokens.verify(token)
        except TokenError as e:
            raise PeerRefused(e.code, str(e)) from e
        try:
            account = await services.accounts.get(claims.sub)
        except NotFound as e:
            raise PeerRefused(sp.TOKEN_INVALID, "no account") from e
        if account.disabled:
            raise PeerRefused(sp.ACCOUNT_DISABLED, "disabled")
        if await services.accounts.host_owner(peer_id) != claims.sub:
            raise PeerRefused(sp.HOST_NOT_BOUND, "not bound")

    async def claim(peer_id: str, conn: str) -> None:
        async with group._relay_pool().acquire() as c, c.transaction():
            row = await c.fetchrow(
                "UPDATE presence SET replica_id = $2, conn = $3, since = now() "
                "FROM (SELECT peer_id, replica_id, conn FROM presence WHERE peer_id = $1 FOR UPDATE) "
                "AS old WHERE presence.peer_id = old.peer_id RETURNING old.replica_id, old.conn",
                peer_id,
                group.replica_id,
                conn,
            )
            if row is None:
                await c.execute(
                    "INSERT INTO presence (peer_id, replica_id, conn) VALUES ($1, $2, $3) "
                    "ON CONFLICT (peer_id) DO NOTHING",
                    peer_id,
                    group.replica_id,
                    conn,
                )
            elif row[0] != group.replica_id:
                await group._notify(row[0], relay.Evict(peer_id, row[1]))

    running.hub.authorize = authorize
    group.claim = claim


async def seed(schema: str, peers: int, key_path: str) -> tuple[list[Identity], list[str]]:
    from load_rows import COLUMNS, rows_for

    from coordinator.db.migrations import migrate

    conn = await asyncpg.connect(_dsn())
    await conn.execute(f"CREATE SCHEMA {schema}")
    await conn.close()
    await migrate(POSTGRES_URL, search_path=schema)
    identities = [Identity.generate() for _ in range(peers)]
    data = rows_for(peers, 0, identities)
    conn = await asyncpg.connect(_dsn(), server_settings={"search_path": schema})
    try:
        for table in ("teams", "accounts", "hosts"):
            await conn.copy_records_to_table(
                table, records=data[table], columns=COLUMNS[table], schema_name=schema
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
    authority = TokenAuthority(load_signing_key(key_path), None)  # type: ignore[arg-type]
    return identities, [authority.issue(a + 1, "trainer") for a in range(peers)]


async def xacts() -> int:
    conn = await asyncpg.connect(_dsn())
    try:
        return int(
            await conn.fetchval(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
            )
        )
    finally:
        await conn.close()


async def burst(
    mode: str,
    schema: str,
    key_path: str,
    exports: str,
    identities: list[Identity],
    tokens: list[str],
    concurrency: int,
) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, SCRIPT, "--serve", mode, schema, key_path, exports,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    port = int((await asyncio.wait_for(proc.stdout.readline(), 120)).decode())
    url = f"http://127.0.0.1:{port}/ws/signal"
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    sockets: list[aiohttp.ClientWebSocketResponse] = []
    refused: dict[str, int] = {}
    sem = asyncio.Semaphore(concurrency)

    async def hello(identity: Identity, token: str) -> None:
        async with sem:
            ws = await session.ws_connect(url, max_msg_size=1 << 20)
            challenge = sp.client_decoder.decode(await ws.receive_str(timeout=60))
            assert isinstance(challenge, sp.Challenge)
            sig = identity.sign(sp.DOMAIN + challenge.nonce)
            await ws.send_str(sp.encode(sp.Hello(public_key=identity.public_key, signature=sig, token=token)))
            reply = sp.client_decoder.decode(await ws.receive_str(timeout=60))
            if isinstance(reply, sp.Error):
                refused[reply.code] = refused.get(reply.code, 0) + 1
            sockets.append(ws)

    await asyncio.sleep(3.0)  # the replica's start-up work (first beats, leader election) out of the way
    before = await xacts()
    t0 = time.perf_counter()
    await asyncio.gather(*(hello(i, t) for i, t in zip(identities, tokens, strict=True)))
    took = time.perf_counter() - t0
    await asyncio.sleep(1.5)  # pg_stat_database is flushed by each backend at most once a second
    spent = await xacts() - before
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    await session.close()
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
    conn = await asyncpg.connect(_dsn(), server_settings={"search_path": schema})
    await conn.execute("DELETE FROM presence")
    await conn.close()
    log(f"{mode}: {len(identities)} hellos in {took:.2f} s, {spent} transactions, refused {refused}")
    return {
        "per_s": len(identities) / took,
        "xacts": spent / len(identities),
        "refused": sum(refused.values()),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    peers = args.peers or (300 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 3)
    schema = f"adm_{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory() as tmp:
        key_path = str(Path(tmp) / "token.key")
        identities, tokens = await seed(schema, peers, key_path)
        runs: dict[str, list[dict[str, float]]] = {"batched": [], "one_by_one": []}
        try:
            for _ in range(rounds):
                for mode in ("one_by_one", "batched"):
                    runs[mode].append(
                        await burst(mode, schema, key_path, tmp, identities, tokens, args.concurrency)
                    )
        finally:
            conn = await asyncpg.connect(_dsn())
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
            await conn.close()
    out: dict[str, Any] = {"peers": peers, "rounds": rounds, "concurrency": args.concurrency}
    for mode, suffix in (("batched", ""), ("one_by_one", "_one_by_one")):
        rates = [r["per_s"] for r in runs[mode]]
        out[f"hellos_per_s{suffix}"] = round(statistics.median(rates), 1)
        out[f"hellos_per_s{suffix}_min"] = round(min(rates), 1)
        out[f"hellos_per_s{suffix}_max"] = round(max(rates), 1)
        out[f"xacts_per_hello{suffix}"] = round(statistics.median(r["xacts"] for r in runs[mode]), 2)
        out[f"refused{suffix}"] = sum(int(r["refused"]) for r in runs[mode])
    out["speedup"] = round(out["hellos_per_s"] / out["hellos_per_s_one_by_one"], 2)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peers", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=500, help="hellos in flight at once")
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(*args.serve))
    else:
        print(json.dumps(asyncio.run(main(args))))
