"""A coordinator killed with SIGKILL leaves no helper process behind: the real ``lah coordinator`` in
its own process, its receipt verifier's pool started by a big batch, then ``kill -9``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import msgspec
import psutil

from coordinator.config import load_config
from coordinator.credit.receipts import ReceiptBatch, sign_receipt
from coordinator.services import open_services

from .ledger_support import make_host

START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _seed(config: Path) -> tuple[str, bytes]:
    """A trainer account with a token, and a batch of its receipts for a volunteer's host (JSON)."""
    services = await open_services(load_config(config))
    try:
        trainer, trainer_id = await make_host(services.sessions, "trainer", role="trainer")
        host, _ = await make_host(services.sessions, "alice")
        token = services.tokens.issue(trainer_id, "trainer")
    finally:
        await services.close()
    now = time.time()
    batch = ReceiptBatch([sign_receipt(trainer, host, "m.0", 1, False, now - i) for i in range(200)])
    return token, msgspec.json.encode(batch)


def _wait_for_site(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    said = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        said.append(line)
        if not line:
            raise AssertionError(f"the coordinator exited ({proc.wait(10)}) before serving: {''.join(said)}")
        if line.startswith("coordinator: site"):
            return
    raise AssertionError("the coordinator did not start in time")


def test_kill_9_of_the_coordinator_leaves_no_helper_process(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "coordinator.toml"
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}"
    config.write_text(
        f'database_url = "{db_url}"\ntoken_key_path = "{tmp_path / "k"}"\nexports_dir = "{tmp_path / "x"}"\n'
        f"port = {port}\nverify_workers = 2\n"
    )
    token, body = asyncio.run(_seed(config))
    code = "import sys; from lah.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "coordinator", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    helpers: list[psutil.Process] = []
    try:
        _wait_for_site(proc)

        async def post() -> dict[str, object]:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            async with aiohttp.ClientSession() as http, asyncio.timeout(60):
                r = await http.post(f"http://127.0.0.1:{port}/api/receipts", data=body, headers=headers)
                assert r.status == 200, await r.text()
                answer: dict[str, object] = await r.json()
                return answer

        assert asyncio.run(post())["accepted"] == 200  # signatures checked in the pool
        helpers = psutil.Process(proc.pid).children(recursive=True)
        assert len(helpers) >= 2  # the verifier's two workers, at least
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=EXIT_TIMEOUT_S)
        _, alive = psutil.wait_procs(helpers, timeout=EXIT_TIMEOUT_S)
        assert alive == [], f"left behind: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT_S)
        for p in helpers:  # only what this test started, if the assertion above failed
            if p.is_running():
                p.kill()
        if proc.stdout is not None:
            proc.stdout.close()
