"""Credit integrity: each attack of issue 29 on a real coordinator, and what the checks cost.

Each scenario runs the whole coordinator (``start_full``: in-process aiohttp on loopback, a real
database: SQLite, then PostgreSQL from ``LAH_TEST_POSTGRES_URL``) with real accounts, tokens, signed
and countersigned receipts over HTTP:

- ``minted_by_one_trainer``: a trainer account posts receipts for a colluding volunteer. For a host
  that never held an assignment (target 0 credit), then for one with a real assignment
  (``/api/assignment``; target: at most the (trainer, host) cap of the hours it held it), and receipts
  backdated over the last 30 days (target 0).
- ``reversed_by_other_trainer``: trainer A pays an honest host; trainer B, who never called it, posts
  spot-check reports covering the host's whole life (target 0 credit reversed).
- ``orphans_after_kill``: the real ``lah coordinator`` in its own process, its verifier pool started by
  a big batch, then ``kill -9``: processes left after 10 s (target 0). Once, on SQLite.
- ``throughput``: receipts/s through ``ledger.ingest`` in batches of 1000 from two posters at once
  with a pool of verifier processes (as ``coordinator_load.py`` (c) measures it), beside the same
  receipts through the ledger of ``BASELINE_COMMIT`` (before these checks: the file read from git), on
  the same database, alternating, ``--repeat`` times each: median and spread.

Every scenario is a function in ``SCENARIOS`` (name -> async function of the database kind and the
options, returning its figures): another scenario is one more entry (``receipts_lost_outage``,
``honest_flags`` from the engine side belong there).

    .venv/bin/python benchmarks/credit_integrity.py --quick
    .venv/bin/python benchmarks/credit_integrity.py --databases sqlite

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import msgspec
import psutil
from figures import log  # benchmarks/ is this script's folder, first on sys.path
from sqlalchemy import text

from coordinator.accounts.accounts import bind_message
from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.credit import ledger, rules
from coordinator.credit.receipts import ReceiptBatch, Verifier, sign_receipt, sign_spot_check
from coordinator.db.models import Account, AssignmentSpan, Host
from coordinator.db.session import create_all, make_engine, session_factory
from coordinator.server.app import RunningCoordinator, start_full
from coordinator.services import open_services
from engine.p2p.identity import Identity

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = os.environ.get("LAH_TEST_POSTGRES_URL", "postgresql+asyncpg://lah:lah@127.0.0.1:5432/lah_test")
BASELINE_COMMIT = "b2d149c"  # the ledger before issue 29's checks
EXP = ExperimentConfig(
    name="bench", expert_type="ffn", grid=[4, 4], hyperparams={"d_model": 16, "hidden": 32}
)
Options = argparse.Namespace
Scenario = Callable[[str, Options], Awaitable[dict[str, Any]]]


# ---------------------------------------------------------------- a real coordinator


@asynccontextmanager
async def coordinator(kind: str) -> AsyncIterator[RunningCoordinator]:
    """The whole coordinator on a fresh database of ``kind`` (a PostgreSQL schema of its own)."""
    tmp = tempfile.TemporaryDirectory()
    schema = f"credit_{uuid.uuid4().hex[:10]}" if kind == "postgres" else None
    url = f"sqlite+aiosqlite:///{tmp.name}/c.sqlite3" if kind == "sqlite" else POSTGRES_URL
    if schema is not None:
        admin = make_engine(POSTGRES_URL)
        async with admin.begin() as conn:
            await conn.execute(text(f"CREATE SCHEMA {schema}"))
        await admin.dispose()
    config = CoordinatorConfig(
        port=0,
        database_url=url,
        token_key_path=f"{tmp.name}/k",
        exports_dir=f"{tmp.name}/x",
        experiments=[EXP],
        verify_workers=0,
    )
    services = await open_services(config, search_path=schema, replicas=False)
    running = await start_full(config, services)
    try:
        yield running
    finally:
        await running.stop()
        if schema is not None:
            admin = make_engine(POSTGRES_URL)
            async with admin.begin() as conn:
                await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            await admin.dispose()
        tmp.cleanup()


class Party:
    """An account with one bound key and a bearer token, talking to the coordinator over HTTP."""

    def __init__(self, running: RunningCoordinator, http: aiohttp.ClientSession, name: str) -> None:
        self.running, self.http, self.name = running, http, name
        self.key = Identity.generate()
        self.token = ""

    async def join(self, role: str = "volunteer") -> Party:
        r = await self.http.post("/api/accounts", json={"name": self.name})
        assert r.status == 201, await r.text()
        reg = await r.json()
        account = reg["account"]["id"]
        self.token = reg["token"]
        proof = self.key.sign(bind_message(account))
        body = {"public_key": _b64(self.key.public_key), "signature": _b64(proof)}
        r = await self.post("/api/hosts", body)
        assert r.status in (200, 201), await r.text()
        if role != "volunteer":  # an operator's act (lah coordinator grant-trainer), then a fresh token
            services = self.running.services
            await services.accounts.set_role(self.name, role, by=None)
            self.token = services.tokens.issue(account, role)
        return self

    async def post(self, path: str, body: Any) -> aiohttp.ClientResponse:
        data = msgspec.json.encode(body)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        return await self.http.post(path, data=data, headers=headers)

    async def credit(self) -> float:
        async with self.running.services.sessions() as s:
            row = await s.get(Host, self.key.peer_id)
            return 0.0 if row is None else row.credit_total


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode()


async def post_receipts(trainer: Party, receipts: list[Any]) -> dict[str, int]:
    """Post in batches of 1000; the refusals' reasons, counted."""
    reasons: dict[str, int] = {}
    for i in range(0, len(receipts), 1000):
        r = await trainer.post("/api/receipts", ReceiptBatch(receipts[i : i + 1000]))
        assert r.status == 200, await r.text()
        for refusal in (await r.json())["rejected"]:
            reasons[refusal["reason"]] = reasons.get(refusal["reason"], 0) + 1
    return reasons


