"""Relaying signals between coordinator replicas through PostgreSQL ``LISTEN``/``NOTIFY``.

Each replica listens on its own channel, ``lah_signal_<replica id>``, on one dedicated asyncpg
connection (a :class:`Listener`). One channel per replica rather than one shared by all: a relayed
offer wakes only the replica that holds its recipient, so N replicas do not each parse every
relay of the group, and a notification to a dead replica's channel simply has no listener. The
sender's replica finds the recipient's replica in the ``presence`` table (``coordinator.hub.presence``)
and notifies in the same statement.

The notifications (pure functions below, tested without I/O), one text line of tab-separated
fields, then for ``deliver`` the frame itself::

    d <to> <origin> <ref> <sender> \\n <frame>   send <frame> (a stamped Signal, or an Error) to peer <to>;
                                               if <to> is not here and <ref> is set, answer <origin>
                                               with Error(unknown_peer, ref) for <sender>
    e <peer> <conn>                            close this replica's socket <conn> of <peer>: it
                                               reconnected elsewhere (the newest socket wins)
    s                                          sweep now (an account was disabled on another replica)
    f <id>                                     the notification is row <id> of ``signal_frames``

A NOTIFY payload must stay under 8000 bytes, and a signaling frame may be up to 64 KiB
(``signaling_protocol.MAX_FRAME_BYTES``); a real aiortc offer is a few KiB. A notification larger
than ``MAX_NOTIFY_BYTES`` is written to ``signal_frames`` and its id notified in the same
transaction, so nothing is cut or dropped for its size; the recipient deletes the row as it reads it.

Errors::

    RelayError
     └── BadNotification   a payload that is none of the above (logged and skipped by the listener)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg  # type: ignore[import-untyped]  # no stubs; the listener uses four calls

logger = logging.getLogger(__name__)

CHANNEL_PREFIX = "lah_signal_"
MAX_NOTIFY_BYTES = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
PING_S = 2.0  # how often an idle listener connection is checked
PING_TIMEOUT_S = 5.0
MAX_BACKOFF_S = 5.0


class RelayError(Exception):
    """Something about relaying between replicas went wrong."""


class BadNotification(RelayError):
    """A notification payload that this module does not write."""


@dataclass(frozen=True)
class Deliver:
    to: str
    origin: str
    ref: int | None
    sender: str
    frame: str


@dataclass(frozen=True)
class Evict:
    peer: str
    conn: str


@dataclass(frozen=True)
class Sweep:
    pass


@dataclass(frozen=True)
class Stored:
    frame_id: int


Notification = Deliver | Evict | Sweep | Stored


def channel_of(replica_id: str) -> str:
    return CHANNEL_PREFIX + replica_id


def encode(n: Notification) -> str:
    if isinstance(n, Deliver):
        ref = "" if n.ref is None else str(n.ref)
        return f"d\t{n.to}\t{n.origin}\t{ref}\t{n.sender}\n{n.frame}"
    if isinstance(n, Evict):
        return f"e\t{n.peer}\t{n.conn}"
    if isinstance(n, Stored):
        return f"f\t{n.frame_id}"
    return "s"


def decode(payload: str) -> Notification:
    head, _, frame = payload.partition("\n")
    fields = head.split("\t")
    try:
        if fields[0] == "d" and len(fields) == 5:
            ref = int(fields[3]) if fields[3] else None
            return Deliver(fields[1], fields[2], ref, fields[4], frame)
        if fields[0] == "e" and len(fields) == 3 and not frame:
            return Evict(fields[1], fields[2])
        if fields[0] == "f" and len(fields) == 2 and not frame:
            return Stored(int(fields[1]))
        if head == "s" and not frame:
            return Sweep()
    except ValueError as e:
        raise BadNotification(f"bad number in notification {head[:80]!r}") from e
    raise BadNotification(f"unknown notification {head[:80]!r}")


def fits_notify(payload: str) -> bool:
    return len(payload.encode()) <= MAX_NOTIFY_BYTES


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    """``postgresql+asyncpg://...`` (SQLAlchemy's spelling) -> ``postgresql://...`` (asyncpg's)."""
    scheme, sep, rest = sqlalchemy_url.partition("://")
    if not sep or not scheme.startswith("postgresql"):
        raise RelayError("the relay needs a PostgreSQL database URL")
    return "postgresql://" + rest


