"""What the coordinator's HTTP handlers stand on: per-address limits and the one framework every JSON
endpoint uses.

Modules, bottom up (each imports only those above it in this list):

- ``ratelimit``: per-address limits (a token bucket for request rates, a counter for concurrent
  connections, the client's address behind trusted proxies); pure, on no other coordinator code, so
  the hub, the replicas' shared buckets and :mod:`coordinator.services` all build on it.
- ``framework``: the error shape (``{"error": code, "message": text}``), the handler wrapper with the
  answers to token and account errors, size-limited body reading, and who is asking (a bearer token
  of an enabled account, a trainer account); above :mod:`coordinator.services`, below every ``api_``
  module.

The two sit on different floors of the coordinator's layers (see :mod:`coordinator`): ``ratelimit``
under the services, ``framework`` over them. This ``__init__`` imports neither, so importing
``ratelimit`` never pulls in the services.

May import: coordinator.accounts.accounts, coordinator.accounts.tokens, coordinator.credit.ledger,
    coordinator.services
"""
