"""The project site: server-rendered pages (no JavaScript), the swarm view's JSON, daily dumps.

Layers, bottom up (each imports only those above it in this list):

- ``search`` (name normalisation, prefix search), ``ranges`` (range sums over the daily rollups),
  ``exports`` (the dump files: atomic writes, listing): pure functions and queries, no HTTP.
- ``queries``, ``subjects``, ``rank``: what the pages read (leaderboards, contributor, team, host,
  milestones, find-my-rank positions).
- ``chart``: charts as inline SVG drawn on the server: credit over time (with its one-sentence
  summary), and lines over a numeric axis (an experiment's validation loss per trainer).
- ``collab``: collaborative training's panel on ``/swarm``, the Trainers tab
  (``/leaderboard?kind=trainers``) and trainers' training samples, through ``coordinator.swarm.collab_status``
  and ``coordinator.credit.training``; it uses ``routes``' helpers, which import it inside their handlers.
- ``experiments``: ``/experiments`` and ``/experiments/{name}`` (each trainer's validation-loss curve,
  the newest generated sample as text, the model's shape and the hosts serving each grid now, through
  ``coordinator.swarm.progress``) and their JSON twins ``/api/site/experiments[/{name}]``; it uses ``routes``'
  helpers, which import it inside ``setup_routes``.
- ``routes``: ``setup_routes(app, ...)`` adds ``/``, ``/leaderboard`` (``range=`` day/week/month),
  ``/contributors/{id}``, ``/swarm``, ``/api/site/swarm``, ``/static/``, through ``experiments`` the
  experiments' pages, and, through ``pages``,
  ``/search``, ``/rank``, ``/teams/{id}``, ``/hosts/{peer_id}``, ``/exports`` and ``/exports/{file}``;
  it validates every parameter (bad ones get a 400 page), renders Jinja2 templates with autoescaping
  on, gzips pages, caches versioned static files, and answers unknown addresses and failures with the
  site's own 404 and 500 pages (``/api/`` and ``/ws/`` keep theirs).
- ``pages``: the handlers for finding people and data (search, find-my-rank, team and host pages, the
  exports' listing); it uses ``routes``' helpers, which import it inside ``setup_routes``.
- ``jobs``: ``start_jobs(app, ...)``: the periodic range refresh and daily dump on the app's loop.
- ``templates/``, ``static/``: the layout and one stylesheet; nothing is loaded from elsewhere.

Leaderboard and contributor JSON live in ``coordinator.credit.api_ledger``. Errors: ``routes.BadParam`` and
``search.SearchError`` (both ``ValueError``: a 400 page); ``exports.ExportError`` (``OSError``: a dump
not written, the previous one still served).

Of the coordinator, the site reads the database's models and session, the configuration, the services,
the ledger and leaderboards, assignment, collaboration status, training and progress; ``jobs`` runs under
a leader (one replica's work), and ``routes`` asks the signaling hub who is online on every replica.

May import: coordinator.config, coordinator.credit.leaderboard, coordinator.credit.ledger,
    coordinator.credit.training, coordinator.db, coordinator.hub.signaling, coordinator.replicas.leader,
    coordinator.services, coordinator.swarm.assignment, coordinator.swarm.collab_status,
    coordinator.swarm.progress
"""

from .jobs import start_jobs
from .routes import (
    MAX_REQUEST_LINE,
    services_database_url,
    services_exports_dir,
    services_sessions,
    setup_routes,
)

__all__ = [
    "MAX_REQUEST_LINE",
    "services_database_url",
    "services_exports_dir",
    "services_sessions",
    "setup_routes",
    "start_jobs",
]
