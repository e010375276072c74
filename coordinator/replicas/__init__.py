"""What lets N coordinator replicas share one PostgreSQL (and one process on SQLite run the same code).

Modules, bottom up (each imports only those above it in this list):

- ``pg_link``: dedicated connections beside the pool (LISTEN, session locks) in the engine's schema,
  with TCP keepalives, and the database's clock.
- ``shared_limits``: rate limits that hold across every replica (one row per bucket, one statement
  per take, the database's clock), and ``LocalBuckets`` over :mod:`coordinator.http.ratelimit` for one
  process.
- ``leader``: periodic work on exactly one replica, by a PostgreSQL advisory lock on a ``pg_link``
  connection; ``LocalLeader`` on SQLite.
- ``outage``: the database is away: a 503 with Retry-After from one middleware, and ``/healthz``; in
  :mod:`coordinator.http.framework`'s error shape.

:mod:`coordinator.services` composes the first three (on SQLite the one-process versions);
:mod:`coordinator.server.app` installs ``outage``. The signaling hub's own replica machinery (presence,
relayed signals) is in :mod:`coordinator.hub`.

May import: coordinator.http.framework, coordinator.http.ratelimit
"""
