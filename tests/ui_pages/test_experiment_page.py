"""An experiment's page in a real Chromium with JavaScript off, on a real coordinator (SQLite) that
trainers posted evaluations to and volunteers took assignments from through the HTTP API: the curves
(one per trainer, named), the newest sample shown as text even where it holds markup, the shape with
the hosts serving each grid, the way there from the navigation and the swarm page, and a 404 for an
unknown experiment. Screenshots at 1280x800 (light) and 390x844 (dark) go to ``artifacts/screenshots/``."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from playwright.async_api import async_playwright, expect

from coordinator.config import CoordinatorConfig, ExperimentConfig
from coordinator.server.app import start_full
from engine.account.coordinator_api import CoordinatorApi
from engine.p2p.identity import Identity

from .seed import XSS
from .seed_progress import SAMPLE, SEED_LM, loss_at
from .test_pages_browser import CHROMIUM, CHROMIUM_ARGS, LAUNCH_TIMEOUT_MS, SCREENSHOTS, TIMEOUT_MS

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="needs Debian's chromium")

CLASSIFIER = ExperimentConfig(
    name="digits", expert_type="ffn", grid=[4], hyperparams={"d_model": 16, "hidden": 32}
)
TRAINERS = {"ada <i>lab</i>": (8, 1.55), "bob": (5, 1.8)}  # name -> (evaluations, loss floor)


async def post_rows(url: str, token: str, count: int, floor: float, sample: str | None) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
        for i in range(1, count + 1):
            body: dict[str, object] = {
                "step": 100 * i,
                "train_tokens": 76_800 * i,
                "val_loss": round(loss_at(76_800 * i, floor), 4),
                "tokens_per_s": 912.0,
            }
            if sample is not None and i == count:
                body["sample"] = sample
            async with http.post(
                f"{url}/api/experiments/{SEED_LM.name}/progress",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            ) as r:
                assert r.status == 200, await r.text()


@pytest.fixture
async def base_url(tmp_path: Path) -> AsyncIterator[str]:
    config = CoordinatorConfig(
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'c.sqlite3'}",
        token_key_path=str(tmp_path / "token.key"),
        experiments=[SEED_LM, CLASSIFIER],
        verify_workers=0,
    )
    running = await start_full(config)
    services = running.services
    try:
        for n, (name, (count, floor)) in enumerate(TRAINERS.items()):
            account = await services.accounts.register(name)
            await services.accounts.set_role(name, "trainer", by=None)
            token = services.tokens.issue(account.id, "trainer")
            await post_rows(running.url, token, count, floor, SAMPLE if n == 0 else None)
        api = CoordinatorApi(running.url, timeout=15)
        try:  # three volunteers take assignments: the shape counts the hosts serving each grid
            for i in range(3):
                credentials = await api.register(f"volunteer{i}")
                identity = Identity.generate()
                await api.bind_host(credentials, identity)
                await api.assignment(credentials.token, identity.peer_id, "cpu", 2 << 20)
        finally:
            await api.close()
        yield running.url
    finally:
        await running.stop()


@pytest.mark.timeout(180)
async def test_the_experiment_page_shows_curves_the_sample_as_text_and_the_shape(base_url: str) -> None:
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
                await page.goto(base_url + "/")
                nav = page.get_by_role("navigation", name="Site")
                await nav.get_by_role("link", name="Experiments").click()
                await expect(page).to_have_url(base_url + "/experiments")
                rows = page.locator("table.board tbody tr")
                await expect(rows).to_have_count(2)
                await expect(rows.first).to_contain_text(
                    "language model, 4 layers, 2 \N{MULTIPLICATION SIGN} 16 experts"
                )
                await expect(rows.nth(1)).to_contain_text("none yet")
                await page.get_by_role("link", name=SEED_LM.name, exact=True).click()
                await expect(page).to_have_url(f"{base_url}/experiments/{SEED_LM.name}")
                await expect(page.get_by_role("heading", level=1)).to_have_text(SEED_LM.name)

                title = f"Validation loss of {SEED_LM.name} over training tokens"
                chart = page.get_by_role("img", name=title)
                await expect(chart).to_have_count(1)
                await expect(chart.locator("polyline")).to_have_count(2)  # one line per trainer
                await expect(chart.locator("circle")).to_have_count(8 + 5)  # a marker per evaluation
                legend = page.get_by_role("list", name="Lines of the chart").get_by_role("listitem")
                await expect(legend).to_have_count(2)
                await expect(legend.first).to_contain_text("bob")  # the one that reported last first
                last_ada = round(loss_at(8 * 76_800, 1.55), 4)
                await expect(legend.nth(1)).to_contain_text(f"ada <i>lab</i>: {last_ada:.3f} at step 800")
                caption = page.locator("figure.chart-box figcaption")
                await expect(caption).to_contain_text(
                    "ada <i>lab</i>: 8 evaluations from 76.8k to 614.4k tokens"
                )

                # The sample: exactly the text posted, markup included, and no element made of it.
                sample = page.locator("figure.sample pre")
                assert await sample.text_content() == SAMPLE
                assert XSS in (await sample.text_content() or "")
                await expect(page.locator("script")).to_have_count(0)
                await expect(page.locator("main i")).to_have_count(0)  # the name's <i> stayed text too
                await expect(page.locator("figure.sample figcaption")).to_contain_text(
                    f"at step 800 (614,400 tokens, validation loss {last_ada:.3f})"
                )

                facts = page.locator("dl.facts")
                await expect(facts).to_contain_text("4 transformer blocks, 4 attention heads each")
                await expect(facts).to_contain_text(
                    "16 (grid 4 \N{MULTIPLICATION SIGN} 4), each token to the best 4"
                )
                grids = page.locator("#shape-h ~ .table-scroll table tbody tr")
                await expect(grids).to_have_count(2)
                hosts = [int(t) for t in await grids.locator("td:nth-child(3)").all_inner_texts()]
                assert hosts == [3, 3], hosts  # every volunteer got experts of both layers
                hosts_tile = page.locator(".stat", has_text="hosts serving it now")
                await expect(hosts_tile).to_contain_text("3")
                await page.screenshot(
                    path=str(SCREENSHOTS / "experiment-posted-1280-light.png"), full_page=True
                )

                await page.goto(base_url + "/swarm")
                await page.get_by_role("link", name=f"{SEED_LM.name}_b3").click()
                await expect(page).to_have_url(f"{base_url}/experiments/{SEED_LM.name}")
                resp = await page.goto(base_url + "/experiments/no-such-thing")
                assert resp is not None and resp.status == 404
                await expect(page.get_by_role("heading", level=1)).to_have_text("Not found")
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
                await page.goto(f"{base_url}/experiments/{SEED_LM.name}")
                await expect(page.locator("figure.sample pre")).to_be_visible()
                widths = await page.evaluate(
                    "() => [document.documentElement.scrollWidth, window.innerWidth]"
                )
                assert widths[0] <= widths[1], widths
                await page.screenshot(
                    path=str(SCREENSHOTS / "experiment-posted-390-dark.png"), full_page=True
                )
                await phone.close()
            finally:
                await dark.close()
