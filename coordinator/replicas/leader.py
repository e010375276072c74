"""Periodic work that must run on exactly one replica: leadership by a PostgreSQL advisory lock.

Daily rollups into range sums, the daily dumps, pruning expired revocations and idle shared rate
buckets: each replica could run them, but two at once would do the work twice and race. So every
replica runs a :class:`Leader`; the one that holds the session-level advisory lock
``pg_try_advisory_lock(key)`` on its own dedicated connection (``pg_link.Link``) is the leader and
runs the jobs, the others retry every ``retry_s``. Leadership is the connection: when the leader
process dies or its connection is cut, the server releases the lock at once (or, for a machine that
vanished silently, after the TCP keepalives of ``pg_link`` give up, ~30 s), and another replica takes
it on its next try. The old leader stops its jobs the moment its connection reports the close, and
at the latest when its ping (every ``check_s``, timing out after ``check_s``) fails: within
``2 * check_s`` of the cut. A new leader therefore waits ``handover_s`` (more than that) after taking
the lock before it starts the jobs, so the two never run jobs at once unless the old one's event loop
stalls for longer than that; and the jobs are written so that even then an overlap is harmless
(range sums publish a new generation, dumps are renamed into place). Work resumes within
``retry_s + handover_s`` (~7 s by default; + keepalive time for a vanished machine) of the old
leader's death.

SQLite is one process: :class:`LocalLeader` always leads and just runs the jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg  # type: ignore[import-untyped]

from .pg_link import Link, close_quietly, ping

log = logging.getLogger(__name__)
LEADER_LOCK = "leader"


@dataclass(frozen=True)
class Job:
    name: str
    period_s: float
    work: Callable[[], Awaitable[object]]
    first_s: float = 0.0  # after this replica starts leading


async def _every(job: Job) -> None:
    await asyncio.sleep(job.first_s)
    while True:
        try:
            await job.work()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("periodic job failed: %s (retried in %.0f s)", job.name, job.period_s)
        await asyncio.sleep(job.period_s)


class LocalLeader:
    """One process (SQLite): always the leader; runs its jobs while ``run`` runs."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.is_leader = False
        self._tasks: list[asyncio.Task[None]] = []

    def add_job(
        self, name: str, period_s: float, work: Callable[[], Awaitable[object]], first_s: float = 0.0
    ) -> None:
        job = Job(name, period_s, work, first_s)
        self.jobs.append(job)
        if self.is_leader:  # joined while this replica leads: starts now
            self._tasks.append(asyncio.create_task(_every(job), name=f"job-{job.name}"))

    def _start_jobs(self) -> None:
        self.is_leader = True
        self._tasks = [asyncio.create_task(_every(j), name=f"job-{j.name}") for j in self.jobs]

    async def _stop_jobs(self) -> None:
        self.is_leader = False
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self) -> None:
        self._start_jobs()
        try:
            await asyncio.Event().wait()
        finally:
            await self._stop_jobs()


class Leader(LocalLeader):
    """One of N replicas on PostgreSQL: runs the jobs only while it holds the leadership lock."""

    def __init__(
        self, link: Link, *, retry_s: float = 2.0, check_s: float = 2.0, handover_s: float | None = None
    ) -> None:
        super().__init__()
        self.link = link
        self.key = link.lock_key(LEADER_LOCK)
        self.retry_s = retry_s
        self.check_s = check_s
        self.handover_s = 2 * check_s + 1.0 if handover_s is None else handover_s
        self.conn: asyncpg.Connection | None = None
        self.terms = 0  # how many times this replica became the leader

    async def _lead(self, conn: asyncpg.Connection) -> None:
        """Hold leadership for as long as ``conn`` answers (returns when it does not)."""
        self.terms += 1
        log.info("this replica leads the periodic jobs (term %d)", self.terms)
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            # The previous leader may not have seen its loss yet: give it the time to stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), self.handover_s)
            if lost.is_set():
                return
            await ping(conn, timeout=self.check_s)
            self._start_jobs()
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), self.check_s)
                if not lost.is_set():
                    await ping(conn, timeout=self.check_s)
            log.warning("leadership lost with its connection")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("leadership lost with its connection: %s", e)
        finally:
            await self._stop_jobs()

    async def run(self) -> None:
        while True:
            try:
                if self.conn is None or self.conn.is_closed():
                    self.conn = await self.link.connect()
                if await self.conn.fetchval(
                    "SELECT pg_try_advisory_lock($1)", self.key, timeout=self.check_s
                ):
                    await self._lead(self.conn)
                    await close_quietly(self.conn)  # whatever it held is gone or going with it
                    self.conn = None
            except asyncio.CancelledError:
                await close_quietly(self.conn)  # closing the session releases the lock
                self.conn = None
                raise
            except Exception as e:
                log.warning("leader election: %s", e)
                await close_quietly(self.conn)
                self.conn = None
            await asyncio.sleep(self.retry_s)
