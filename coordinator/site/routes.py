"""Mounts the site on the app (``setup_routes``): the pages' handlers, here and in ``pages``, ``collab``
and ``experiments``, the static files, and the middleware that answers unknown addresses and failures
with the site's own pages; see the package docstring for the map."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..config import CoordinatorConfig
from ..credit.leaderboard import MAX_DEPTH, LeaderboardError
from ..services import SERVICES
from . import experiments, pages, queries, subjects
from .chart import chart_context
from .collab import collab_panel, panel_context, trainers_page, training_samples
from .params import BadParam, account_id_param, leaderboard_params
from .queries import KINDS, ExperimentCoverage
from .render import (
    SECURITY_HEADERS,
    SITE,
    STATIC_DIR,
    ConfigGetter,
    ExportsGetter,
    OnlineGetter,
    SessionsGetter,
    SiteContext,
    error_page,
    make_env,
    render,
    to_json,
)

#: Grids with more cells than this are summarised, not drawn cell by cell.
MAX_GRID_CELLS = 4096
ROW_1D = 16  # a one-dimensional grid wraps into rows of this many cells

log = logging.getLogger(__name__)
#: Request lines the server accepts (aiohttp's default is 8190 bytes): long enough that an oversized
#: search reaches the site and gets its own clear 400 page instead of a bare parser error.
MAX_REQUEST_LINE = 16 * 1024
#: Versioned static files (``?v=<hash>``) never change under their URL.
STATIC_CACHE = "public, max-age=31536000, immutable"


def services_sessions(app: web.Application) -> async_sessionmaker[AsyncSession]:
    return app[SERVICES].sessions


def services_config(app: web.Application) -> CoordinatorConfig:
    return app[SERVICES].config


async def hub_online(app: web.Application) -> Sequence[str] | None:
    """Every replica's peers (coordinator.hub.presence), not only this process's."""
    from ..hub.signaling import HUB_KEY

    hub = app.get(HUB_KEY)
    return None if hub is None else await hub.online_all()


def services_database_url(app: web.Application) -> str:
    """The URL of the services' database, password included (handed to the dump child process)."""
    return app[SERVICES].engine.url.render_as_string(hide_password=False)


def services_exports_dir(app: web.Application) -> Path:
    return exports_dir(app[SERVICES].config)


def exports_dir(config: CoordinatorConfig) -> Path:
    if config.exports_dir:
        return Path(config.exports_dir)
    import platformdirs

    return Path(platformdirs.user_data_dir("learning-at-home")) / "exports"


def setup_routes(
    app: web.Application,
    get_sessions: SessionsGetter = services_sessions,
    get_config: ConfigGetter = services_config,
    get_online: OnlineGetter | None = hub_online,
    *,
    per_page: int = 25,
    clock: Callable[[], float] = time.time,
    get_exports_dir: ExportsGetter = services_exports_dir,
) -> None:
    """Add the pages, ``/api/site/swarm``, ``/api/site/experiments``, ``/exports/`` and ``/static/`` to
    ``app``, and the site's own
    404 and error pages for every address outside ``/api/`` and ``/ws/``.

    The leaderboard's and contributors' JSON is ``coordinator.credit.api_ledger``'s (``/api/leaderboard``,
    ``/api/contributors/{id}``); only the swarm view (coverage, peers online, top hosts) is new here.

    By default the pages read ``app[SERVICES]`` and the signaling hub (0 peers online without one).
    The accessors are called per request with the app, so these may be put on the app after this
    (at startup); tests pass their own.
    """
    app[SITE] = SiteContext(
        get_sessions, get_config, get_online, make_env(), per_page, clock, get_exports_dir
    )
    r = app.router
    r.add_get("/", index, name="site.index")
    r.add_get("/leaderboard", leaderboard_page, name="site.leaderboard")
    r.add_get("/contributors/{account_id}", contributor_page, name="site.contributor")
    r.add_get("/teams/{team_id}", pages.team_page, name="site.team")
    r.add_get("/hosts/{peer_id}", pages.host_page, name="site.host")
    r.add_get("/search", pages.search_page, name="site.search")
    r.add_get("/rank", pages.rank_page, name="site.rank")
    r.add_get("/exports", pages.exports_page, name="site.exports")
    r.add_get("/exports/{name}", pages.export_file, name="site.export_file")
    r.add_get("/swarm", swarm_page, name="site.swarm")
    r.add_get("/api/site/swarm", swarm_api, name="site.api.swarm")
    r.add_get("/experiments", experiments.experiments_page, name="site.experiments")
    r.add_get("/experiments/{name}", experiments.experiment_page, name="site.experiment")
    r.add_get("/api/site/experiments", experiments.experiments_api, name="site.api.experiments")
    r.add_get("/api/site/experiments/{name}", experiments.experiment_api, name="site.api.experiment")
    r.add_static("/static/", STATIC_DIR, name="site.static", append_version=True)
    app.middlewares.append(site_errors)
    app.on_response_prepare.append(_cache_static)


def _is_page(request: web.Request) -> bool:
    return not request.path.startswith(("/api/", "/ws/", "/healthz"))