# ---------------------------------------------------------------- scenarios


async def minted_by_one_trainer(kind: str, options: Options) -> dict[str, Any]:
    batches = 2 if options.quick else 10
    async with coordinator(kind) as running, aiohttp.ClientSession(running.url) as http:
        trainer = await Party(running, http, "mallory-trainer").join("trainer")
        friend = await Party(running, http, "friend").join()
        now = time.time()
        big = [
            sign_receipt(trainer.key, friend.key, "bench.0.0", 5000, True, now - i * 1e-3)
            for i in range(1000 * batches)
        ]
        no_assignment = await post_receipts(trainer, big)
        minted_unassigned = await friend.credit()

        # A real assignment: the host asks for one, then the trainer bills it as much as it can.
        r = await friend.post("/api/assignment", {"peer_id": friend.key.peer_id, "memory_bytes": 1 << 30})
        assert r.status == 200, await r.text()
        uid = (await r.json())["experts"][0]["uid"]
        held_from = time.time()
        now = time.time()
        billed = [
            sign_receipt(trainer.key, friend.key, uid, 5000, True, now - i * 1e-3)
            for i in range(1000 * batches)
        ]
        with_assignment = await post_receipts(trainer, billed)
        minted_assigned = await friend.credit() - minted_unassigned
        old = [
            sign_receipt(trainer.key, friend.key, uid, 5000, True, now - 3600 - random.uniform(0, 29 * 86400))
            for _ in range(1000)
        ]
        backdated = await post_receipts(trainer, old)
        minted_backdated = await friend.credit() - minted_unassigned - minted_assigned
        config = running.services.config
        caps = rules.CreditCaps(config.host_credit_per_hour, config.pair_credit_share)
        hours = len({rules.hour_of(held_from - rules.HOLD_GRACE_S), rules.hour_of(now)})
    return {
        "minted_without_assignment": minted_unassigned,
        "minted_with_assignment": minted_assigned,
        "cap_with_assignment": caps.pair_cap("cpu") * hours,
        "minted_backdated": minted_backdated,
        "refusals": {"no_assignment": no_assignment, "assigned": with_assignment, "backdated": backdated},
        "attempted_credit": 5000 * 2 * len(big),
    }


async def reversed_by_other_trainer(kind: str, options: Options) -> dict[str, Any]:
    async with coordinator(kind) as running, aiohttp.ClientSession(running.url) as http:
        honest_trainer = await Party(running, http, "trainer-a").join("trainer")
        other_trainer = await Party(running, http, "trainer-b").join("trainer")
        born = time.time()
        host = await Party(running, http, "honest").join()
        r = await host.post("/api/assignment", {"peer_id": host.key.peer_id, "memory_bytes": 1 << 30})
        uid = (await r.json())["experts"][0]["uid"]
        now = time.time()
        receipts = [
            sign_receipt(honest_trainer.key, host.key, uid, 100, False, now - i * 1e-3) for i in range(2000)
        ]
        await post_receipts(honest_trainer, receipts)
        granted = await host.credit()
        statuses: dict[str, int] = {}
        # Five reports covering the host's whole life (the cap stops the last two), and one that starts
        # days before the host existed, from a trainer that never called it.
        starts = [born - 60 + i for i in range(5)] + [born - 3 * 86400]
        for start in starts:
            report = sign_spot_check(other_trainer.key, host.key.peer_id, uid, start, time.time(), "differs")
            r = await other_trainer.post("/api/spot-checks", report)
            code = str(r.status) if r.status == 201 else (await r.json())["error"]
            statuses[code] = statuses.get(code, 0) + 1
        left = await host.credit()
    return {"granted": granted, "reversed_credit": granted - left, "reports": statuses}


