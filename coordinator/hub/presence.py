"""Replicas of one coordinator sharing PostgreSQL: who is online where, and signals between them.

Every replica (any ``lah coordinator`` given the same PostgreSQL URL: its id is drawn at start)
has a row in ``replicas`` whose ``heartbeat_at`` it sets to the database's ``now()`` every
``HEARTBEAT_S`` (2 s). A peer's signaling socket is a row in ``presence`` naming its replica and
the socket (``conn``). Whatever reads presence (``online``, ``forward``) counts only replicas whose
heartbeat is younger than ``DEAD_AFTER_S`` (6 s, three missed beats), by the database's clock, so a
replica's own clock being off changes nothing. **Bound:** a replica that dies without cleaning up
(kill -9, lost machine) stops being listed, and stops being relayed to, at most ``DEAD_AFTER_S``
after its last heartbeat, so within 6 s of its death. Its rows are deleted ``REAP_AFTER_S`` later
by whichever replica beats next; a replica that was only slow finds its row gone, writes it again
and claims its peers anew.

A peer that connects claims its presence row: the latest connection wins, and if the row named a
socket on another live replica, that replica is told (``relay.Evict``) to close it, as one hub
closes a duplicate socket itself. Claims are batched (``batching.Batcher``: those arriving while the
previous batch is written go in the next): one UPDATE and at most one INSERT over arrays for the
whole batch, and one NOTIFY statement for its evictions, so a failover's thousand joins cost a few
dozen statements, not a transaction each. The signaling hub (``coordinator.hub.signaling``) forwards a signal
whose recipient is not on this replica with :meth:`ReplicaGroup.forward`; the recipient's replica
delivers it, or answers the sender with ``Error(unknown_peer)`` if the peer left meanwhile.

Rate limits and duplicate suppression of offers stay with the replica that holds the sender's
socket (a sender is on one replica at a time). The hub's ``recheck`` sweep runs on every replica;
a disable on one replica asks all others to sweep at once (``relay.Sweep``).

:meth:`ReplicaGroup.healthy` is false while the relay listener is away or the last heartbeat is
older than ``DEAD_AFTER_S``: the proxy's health check should then send new sockets elsewhere. While
the listener is away the replica's row says ``listening = false`` and others answer signals for its
peers with ``unknown_peer`` instead of notifying into the void.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any, Protocol

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.p2p import signaling_protocol as sp

from . import relay
from .batching import Batcher

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
DEAD_AFTER_S = 6.0
REAP_AFTER_S = 60.0
FRAME_TTL_S = 60.0  # a stored frame nobody read (its replica died) is deleted after this

_CHANNEL = f"'{relay.CHANNEL_PREFIX}' || r.id"  # the replica's channel, in SQL
# A peer's replica if it is live and listening (asyncpg's numbered parameters: peer id, DEAD_AFTER_S).
_LOCATE = (
    "FROM presence p JOIN replicas r ON r.id = p.replica_id "
    "WHERE p.peer_id = $1 AND r.listening AND r.heartbeat_at > now() - make_interval(secs => $2)"
)
# A batch of claims (asyncpg's numbered parameters: peer ids, conns, this replica): the rows that
# existed, with the replica and socket each named before; then the rows that did not.
_CLAIM_UPDATE = (
    "UPDATE presence SET replica_id = $3, conn = n.conn, since = now() "
    "FROM unnest($1::text[], $2::text[]) AS n(peer_id, conn), "
    "(SELECT peer_id, replica_id, conn FROM presence WHERE peer_id = ANY($1::text[]) "
    "ORDER BY peer_id FOR UPDATE) AS old "
    "WHERE presence.peer_id = n.peer_id AND old.peer_id = n.peer_id "
    "RETURNING n.peer_id, old.replica_id, old.conn"
)
_CLAIM_INSERT = (
    "INSERT INTO presence (peer_id, replica_id, conn) "
    "SELECT n.peer_id, $3, n.conn FROM unnest($1::text[], $2::text[]) AS n(peer_id, conn) "
    "ORDER BY n.peer_id ON CONFLICT (peer_id) DO NOTHING RETURNING peer_id"
)
RELAY_POOL_SIZE = 8
RELAY_POOL_MIN = 2
MAX_HANDLING = 4096  # notifications being handled at once (delivering to sockets)


class LocalPeers(Protocol):
    """What the replica's own signaling hub does for the group."""

    def local_peers(self) -> dict[str, str]:
        """peer id -> conn of the sockets this replica holds."""
        ...

    async def deliver_local(self, peer_id: str, frame: str) -> bool:
        """Send ``frame`` to this replica's socket of ``peer_id``; False if there is none."""
        ...

    async def evict_local(self, peer_id: str, conn: str) -> None: ...

    async def sweep(self) -> int: ...


