"""The signaling hub: authenticated peers exchange signed offers and answers through it, on one
coordinator process or across replicas sharing one PostgreSQL; and the TURN credentials it hands out.

Modules, bottom up (each imports only those above it in this list):

- ``turn``: short-lived TURN credentials, as coturn's ``use-auth-secret`` checks them.
- ``batching``: many callers, one statement per batch (the hub's host lookups and presence claims, so
  a failover's burst of hellos shares its database round trips); needs nothing.
- ``relay``: the notifications replicas send each other over PostgreSQL LISTEN/NOTIFY, and the
  listener that receives them.
- ``presence``: replicas sharing one PostgreSQL: heartbeats, who is online where, forwarding a signal
  to the peer's replica; on ``relay`` and ``batching``.
- ``offer_gate``: which offers are relayed (a token bucket per sender, replays dropped); pure.
- ``signaling``: the hub itself (authenticated peers, offer/answer relay, per-address limits from
  :mod:`coordinator.http.ratelimit`); on ``presence`` when it runs as one of several replicas.

The hub needs no account or database code of its own: :mod:`coordinator.services` gives it the checks
of tokens and host bindings (``authorize``) and the batchers, and :mod:`coordinator.server.app` mounts it.

May import: coordinator.http.ratelimit, engine.p2p.errors, engine.p2p.identity, engine.p2p.signaling_protocol
"""