async def orphans_after_kill(kind: str, options: Options) -> dict[str, Any]:
    """The real ``lah coordinator`` process, killed with SIGKILL once its verifier pool runs."""
    with tempfile.TemporaryDirectory() as tmp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        config_path = Path(tmp) / "c.toml"
        config_path.write_text(
            f'database_url = "sqlite+aiosqlite:///{tmp}/c.sqlite3"\ntoken_key_path = "{tmp}/k"\n'
            f'exports_dir = "{tmp}/x"\nport = {port}\nverify_workers = 2\n'
        )
        token, body = await _seed_for_kill(config_path)
        proc = _lah_coordinator(config_path)
        helpers: list[psutil.Process] = []
        try:
            assert proc.stdout is not None
            line = ""
            while not line.startswith("coordinator: site"):
                line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
                assert line, "the coordinator exited before serving"
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            async with aiohttp.ClientSession() as http:
                r = await http.post(f"http://127.0.0.1:{port}/api/receipts", data=body, headers=headers)
                assert r.status == 200, await r.text()
            helpers = psutil.Process(proc.pid).children(recursive=True)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            t0 = time.monotonic()
            _, alive = await asyncio.to_thread(psutil.wait_procs, helpers, 10)
            gone_s = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
            for p in helpers:
                if p.is_running():
                    p.kill()
            if proc.stdout is not None:
                proc.stdout.close()
    return {
        "helpers_before_kill": len(helpers),
        "orphans_after_kill": len(alive),
        "gone_within_s": round(gone_s, 2),
    }


def _lah_coordinator(config_path: Path) -> subprocess.Popen[str]:
    code = "import sys; from lah.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, "coordinator", "--config", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )


async def _seed_for_kill(config_path: Path) -> tuple[str, bytes]:
    from coordinator.config import load_config

    services = await open_services(load_config(config_path))
    try:
        trainer, host = Identity.generate(), Identity.generate()
        async with services.sessions() as s, s.begin():
            ta, ha = Account(name="trainer", role="trainer"), Account(name="host")
            s.add_all([ta, ha])
            await s.flush()
            s.add_all(
                [
                    Host(peer_id=trainer.peer_id, public_key=trainer.public_key, account_id=ta.id),
                    Host(peer_id=host.peer_id, public_key=host.public_key, account_id=ha.id),
                ]
            )
            trainer_id = ta.id
        token = services.tokens.issue(trainer_id, "trainer")
    finally:
        await services.close()
    now = time.time()
    batch = ReceiptBatch([sign_receipt(trainer, host, "m.0", 1, False, now - i) for i in range(200)])
    return token, msgspec.json.encode(batch)


# ---------------------------------------------------------------- throughput beside the baseline


