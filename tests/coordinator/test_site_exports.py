"""Daily dumps: what they hold, how the site lists and serves them, and a writer killed mid-write."""

from __future__ import annotations

import asyncio
import csv
import gzip
import io
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig
from coordinator.db.session import session_factory
from coordinator.site import exports, setup_routes
from tests.ui_pages.seed import NOW, XSS, seed_small

DAY = time.strftime("%Y-%m-%d", time.gmtime(NOW))
YESTERDAY = time.strftime("%Y-%m-%d", time.gmtime(NOW - 86400))
Client = TestClient[web.Request, web.Application]


def read_gz(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


async def test_dumps_hold_every_enabled_subject_with_documented_columns(
    db: AsyncEngine, tmp_path: Path
) -> None:
    sessions = session_factory(db)
    await seed_small(sessions)
    written = await exports.write_dumps(sessions, tmp_path, NOW)
    assert sorted(p.name for p in written) == sorted(
        f"{k}-{DAY}.{f}.gz" for k in exports.KINDS for f in exports.FORMATS
    )
    for kind, expected in (("users", 14), ("teams", 3), ("hosts", 13)):
        rows = list(csv.DictReader(io.StringIO(read_gz(tmp_path / f"{kind}-{DAY}.csv.gz"))))
        assert len(rows) == expected
        assert list(rows[0]) == [c for c, _ in exports.COLUMNS[kind]]
        objects = json.loads(read_gz(tmp_path / f"{kind}-{DAY}.json.gz"))
        assert len(objects) == expected and list(objects[0]) == list(rows[0])
    users = json.loads(read_gz(tmp_path / f"users-{DAY}.json.gz"))
    names = {u["name"] for u in users}
    assert "banned" not in names and XSS in names  # disabled accounts are left out; names kept verbatim
    u00 = next(u for u in users if u["name"] == "u00")
    assert u00["credit_total"] == 1200.0 and u00["team"] == "red" and u00["joined"].endswith("Z")
    teams = {t["name"]: t for t in json.loads(read_gz(tmp_path / f"teams-{DAY}.json.gz"))}
    assert teams["red"]["members"] == 6
    hosts = list(csv.DictReader(io.StringIO(read_gz(tmp_path / f"hosts-{DAY}.csv.gz"))))
    assert {h["flagged"] for h in hosts} == {"true", "false"}


async def test_empty_database_gives_valid_empty_dumps(db: AsyncEngine, tmp_path: Path) -> None:
    await exports.write_dumps(session_factory(db), tmp_path, NOW)
    assert json.loads(read_gz(tmp_path / f"teams-{DAY}.json.gz")) == []
    assert read_gz(tmp_path / f"teams-{DAY}.csv.gz").splitlines() == [
        ",".join(c for c, _ in exports.COLUMNS["teams"])
    ]


async def test_old_dumps_are_pruned(db: AsyncEngine, tmp_path: Path) -> None:
    sessions = session_factory(db)
    for d in range(4):
        await exports.write_dumps(sessions, tmp_path, NOW - d * 86400, keep=2)
    dates = {d.date for d in exports.listing(tmp_path)}
    assert dates == {DAY, YESTERDAY}


@pytest.fixture
async def site(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[tuple[Client, Path]]:
    sessions = session_factory(db)
    await seed_small(sessions)
    app = web.Application()
    config = CoordinatorConfig()
    setup_routes(
        app, lambda _: sessions, lambda _: config, None, clock=lambda: NOW, get_exports_dir=lambda _: tmp_path
    )
    async with TestClient(TestServer(app)) as client:
        yield client, tmp_path


async def test_exports_page_lists_and_serves_dumps(site: tuple[Client, Path], db: AsyncEngine) -> None:
    client, directory = site
    empty = await client.get("/exports")
    assert empty.status == 200 and "No dump has been written yet" in await empty.text()
    await exports.write_dumps(session_factory(db), directory, NOW)
    page = await (await client.get("/exports")).text()
    for d in exports.listing(directory):
        assert f'href="/exports/{d.name}"' in page
    assert "credit_recent_per_day" in page and re.search(r"\d+(\.\d)? (Bytes|kB)", page)  # columns, sizes
    name = f"users-{DAY}.csv.gz"
    resp = await client.get(f"/exports/{name}", auto_decompress=False)
    body = await resp.read()
    assert resp.status == 200 and resp.headers["Content-Type"] == "application/gzip"
    assert "Content-Encoding" not in resp.headers  # a .gz file, not a compressed transfer of a CSV
    assert body == (directory / name).read_bytes()
    assert resp.headers["Cache-Control"].startswith("public")


KILLED_WRITER = """
import sys, time
from pathlib import Path
from coordinator.site.exports import write_atomic

def chunks():
    for i in range(200):
        yield (f"row {i}," + "x" * 4000 + "\\n").encode() * 20
    print("written", flush=True)
    time.sleep(600)  # still writing when killed
    yield b"never"

write_atomic(Path(sys.argv[1]), sys.argv[2], chunks())
"""


async def test_a_dump_killed_mid_write_leaves_the_previous_one_served(
    site: tuple[Client, Path], db: AsyncEngine
) -> None:
    client, directory = site
    await exports.write_dumps(session_factory(db), directory, NOW - 86400)  # yesterday's dumps
    before = {d.name: (directory / d.name).read_bytes() for d in exports.listing(directory)}
    name = f"users-{DAY}.csv.gz"
    root = str(Path(__file__).parents[2])
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        KILLED_WRITER,
        str(directory),
        name,
        stdout=asyncio.subprocess.PIPE,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        assert line.strip() == b"written"  # the writer is now mid-file
        partial = [p for p in directory.iterdir() if p.name.startswith(f".{name}.partial-")]
        assert len(partial) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), timeout=30)
    assert partial[0].exists() and partial[0].stat().st_size > 0  # the half-written file is left...
    assert not (directory / name).exists()  # ...under a hidden name only
    assert {d.name: (directory / d.name).read_bytes() for d in exports.listing(directory)} == before
    page = await (await client.get("/exports")).text()
    assert name not in page and ".partial" not in page
    assert (await client.get(f"/exports/{partial[0].name}")).status == 404
    for n in before:  # yesterday's dumps are whole and still served
        resp = await client.get(f"/exports/{n}", auto_decompress=False)
        assert resp.status == 200 and gzip.decompress(await resp.read())
    # The next run deletes the leftover and writes today's dumps.
    await exports.write_dumps(session_factory(db), directory, NOW)
    assert not partial[0].exists()
    assert len(read_gz(directory / name).splitlines()) == 15  # header + 14 users


