"""Finding people on the site, over HTTP on SQLite and PostgreSQL: search (and its bad input), team and
host pages (and the site's 404 for unknown ones), find-my-rank, range leaderboards, gzip and caching."""

from __future__ import annotations

import gzip
import re
from collections.abc import AsyncIterator
from html import unescape
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig
from coordinator.db.models import Account, CreditDay, CreditRange, Team
from coordinator.db.session import session_factory
from coordinator.site import ranges, search, setup_routes
from coordinator.site.routes import MAX_REQUEST_LINE, STATIC_CACHE
from tests.ui_pages.seed import NOW, TODAY, Small, peer_id, seed_small

PER_PAGE = 5
ODD_NAMES = ["a_b", "a%b", "axb", "a\\b", "Ada", "%lead", "Ärger"]

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def site(db: AsyncEngine, tmp_path: Path) -> AsyncIterator[tuple[Client, Small, dict[str, int]]]:
    sessions = session_factory(db)
    small = await seed_small(sessions)
    async with sessions() as s, s.begin():
        odd = [Account(name=n, credit_total=1.0) for n in ODD_NAMES]
        s.add_all(odd)
        await s.flush()
        extra = {a.name: a.id for a in odd}
        # Range data: u05 earned most today, u01 most over the week, u00 most over the month.
        for name, days in (("u05", {0: 500.0}), ("u01", {2: 300.0, 5: 300.0}), ("u00", {20: 2000.0})):
            for ago, credit in days.items():
                s.add(CreditDay(subject_kind="account", subject_id=str(small.ids[name]), day=TODAY - ago,
                                credit=credit))  # fmt: skip
        s.add(CreditDay(subject_kind="account", subject_id=str(small.ids["banned"]), day=TODAY, credit=1e9))
        s.add(CreditDay(subject_kind="host", subject_id=peer_id("h2"), day=TODAY - 1, credit=42.0))
    await ranges.refresh(sessions, NOW)
    config = CoordinatorConfig(experiments=[small.experiment])
    app = web.Application()
    setup_routes(
        app,
        lambda _: sessions,
        lambda _: config,
        lambda _: [],
        per_page=PER_PAGE,
        clock=lambda: NOW,
        get_exports_dir=lambda _: tmp_path,
    )
    server = TestServer(app)
    await server.start_server(max_line_size=MAX_REQUEST_LINE)
    async with TestClient(server) as client:
        yield client, small, {**small.ids, **extra}


Site = tuple[Client, Small, dict[str, int]]


async def html(client: Client, path: str, status: int = 200) -> str:
    resp = await client.get(path)
    body = await resp.text()
    assert resp.status == status, body
    assert resp.content_type == "text/html"
    assert "script-src 'none'" in resp.headers["Content-Security-Policy"]
    return body


def hits(page: str) -> list[str]:
    """Names linked from the results table."""
    if "<tbody>" not in page:
        return []
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [unescape(n) for n in re.findall(r'<a href="/(?:contributors|teams)/\d+">([^<]*)</a>', body)]


# ---- search ------------------------------------------------------------------------------------------


async def test_search_is_a_case_insensitive_prefix_match_and_pages(site: Site) -> None:
    client, _, _ = site
    first = await html(client, "/search?q=U0")
    assert hits(first) == ["u00", "u01", "u02", "u03", "u04"]
    assert 'rel="next"' in first and "<title>Search “U0” in volunteers" in first
    second = await html(client, "/search?q=u0&page=2")
    assert hits(second) == ["u05", "u06", "u07", "u08", "u09"]
    assert hits(await html(client, "/search?q=u1")) == ["u10", "u11"]
    assert hits(await html(client, "/search?q=ban")) == []  # disabled accounts are never found


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("a_", ["a_b"]),  # "_" is a letter here, not "any one character"
        ("a%", ["a%b"]),  # "%" too, not "anything"
        ("a%25", ["a%b"]),  # the same, URL-encoded by hand
        ("%", ["%lead"]),
        ("_", []),
        ("a\\", ["a\\b"]),  # the escape character itself is escaped
        ("ax", ["axb"]),
    ],
)
async def test_search_wildcards_match_themselves(site: Site, query: str, expected: list[str]) -> None:
    client, _, _ = site
    from urllib.parse import quote

    q = query if "%25" in query else quote(query)
    assert hits(await html(client, f"/search?q={q}")) == expected


