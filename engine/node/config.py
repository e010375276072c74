"""VolunteerConfig: a node's knobs that are not the volunteer's own settings (those are
:class:`~engine.resources.Settings`, which a person edits): timeouts and periods of the join flow,
the declarations, the upkeep and the drain, and how links and the governor are built. Defaults are what
``lah node`` runs with; tests and local swarms shorten them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.p2p import LinkConfig

__all__ = ["VolunteerConfig"]


@dataclass(frozen=True)
class VolunteerConfig:
    start_timeout: float = 60.0  # start() retries the coordinator this long, then says why it failed
    retry_s: float = 2.0  # between those retries
    http_timeout: float = 15.0  # one call to the coordinator
    declare_ttl: float = 60.0  # how long a declaration of the hosted experts lives in the DHT
    declare_period: float = 20.0  # how often they are declared again while the node works
    checkpoint_interval_s: float = 300.0  # experts' weights written to disk at most this often
    upkeep_interval: float = 1.0  # the upkeep loop's tick (re-assignment, re-declaration, credit)
    drain_timeout: float = 5.0  # requests in flight are given this long when work stops
    refresh_margin_s: float = 600.0  # the token is refreshed this long before it expires
    link: LinkConfig = field(default_factory=lambda: LinkConfig(connect_timeout=15))
    governor_options: dict[str, Any] = field(default_factory=dict)  # passed on to the Governor
