"""The project site: server-rendered pages (no JavaScript), and the swarm view's JSON.

- ``routes``: ``setup_routes(app, ...)`` adds ``/``, ``/leaderboard``, ``/contributors/{id}``, ``/swarm``,
  ``/api/site/swarm`` and ``/static/``; it validates every parameter (bad ones get a 400 page) and renders
  Jinja2 templates with autoescaping on. Leaderboard and contributor JSON live in ``coordinator.api_ledger``.
- ``queries``: what the pages read: ``coordinator.leaderboard``'s results plus a few page-only lookups,
  and the swarm view (grid coverage, top hosts).
- ``chart``: credit over time as inline SVG drawn on the server, so pages need no JavaScript.
- ``templates/``, ``static/``: the layout and one stylesheet; nothing is loaded from elsewhere.
"""

from .jobs import start_jobs
from .routes import MAX_REQUEST_LINE, services_exports_dir, services_sessions, setup_routes

__all__ = ["MAX_REQUEST_LINE", "services_exports_dir", "services_sessions", "setup_routes", "start_jobs"]