def new_replica_id() -> str:
    return secrets.token_hex(8)


def new_conn_id() -> str:
    return secrets.token_hex(8)


class ReplicaGroup:
    def __init__(self, engine: AsyncEngine, *, replica_id: str | None = None) -> None:
        if engine.dialect.name != "postgresql":
            raise relay.RelayError("replicas need PostgreSQL")
        self.engine = engine
        self.replica_id = replica_id or new_replica_id()
        self.dsn = relay.asyncpg_dsn(engine.url.render_as_string(hide_password=False))
        self.listener = relay.Listener(
            self.dsn,
            relay.channel_of(self.replica_id),
            self._on_payload,
            self._set_listening,
        )
        self._hub: LocalPeers | None = None
        self._handling: set[asyncio.Task[None]] = set()
        self._pool: Any = None  # asyncpg.Pool: the relay's statements, in the engine's search_path
        self._claims: Batcher[tuple[str, str], None] = Batcher(self._claim_batch)
        self._beat: asyncio.Task[None] | None = None
        self._last_beat = -1e9
        # "largest": the longest notification this replica sent, in bytes (real frame sizes)
        self.stats = {"forwarded": 0, "stored": 0, "delivered": 0, "bounced": 0, "evicted": 0, "largest": 0}

    async def start(self, hub: LocalPeers) -> None:
        self._hub = hub
        async with self.engine.connect() as c:
            search_path = (await c.execute(text("SHOW search_path"))).scalar_one()
        # The group's own pool (heartbeats included): a request load that holds every connection of
        # the app's pool must not delay a heartbeat past DEAD_AFTER_S.
        self._pool = await asyncpg.create_pool(
            self.dsn,
            min_size=RELAY_POOL_MIN,  # open before a burst needs them: a connect costs ~10-20 ms
            max_size=RELAY_POOL_SIZE,
            server_settings={"search_path": search_path},
        )
        await self._pool.execute("INSERT INTO replicas (id, listening) VALUES ($1, false)", self.replica_id)
        self._last_beat = time.monotonic()
        await self.listener.start()
        self._beat = asyncio.create_task(self._beat_forever(), name=f"replica-heartbeat-{self.replica_id}")

    async def stop(self) -> None:
        """Leave cleanly: the peers' rows go with the replica's (the hub closed the sockets)."""
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
            self._beat = None
        await self.listener.stop()
        await self._claims.close()
        for task in list(self._handling):
            task.cancel()
        await asyncio.gather(*self._handling, return_exceptions=True)
        if self._pool is None:
            return
        try:
            await self._pool.execute("DELETE FROM replicas WHERE id = $1", self.replica_id)
        except Exception:  # the database is away: the others will reap the row
            logger.warning("cannot remove replica %s", self.replica_id)
        await self._pool.close()
        self._pool = None

    def healthy(self) -> bool:
        return self.listener.listening and time.monotonic() - self._last_beat < DEAD_AFTER_S

    # -- presence ----------------------------------------------------------------------------------

    async def claim(self, peer_id: str, conn: str) -> None:
        """Make ``conn`` on this replica the peer's socket; close the one it replaces elsewhere.

        Claims are batched (``batching.Batcher``): a failover's burst of joins shares a few
        statements per batch instead of a transaction each. A failed batch fails every claim in it."""
        await self._claims.get((peer_id, conn))

    async def _claim_batch(self, claims: list[tuple[str, str]]) -> list[None]:
        """Two autocommit statements for the whole batch (three with evictions), whatever its size.

        Within the batch the last claim of a peer wins (the hub already closed that peer's older
        socket here); batches run one at a time, so claims of one peer are applied in order.
        """
        latest = dict(claims)  # peer -> conn of its last claim in this batch (dicts keep the last)
        peers = sorted(latest)  # rows locked in one order by every replica: no deadlocks
        pool = self._relay_pool()
        evict: list[tuple[str, str, str]] = []  # (replica, peer, conn) of sockets replaced elsewhere
        for _ in range(3):
            conns = [latest[p] for p in peers]
            # UPDATE first (it locks the rows, so two claims of one peer are ordered), then INSERT.
            rows = await pool.fetch(_CLAIM_UPDATE, peers, conns, self.replica_id)
            for row in rows:
                if row[1] != self.replica_id:
                    evict.append((row[1], row[0], row[2]))
            updated = {row[0] for row in rows}
            peers = [p for p in peers if p not in updated]
            if not peers:
                break
            inserted = await pool.fetch(_CLAIM_INSERT, peers, [latest[p] for p in peers], self.replica_id)
            done = {row[0] for row in inserted}
            peers = [p for p in peers if p not in done]  # inserted meanwhile by another claim: update
            if not peers:
                break
        else:
            raise relay.RelayError(f"cannot claim presence of {len(peers)} peers")
        if evict:  # one statement: a notification to each live replica that held a replaced socket
            await pool.execute(
                f"SELECT pg_notify({_CHANNEL}, e.payload) "
                "FROM unnest($1::text[], $2::text[]) AS e(replica_id, payload) "
                "JOIN replicas r ON r.id = e.replica_id "
                "WHERE r.heartbeat_at > now() - make_interval(secs => $3)",
                [r for r, _, _ in evict],
                [relay.encode(relay.Evict(peer, conn)) for _, peer, conn in evict],
                DEAD_AFTER_S,
            )
        return [None] * len(claims)

    async def release(self, peer_id: str, conn: str) -> None:
        await self._relay_pool().execute(
            "DELETE FROM presence WHERE peer_id = $1 AND conn = $2", peer_id, conn
        )

    async def online(self) -> list[str]:
        """Every peer on a live replica of the group, sorted."""
        rows = await self._relay_pool().fetch(
            "SELECT p.peer_id FROM presence p JOIN replicas r ON r.id = p.replica_id "
            "WHERE r.heartbeat_at > now() - make_interval(secs => $1) ORDER BY p.peer_id",
            DEAD_AFTER_S,
        )
        return [r[0] for r in rows]

    # -- relaying ----------------------------------------------------------------------------------

    async def forward(self, to: str, frame: str, *, sender: str, ref: int | None) -> bool:
        """Send ``frame`` to ``to`` on whichever live replica holds it; False if none does.

        The hot path: one autocommit statement on the relay's own asyncpg pool finds the replica
        and notifies it (SQLAlchemy's per-statement cost doubled a relay's latency here).
        """
        payload = relay.encode(relay.Deliver(to, self.replica_id, ref, sender, frame))
        self.stats["largest"] = max(self.stats["largest"], len(payload.encode()))
        pool = self._relay_pool()
        if relay.fits_notify(payload):
            sent = await pool.fetchrow(
                f"SELECT pg_notify({_CHANNEL}, $3) {_LOCATE}", to, DEAD_AFTER_S, payload
            )
            found = sent is not None
        else:
            async with pool.acquire() as c, c.transaction():
                target = await c.fetchval(f"SELECT r.id {_LOCATE}", to, DEAD_AFTER_S)
                found = target is not None
                if target is not None:
                    await self._store(c, target, payload)
        if found:
            self.stats["forwarded"] += 1
        return found

    async def request_sweep(self) -> None:
        """Ask every other live replica to recheck its peers now."""
        await self._relay_pool().execute(
            f"SELECT pg_notify({_CHANNEL}, 's') FROM replicas r "
            "WHERE r.id <> $1 AND r.heartbeat_at > now() - make_interval(secs => $2)",
            self.replica_id,
            DEAD_AFTER_S,
        )

    async def _notify(self, replica_id: str, n: relay.Notification) -> None:
        payload = relay.encode(n)
        pool = self._relay_pool()
        if relay.fits_notify(payload):
            await pool.execute("SELECT pg_notify($1, $2)", relay.channel_of(replica_id), payload)
            return
        async with pool.acquire() as c, c.transaction():
            await self._store(c, replica_id, payload)

    async def _store(self, c: Any, replica_id: str, payload: str) -> None:
        """In ``c``'s transaction: the payload as a row, and its id notified (both or neither)."""
        frame_id = await c.fetchval(
            "INSERT INTO signal_frames (replica_id, body) VALUES ($1, $2) RETURNING id", replica_id, payload
        )
        await c.execute(
            "SELECT pg_notify($1, $2)", relay.channel_of(replica_id), relay.encode(relay.Stored(frame_id))
        )
        self.stats["stored"] += 1

    def _relay_pool(self) -> Any:
        if self._pool is None:
            raise relay.RelayError("the replica group is not started")
        return self._pool

    async def _on_payload(self, payload: str) -> None:
        """Each notification in a task of its own: one slow recipient's socket (a full send buffer)
        must not hold up every relay into this replica behind it."""
        n = relay.decode(payload)
        if len(self._handling) >= MAX_HANDLING:
            await self._handle(n)  # that many in flight: the listener's queue waits instead
            return
        task = asyncio.create_task(self._handle(n))
        self._handling.add(task)
        task.add_done_callback(self._handled)

    def _handled(self, task: asyncio.Task[None]) -> None:
        self._handling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("cannot handle a relayed notification", exc_info=task.exception())

    async def _handle(self, n: relay.Notification) -> None:
        hub = self._hub
        assert hub is not None
        if isinstance(n, relay.Stored):
            body = await self._relay_pool().fetchval(
                "DELETE FROM signal_frames WHERE id = $1 RETURNING body", n.frame_id
            )
            if body is None:
                logger.warning("stored signal frame %d is gone", n.frame_id)
                return
            n = relay.decode(body)
            if isinstance(n, relay.Stored):
                raise relay.BadNotification("a stored frame that points to another")
        if isinstance(n, relay.Deliver):
            if await hub.deliver_local(n.to, n.frame):
                self.stats["delivered"] += 1
            elif n.ref is not None and n.sender:
                self.stats["bounced"] += 1
                error = unknown_peer_error(n.to, n.ref)
                await self._notify(n.origin, relay.Deliver(n.sender, self.replica_id, None, "", error))
        elif isinstance(n, relay.Evict):
            self.stats["evicted"] += 1
            await hub.evict_local(n.peer, n.conn)
        else:
            await hub.sweep()

    # -- heartbeat ---------------------------------------------------------------------------------

    async def _set_listening(self, listening: bool) -> None:
        await self._relay_pool().execute(
            "UPDATE replicas SET listening = $2, heartbeat_at = now() WHERE id = $1",
            self.replica_id,
            listening,
        )

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.beat()
            except Exception:  # the database is away: unhealthy until a beat gets through
                logger.warning("replica %s cannot beat", self.replica_id, exc_info=True)

    async def beat(self) -> None:
        """One heartbeat: say this replica lives, rejoin if it was reaped, reap the dead."""
        listening = self.listener.listening
        async with self._relay_pool().acquire() as c, c.transaction():
            status = await c.execute(
                "UPDATE replicas SET heartbeat_at = now(), listening = $2 WHERE id = $1",
                self.replica_id,
                listening,
            )
            rejoined = status == "UPDATE 0"
            if rejoined:
                await c.execute(
                    "INSERT INTO replicas (id, listening) VALUES ($1, $2)", self.replica_id, listening
                )
            await c.execute(
                "DELETE FROM replicas WHERE heartbeat_at < now() - make_interval(secs => $1)", REAP_AFTER_S
            )
            await c.execute(
                "DELETE FROM signal_frames WHERE created_at < now() - make_interval(secs => $1)", FRAME_TTL_S
            )
        self._last_beat = time.monotonic()
        if rejoined and self._hub is not None:
            logger.warning("replica %s was taken for dead; claiming its peers again", self.replica_id)
            await asyncio.gather(*(self.claim(p, c) for p, c in self._hub.local_peers().items()))


def unknown_peer_error(peer_id: str, ref: int) -> str:
    return sp.encode(sp.Error(code="unknown_peer", message=f"peer {peer_id[:12]} went away", ref=ref))
