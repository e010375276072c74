"""Every page type of the site, audited in a real browser: axe-core, page width, screenshots.

Debian's Chromium (through Playwright) loads each page type with realistic seeded data at 1280x800 and
390x844, in the light and the dark colour scheme, and:

- runs axe-core (pinned in ``package.json``, installed by ``make test``) and fails on any serious or
  critical violation (contrast included, so both schemes are audited);
- measures the document's ``scrollWidth``: no page may be wider than the viewport;
- saves a full-page screenshot of each to ``artifacts/screenshots/<page>-<width>-<scheme>.png``.

axe needs script in the page, so these contexts run JavaScript and bypass the CSP (the pages have no
script of their own; ``test_pages_browser`` checks them with JavaScript off).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import Browser, async_playwright
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig
from coordinator.db.models import Host
from coordinator.db.session import create_all, make_engine, session_factory
from coordinator.site import exports, ranges, setup_routes

from .seed import LONG_NAME, NOW, seed_realistic
from .seed_collab import COLLAB_EXPERIMENTS, seed_collab
from .seed_progress import SEED_LM, seed_progress
from .test_pages_browser import CHROMIUM, CHROMIUM_ARGS, LAUNCH_TIMEOUT_MS, SCREENSHOTS, TIMEOUT_MS

AXE = Path(__file__).resolve().parent / "node_modules" / "axe-core" / "axe.min.js"
VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}
SCHEMES = ("light", "dark")

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="needs Debian's chromium")


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A seeded site on 127.0.0.1; returns its URL and the paths of one page of every type."""
    engine: AsyncEngine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'site.sqlite3'}")
    await create_all(engine)
    sessions = session_factory(engine)
    ids = await seed_realistic(sessions)
    await seed_progress(sessions, await seed_collab(sessions))
    await ranges.refresh(sessions, NOW)
    dumps = tmp_path / "exports"
    await exports.write_dumps(sessions, dumps, NOW)
    async with sessions() as s:
        host = (await s.execute(Host.__table__.select().order_by(Host.credit_total.desc()).limit(1))).first()
    assert host is not None
    config = CoordinatorConfig(experiments=[*COLLAB_EXPERIMENTS, SEED_LM])
    app = web.Application()
    setup_routes(
        app,
        lambda _: sessions,
        lambda _: config,
        lambda _: [f"peer{i}" for i in range(17)],
        clock=lambda: NOW,
        get_exports_dir=lambda _: dumps,
    )
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    top_team = min(ids.values())  # teams and accounts both start at 1
    pages = {
        "overview": "/",
        "leaderboard-users-total": "/leaderboard?kind=users&sort=total",
        "leaderboard-teams-recent": "/leaderboard?kind=teams&sort=recent",
        "leaderboard-hosts-week": "/leaderboard?kind=hosts&range=week",
        "leaderboard-trainers": "/leaderboard?kind=trainers",
        "leaderboard-users-day-marked": f"/leaderboard?kind=users&range=day&mark={ids[LONG_NAME]}",
        "contributor": f"/contributors/{ids[LONG_NAME]}",
        "team": f"/teams/{top_team}",
        "host": f"/hosts/{host.peer_id}",
        "search": "/search?q=a&in=users",
        "search-empty": "/search",
        "swarm": "/swarm",
        "experiments": "/experiments",
        "experiment": f"/experiments/{SEED_LM.name}",
        "exports": "/exports",
        "not-found": "/no/such/page",
        "bad-request": "/leaderboard?sort=bogus",
    }
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", pages
    finally:
        await runner.cleanup()
        await engine.dispose()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        b = await pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=LAUNCH_TIMEOUT_MS
        )
        try:
            yield b
        finally:
            await b.close()


async def audit(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the loaded page."""
    await page.add_script_tag(path=str(AXE))
    result = await page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [n["target"] for n in v["nodes"][:5]],
        }
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.timeout(600)  # 17 pages, each loaded, measured, audited and photographed, on a shared box
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("viewport", list(VIEWPORTS))
async def test_every_page_type_passes_axe_and_fits(
    site: tuple[str, dict[str, str]], browser: Browser, viewport: str, scheme: str
) -> None:
    assert AXE.exists(), "axe-core is missing: run `make test` (npm ci in tests/ui_pages)"
    base, pages = site
    width, height = VIEWPORTS[viewport]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems: dict[str, Any] = {}
    statuses: dict[str, int] = {}
    context = await browser.new_context(
        viewport={"width": width, "height": height},
        color_scheme=scheme,  # type: ignore[arg-type]
        bypass_csp=True,
        java_script_enabled=True,
    )
    try:
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        for name, path in pages.items():
            resp = await page.goto(base + path)
            assert resp is not None
            statuses[name] = resp.status
            where = f"{name} @ {width}px {scheme}"
            widths = await page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
            if widths[0] > widths[1]:
                problems[where + " width"] = f"page is {widths[0]} px wide in a {widths[1]} px viewport"
            found = await audit(page)
            if found:
                problems[where + " axe"] = found
            shot = SCREENSHOTS / f"{name}-{width}-{scheme}.png"
            await page.screenshot(path=str(shot), full_page=True, timeout=TIMEOUT_MS)
            assert shot.stat().st_size > 5_000
    finally:
        await context.close()
    assert not problems, json.dumps(problems, indent=1)
    assert statuses["not-found"] == 404 and statuses["bad-request"] == 400
    assert all(s == 200 for n, s in statuses.items() if n not in ("not-found", "bad-request")), statuses


async def test_forced_colours_keep_the_grid_readable(
    site: tuple[str, dict[str, str]], browser: Browser
) -> None:
    """In forced-colours mode the grid's cells still say how many hosts serve each expert (text, and
    solid/dashed/dotted borders), not just a colour the mode erases."""
    base, _ = site
    context = await browser.new_context(viewport={"width": 1280, "height": 800}, forced_colors="active")
    try:
        page = await context.new_page()
        await page.goto(base + "/swarm")
        cells = page.locator("table.grid").first.locator("td")
        texts = await cells.all_inner_texts()
        assert len(texts) == 64 and all(t.strip().isdigit() for t in texts)
        styles = await cells.evaluate_all("cs => cs.map(c => getComputedStyle(c).borderTopStyle)")
        classes = await cells.evaluate_all("cs => cs.map(c => c.className)")
        by_level = {c: {s for s, k in zip(styles, classes, strict=True) if k == c} for c in set(classes)}
        assert by_level.get("cov-low", {"dashed"}) == {"dashed"} and by_level.get("cov-none", {"dotted"}) == {
            "dotted"
        }
        assert by_level["cov-ok"] == {"solid"}
        dense = await page.locator("table.grid.dense td").all_inner_texts()
        assert dense and set(dense) <= {"●", "◐", "○"}
        await page.screenshot(path=str(SCREENSHOTS / "swarm-1280-forced-colors.png"), full_page=True)
    finally:
        await context.close()
