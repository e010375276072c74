"""The coordinator: the one central service of a collaboration. Tensor traffic never passes through it.

Modules, bottom up:

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
- :mod:`coordinator.progress`, :mod:`coordinator.api_progress`: trainers' evaluation reports of an
  experiment's model (step, tokens, validation loss, a generated sample), stored bounded per trainer
  account, and what the experiment's page reads of them (one curve per trainer, the newest sample).
- :mod:`coordinator.app`: the aiohttp application that mounts the hub, and how to run it.

It imports ``engine`` (shared wire schemas and identities) and never ``app``.
"""