def baseline_ingest(commit: str = BASELINE_COMMIT) -> Any:
    """``ingest`` of the ledger at ``commit`` (this repository's own history, read with git), as a module
    of ``coordinator.credit`` so that its relative imports find today's receipts, training and models."""
    source = subprocess.run(
        ["git", "show", f"{commit}:coordinator/credit/ledger.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    name = "coordinator.credit._ledger_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "coordinator.credit"
    sys.modules[name] = module
    exec(compile(source, f"{commit}:coordinator/credit/ledger.py", "exec"), module.__dict__)
    return module.ingest


async def throughput(kind: str, options: Options) -> dict[str, Any]:
    hosts_n, trainers_n = (200, 4) if options.quick else (1000, 8)
    per_run = 4000 if options.quick else 20000
    tmp = tempfile.TemporaryDirectory()
    schema = f"credit_{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        engine = make_engine(f"sqlite+aiosqlite:///{tmp.name}/c.sqlite3")
    else:
        admin = make_engine(POSTGRES_URL)
        async with admin.begin() as conn:
            await conn.execute(text(f"CREATE SCHEMA {schema}"))
        await admin.dispose()
        engine = make_engine(POSTGRES_URL, search_path=schema)
    await create_all(engine)
    sessions = session_factory(engine)
    trainers = [Identity.generate() for _ in range(trainers_n)]
    hosts = [Identity.generate() for _ in range(hosts_n)]
    uid_of = {h.peer_id: f"bench.{i % 4}.{i // 4 % 4}" for i, h in enumerate(hosts)}
    async with sessions() as s, s.begin():
        for i, ident in enumerate([*trainers, *hosts]):
            account = Account(name=f"a{i}", role="trainer" if i < trainers_n else "volunteer")
            s.add(account)
            await s.flush()
            s.add(Host(peer_id=ident.peer_id, public_key=ident.public_key, account_id=account.id))
        await s.flush()
        s.add_all(
            AssignmentSpan(
                host_peer_id=h.peer_id,
                expert_uid=uid_of[h.peer_id],
                held_from=0.0,
                held_until=4e9,
                device="cpu",
                memory_bytes=1 << 30,
            )
            for h in hosts
        )
    rng = random.Random(5)
    now = time.time()

    def make(n: int) -> list[Any]:
        out = []
        for i in range(n):
            h = hosts[rng.randrange(len(hosts))]
            out.append(
                sign_receipt(
                    trainers[i % len(trainers)],
                    h,
                    uid_of[h.peer_id],
                    rng.randrange(1, 512),
                    rng.random() < 0.5,
                    now - rng.uniform(0, 3000),
                )
            )
        return out

    verifier = Verifier(workers=options.workers)
    fns = {"checked": ledger.ingest, "baseline": baseline_ingest()}
    await ledger.ingest(sessions, make(1000), now=now, verifier=verifier)  # warm-up: spawns the pool
    rates: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(options.repeat):
        for name, fn in fns.items():
            receipts = make(per_run)
            batches = [receipts[i : i + 1000] for i in range(0, len(receipts), 1000)]

            async def poster(mine: list[list[Any]], fn: Any = fn) -> int:
                return sum([(await fn(sessions, b, now=now, verifier=verifier)).accepted for b in mine])

            t0 = time.perf_counter()
            accepted = sum(await asyncio.gather(*(poster(batches[i::2]) for i in range(2))))
            rates[name].append(len(receipts) / (time.perf_counter() - t0))
            assert accepted == len(receipts), (name, accepted)
    verifier.close()
    await engine.dispose()
    if kind == "postgres":
        admin = make_engine(POSTGRES_URL)
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        await admin.dispose()
    tmp.cleanup()
    out: dict[str, Any] = {}
    for name, values in rates.items():
        out[f"{name}_receipts_per_s"] = round(statistics.median(values))
        out[f"{name}_spread"] = [round(min(values)), round(max(values))]
    out["checked_over_baseline"] = round(out["checked_receipts_per_s"] / out["baseline_receipts_per_s"], 3)
    return out


#: name -> scenario; ``orphans_after_kill`` runs once (its own SQLite), the others per database.
SCENARIOS: dict[str, Scenario] = {
    "minted_by_one_trainer": minted_by_one_trainer,
    "reversed_by_other_trainer": reversed_by_other_trainer,
    "throughput": throughput,
}
ONCE: dict[str, Scenario] = {"orphans_after_kill": orphans_after_kill}


async def main(options: Options) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, scenario in ONCE.items():
        if options.only and name not in options.only:
            continue
        log(f"{name} ...")
        results[name] = await scenario("sqlite", options)
        log(f"{name}: {results[name]}")
    for kind in options.databases:
        for name, scenario in SCENARIOS.items():
            if options.only and name not in options.only:
                continue
            log(f"{name} on {kind} ...")
            results.setdefault(name, {})[kind] = await scenario(kind, options)
            log(f"{name} on {kind}: {results[name][kind]}")
    return results


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer receipts and repeats (about a minute)")
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"]
    )
    parser.add_argument("--only", nargs="+", help="these scenarios only")
    parser.add_argument("--repeat", type=int, help="throughput runs per ledger (default 3, quick 2)")
    parser.add_argument("--workers", type=int, default=2, help="verifier processes (default 2)")
    options = parser.parse_args(argv)
    if options.repeat is None:
        options.repeat = 2 if options.quick else 3
    return options


if __name__ == "__main__":
    figures = asyncio.run(main(parse()))
    print(json.dumps(figures), flush=True)
