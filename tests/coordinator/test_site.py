"""The project site over HTTP, on SQLite and PostgreSQL: pages, JSON, sorting, paging, escaping, bad input."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from html import unescape

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig
from coordinator.db.models import Account, Assignment, Host
from coordinator.db.session import session_factory
from coordinator.site import setup_routes
from tests.ui_pages.seed import NOW, XSS, XSS_TEAM, Small, seed_small

PER_PAGE = 5


@pytest.fixture
async def site(db: AsyncEngine) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], Small]]:
    sessions = session_factory(db)
    small = await seed_small(sessions)
    config = CoordinatorConfig(experiments=[small.experiment])
    app = web.Application()
    setup_routes(
        app,
        lambda _: sessions,
        lambda _: config,
        lambda _: ["peer-a", "peer-b"],
        per_page=PER_PAGE,
        clock=lambda: NOW,
    )
    async with TestClient(TestServer(app)) as client:
        yield client, small


Site = tuple[TestClient[web.Request, web.Application], Small]


async def get_json(client: TestClient[web.Request, web.Application], path: str) -> dict:  # type: ignore[type-arg]
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    assert resp.content_type == "application/json"
    data: dict = await resp.json()  # type: ignore[type-arg]
    return data


async def get_html(client: TestClient[web.Request, web.Application], path: str, status: int = 200) -> str:
    resp = await client.get(path)
    text = await resp.text()
    assert resp.status == status, text
    assert resp.content_type == "text/html"
    assert "script-src 'none'" in resp.headers["Content-Security-Policy"]
    return text


def names_in_table(html: str) -> list[str]:
    return [unescape(n) for n in re.findall(r'<a href="/contributors/\d+">([^<]*)</a>', html)]


def table_rows(html: str) -> list[list[str]]:
    """Cell texts of the first table body (tags stripped, entities decoded)."""
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        for tr in re.split(r"<tr[^>]*>", body)[1:]
    ]


async def board(client: TestClient[web.Request, web.Application], query: str) -> list[list[str]]:
    return table_rows(await get_html(client, f"/leaderboard?{query}"))


def num(cell: str) -> float:
    return float(cell.replace(",", ""))


async def test_pages_render(site: Site) -> None:
    client, small = site
    index = await get_html(client, "/")
    for link in ('href="/leaderboard', 'href="/swarm"', "/static/site.css"):
        assert link in index
    assert "peers online" in index
    board = await get_html(client, "/leaderboard")
    assert names_in_table(board) == ["u00", "u01", "u02", "u03", "u04"]
    who = await get_html(client, f"/contributors/{small.ids['u00']}")
    assert "<h1>u00</h1>" in who and "<svg" in who and re.search(r'team <a href="/teams/\d+">red</a>', who)
    swarm = await get_html(client, "/swarm")
    assert "ffn" in swarm


async def test_users_sorted_by_total_and_recent_and_paged(site: Site) -> None:
    client, _ = site
    total = await board(client, "kind=users&sort=total")
    assert [r[1] for r in total] == ["u00", "u01", "u02", "u03", "u04"]
    assert [num(r[3]) for r in total] == [1200, 1100, 1000, 900, 800]
    page3 = await board(client, "kind=users&sort=total&page=3")
    assert [(r[0], r[1]) for r in page3] == [("11", "u10"), ("12", "u11"), ("13", "stale"), ("14", XSS)]
    html = await get_html(client, "/leaderboard?sort=total&page=3")
    assert "Page 3 of 3 · 14 volunteers" in html  # the disabled account is not counted
    assert "banned" not in html and 'rel="next"' not in html
    last = await board(client, "sort=recent&page=3")
    assert last[-1][1] == XSS and num(last[-1][4]) == 0.0


async def test_recent_credit_is_decayed_to_now_before_sorting(site: Site) -> None:
    client, _ = site
    rows = await board(client, "sort=recent")
    # "stale" stored 1e5 seventy days ago: 1e5 / 2**10 = 97.7 now, below u09's 100 and above u08's 90.
    assert [r[1] for r in rows] == ["u11", "u10", "u09", "stale", "u08"]
    rac = math.log(2) / 7  # the ledger's recent sum as a per-day average
    assert num(rows[0][4]) == pytest.approx(120 * rac, abs=0.05)
    assert num(rows[3][4]) == pytest.approx(1e5 / 2**10 * rac, abs=0.05)


async def test_leaderboard_html_sort_links_and_pager(site: Site) -> None:
    client, _ = site
    html = await get_html(client, "/leaderboard?kind=users&sort=recent&page=2")
    assert names_in_table(html) == ["u07", "u06", "u05", "u04", "u03"]
    assert 'href="/leaderboard?kind=users&amp;sort=total"' in html  # header link to the other sort
    assert 'rel="prev" href="/leaderboard?kind=users&amp;sort=recent"' in html
    assert 'rel="next" href="/leaderboard?kind=users&amp;sort=recent&amp;page=3"' in html
    assert "Page 2 of 3" in html
    beyond = await get_html(client, "/leaderboard?page=9")
    assert "There is no page 9" in beyond


async def test_teams_and_hosts_boards(site: Site) -> None:
    client, small = site
    teams = await board(client, "kind=teams")
    assert [(t[1], t[2]) for t in teams] == [("red", "6"), ("blue", "6"), (XSS_TEAM, "1")]
    assert (await board(client, "kind=teams&sort=recent"))[0][1] == "blue"
    html = await get_html(client, "/leaderboard?kind=hosts")
    assert "13 hosts" in html
    assert f'<a href="/contributors/{small.ids["u00"]}">u00</a>' in html  # owner links to the contributor
    hosts = await board(client, "kind=hosts&sort=recent")
    assert [h[2] for h in hosts[:2]] == ["u11", "u10"] and [h[3] for h in hosts[:2]] == ["blue", "red"]


async def test_display_names_are_escaped_everywhere(site: Site) -> None:
    client, small = site
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    paths = [
        "/leaderboard?page=3",
        "/leaderboard?kind=hosts&page=3",
        f"/contributors/{small.ids[XSS]}",
        "/swarm",
    ]
    for path in paths[:3]:
        html = await get_html(client, path)
        assert "<script" not in html
        assert escaped in html, path
    teams = await get_html(client, "/leaderboard?kind=teams")
    assert "<b onmouseover" not in teams and "&lt;b onmouseover=&#34;x()&#34;&gt;bold&lt;/b&gt;" in teams
    who = await get_html(client, f"/contributors/{small.ids[XSS]}")
    assert "<b onmouseover" not in who
    swarm = await get_html(client, "/swarm")
    assert "<script" not in swarm


@pytest.mark.parametrize(
    "query",
    [
        "kind=admins",
        "kind=users%27%20OR%20%271%27%3D%271",
        "sort=name",
        "sort=total;DROP TABLE accounts",
        "sort=credit_total%20DESC--",
        "page=0",
        "page=-1",
        "page=abc",
        "page=1.5",
        "page=%2B2",
        "page=%202",
        "page=1_0",
        "page=%D9%A3",  # ARABIC-INDIC DIGIT THREE: isdigit() but not ASCII
        "page=2001",  # deeper than coordinator.credit.leaderboard.MAX_DEPTH rows (5 a page)
        "page=99999999999999999999999999",
        "page=1%20OR%201%3D1",
        "kind=",
    ],
)
async def test_bad_parameters_get_400(site: Site, query: str) -> None:
    client, _ = site
    html = await get_html(client, f"/leaderboard?{query}", status=400)
    assert "Bad request" in html and "must be" in html


async def test_injection_attempts_change_nothing(site: Site, db: AsyncEngine) -> None:
    client, _ = site
    for path in [
        "/leaderboard?kind=users;DELETE FROM accounts",
        "/leaderboard?sort=recent) OR 1=1 --",
        "/contributors/1 OR 1=1",
        "/contributors/1;DROP TABLE hosts",
        "/contributors/1%27--",
        "/contributors/0x1",
    ]:
        resp = await client.get(path)
        assert resp.status in (400, 404), path
    async with session_factory(db)() as s:
        assert (await s.execute(select(func.count()).select_from(Account))).scalar_one() == 15
        assert (await s.execute(select(func.count()).select_from(Host))).scalar_one() == 13
    assert "14 volunteers" in await get_html(client, "/leaderboard")


@pytest.mark.parametrize("ident", ["999999", "0", "-1", "abc", "1e3", "2147483648", "%EF%BC%91"])
async def test_unknown_contributor_is_404(site: Site, ident: str) -> None:
    client, _ = site
    html = await get_html(client, f"/contributors/{ident}", status=404)
    assert "Not found" in html and "no contributor" in html


async def test_disabled_account_has_no_page(site: Site) -> None:
    client, small = site
    await get_html(client, f"/contributors/{small.ids['banned']}", status=404)


async def test_contributor_page(site: Site) -> None:
    client, small = site
    uid = small.ids["u00"]
    html = await get_html(client, f"/contributors/{uid}")
    assert "<h1>u00</h1>" in html and re.search(r'team <a href="/teams/\d+">red</a>', html)
    assert "Rank 1 by total credit" in html
    assert re.search(r'<div class="value">1,200</div><div class="label">total credit', html)
    # 30 days at least; the 400-day-old row is outside the chart
    assert html.count('<rect class="hover"') == 30
    assert "<title>2025-06-15: 0.0</title>" in html and "<title>2025-06-14: 10.0</title>" in html
    assert "<title>2025-06-06: 90.0</title>" in html
    assert ">Jun 15</text>" in html  # x axis label: today
    assert '<div class="value">450</div><div class="label">credit in the last 30 days' in html
    hosts = table_rows(html.split('id="hosts-h"')[1])
    assert hosts[0][1:4] == ["1,200", "1.0", "1,000"]  # a host's total, recent, requests
    assert "just now" in hosts[0][4]
    u03 = await get_html(client, f"/contributors/{small.ids['u03']}")
    assert "flagged" in u03 and "3 min ago" in u03
    stale = await get_html(client, f"/contributors/{small.ids['stale']}")
    assert "No credit in the last 30 days" in stale and "No hosts bound" in stale
    assert "Rank 13 by total credit" in stale


async def test_swarm_page_and_json(site: Site) -> None:
    client, _ = site
    data = await get_json(client, "/api/site/swarm")
    assert data["peers_online"] == 2
    (exp,) = data["experiments"]
    assert exp["name"] == "ffn" and exp["experts"] == 6
    assert exp["hosts_per_expert"] == {
        "ffn.0.0": 2,
        "ffn.0.1": 1,
        "ffn.0.2": 0,
        "ffn.1.0": 0,
        "ffn.1.1": 0,
        "ffn.1.2": 0,
    }
    assert exp["covered"] == 2 and exp["replicated"] == 1
    assert [h["requests_served"] for h in data["top_hosts"][:3]] == [12000, 11000, 10000]
    assert data["hosts"] == 13 and data["requests_served"] == sum(1000 * i for i in range(1, 13))
    html = await get_html(client, "/swarm")
    assert html.count('class="cov-ok"') == 2  # the one replicated cell, and its part of the bar
    assert 'title="ffn.0.1: 1 of 2 hosts"' in html and 'title="ffn.1.0: 0 of 2 hosts"' in html
    assert "1 of 6 experts have 2 or more live hosts" in html


async def test_static_stylesheet(site: Site) -> None:
    client, _ = site
    resp = await client.get("/static/site.css")
    assert resp.status == 200 and resp.content_type == "text/css"
    assert "table.board" in await resp.text()
    missing = await client.get("/static/../routes.py")
    assert missing.status in (403, 404)


async def test_assignment_count_excludes_expired(site: Site, db: AsyncEngine) -> None:
    async with session_factory(db)() as s:
        assert (await s.execute(select(func.count()).select_from(Assignment))).scalar_one() == 5
    client, _ = site
    exp = (await get_json(client, "/api/site/swarm"))["experiments"][0]
    assert exp["hosts_per_expert"]["ffn.1.0"] == 0
