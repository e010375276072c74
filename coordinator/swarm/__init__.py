"""What the swarm does: which experts each node hosts, what collaborative trainers report of their
collaboration, and trainers' evaluations of an experiment's model; and the JSON APIs for each.

Modules, bottom up (each imports only those above it in this list):

- ``assignment``: which experts a node should host (every expert covered by at least ``replication``
  hosts): pure planning, then the database's assignments and the history of who held what when (what
  the ledger credits by); a trainer account's hosts get none (``ledger.TRAINER_ROLES``).
- ``collab_status``: collaborative trainers' status reports (schema, checks, storage) and the swarm's
  view of each collaboration; a report's processed samples feed ``coordinator.credit.training``.
- ``progress``: trainers' evaluation reports (step, tokens, validation loss, a generated sample),
  stored bounded per trainer account, and what an experiment's page reads of them.
- ``api_swarm``: a node's assignment, signed for its DHT declarations, with the peers to bootstrap
  its DHT from; ``api_collab``: status reports in, collaborations and the trainers' board out;
  ``api_progress``: evaluation reports in. Reports pass per-account token buckets
  (:mod:`coordinator.http.ratelimit`, shared between replicas by :mod:`coordinator.replicas.shared_limits`).

``assignment``, ``collab_status`` and ``progress`` sit below :mod:`coordinator.services` and need no
HTTP; the three ``api_`` modules sit above it and above :mod:`coordinator.http.framework`, like every
JSON API of the coordinator. The site's pages (:mod:`coordinator.site`) read the first three too.

May import: coordinator.config, coordinator.credit.ledger, coordinator.credit.training, coordinator.db,
    coordinator.http, coordinator.hub.signaling, coordinator.replicas.shared_limits,
    coordinator.services, engine.wire.statements
"""
