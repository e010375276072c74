"""Collaborative training on the site, in a real Chromium with JavaScript off: the swarm page's
collaboration panel and the leaderboard's Trainers tab, with seeded trainers; screenshots of both at
1280x800 (light) and 390x844 (dark) go to ``artifacts/screenshots/``."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from playwright.async_api import async_playwright, expect

from coordinator.config import CoordinatorConfig
from coordinator.db.session import create_all, make_engine, session_factory
from coordinator.site import setup_routes

from .seed import NOW, XSS_TEAM, seed_realistic
from .seed_collab import COLLAB_EXPERIMENTS, seed_collab
from .test_pages_browser import CHROMIUM, CHROMIUM_ARGS, LAUNCH_TIMEOUT_MS, SCREENSHOTS, TIMEOUT_MS

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="needs Debian's chromium")


@pytest.fixture
async def base_url(tmp_path: Path) -> AsyncIterator[str]:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'site.sqlite3'}")
    await create_all(engine)
    sessions = session_factory(engine)
    await seed_realistic(sessions)
    await seed_collab(sessions)
    config = CoordinatorConfig(experiments=COLLAB_EXPERIMENTS)
    app = web.Application()
    setup_routes(app, lambda _: sessions, lambda _: config, lambda _: ["p"] * 9, clock=lambda: NOW)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
        await engine.dispose()


@pytest.mark.timeout(180)
async def test_swarm_panel_and_trainers_tab(base_url: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lah-chromium-") as profile:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                headless=True,
                timeout=LAUNCH_TIMEOUT_MS,
                viewport={"width": 1280, "height": 800},
                java_script_enabled=False,
            )
            try:
                page = await context.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                await page.goto(base_url + "/swarm")
                panel = page.locator("section.collab")
                await expect(panel).to_have_count(1)  # one collaborative experiment of three
                await expect(panel.get_by_role("heading", level=3)).to_contain_text("transformer_moe")
                stats = panel.locator(".stat")
                await expect(stats.filter(has_text="trainers online")).to_contain_text("4")
                await expect(stats.filter(has_text="epoch").first).to_contain_text("57")
                # 412.5 + 233 + 61.2 samples/s of the trainers in epoch 57 (Larry, at 56, is behind)
                await expect(stats.filter(has_text="samples/s together")).to_contain_text("707")
                # the slowest time of epoch 57's round; one trainer stepped alone, so not "ok"
                await expect(stats.filter(has_text="last round")).to_contain_text("2.31 s")
                await expect(stats.filter(has_text="last round")).to_contain_text("2 ok, 1 stepped locally")
                await expect(panel).to_contain_text("2,088 of 4,096 samples (51%)")
                await expect(panel.get_by_role("img", name="Towards epoch 58")).to_have_count(1)
                rows = panel.locator("table tbody tr")
                await expect(rows).to_have_count(4)  # Gone Gary's report is too old to show
                await expect(rows.first).to_contain_text("412.5")
                await expect(rows.nth(2)).to_contain_text("Late Larry")  # fastest first: 95 > 61.2
                await expect(rows.nth(2)).to_contain_text("skipped")
                await expect(rows.nth(3)).to_contain_text("stepped locally")
                await panel.screenshot(path=str(SCREENSHOTS / "swarm-collab-panel-1280-light.png"))
                await page.screenshot(path=str(SCREENSHOTS / "swarm-collab-1280-light.png"), full_page=True)

                await page.goto(base_url + "/leaderboard")
                await page.get_by_role("link", name="Trainers", exact=True).click()
                await expect(page).to_have_url(base_url + "/leaderboard?kind=trainers")
                board = page.locator("table.board tbody tr")
                await expect(board).to_have_count(5)
                names = [t.strip() for t in await board.locator("td:nth-child(2)").all_inner_texts()]
                # claimed, bounded by receipts: 2.35M, min(1.1M, 0.8M), 240k, 31k, min(5k, 4k)
                assert names == [
                    "Lab GPU trainer",
                    "Dense Dave",
                    "Relay Rita (behind NAT)",
                    "Late Larry",
                    "Gone Gary",
                ]
                samples = await board.locator("td:nth-child(4)").all_inner_texts()
                assert samples == ["2,350,000", "800,000", "240,000", "31,000", "4,000"]
                await expect(page.get_by_role("link", name="Dense Crew " + XSS_TEAM).first).to_be_visible()
                await expect(page.locator('.tabs a[aria-current="page"]')).to_have_text("Trainers")
                await page.get_by_role("link", name="Dense Dave").click()
                await expect(page.locator(".stat", has_text="training samples")).to_contain_text("800,000")
                await page.go_back()
                await page.screenshot(
                    path=str(SCREENSHOTS / "leaderboard-trainers-1280-light.png"), full_page=True
                )
                resp = await page.goto(base_url + "/leaderboard?kind=trainers&sort=recent")
                assert resp is not None and resp.status == 400
            finally:
                await context.close()

            dark = await pw.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=LAUNCH_TIMEOUT_MS
            )
            try:
                phone = await dark.new_context(
                    viewport={"width": 390, "height": 844}, color_scheme="dark", java_script_enabled=False
                )
                page = await phone.new_page()
                page.set_default_timeout(TIMEOUT_MS)
                await page.goto(base_url + "/swarm")
                await expect(page.locator("section.collab .stat").first).to_be_visible()
                widths = await page.evaluate(
                    "() => [document.documentElement.scrollWidth, window.innerWidth]"
                )
                assert widths[0] <= widths[1], widths
                await page.locator("section.collab").screenshot(
                    path=str(SCREENSHOTS / "swarm-collab-panel-390-dark.png")
                )
                await page.screenshot(path=str(SCREENSHOTS / "swarm-collab-390-dark.png"), full_page=True)
                await page.goto(base_url + "/leaderboard?kind=trainers")
                await page.screenshot(
                    path=str(SCREENSHOTS / "leaderboard-trainers-390-dark.png"), full_page=True
                )
                await phone.close()
            finally:
                await dark.close()
