"""N real ``lah coordinator`` processes on one PostgreSQL database behind a real HAProxy.

The tests (``tests/coordinator/test_cluster_proxy.py``) and the benchmark
(``benchmarks/coordinator_load.py --replicas N``) share it. Each replica is started exactly as an
operator would start one: ``lah coordinator --config FILE --port P`` with ``LAH_DATABASE_URL`` in the
environment and nothing else to say that it joins a group. The proxy's configuration is rendered from
``deploy/haproxy.cfg.template``, the file docs/deploy.md shows; ``python -m tests.cluster 3`` prints it.

Errors: :class:`ClusterError` (a process that did not come up or exited early, with its log's tail).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "haproxy.cfg.template"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"  # Debian's package (scripts/services)
DATABASE = "lah_replica_deploy"  # a database of its own: the cluster empties it on start
START_TIMEOUT_S = 90.0  # a replica imports the coordinator (seconds on a loaded 2-core box) and migrates


class ClusterError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cluster_database_url() -> str:
    """``LAH_CLUSTER_POSTGRES_URL``, else ``LAH_TEST_POSTGRES_URL``'s server with a database of its own."""
    explicit = os.environ.get("LAH_CLUSTER_POSTGRES_URL")
    if explicit:
        return explicit
    base = urlsplit(
        os.environ.get("LAH_TEST_POSTGRES_URL", "postgresql+asyncpg://lah:lah@127.0.0.1:5432/lah_test")
    )
    return urlunsplit((base.scheme, base.netloc, f"/{DATABASE}", base.query, base.fragment))


def raise_fd_limit() -> None:
    """Thousands of sockets (clients here, the proxy and replicas as children) need the hard limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def render_haproxy_config(
    bind: str,
    servers: list[tuple[str, str, int]],
    stats_socket: str,
    maxconn: int = 8000,
) -> str:
    """The proxy's configuration: ``servers`` are (name, host, port) of the replicas."""
    lines = [f"    server {name} {host}:{port} check" for name, host, port in servers]
    return string.Template(TEMPLATE.read_text()).substitute(
        bind=bind,
        servers="\n".join(lines),
        stats_socket=stats_socket,
        maxconn=maxconn,
        server_maxconn=maxconn,
    )


def _dsn(url: str, database: str | None = None) -> str:
    """asyncpg's DSN from the SQLAlchemy URL (optionally another database on the same server)."""
    parts = urlsplit(url.replace("+asyncpg", ""))
    path = f"/{database}" if database is not None else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


