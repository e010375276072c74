"""The site's periodic work, run on the coordinator's event loop: range sums and daily dumps.

``start_jobs(app, ...)`` adds a startup hook that runs two loops and a cleanup hook that stops them:
the range leaderboards are re-summed every ``RANGE_EVERY_S`` (``ranges.refresh``), and the dumps of
the current UTC day are written once they are missing (checked every ``EXPORT_CHECK_S``;
``exports.write_dumps``, in a child process when given the database URL). A failure is logged and
retried on the next round; it never stops the site. Given a ``leader`` (``coordinator.replicas.leader``), the
loops are its jobs instead: with several replicas they run on the one that leads, and move with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..replicas.leader import LocalLeader
from . import exports, ranges

RANGE_EVERY_S = 300.0
EXPORT_CHECK_S = 600.0
EXPORT_FIRST_S = 60.0  # after startup: a coordinator restarted in a loop (or a test's) writes nothing
log = logging.getLogger(__name__)
JOBS = web.AppKey("site_jobs", list)


async def _every(period: float, work: Callable[[], Awaitable[object]], what: str, first: float = 0.0) -> None:
    await asyncio.sleep(first)
    while True:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("site job failed: %s (retried in %.0f s)", what, period)
        await asyncio.sleep(period)


def start_jobs(
    app: web.Application,
    get_sessions: Callable[[web.Application], async_sessionmaker[AsyncSession]],
    get_exports_dir: Callable[[web.Application], Path],
    clock: Callable[[], float] = time.time,
    get_database_url: Callable[[web.Application], str] | None = None,
    export_first_s: float = EXPORT_FIRST_S,
    leader: LocalLeader | None = None,
) -> None:
    """``get_database_url``: write the dumps in a child process reading that database (the server's
    loop stays free); None: in this process, formatting in a worker thread."""

    async def refresh_ranges() -> None:
        await ranges.refresh(get_sessions(app), clock())

    async def daily_dump() -> None:
        directory = get_exports_dir(app)
        today = time.strftime("%Y-%m-%d", time.gmtime(clock()))
        done = {(d.kind, d.fmt) for d in exports.listing(directory) if d.date == today}
        if len(done) < len(exports.KINDS) * len(exports.FORMATS):
            if get_database_url is None:
                await exports.write_dumps(get_sessions(app), directory, clock())
            else:
                search_path = await exports.search_path_of(get_sessions(app))
                await exports.write_in_child(
                    get_database_url(app), directory, clock(), search_path=search_path
                )

    if leader is not None:
        leader.add_job("range sums", RANGE_EVERY_S, refresh_ranges)
        leader.add_job("daily dumps", EXPORT_CHECK_S, daily_dump, export_first_s)
        return

    async def start(_: web.Application) -> None:
        app[JOBS] = [
            asyncio.create_task(_every(RANGE_EVERY_S, refresh_ranges, "range sums")),
            asyncio.create_task(_every(EXPORT_CHECK_S, daily_dump, "daily dumps", export_first_s)),
        ]

    async def stop(_: web.Application) -> None:
        for task in app.get(JOBS, []):
            task.cancel()
        for task in app.get(JOBS, []):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