async def test_search_confusables_and_compatibility_forms(site: Site) -> None:
    client, _, _ = site
    assert hits(await html(client, "/search?q=%D0%90da")) == ["Ada"]  # Cyrillic capital A, then Latin "da"
    assert hits(await html(client, "/search?q=%D0%B0d%D0%B0")) == ["Ada"]  # Cyrillic small a twice
    assert hits(await html(client, "/search?q=%EF%BC%A1%EF%BD%84")) == ["Ada"]  # full-width "Ad"
    # Non-ASCII letters match as typed everywhere (and in any case on PostgreSQL).
    assert hits(await html(client, "/search?q=%C3%84rg")) == ["Ärger"]


async def test_search_refuses_long_queries_clearly(site: Site) -> None:
    client, _, _ = site
    for q in ["x" * 10_240, "x" * 65]:
        page = await html(client, f"/search?q={q}", status=400)
        assert "Bad request" in page and "limited to 64 characters" in page
    assert "u00" in await html(client, "/search?q=" + "u00" + "%20" * 61)  # blanks are trimmed first


async def test_empty_search_shows_the_form(site: Site) -> None:
    client, _, _ = site
    for path in ["/search", "/search?q=", "/search?q=%20%20%20", "/search?q=&in=hosts"]:
        page = await html(client, path)
        assert 'type="search"' in page and "<tbody>" not in page and "match from their start" in page


async def test_search_teams_and_hosts(site: Site) -> None:
    client, _, _ = site
    assert hits(await html(client, "/search?q=RE&in=teams")) == ["red"]
    hosts = await html(client, f"/search?q={peer_id('h3')[:6].upper()}&in=hosts")
    assert f'href="/hosts/{peer_id("h3")}"' in hosts
    assert "<tbody>" not in await html(client, "/search?q=zz-not-hex&in=hosts")
    await html(client, "/search?q=a&in=admins", status=400)
    await html(client, "/search?q=a&page=0", status=400)


def test_normalise_and_escape() -> None:
    assert search.normalise("  \uff21\uff44\uff41   Lovelace ") == "Ada Lovelace"
    assert search.escape_like("a%b_c\\") == "a\\%b\\_c\\\\%"
    assert search.variants("\u0410da", "sqlite") == ("\u0410da", "ada")
    assert search.variants("Ärger", "sqlite") == ("Ärger", "ärger")
    assert search.variants("Ärger", "postgresql") == ("ärger",)
    with pytest.raises(search.SearchError):
        search.normalise("x" * 65)


async def test_name_search_uses_the_lower_name_index(site: Site, db: AsyncEngine) -> None:
    """The plan for a prefix search reads the index, not the table."""
    async with db.connect() as conn:
        if db.dialect.name == "sqlite":
            plan = (
                await conn.execute(
                    text(
                        "EXPLAIN QUERY PLAN SELECT id FROM accounts"
                        " WHERE lower(name) >= 'ab' AND lower(name) < 'ac'"
                    )
                )
            ).all()
            assert "ix_accounts_name_lower" in " ".join(str(r[-1]) for r in plan)
        else:
            await conn.execute(text("SET enable_seqscan = off"))
            plan = (
                await conn.execute(
                    text(
                        "EXPLAIN SELECT id FROM accounts WHERE lower(name) LIKE 'ab%'"
                        " ORDER BY lower(name) USING ~<~ LIMIT 5"
                    )
                )
            ).all()
            text_plan = " ".join(r[0] for r in plan)
            # The prefix is a range of the index (on big tables the index also gives the order).
            assert "ix_accounts_name_lower" in text_plan and "Index Cond" in text_plan, text_plan


# ---- team and host pages, the site's 404 -------------------------------------------------------------