async def reset_database(url: str) -> None:
    """Create the database if it is missing, then empty it: replicas start on a blank one."""
    name = urlsplit(url).path.lstrip("/")
    admin = await asyncpg.connect(_dsn(url, "postgres"))
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(_dsn(url))
    try:
        await conn.execute("DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class Replica:
    name: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    """``async with Cluster(n, workdir) as c``: replicas up and the proxy seeing them all healthy."""

    replicas_wanted: int
    workdir: Path
    database_url: str = field(default_factory=lambda: cluster_database_url())
    config: dict[str, Any] = field(default_factory=dict)  # extra coordinator settings (TOML scalars)
    maxconn: int = 8000
    reset: bool = True  # empty the database first
    replicas: list[Replica] = field(default_factory=list)
    proxy_port: int = 0
    proxy: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def signaling_url(self) -> str:
        return f"ws://127.0.0.1:{self.proxy_port}/ws/signal"

    @property
    def stats_socket(self) -> Path:
        return self.workdir / "haproxy.sock"

    @property
    def config_path(self) -> Path:
        return self.workdir / "coordinator.toml"

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        raise_fd_limit()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.reset:
            await reset_database(self.database_url)
        self._write_coordinator_config()
        self.replicas = [
            Replica(f"r{i + 1}", free_port(), self.workdir / f"r{i + 1}.log")
            for i in range(self.replicas_wanted)
        ]
        for replica in self.replicas:  # all at once, as an operator's process manager would
            self._spawn(replica)
        await asyncio.gather(*(self.wait_healthy(r) for r in self.replicas))
        self.proxy_port = free_port()
        await self.start_proxy()

    def _write_coordinator_config(self) -> None:
        # One token key for the whole group: every replica must accept the tokens any other issued.
        # Written before any replica starts so that none of them races to create it.
        from coordinator.accounts.tokens import load_signing_key

        key = self.workdir / "token.key"
        load_signing_key(key)
        settings: dict[str, Any] = {
            "host": "127.0.0.1",
            "token_key_path": str(key),
            "exports_dir": str(self.workdir / "exports"),
            "trusted_proxies": ["127.0.0.1"],
            "verify_workers": 0,
            **self.config,
        }
        self.config_path.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in settings.items()))

    def _spawn(self, replica: Replica) -> None:
        env = {**os.environ, "LAH_DATABASE_URL": self.database_url}
        cmd = [sys.executable, "-m", "lah", "coordinator", "--config", str(self.config_path)]
        with replica.log.open("ab") as log:
            replica.proc = subprocess.Popen(
                [*cmd, "--port", str(replica.port)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    async def wait_healthy(self, replica: Replica, timeout: float = START_TIMEOUT_S) -> None:
        """Until the replica's own /healthz answers 200 (its database reachable, migrations done)."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if not replica.alive:
                    raise ClusterError(f"replica {replica.name} exited:\n{_tail(replica.log)}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{replica.url}/healthz", timeout=aiohttp.ClientTimeout(5)) as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.2)
        raise ClusterError(f"replica {replica.name} not healthy in {timeout:.0f} s:\n{_tail(replica.log)}")

    async def start_proxy(self, timeout: float = 30.0) -> None:
        """(Re)start HAProxy on ``proxy_port``; returns once it reports every live replica UP."""
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(
            render_haproxy_config(
                f"127.0.0.1:{self.proxy_port}",
                [(r.name, "127.0.0.1", r.port) for r in self.replicas],
                str(self.stats_socket),
                self.maxconn,
            )
        )
        log = (self.workdir / "haproxy.log").open("ab")
        self.proxy = subprocess.Popen(  # noqa: ASYNC220 (a child that outlives this call; nothing to await)
            [HAPROXY, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        want = {r.name for r in self.replicas if r.alive}
        await self.wait_servers(lambda up: want <= up, timeout)

    async def server_states(self) -> dict[str, str]:
        """Each replica's state as the proxy's health checks see it (UP, DOWN, ...), from its runtime API."""
        reader, writer = await asyncio.open_unix_connection(str(self.stats_socket))
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            data = (await reader.read()).decode()
        finally:
            writer.close()
        states = {}
        lines = data.splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == "replicas" and row.get("svname") not in ("FRONTEND", "BACKEND"):
                states[row["svname"]] = row["status"]
        return states

    async def wait_servers(self, ok: Any, timeout: float = 30.0) -> set[str]:
        """Until ``ok(set of replicas the proxy has UP)`` holds."""
        deadline = time.monotonic() + timeout
        up: set[str] = set()
        while time.monotonic() < deadline:
            if self.proxy is None or self.proxy.poll() is not None:
                raise ClusterError(f"haproxy exited:\n{_tail(self.workdir / 'haproxy.log')}")
            with contextlib.suppress(OSError, IndexError):
                up = {name for name, state in (await self.server_states()).items() if state.startswith("UP")}
                if ok(up):
                    return up
            await asyncio.sleep(0.2)
        raise ClusterError(f"proxy sees {sorted(up)} up after {timeout:.0f} s")

    def kill(self, index: int) -> Replica:
        """SIGKILL one replica: no cleanup, its sockets and presence rows die with it."""
        replica = self.replicas[index]
        if replica.proc is not None and replica.alive:
            replica.proc.send_signal(signal.SIGKILL)
            replica.proc.wait(10)
        return replica

    async def restart(self, index: int) -> None:
        replica = self.replicas[index]
        self.kill(index)
        self._spawn(replica)
        await self.wait_healthy(replica)

    def kill_proxy(self) -> None:
        """SIGKILL the proxy: every socket through it drops at once, mid-frame or not."""
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.send_signal(signal.SIGKILL)
            self.proxy.wait(10)

    async def stop(self) -> None:
        self.kill_proxy()
        for replica in self.replicas:
            if replica.alive:
                assert replica.proc is not None
                replica.proc.terminate()
        for replica in self.replicas:
            if replica.proc is not None:
                try:
                    await asyncio.to_thread(replica.proc.wait, 15)
                except subprocess.TimeoutExpired:
                    replica.proc.kill()
                    replica.proc.wait(5)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


if __name__ == "__main__":  # the configuration docs/deploy.md shows
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(
        render_haproxy_config(
            "0.0.0.0:8470",
            [(f"r{i + 1}", "127.0.0.1", 8471 + i) for i in range(n)],
            "/run/haproxy/lah.sock",
        ),
        end="",
    )
