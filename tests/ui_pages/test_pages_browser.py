"""The site in a real browser (Debian's Chromium through Playwright), on a real server on 127.0.0.1.

Seeds a realistic swarm, walks the pages a visitor would, asserts what is on screen and saves a
screenshot of each page to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import BrowserContext, Page, async_playwright, expect
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.config import CoordinatorConfig
from coordinator.db.session import create_all, make_engine, session_factory
from coordinator.site import setup_routes

from .seed import NOW, REALISTIC_EXPERIMENTS, XSS, seed_realistic

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 15_000
# Starting Chromium on a fresh profile is a process launch, not a page wait: on a 2-core box busy
# with the rest of the suite it has taken over 15 s, so it gets its own, longer bound.
LAUNCH_TIMEOUT_MS = 60_000

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="needs Debian's chromium")


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'site.sqlite3'}")
    await create_all(engine)
    yield engine
    await engine.dispose()


@pytest.fixture
async def base_url(engine: AsyncEngine) -> AsyncIterator[str]:
    sessions = session_factory(engine)
    await seed_realistic(sessions)
    config = CoordinatorConfig(experiments=REALISTIC_EXPERIMENTS)
    app = web.Application()
    online = [f"peer{i}" for i in range(17)]
    setup_routes(app, lambda _: sessions, lambda _: config, lambda _: online, clock=lambda: NOW)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def chromium() -> AsyncIterator[BrowserContext]:
    """A fresh profile each time; a finite launch timeout; JavaScript off: the pages must not need it."""
    with tempfile.TemporaryDirectory(prefix="lah-chromium-") as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                headless=True,
                timeout=LAUNCH_TIMEOUT_MS,
                viewport={"width": 1200, "height": 900},
                java_script_enabled=False,
            )
            try:
                yield context
            finally:
                await context.close()


async def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True, timeout=TIMEOUT_MS)


async def test_visitor_walks_the_site(base_url: str, chromium: BrowserContext) -> None:
    page = await chromium.new_page()
    page.set_default_timeout(TIMEOUT_MS)

    await page.goto(base_url + "/")
    await expect(page.get_by_role("heading", name="Training together on donated GPUs")).to_be_visible()
    await expect(page.locator(".stat", has_text="peers online")).to_contain_text("17")
    await shot(page, "overview")

    await page.get_by_role("link", name="Leaderboard", exact=True).click()
    await expect(page.get_by_role("heading", name="Leaderboard")).to_be_visible()
    rows = page.locator("table.board tbody tr")
    await expect(rows).to_have_count(25)
    await expect(page.locator(".pager .where")).to_contain_text("Page 1 of 2")
    await shot(page, "leaderboard-total")

    # Sort by recent credit from the column header, then go to page 2.
    await page.get_by_role("link", name="Recent", exact=True).click()
    await expect(page).to_have_url(base_url + "/leaderboard?kind=users&sort=recent")
    await expect(page.locator("th.sorted")).to_have_text("Recent ▾")
    recent = [float(t.replace(",", "")) for t in await rows.locator("td:nth-child(5)").all_inner_texts()]
    assert recent == sorted(recent, reverse=True) and recent[0] > 0
    await page.get_by_role("link", name="Next →").click()
    await expect(page).to_have_url(base_url + "/leaderboard?kind=users&sort=recent&page=2")
    await expect(rows.first.locator("td.rank")).to_have_text("26")
    await expect(page.locator(".pager .where")).to_contain_text("Page 2 of 2")
    await shot(page, "leaderboard-recent-page2")

    await page.get_by_role("link", name="Teams", exact=True).click()
    await expect(page.locator("table.board tbody tr").first).to_be_visible()
    await shot(page, "leaderboard-teams")

    # The script-tag name shows as text, and nothing ran (JavaScript is off; the CSP forbids it anyway).
    await page.goto(base_url + "/leaderboard?kind=users&sort=total")
    board_text = await page.locator("main").inner_text()
    if XSS not in board_text:
        await page.goto(base_url + "/leaderboard?kind=users&sort=total&page=2")
    await expect(page.get_by_role("link", name=XSS)).to_be_visible()
    await page.get_by_role("link", name=XSS).click()
    await expect(page.get_by_role("heading", level=1)).to_have_text(XSS)

    await page.goto(base_url + "/leaderboard?kind=users&sort=total")
    top = page.locator("table.board tbody tr").first.get_by_role("link").first  # the name; then the team
    top_name = await top.inner_text()
    await top.click()
    await expect(page.get_by_role("heading", level=1)).to_have_text(top_name)
    await expect(page.locator("svg.chart")).to_be_visible()
    await expect(page.locator("svg.chart .xlabel").first).to_have_text("Jun 15")  # today, first drawn
    await expect(page.locator(".stat", has_text="total credit")).to_be_visible()
    await expect(page.get_by_role("heading", name="Hosts")).to_be_visible()
    await shot(page, "contributor")

    await page.get_by_role("link", name="Swarm", exact=True).click()
    await expect(page.get_by_role("heading", name="Swarm health")).to_be_visible()
    await expect(page.get_by_role("heading", name="transformer_moe")).to_be_visible()
    await expect(page.locator("table.grid").first.locator("td")).to_have_count(64)
    await expect(page.locator("table.grid").nth(1).locator("td.cov-none")).to_have_count(32)
    await expect(page.locator(".stat", has_text="peers online")).to_contain_text("17")
    await shot(page, "swarm")

    await page.goto(base_url + "/leaderboard?sort=bogus")
    await expect(page.get_by_role("heading", name="Bad request")).to_be_visible()
    await page.goto(base_url + "/contributors/424242")
    await expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    await shot(page, "not-found")
    for name in ("overview", "leaderboard-total", "leaderboard-recent-page2", "contributor", "swarm"):
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 10_000