async def test_team_page(site: Site, db: AsyncEngine) -> None:
    client, _, _ = site
    async with session_factory(db)() as s:
        red = (await s.execute(Team.__table__.select().where(Team.name == "red"))).first()
    assert red is not None
    page = await html(client, f"/teams/{red.id}")
    assert "<h1>red</h1>" in page and "6 members" in page and "<title>red · Team" in page
    assert hits(page.split('id="members-h"')[1]) == ["u00", "u02", "u04", "u06", "u08"]
    assert 'rel="next" href="/teams/' in page
    assert hits((await html(client, f"/teams/{red.id}?page=2")).split('id="members-h"')[1]) == ["u10"]


async def test_host_page(site: Site) -> None:
    client, small, _ = site
    page = await html(client, f"/hosts/{peer_id('h2')}")
    assert f'<a href="/contributors/{small.ids["u02"]}">u02</a>' in page
    assert "3,000" in page and "<svg" in page and "Daily credit as a table" in page


@pytest.mark.parametrize(
    "path",
    [
        "/teams/999999",
        "/teams/0",
        "/teams/abc",
        "/teams/1%20OR%201=1",
        "/hosts/" + "0" * 40,
        "/hosts/xyz",
        "/hosts/" + "A" * 40,
        "/no/such/page",
        "/leaderboards",
        "/exports/users-2025-01-01.csv.gz",
        "/exports/..%2Fsite.sqlite3",
    ],
)
async def test_unknown_pages_get_the_sites_404(site: Site, path: str) -> None:
    client, _, _ = site
    page = await html(client, path, status=404)
    assert "<h1>Not found</h1>" in page and 'href="/leaderboard"' in page and "site.css" in page


async def test_api_addresses_keep_their_own_404(site: Site) -> None:
    client, _, _ = site
    resp = await client.get("/api/nothing")
    assert resp.status == 404 and resp.content_type != "text/html"


async def test_a_failing_page_gets_the_sites_error_page(db: AsyncEngine) -> None:
    def broken(_: web.Application) -> CoordinatorConfig:
        raise RuntimeError("config gone")

    app = web.Application()
    setup_routes(app, lambda _: session_factory(db), broken, None, clock=lambda: NOW)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/swarm")
        body = await resp.text()
        assert resp.status == 500 and "Something went wrong" in body and "config gone" not in body


# ---- ranges and find-my-rank -------------------------------------------------------------------------


def board_names(page: str) -> list[str]:
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [unescape(n) for n in re.findall(r'<a href="/contributors/\d+">([^<]*)</a>', body)]


async def test_range_leaderboards(site: Site) -> None:
    client, _, _ = site
    day = await html(client, "/leaderboard?kind=users&range=day")
    assert board_names(day) == ["u05"]  # the disabled account's credit today is never shown...
    assert re.search(r'<td class="num rank">1</td>', day)  # ...nor counted
    assert "<title>Volunteers by credit today · Leaderboard" in day
    assert board_names(await html(client, "/leaderboard?kind=users&range=week")) == ["u01", "u05", "u00"]
    assert board_names(await html(client, "/leaderboard?kind=users&range=month")) == ["u00", "u01", "u05"]
    hosts = await html(client, "/leaderboard?kind=hosts&range=week")
    assert f'href="/hosts/{peer_id("h2")}"' in hosts and "42.0" in hosts
    await html(client, "/leaderboard?kind=users&range=year", status=400)
    await html(client, "/leaderboard?kind=users&range=week&sort=recent", status=400)


async def test_ranges_refresh_replaces_the_old_sums(site: Site, db: AsyncEngine) -> None:
    client, small, _ = site
    sessions = session_factory(db)
    async with sessions() as s, s.begin():
        s.add(CreditDay(subject_kind="account", subject_id=str(small.ids["u09"]), day=TODAY, credit=9000.0))
    await ranges.refresh(sessions, NOW + 60)
    assert board_names(await html(client, "/leaderboard?kind=users&range=day")) == ["u09", "u05"]
    await ranges.refresh(sessions, NOW + 86400 * 40)  # 40 days on: every window is empty
    assert "<tbody>" not in await html(client, "/leaderboard?kind=users&range=month")


