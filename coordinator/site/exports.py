"""Daily dumps of users, teams and hosts (CSV and JSON, gzip) for third-party stats sites.

Files are named ``<kind>-<YYYY-MM-DD>.<csv|json>.gz`` (the UTC day they were written). Each is written to
a hidden temporary file in the same directory (``.<name>.partial-<pid>``), flushed to disk, then renamed
over its final name: a rename within one directory is atomic, so a reader (or the site) sees the old
dump or the whole new one, and a job killed mid-write leaves only a hidden partial file that ``listing``
never shows and the next run deletes. One job writes a directory at a time (the periodic job).

Rows are read in keyset batches and formatted and compressed in a worker thread, so a dump of
100,000 users does not hold the event loop (pages keep being served meanwhile). ``COLUMNS``
documents every column; the exports page prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import gzip
import io
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..credit.ledger import decay, rac_per_day
from ..db.models import Account, Host, Team

KINDS = ("users", "teams", "hosts")
FORMATS = ("csv", "json")
BATCH = 2000
KEEP_DAYS = 7
NAME_RE = re.compile(r"^(users|teams|hosts)-(\d{4}-\d{2}-\d{2})\.(csv|json)\.gz$")

#: kind -> [(column, meaning)]; the CSV header and the JSON keys, in this order.
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "users": [
        ("id", "account id (stable; the contributor page is /contributors/<id>)"),
        ("name", "display name (Unicode, NFC)"),
        ("team_id", "team id, empty/null when in no team"),
        ("team", "team name, empty/null when in no team"),
        ("credit_total", "all credit ever granted"),
        ("credit_recent_per_day", "recent average credit per day (7-day half-life), as of the dump"),
        ("joined", "registration time, ISO 8601 UTC"),
    ],
    "teams": [
        ("id", "team id (the team page is /teams/<id>)"),
        ("name", "team name"),
        ("members", "enabled accounts in the team"),
        ("credit_total", "all credit ever granted to members while in the team"),
        ("credit_recent_per_day", "recent average credit per day, as of the dump"),
        ("created", "creation time, ISO 8601 UTC"),
    ],
    "hosts": [
        ("peer_id", "host id: hash of the host's public key (the host page is /hosts/<peer_id>)"),
        ("account_id", "owning account id"),
        ("credit_total", "all credit ever granted to this host"),
        ("credit_recent_per_day", "recent average credit per day, as of the dump"),
        ("requests_served", "expert requests this host answered"),
        ("last_seen", "last contact with the coordinator, ISO 8601 UTC (empty/null: never)"),
        ("flagged", "true when spot checks found wrong results"),
    ],
}


class ExportError(OSError):
    """A dump could not be written (disk full, directory missing): the previous dump stays served."""


@dataclass(frozen=True)
class Dump:
    name: str
    kind: str
    fmt: str
    date: str
    size: int
    written: float  # mtime


def listing(directory: Path) -> list[Dump]:
    """Complete dumps only, newest date first (hidden partial files never match ``NAME_RE``)."""
    out = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for e in entries:
        m = NAME_RE.match(e.name)
        if m is None or not e.is_file():
            continue
        st = e.stat()
        out.append(Dump(e.name, m.group(1), m.group(3), m.group(2), st.st_size, st.st_mtime))
    out.sort(key=lambda d: (d.date, -KINDS.index(d.kind), d.fmt == "csv"), reverse=True)
    return out


def dump_path(directory: Path, name: str) -> Path | None:
    """The file for ``name`` if it is a complete dump (the name is checked, never joined blindly)."""
    if NAME_RE.match(name) is None:
        return None
    path = directory / name
    return path if path.is_file() else None


def _iso(ts: float | None) -> str | None:
    if not ts:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _dt(value: Any) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return str(value.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _iso(value.timestamp())


class _Writer:
    """One dump file being written: gzip into a hidden temporary, renamed on ``commit``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.final = directory / name
        self.tmp = directory / f".{name}.partial-{os.getpid()}"
        self._raw: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit/abort
        self._gz = gzip.GzipFile(filename=name[:-3], mode="wb", fileobj=self._raw, compresslevel=6, mtime=0)

    def write(self, data: bytes) -> None:
        self._gz.write(data)

    def commit(self) -> None:
        self._gz.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        for f in (self._gz, self._raw):
            with contextlib.suppress(OSError):
                f.close()
        self.tmp.unlink(missing_ok=True)


