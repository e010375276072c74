"""The coordinator: the one central service of a collaboration. Tensor traffic never passes through it.

Modules, bottom up (each imports only those above it in this list):

- :mod:`coordinator.config`: the configuration: a TOML file, then ``LAH_*`` environment variables on top
  (database URL, TURN, experiments, limits).
- :mod:`coordinator.db` (a package): SQLAlchemy 2 models and async engines, SQLite by default or
  PostgreSQL; :mod:`coordinator.migrations` (a package): Alembic's migrations of that schema, for both.
- :mod:`coordinator.http`: what every JSON endpoint shares: the error shape, the handler wrapper and
  size-limited body reading. :mod:`coordinator.ratelimit`: per-address limits (a token bucket for
  request rates, a counter for concurrent connections).
- :mod:`coordinator.turn`: short-lived TURN credentials, as coturn's ``use-auth-secret`` checks them.
- :mod:`coordinator.batching`: many callers, one statement per batch (the hub's host lookups and
  presence claims, so a failover's burst of hellos shares its database round trips); needs nothing.
- :mod:`coordinator.relay`: the notifications replicas send each other over PostgreSQL LISTEN/NOTIFY,
  and the listener that receives them.
- :mod:`coordinator.presence`: replicas sharing one PostgreSQL (heartbeats, who is online where,
  forwarding a signal to the peer's replica); on relay.
- :mod:`coordinator.signaling`: the signaling hub (authenticated peers, presence, offer/answer relay);
  on presence when it runs as one of several replicas.
- :mod:`coordinator.pg_link`, :mod:`coordinator.shared_limits`, :mod:`coordinator.leader`,
  :mod:`coordinator.outage`: what lets N replicas share one PostgreSQL (dedicated connections for
  LISTEN and locks, database-clocked rate buckets, the leader of periodic jobs, 503 while it is away);
  :mod:`coordinator.services` composes them, and on SQLite uses the one-process versions.
- :mod:`coordinator.receipts`, :mod:`coordinator.training`, :mod:`coordinator.ledger`,
  :mod:`coordinator.spot_checks`, :mod:`coordinator.leaderboard`: signed receipts checked in batches,
  trainers' own training samples (a credit kind of its own, bounded by their receipts), the credit on
  hosts, accounts and teams, failed spot checks (flags), leaderboards and histories.
- :mod:`coordinator.tokens`: bearer tokens signed by the coordinator's Ed25519 key, short-lived,
  refreshable, revocable. :mod:`coordinator.confusables`: skeletons of display names, so names that
  look alike are refused as duplicates. :mod:`coordinator.accounts`: accounts, teams, hosts and the
  allowlist (invitations). :mod:`coordinator.trainers`: trainer accounts (an admin grants the role,
  the researcher logs in with a single-use code).
- :mod:`coordinator.services`: what every handler shares (configuration, database, token authority,
  accounts, limits), opened once: the database migrated, the signing key loaded.
- :mod:`coordinator.api_accounts`, :mod:`coordinator.api_trainers`, :mod:`coordinator.api_ledger`:
  JSON APIs for accounts, hosts and tokens; for trainers (experiments' configs, which ``lah train``
  reads, trainer login, the admin's grant); for credit (receipts and spot-check reports in,
  leaderboards and histories out).
- :mod:`coordinator.assignment`, :mod:`coordinator.api_swarm`: which experts a node should host (every
  expert covered by at least ``replication`` hosts), and a node's assignment with the peers to
  bootstrap its DHT from.
- :mod:`coordinator.collab_status`, :mod:`coordinator.api_collab`: collaborative trainers' status
  reports, and the JSON API of collaborative training (reports in; collaborations and trainers out).
- :mod:`coordinator.progress`, :mod:`coordinator.api_progress`: trainers' evaluation reports of an
  experiment's model (step, tokens, validation loss, a generated sample), stored bounded per trainer
  account, and what the experiment's page reads of them (one curve per trainer, the newest sample).
- :mod:`coordinator.site` (a package): the project's server-rendered pages and their JSON twins.
- :mod:`coordinator.app`: the aiohttp application that mounts the hub (``create_app``) or everything
  (``create_full_app``), and how to run it.
- :mod:`coordinator.cli`: ``lah coordinator``: the whole coordinator from a TOML config, and the
  operator's tools that act on its database directly (invite, disable, enable, grant-trainer).

It imports of ``engine`` only the shared schemas, signed statements and identities, and never ``app``.

May import: engine.p2p.errors, engine.p2p.identity, engine.p2p.signaling_protocol, engine.wire.statements
"""