Handler = Callable[[str], Awaitable[None]]
StateChange = Callable[[bool], Awaitable[None]]


class Listener:
    """One asyncpg connection that ``LISTEN``s on ``channel`` and hands payloads to ``handle`` in order.

    A lost connection (terminated backend, database restart, dead network found by the ping every
    ``PING_S``) is reopened with backoff capped at ``MAX_BACKOFF_S``; ``on_state(False)`` is awaited
    as soon as the loss is seen and ``on_state(True)`` once listening again, so the replica can tell
    the others not to relay to it meanwhile. ``listening`` is what a health check reads.

    What was notified to the channel between the loss and its detection is gone (PostgreSQL keeps
    nothing for a listener that left): at once for a closed or terminated connection, up to
    ``PING_S + PING_TIMEOUT_S`` for a network that went silent, in which case the replica's
    heartbeats fail too and the others soon take it for dead. A dial caught in that window times out
    at its sender, who dials again.
    """

    def __init__(self, dsn: str, channel: str, handle: Handler, on_state: StateChange) -> None:
        self.dsn = dsn
        self.channel = channel
        self.handle = handle
        self.on_state = on_state
        self.listening = False
        self.reconnects = 0
        self._conn: asyncpg.Connection | None = None
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._lost = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Listen once (raising if the database cannot be reached), then keep listening."""
        await self._open()
        self._tasks = [
            asyncio.create_task(self._supervise(), name=f"relay-listener-{self.channel}"),
            asyncio.create_task(self._consume(), name=f"relay-consumer-{self.channel}"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.listening = False
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.close(), PING_TIMEOUT_S)
            self._conn = None

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server process (tests terminate it)."""
        return None if self._conn is None else self._conn.get_server_pid()

    async def _open(self) -> None:
        conn = await asyncpg.connect(self.dsn, timeout=PING_TIMEOUT_S)
        try:
            await conn.add_listener(self.channel, self._on_notify)
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._on_terminated)
        self._conn = conn
        self._lost.clear()
        self.listening = True
        await self.on_state(True)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._queue.put_nowait(payload)

    def _on_terminated(self, conn: object) -> None:
        if conn is self._conn:
            self._lost.set()

    async def _supervise(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), PING_S)
            conn = self._conn
            if not self._lost.is_set() and conn is not None:
                try:
                    await asyncio.wait_for(conn.execute("SELECT 1"), PING_TIMEOUT_S)
                    continue
                except Exception:  # a silent network: the ping times out
                    logger.warning("relay listener %s does not answer", self.channel)
            await self._reopen()

    async def _reopen(self) -> None:
        self.listening = False
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None
        try:
            await self.on_state(False)
        except Exception:  # the database may be away altogether
            logger.warning("cannot mark relay listener %s away", self.channel)
        backoff = 0.2
        while True:
            try:
                await self._open()
                self.reconnects += 1
                logger.info("relay listener %s is back", self.channel)
                return
            except Exception as e:
                logger.warning(
                    "relay listener %s cannot reconnect (%r); retry in %.1f s", self.channel, e, backoff
                )
                if self._conn is not None:
                    self._conn.terminate()
                    self._conn = None
                self.listening = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _consume(self) -> None:
        while True:
            payload = await self._queue.get()
            try:
                await self.handle(payload)
            except Exception:  # one bad notification must not stop the relay
                logger.exception("cannot handle a relayed notification")
