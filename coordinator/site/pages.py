"""Handlers for finding people and data: search, find-my-rank, team and host pages, exports.

They check parameters with ``params`` and answer through ``render`` (pages, error pages);
``routes.setup_routes`` adds them.
"""

from __future__ import annotations

import re

from aiohttp import web

from ..credit.leaderboard import MAX_DEPTH
from . import exports, ranges, rank, search, subjects
from .chart import chart_context
from .params import BadParam, choice_param, int_param
from .queries import KINDS, SORTS
from .render import SITE, error_page, leaderboard_url, render

PEER_RE = re.compile(r"^[0-9a-f]{40}$")
MAX_TEAM_ID = 2**31 - 1
#: An export is at most a day old: clients may keep it an hour.
EXPORT_CACHE = "public, max-age=3600"


async def search_page(request: web.Request) -> web.Response:
    ctx = request.app[SITE]
    raw = request.query.get("q", "")
    try:
        scope = choice_param(request.query, "in", search.SCOPES, "users")
        page = int_param(request.query.get("page", "1"), "page", 1, search.MAX_PAGE)
        async with ctx.get_sessions(request.app)() as session:
            results = await search.search(session, raw, scope, page, ctx.per_page)  # type: ignore[arg-type]
    except (BadParam, search.SearchError) as e:
        return error_page(request, 400, str(e))
    return render(request, "search.html", nav="search", results=results, scopes=search.SCOPES)


async def rank_page(request: web.Request) -> web.Response:
    """Find-my-rank: redirect to the leaderboard page holding the name, its row marked."""
    ctx = request.app[SITE]
    try:
        kind = choice_param(request.query, "kind", KINDS, "users")
        order = choice_param(request.query, "order", (*SORTS, *ranges.RANGE_DAYS), "total")
        raw = request.query.get("name", "")
        async with ctx.get_sessions(request.app)() as session:
            found = await rank.resolve(session, kind, raw)
            pos = None if found is None else await rank.position(session, kind, order, found[0], ctx.clock())
    except (BadParam, search.SearchError) as e:
        return error_page(request, 400, str(e))
    if found is None:
        if not raw.strip():
            return error_page(request, 400, "Type a name to find its rank.")
        scope = "hosts" if kind == "hosts" else kind
        raise web.HTTPFound("/search?" + _qs({"q": raw, "in": scope}))
    key, name = found
    rng = order if order in ranges.RANGE_DAYS else "all"
    sort = order if order in SORTS else "total"
    if pos is None or pos > MAX_DEPTH:
        label = ranges.RANGE_LABELS[rng] if rng != "all" else f"{sort} credit"
        why = (
            "has no credit in this range"
            if pos is None and rng != "all"
            else "is ranked below the listed pages"
        )
        return render(
            request, "rank.html", nav="leaderboard", name=name, why=why, label=label, kind=kind, key=key
        )
    page = (pos - 1) // ctx.per_page + 1
    url = leaderboard_url(kind, sort, page, rng)
    raise web.HTTPFound(url + ("&" if "?" in url else "?") + _qs({"mark": key}) + "#r-" + key)


def _qs(q: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return urlencode(q)


async def team_page(request: web.Request) -> web.Response:
    ctx = request.app[SITE]
    try:
        team_id = int_param(request.match_info["team_id"], "team id", 1, MAX_TEAM_ID)
    except BadParam:
        return error_page(request, 404, "There is no team with this id.")
    try:
        page = int_param(request.query.get("page", "1"), "page", 1, 10_000)
    except BadParam as e:
        return error_page(request, 400, str(e))
    info = await subjects.team(ctx.get_sessions(request.app), team_id, ctx.clock(), page, ctx.per_page)
    if info is None:
        return error_page(request, 404, "There is no team with this id.")
    title = f"{info.name}: daily credit, last {len(info.days)} days"
    return render(request, "team.html", nav="leaderboard", team=info, **chart_context(info.days, title))


async def host_page(request: web.Request) -> web.Response:
    ctx = request.app[SITE]
    peer_id = request.match_info["peer_id"]
    if PEER_RE.match(peer_id) is None:
        return error_page(request, 404, "There is no host with this id.")
    info = await subjects.host(ctx.get_sessions(request.app), peer_id, ctx.clock())
    if info is None or info.account_disabled:
        return error_page(request, 404, "There is no host with this id.")
    title = f"Host {peer_id[:12]}: daily credit, last {len(info.days)} days"
    return render(request, "host.html", nav="leaderboard", host=info, **chart_context(info.days, title))


async def exports_page(request: web.Request) -> web.Response:
    ctx = request.app[SITE]
    dumps = exports.listing(ctx.get_exports_dir(request.app))
    return render(request, "exports.html", nav="exports", dumps=dumps, columns=exports.COLUMNS)


async def export_file(request: web.Request) -> web.StreamResponse:
    ctx = request.app[SITE]
    path = exports.dump_path(ctx.get_exports_dir(request.app), request.match_info["name"])
    if path is None:
        return error_page(request, 404, "There is no export with this name; the exports page lists them.")
    # Already gzip: served as the file it is, never compressed again.
    return web.FileResponse(
        path,
        headers={
            "Content-Type": "application/gzip",
            "Content-Disposition": f'attachment; filename="{path.name}"',
            "Cache-Control": EXPORT_CACHE,
            "X-Content-Type-Options": "nosniff",
        },
    )