async def test_the_periodic_job_sums_ranges_and_writes_dumps_in_a_child(
    db: AsyncEngine, tmp_path: Path
) -> None:
    """``start_jobs`` as the full app runs it: on startup, range sums are published and a child
    process writes the day's six dumps from the same database (on PostgreSQL, from the same schema:
    the test's tables live in one of their own, which the URL alone does not name)."""
    from coordinator.site import ranges, start_jobs

    url = db.url.render_as_string(hide_password=False)
    sessions = session_factory(db)
    await seed_small(sessions)
    app = web.Application()
    dumps = tmp_path / "dumps"
    start_jobs(
        app,
        lambda _: sessions,
        lambda _: dumps,
        clock=lambda: NOW,
        get_database_url=lambda _: url,
        export_first_s=0.0,
    )
    runner = web.AppRunner(app)
    await runner.setup()  # runs the startup hooks: the jobs begin
    try:
        for _ in range(600):
            if len(exports.listing(dumps)) == 6:
                break
            await asyncio.sleep(0.1)
        assert sorted(d.name for d in exports.listing(dumps)) == sorted(
            f"{k}-{DAY}.{f}.gz" for k in exports.KINDS for f in exports.FORMATS
        )
        assert len(read_gz(dumps / f"users-{DAY}.csv.gz").splitlines()) == 15
        async with sessions() as s:
            assert await ranges.published(s, 30) == NOW
    finally:
        await runner.cleanup()  # stops the loops
