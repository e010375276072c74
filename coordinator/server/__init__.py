"""How the coordinator runs: the aiohttp application that mounts every part, and ``lah coordinator``.

Modules, bottom up (each imports only those above it in this list):

- ``app``: ``create_app`` (the signaling hub alone, open to any key holder: the transport demo and
  tests), ``create_full_app`` (everything: the hub, every JSON API, the site, 503s while the database
  is away, the leader's periodic jobs) and ``start``/``start_full``, which serve either in-process and
  return a ``RunningCoordinator`` (tests, the demos, ``lah coordinator``).
- ``cli``: ``lah coordinator``: the whole coordinator from a TOML config (and ``LAH_*`` environment),
  and the operator's tools that act on its database directly (invite, disable, enable, grant-trainer).

This is the top floor of the coordinator: nothing else in it imports this package.

May import: coordinator.accounts, coordinator.config, coordinator.credit, coordinator.http.framework,
    coordinator.hub, coordinator.replicas.outage, coordinator.services, coordinator.site,
    coordinator.swarm, engine.p2p.signaling_protocol
"""