@pytest.mark.parametrize(
    ("query", "location"),
    [
        ("kind=users&name=u07", "/leaderboard?kind=users&sort=total&page=2&mark={u07}#r-{u07}"),
        ("kind=users&name=U07&order=recent", "/leaderboard?kind=users&sort=recent&page=2&mark={u07}#r-{u07}"),
        ("kind=users&name=u01&order=week", "/leaderboard?kind=users&range=week&mark={u01}#r-{u01}"),
        ("kind=users&name=stale&order=recent", "/leaderboard?kind=users&sort=recent&mark={stale}#r-{stale}"),
    ],
)
async def test_find_my_rank_jumps_to_the_page(site: Site, query: str, location: str) -> None:
    client, _, ids = site
    resp = await client.get(f"/rank?{query}", allow_redirects=False)
    assert resp.status == 302
    assert resp.headers["Location"] == location.format(**ids)
    page = await html(client, resp.headers["Location"].split("#")[0])
    name = re.search(r"name=(\w+)", query).group(1).lower()  # type: ignore[union-attr]
    assert re.search(rf'<tr id="r-{ids[name]}" class="mark" aria-current="true">', page)


async def test_find_my_rank_without_a_match(site: Site) -> None:
    client, _, _ = site
    resp = await client.get("/rank?kind=users&name=u", allow_redirects=False)
    assert resp.status == 302 and resp.headers["Location"] == "/search?q=u&in=users"
    page = await html(client, "/rank?kind=users&name=u02&order=day")
    assert "has no credit in this range" in page
    await html(client, "/rank?kind=users&name=", status=400)
    await html(client, "/rank?kind=users&name=u00&order=forever", status=400)


# ---- compression and caching -------------------------------------------------------------------------


async def test_pages_are_gzipped_and_versioned_static_files_cached(site: Site) -> None:
    client, _, _ = site
    resp = await client.get("/leaderboard", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    raw = await resp.read()
    assert resp.headers["Content-Encoding"] == "gzip"
    assert b"<h1>Leaderboard</h1>" in gzip.decompress(raw)
    plain = await client.get("/leaderboard", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers
    css = re.search(r'href="(/static/site\.css\?v=[^"]+)"', await plain.text())
    assert css is not None
    versioned = await client.get(unescape(css.group(1)))
    assert versioned.status == 200 and versioned.headers["Cache-Control"] == STATIC_CACHE
    bare = await client.get("/static/site.css")
    assert bare.headers["Cache-Control"] == "no-cache"


async def test_a_half_written_range_refresh_is_never_read_and_is_dropped(site: Site, db: AsyncEngine) -> None:
    """Rows of a generation nobody published (a refresh killed mid-way) change no page, and the next
    refresh deletes them."""
    client, small, _ = site
    sessions = session_factory(db)
    async with sessions() as s, s.begin():
        s.add(
            CreditRange(
                subject_kind="account",
                days=1,
                computed_at=NOW + 1,
                subject_id=str(small.ids["u09"]),
                credit=1e6,
            )
        )
    assert board_names(await html(client, "/leaderboard?kind=users&range=day")) == ["u05"]
    resp = await client.get("/rank?kind=users&name=u09&order=day")
    assert "has no credit in this range" in await resp.text()
    await ranges.refresh(sessions, NOW + 120)
    async with sessions() as s:
        generations = (await s.execute(select(CreditRange.computed_at).distinct())).scalars().all()
    assert generations == [NOW + 120]
    assert board_names(await html(client, "/leaderboard?kind=users&range=day")) == ["u05"]


async def test_find_my_rank_below_the_listed_pages(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting stops at the leaderboard's depth: a name further down gets a page saying so."""
    from coordinator.site import pages, rank

    for module in (rank, ranges, pages):
        monkeypatch.setattr(module, "MAX_DEPTH", 2)  # u05: 6th by total, 3rd over 30 days
    client, _, _ = site
    for order in ("total", "month"):
        page = await html(client, f"/rank?kind=users&name=u05&order={order}")
        assert "is ranked below the listed pages" in page, (order, page[-3000:])
    resp = await client.get("/rank?kind=users&name=u01&order=total", allow_redirects=False)
    assert resp.status == 302  # rank 2: listed
    resp = await client.get("/rank?kind=users&name=u05&order=recent", allow_redirects=False)
    assert resp.status == 200 and "is ranked below the listed pages" in await resp.text()