def write_atomic(directory: Path, name: str, chunks: Iterable[bytes]) -> Path:
    """Write ``chunks`` gzipped as ``directory/name`` atomically (see the module doc)."""
    w = _Writer(directory, name)
    try:
        for chunk in chunks:
            w.write(chunk)
        w.commit()
    except BaseException:
        w.abort()
        raise
    _fsync_dir(directory)
    return w.final


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clean_partials(directory: Path) -> int:
    """Delete partial files left by killed jobs; returns how many."""
    n = 0
    for p in directory.glob(".*.partial-*"):
        p.unlink(missing_ok=True)
        n += 1
    return n


async def _batches(session: AsyncSession, kind: str) -> AsyncIterator[list[tuple[Any, ...]]]:
    """Raw rows in key order, ``BATCH`` at a time (keyset paging: each batch is one index range)."""
    last: Any = None
    while True:
        if kind == "users":
            q: Any = (
                select(Account.id, Account.name, Account.team_id, Team.name, Account.credit_total,
                       Account.credit_recent, Account.credit_recent_at, Account.created_at)
                .outerjoin(Team, Team.id == Account.team_id)
                .where(Account.disabled.is_(False))
                .order_by(Account.id)
            )  # fmt: skip
            if last is not None:
                q = q.where(Account.id > last)
        elif kind == "teams":
            members = (
                select(func.count())
                .where(Account.team_id == Team.id, Account.disabled.is_(False))
                .scalar_subquery()
            )
            q = select(Team.id, Team.name, members, Team.credit_total, Team.credit_recent,
                       Team.credit_recent_at, Team.created_at).order_by(Team.id)  # fmt: skip
            if last is not None:
                q = q.where(Team.id > last)
        else:
            q = select(Host.peer_id, Host.account_id, Host.credit_total, Host.credit_recent,
                       Host.credit_recent_at, Host.requests_served, Host.last_seen,
                       Host.flagged).order_by(Host.peer_id)  # fmt: skip
            if last is not None:
                q = q.where(Host.peer_id > last)
        rows = [tuple(r) for r in (await session.execute(q.limit(BATCH))).all()]
        if not rows:
            return
        last = rows[-1][0]
        yield rows
        if len(rows) < BATCH:
            return


def _records(kind: str, rows: list[tuple[Any, ...]], now: float) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if kind == "users":
            rac = rac_per_day(decay(r[5], r[6], now))
            out.append({"id": r[0], "name": r[1], "team_id": r[2], "team": r[3], "credit_total": r[4],
                        "credit_recent_per_day": round(rac, 6), "joined": _dt(r[7])})  # fmt: skip
        elif kind == "teams":
            rac = rac_per_day(decay(r[4], r[5], now))
            out.append({"id": r[0], "name": r[1], "members": int(r[2]), "credit_total": r[3],
                        "credit_recent_per_day": round(rac, 6), "created": _dt(r[6])})  # fmt: skip
        else:
            rac = rac_per_day(decay(r[3], r[4], now))
            out.append({"peer_id": r[0], "account_id": r[1], "credit_total": r[2],
                        "credit_recent_per_day": round(rac, 6), "requests_served": int(r[5]),
                        "last_seen": _iso(r[6]), "flagged": bool(r[7])})  # fmt: skip
    return out


def _csv_chunk(kind: str, rows: list[dict[str, Any]], header: bool) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = [c for c, _ in COLUMNS[kind]]
    if header:
        w.writerow(cols)
    for r in rows:
        w.writerow(
            ["" if r[c] is None else str(r[c]).lower() if isinstance(r[c], bool) else r[c] for c in cols]
        )
    return buf.getvalue().encode()


