"""Query and path parameters, checked before anything reads them: a value outside what the page accepts
raises ``BadParam`` (a ``ValueError``), which the handlers answer with a 400 page; nothing unchecked is
passed on to a query.

Its own module so that ``routes`` and the modules holding the handlers (``pages``, ``collab``) share it
without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiohttp import web

from . import ranges
from .queries import KINDS, SORTS, Kind, Sort

MAX_ACCOUNT_ID = 2**31 - 1


class BadParam(ValueError):
    """A query parameter outside what the page accepts: answered with 400, never passed on."""


def choice_param(query: Mapping[str, str], name: str, allowed: Sequence[str], default: str) -> str:
    value = query.get(name, default)
    if value not in allowed:
        raise BadParam(f"{name} must be one of: {', '.join(allowed)}")
    return value


def int_param(raw: str, name: str, lo: int, hi: int) -> int:
    # isdigit alone accepts other scripts' digits and superscripts; int() accepts "+1", " 1", "1_0".
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10:
        raise BadParam(f"{name} must be a whole number from {lo} to {hi}")
    v = int(raw)
    if not lo <= v <= hi:
        raise BadParam(f"{name} must be a whole number from {lo} to {hi}")
    return v


def leaderboard_params(query: Mapping[str, str], max_page: int) -> tuple[Kind, Sort, int, str]:
    kind = choice_param(query, "kind", KINDS, "users")
    sort = choice_param(query, "sort", SORTS, "total")
    page = int_param(query.get("page", "1"), "page", 1, max_page)
    rng = choice_param(query, "range", ranges.RANGES, "all")
    if rng != "all" and sort != "total":
        raise BadParam("a time range ranks by the credit in the range: leave out sort")
    return kind, sort, page, rng  # type: ignore[return-value]


def account_id_param(request: web.Request) -> int | None:
    try:
        return int_param(request.match_info["account_id"], "account id", 1, MAX_ACCOUNT_ID)
    except BadParam:
        return None  # no such contributor, whatever it looked like
