"""The Status window links the site's page of the language model whose layers the volunteer's node
hosts, and nothing for a node hosting a classifier's experts: a real coordinator, a real ``lah node``
child, real widgets. The link opens through QDesktopServices (caught here by a URL handler, so no
browser starts)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QUrl, Slot
from PySide6.QtGui import QDesktopServices

from app.qt.controller import AppController
from coordinator.config import ExperimentConfig, LanguageModel

from .conftest import Coordinator, start_coordinator
from .helpers import consented

LM = ExperimentConfig(
    name="tiny_lm",
    kind="lm",
    expert_type="ffn",
    grid=[2, 2],
    lm=LanguageModel(vocab_size=65, context=32, layers=2, heads=2, dim=16, moe_every=1, k_best=2),
)
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


class Opened(QObject):
    """Where QDesktopServices sends http links while a test runs."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url.toString())


@pytest.fixture
def opened() -> Iterator[Opened]:
    catcher = Opened()
    # PySide6 6.12 takes the slot's name as str at run time, whatever its stubs say
    QDesktopServices.setUrlHandler("http", catcher, "open")  # type: ignore[arg-type]
    yield catcher
    QDesktopServices.unsetUrlHandler("http")


@pytest.fixture
def lm_coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    c = start_coordinator(tmp_path / "coordinator", experiments=[LM])
    yield c
    c.stop()
    c.loop.close()


def _running(
    url: str, make_controller: Callable[..., AppController], wait_until: Callable[..., None]
) -> AppController:
    consented(url, name="Ada")
    c = make_controller(use_tray=False)
    c.start()
    wait_until(lambda: (c.status or {}).get("state") == "running", 90, "the node to run")
    wait_until(lambda: (c.status or {}).get("experts"), 30, "the node to host experts")
    c.show_status()
    return c


def test_a_node_hosting_a_models_layers_links_its_page(
    app_env: Path,
    lm_coordinator: Coordinator,
    make_controller: Callable[..., AppController],
    wait_until: Callable[..., None],
    opened: Opened,
) -> None:
    c = _running(lm_coordinator.url, make_controller, wait_until)
    assert c.status is not None and c.status["lm_experiments"] == ["tiny_lm"]
    experts = c.status["experts"]
    assert all(re.fullmatch(r"tiny_lm_b[01]\.\d\.\d", uid) for uid in experts), experts
    window = c.status_window
    wait_until(lambda: window.models.isVisible(), 10, "the link to show")
    page = f"{lm_coordinator.url}/experiments/tiny_lm"
    assert f'<a href="{page}">tiny_lm</a>' in window.models.text()
    assert window.form.labelForField(window.models).text() == "Helps to train:"
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert window.grab().save(str(SHOTS / "status-window-experiment-link.png"))
    window.models.linkActivated.emit(page)  # what a click on the link sends
    wait_until(lambda: opened.urls, 5, "the browser to be asked")
    assert opened.urls == [page]


def test_a_node_hosting_a_classifiers_experts_shows_no_link(
    app_env: Path,
    coordinator: Coordinator,
    make_controller: Callable[..., AppController],
    wait_until: Callable[..., None],
) -> None:
    c = _running(coordinator.url, make_controller, wait_until)
    assert c.status is not None and c.status["experts"] and c.status["lm_experiments"] == []
    window = c.status_window
    assert window.isVisible() and window.fields["experts"].isVisible()
    assert not window.models.isVisible() and window.models.text() == ""