@web.middleware
async def site_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Unknown addresses and failures get the site's own pages (JSON and sockets keep theirs)."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPNotFound:
        if not _is_page(request):
            raise
        return error_page(request, 404, "There is no page at this address.")
    except web.HTTPException:
        raise
    except Exception:
        if not _is_page(request):
            raise
        log.exception("page %s failed", request.path)
        return error_page(request, 500, "Something went wrong on our side. Please try again in a minute.")


async def _cache_static(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith("/static/") and response.status == 200:
        response.headers["Cache-Control"] = STATIC_CACHE if "v" in request.query else "no-cache"


# ---- handlers ------------------------------------------------------------------------------------------


async def _load_swarm(request: web.Request, top: int = 20) -> queries.Swarm:
    ctx = request.app[SITE]
    online = ctx.get_online(request.app) if ctx.get_online is not None else None
    if inspect.isawaitable(online):
        online = await online
    config = ctx.get_config(request.app)
    async with ctx.get_sessions(request.app)() as session:
        return await queries.swarm(session, config.grids, len(online or ()), ctx.clock(), top)


async def index(request: web.Request) -> web.Response:
    ctx = request.app[SITE]
    swarm = await _load_swarm(request, top=0)
    sessions = ctx.get_sessions(request.app)
    users = await queries.leaderboard_page(sessions, "users", "recent", 1, 5, ctx.clock())
    teams = await queries.leaderboard_page(sessions, "teams", "recent", 1, 5, ctx.clock())
    return render(request, "index.html", nav="index", swarm=swarm, users=users, teams=teams)


async def leaderboard_page(request: web.Request) -> web.Response:
    if request.query.get("kind") == "trainers":
        return await trainers_page(request)
    ctx = request.app[SITE]
    try:
        kind, sort, page, rng = leaderboard_params(request.query, max_page=MAX_DEPTH // ctx.per_page)
        sessions = ctx.get_sessions(request.app)
        if rng == "all":
            board = await queries.leaderboard_page(sessions, kind, sort, page, ctx.per_page, ctx.clock())
        else:
            board = await queries.range_leaderboard_page(sessions, kind, rng, page, ctx.per_page)
    except (BadParam, LeaderboardError) as e:
        return error_page(request, 400, str(e))
    mark = request.query.get("mark")
    return render(request, "leaderboard.html", nav="leaderboard", board=board, kinds=KINDS, mark=mark)


async def _load_contributor(request: web.Request) -> queries.Contributor | None:
    account_id = account_id_param(request)
    if account_id is None:
        return None
    ctx = request.app[SITE]
    return await queries.contributor(ctx.get_sessions(request.app), account_id, ctx.clock())


async def contributor_page(request: web.Request) -> web.Response:
    who = await _load_contributor(request)
    if who is None:
        return error_page(request, 404, "There is no contributor with this id.")
    ctx = request.app[SITE]
    extras = await subjects.account_extras(ctx.get_sessions(request.app), who.id, who.total)
    chart = chart_context(who.days, f"Daily credit, last {len(who.days)} days")
    training = await training_samples(request, who.id)
    return render(
        request, "contributor.html", nav="leaderboard", who=who, extras=extras, training=training, **chart
    )


@dataclass(frozen=True)
class GridCell:
    uid: str
    label: str
    hosts: int
    level: str  # css class: none, low, ok


@dataclass(frozen=True)
class GridView:
    """An experiment's grid laid out as table rows: the last grid axis runs across."""

    col_labels: list[str]
    rows: list[tuple[str, list[GridCell]]]


def grid_view(exp: ExperimentCoverage) -> GridView | None:
    if exp.experts == 0 or exp.experts > MAX_GRID_CELLS:
        return None
    cells = []
    for uid, n in exp.hosts_per_expert.items():
        level = "none" if n == 0 else "low" if n < exp.replication else "ok"
        cells.append(GridCell(uid, uid[len(exp.name) + 1 :], n, level))
    width = exp.grid[-1] if len(exp.grid) > 1 else min(ROW_1D, exp.experts)
    rows = []
    for start in range(0, len(cells), width):
        chunk = cells[start : start + width]
        # 2-D and up: the row is the uid without its last index; 1-D: the range of indices in the row.
        label = chunk[0].label.rsplit(".", 1)[0] if len(exp.grid) > 1 else f"{start}-{start + len(chunk) - 1}"
        rows.append((label, chunk))
    return GridView([str(j) for j in range(width)] if len(exp.grid) > 1 else [], rows)


async def swarm_page(request: web.Request) -> web.Response:
    swarm = await _load_swarm(request)
    grids = [grid_view(e) for e in swarm.experiments]
    config = request.app[SITE].get_config(request.app)
    return render(
        request,
        "swarm.html",
        nav="swarm",
        swarm=swarm,
        experiments=list(zip(swarm.experiments, grids, strict=True)),
        experiment_of={g.name: g.part_of or g.name for g in config.grids},  # a layer's page is its model's
        collaborations=await collab_panel(request),
        **panel_context(),
    )


async def swarm_api(request: web.Request) -> web.Response:
    swarm = await _load_swarm(request)
    data = to_json(swarm)
    for exp, out in zip(swarm.experiments, data["experiments"], strict=True):
        out.update(experts=exp.experts, covered=exp.covered, replicated=exp.replicated)
    return web.json_response(data, headers=SECURITY_HEADERS)