def _json_chunk(rows: list[dict[str, Any]], first: bool) -> bytes:
    body = ",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows)
    return (("[\n" if first else ",\n") + body).encode()


async def write_dumps(
    sessions: async_sessionmaker[AsyncSession],
    directory: Path,
    now: float | None = None,
    keep: int = KEEP_DAYS,
) -> list[Path]:
    """Write today's six dumps into ``directory``, then drop dumps older than ``keep`` days."""
    now = time.time() if now is None else now
    date = time.strftime("%Y-%m-%d", time.gmtime(now))
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(clean_partials, directory)
    written: list[Path] = []
    for kind in KINDS:
        csv_w = _Writer(directory, f"{kind}-{date}.csv.gz")
        json_w = _Writer(directory, f"{kind}-{date}.json.gz")
        try:
            first = True
            async with sessions() as session:
                async for batch in _batches(session, kind):
                    await asyncio.to_thread(_write_batch, kind, batch, now, first, csv_w, json_w)
                    first = False
            if first:
                csv_w.write(_csv_chunk(kind, [], True))
                json_w.write(b"[")
            json_w.write(b"\n]\n")
            await asyncio.to_thread(csv_w.commit)
            await asyncio.to_thread(json_w.commit)
        except BaseException as e:
            csv_w.abort()
            json_w.abort()
            if isinstance(e, OSError):
                raise ExportError(f"cannot write the {kind} dump in {directory}: {e}") from e
            raise
        written += [csv_w.final, json_w.final]
    await asyncio.to_thread(_fsync_dir, directory)
    await asyncio.to_thread(prune, directory, keep)
    return written


def _write_batch(
    kind: str, rows: list[tuple[Any, ...]], now: float, first: bool, csv_w: _Writer, json_w: _Writer
) -> None:
    """Format and compress one batch (in a worker thread: the event loop keeps serving pages)."""
    records = _records(kind, rows, now)
    csv_w.write(_csv_chunk(kind, records, first))
    json_w.write(_json_chunk(records, first))


def prune(directory: Path, keep: int) -> list[str]:
    """Delete dumps of all but the newest ``keep`` dates; returns the names deleted."""
    dates = sorted({d.date for d in listing(directory)}, reverse=True)
    old = set(dates[keep:])
    gone = []
    for d in listing(directory):
        if d.date in old:
            (directory / d.name).unlink(missing_ok=True)
            gone.append(d.name)
    return gone


#: The child process reads its database URL here (not argv: a URL may hold a password).
URL_ENV = "LAH_EXPORT_DATABASE_URL"
SEARCH_PATH_ENV = "LAH_EXPORT_SEARCH_PATH"  # PostgreSQL schema (tests and benchmarks use one each)


async def write_in_child(
    url: str, directory: Path, now: float, timeout_s: float = 1800.0, search_path: str | None = None
) -> None:
    """``write_dumps`` in a child process (``python -m coordinator.site.exports``): formatting and
    compressing 100,000 rows is CPU work, and in a child it never competes with the pages for the
    server's event loop or GIL. A child killed mid-write leaves the previous dumps served."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "coordinator.site.exports",
        str(directory),
        repr(now),
        env={**os.environ, URL_ENV: url, **({SEARCH_PATH_ENV: search_path} if search_path else {})},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    if proc.returncode != 0:
        raise ExportError(
            f"the dump process failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}"
        )


async def search_path_of(sessions: async_sessionmaker[AsyncSession]) -> str | None:
    """The schema search path the server's own connections use (PostgreSQL; None on SQLite), so the
    child reads the same tables: a URL alone does not carry it."""
    async with sessions() as s:
        if s.get_bind().dialect.name != "postgresql":
            return None
        return str((await s.execute(text("SHOW search_path"))).scalar_one())


async def _child(directory: Path, now: float) -> None:
    from ..db.session import make_engine, session_factory

    engine = make_engine(os.environ[URL_ENV], search_path=os.environ.get(SEARCH_PATH_ENV))
    try:
        await write_dumps(session_factory(engine), directory, now)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(_child(Path(sys.argv[1]), float(sys.argv[2])))
