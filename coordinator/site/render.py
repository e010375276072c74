"""What every page handler shares: the site's context on the app, the Jinja2 environment and its filters,
and the responses (a rendered page, the error page, JSON), each with the site's security headers.

Its own module so that ``routes`` (which mounts the handlers) and the modules holding the handlers
(``pages``, ``collab``, ``experiments``) both import it, and not each other.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ..config import CoordinatorConfig
from . import ranges
from .chart import day_label

HERE = Path(__file__).parent
TEMPLATES_DIR = HERE / "templates"
STATIC_DIR = HERE / "static"

SessionsGetter = Callable[[web.Application], async_sessionmaker[AsyncSession]]
ConfigGetter = Callable[[web.Application], CoordinatorConfig]
OnlineGetter = Callable[[web.Application], Sequence[str] | Awaitable[Sequence[str] | None] | None]
ExportsGetter = Callable[[web.Application], Path]

#: No script at all, nothing from elsewhere: the pages need neither.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@dataclass(frozen=True)
class SiteContext:
    get_sessions: SessionsGetter
    get_config: ConfigGetter
    get_online: OnlineGetter | None
    env: jinja2.Environment
    per_page: int
    clock: Callable[[], float]
    get_exports_dir: ExportsGetter


SITE = web.AppKey("site", SiteContext)


def make_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=True,  # every template, whatever its name: display names are user input
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["credit"] = format_credit
    env.filters["compact"] = compact
    env.filters["day"] = day_label
    env.filters["short_peer"] = short_peer
    env.filters["date"] = format_date
    env.globals["lb_url"] = leaderboard_url
    env.globals["ago"] = ago
    env.globals["range_labels"] = ranges.RANGE_LABELS
    env.globals["ranges"] = ranges.RANGES
    return env


# ---- formatting ----------------------------------------------------------------------------------------


def format_credit(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:,.1f}"


def compact(v: float) -> str:
    """Big counts for the stat tiles: 13,628,885 -> "13.6M"; below a million, all digits."""
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(v) >= limit:
            return f"{v / limit:.1f}{suffix}"
    return f"{v:,.0f}"


def short_peer(peer_id: str) -> str:
    return peer_id if len(peer_id) <= 12 else peer_id[:12] + "…"


def ago(ts: float, now: float) -> str:
    if ts <= 0:
        return "never"
    s = max(0.0, now - ts)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if s >= size:
            return f"{int(s // size)} {unit} ago"
    return "just now"


def format_date(value: Any) -> str:
    """A datetime, or unix time, as "2025-06-15" (UTC); "unknown" for none."""
    if value is None or value == 0:
        return "unknown"
    if isinstance(value, int | float):
        return time.strftime("%Y-%m-%d", time.gmtime(value))
    return str(value.strftime("%Y-%m-%d"))


def leaderboard_url(kind: str, sort: str, page: int = 1, range: str = "all", mark: str | None = None) -> str:
    q: dict[str, str | int] = {"kind": kind}
    if range != "all":
        q["range"] = range
    else:
        q["sort"] = sort
    if page > 1:
        q["page"] = page
    url = "/leaderboard?" + urlencode(q)
    if mark is not None:
        url += "#r-" + mark
    return url


# ---- responses -----------------------------------------------------------------------------------------


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    ctx = request.app[SITE]
    context.setdefault("now", ctx.clock())
    context.setdefault("nav", "")
    body = ctx.env.get_template(template).render(static=_static_urls(request), **context)
    resp = web.Response(text=body, status=status, content_type="text/html", charset="utf-8")
    resp.headers.update(SECURITY_HEADERS)
    compress(request, resp)
    return resp


def compress(request: web.Request, resp: web.StreamResponse) -> None:
    """gzip when the client takes it (pages shrink about fivefold)."""
    if "gzip" in request.headers.get("Accept-Encoding", "").lower():
        resp.enable_compression(web.ContentCoding.gzip)


def _static_urls(request: web.Request) -> Callable[[str], str]:
    resource = request.app.router["site.static"]

    def url(filename: str) -> str:
        return str(resource.url_for(filename=filename))

    return url


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    titles = {400: "Bad request", 404: "Not found", 500: "Something went wrong"}
    return render(request, "error.html", status=status, title=titles.get(status, "Error"), message=message)


def error_json(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=SECURITY_HEADERS)


def to_json(obj: Any) -> Any:
    return dataclasses.asdict(obj)
