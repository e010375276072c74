"""The project site: server-rendered pages (no JavaScript), the swarm view's JSON, daily dumps.

Layers, bottom up (each imports only those above it in this list):

- ``search`` (name normalisation, prefix search), ``ranges`` (range sums over the daily rollups),
  ``exports`` (the dump files: atomic writes, listing): pure functions and queries, no HTTP.
- ``queries``, ``subjects``, ``rank``: what the pages read (leaderboards, contributor, team, host,
  milestones, find-my-rank positions).
- ``chart``: charts as inline SVG drawn on the server: credit over time (with its one-sentence
  summary), and lines over a numeric axis (an experiment's validation loss per trainer).
- ``params``: query and path parameters checked before anything reads them (``BadParam``,
  ``int_param``, ``choice_param``, the leaderboard's and a contributor's); ``render``: the site's
  context on the app (``SITE``), the Jinja2 environment (autoescaping on) and its filters, rendered and
  gzipped pages, the error page and JSON, each with the security headers. What every handler shares.
- ``collab``: collaborative training's panel on ``/swarm``, the Trainers tab
  (``/leaderboard?kind=trainers``) and trainers' training samples, through ``coordinator.swarm.collab_status``
  and ``coordinator.credit.training``.
- ``experiments``: ``/experiments`` and ``/experiments/{name}`` (each trainer's validation-loss curve,
  the newest generated sample as text, the model's shape and the hosts serving each grid now, through
  ``coordinator.swarm.progress``) and their JSON twins ``/api/site/experiments[/{name}]``.
- ``pages``: the handlers for finding people and data (search, find-my-rank, team and host pages, the
  exports' listing).
- ``routes``: ``setup_routes(app, ...)`` mounts it all: ``/``, ``/leaderboard`` (``range=``
  day/week/month), ``/contributors/{id}``, ``/swarm``, ``/api/site/swarm`` (its own handlers),
  ``/static/``, the experiments' pages, and, through ``pages``, ``/search``, ``/rank``, ``/teams/{id}``,
  ``/hosts/{peer_id}``, ``/exports`` and ``/exports/{file}``; bad parameters get a 400 page, versioned
  static files are cached, and unknown addresses and failures get the site's own 404 and 500 pages
  (``/api/`` and ``/ws/`` keep theirs).
- ``jobs``: ``start_jobs(app, ...)``: the periodic range refresh and daily dump on the app's loop.
- ``templates/``, ``static/``: the layout and one stylesheet; nothing is loaded from elsewhere.

Leaderboard and contributor JSON live in ``coordinator.credit.api_ledger``. Errors: ``params.BadParam`` and
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
