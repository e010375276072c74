"""The coordinator: the one central service of a collaboration. Tensor traffic never passes through it.

Its parts, by domain (each package's docstring names its modules and their order):

- :mod:`coordinator.accounts` (a package): who takes part: accounts, teams, hosts, bearer tokens,
  invitations, trainer accounts, and their JSON APIs.
- :mod:`coordinator.credit` (a package): what volunteers earn: signed receipts checked in batches, the
  credit ledger, spot checks, trainers' training samples, leaderboards, and the credit's JSON API.
- :mod:`coordinator.swarm` (a package): what the swarm does: each node's expert assignment,
  collaborative trainers' status reports, trainers' evaluations of an experiment's model, and the JSON
  APIs for each.
- :mod:`coordinator.hub` (a package): the signaling hub (signed offers and answers between
  authenticated peers), on one process or across replicas, and TURN credentials.
- :mod:`coordinator.replicas` (a package): what lets N replicas share one PostgreSQL: dedicated
  connections, rate buckets in the database, the leader of periodic jobs, 503s while it is away.
- :mod:`coordinator.site` (a package): the project's server-rendered pages and their JSON twins.

Layers, bottom up (each imports only those above it in this list; a domain package spans several, its
model low and its ``api_`` modules high):

- :mod:`coordinator.config`: the configuration: a TOML file, then ``LAH_*`` environment variables on top
  (database URL, TURN, experiments, limits).
- :mod:`coordinator.db` (a package): SQLAlchemy 2 models and async engines, SQLite by default or
  PostgreSQL, and ``db.migrations``: Alembic's migrations of that schema, for both.
- ``http.ratelimit`` (in :mod:`coordinator.http`, a package): per-address limits (a token bucket for
  request rates, a counter for concurrent connections, the client's address behind trusted proxies).
- The hub and the replicas' links, leader and shared buckets; then the domains' models: credit (all
  but ``api_ledger``), accounts (``confusables``, ``tokens``, ``accounts``, ``trainers``: on the
  ledger's ``IN`` list and trainer roles), swarm (``assignment``, ``collab_status``, ``progress``).
- :mod:`coordinator.services`: what every handler shares (configuration, database, token authority,
  accounts, limits, leader, the hub's checks of tokens and hosts), opened once: the database migrated,
  the signing key loaded.
- ``http.framework``: the one HTTP framework every JSON endpoint uses: the error shape, the handler
  wrapper (with the answers to token and account errors), size-limited body reading, and who is asking
  (a bearer token of an enabled account, a trainer account); on the services.
- The JSON APIs, on the framework: ``accounts.api_accounts``, ``accounts.api_trainers``,
  ``credit.api_ledger``, ``swarm.api_swarm``, ``swarm.api_collab``, ``swarm.api_progress``; and
  ``replicas.outage`` (503s in the framework's error shape).
- :mod:`coordinator.site` (a package): pages over the domains' models and the services.
- :mod:`coordinator.server` (a package): how the coordinator runs: ``server.app``, the aiohttp
  application that mounts the hub (``create_app``) or everything (``create_full_app``), and how to
  start it; ``server.cli``, ``lah coordinator``: the whole coordinator from a TOML config, and the
  operator's tools that act on its database directly (invite, disable, enable, grant-trainer).

It imports of ``engine`` only the shared schemas, signed statements and identities (each package's line
says which), and never ``app``.

May import: engine.p2p.signaling_protocol
"""
