"""The app's side of updates: ``lah update`` runs as a real child against a real HTTP server on
127.0.0.1; a site that is down and a manifest signed by any key but the built-in one offer nothing.
What an offer does in the app (the menu item, the verified file opened) is checked on the reply the
child gives; signature, version and hash rules themselves are tested in tests/installers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.core.manifest import Download, sign_manifest
from app.qt.controller import AppController
from app.qt.update_check import UpdateChecker

from .helpers import free_port


@pytest.fixture
def site() -> Iterator[dict[str, bytes]]:
    routes: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    routes["base"] = f"http://127.0.0.1:{server.server_address[1]}".encode()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield routes
    server.shutdown()
    server.server_close()


def run_check(qtbot: Any, checker: UpdateChecker) -> dict[str, Any]:
    offers: list[str] = []
    checker.available.connect(lambda version, _notes: offers.append(version))
    checker.check()
    qtbot.waitUntil(lambda: checker.last is not None, timeout=60_000)
    assert offers == []
    assert checker.last is not None
    reply = checker.last
    # Freed here, on the GUI thread, not by the garbage collector on another thread later.
    checker.deleteLater()
    with qtbot.waitSignal(checker.destroyed, timeout=5_000):
        pass
    return reply


def test_a_site_that_is_down_offers_nothing(qtbot: Any, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}/manifest.json"
    reply = run_check(qtbot, UpdateChecker(tmp_path, ["--manifest-url", down]))
    assert reply["offer"] is False and reply["error"].startswith("UpdateUnavailable")


def test_a_manifest_not_signed_by_the_project_offers_nothing(
    qtbot: Any, tmp_path: Path, site: dict[str, bytes]
) -> None:
    base = site["base"].decode()
    site["/installer"] = b"not the project's"
    downloads = {"any": Download(f"{base}/installer", "0" * 64, 17)}
    site["/manifest.json"] = sign_manifest("99.0.0", downloads, Ed25519PrivateKey.generate())
    reply = run_check(qtbot, UpdateChecker(tmp_path, ["--manifest-url", f"{base}/manifest.json"]))
    assert reply["offer"] is False and reply["error"].startswith("SignatureInvalid")


def test_an_offer_shows_in_the_menu_and_the_verified_file_is_opened(
    qtbot: Any, app_env: Path, make_controller: Callable[..., AppController], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = make_controller(coordinator="http://127.0.0.1:9", use_tray=False)
    assert not c.actions.update.isVisible()
    c.updates.handle({"offer": True, "version": "0.2.0", "notes_url": "https://x/notes"}, downloading=False)
    assert c.actions.update.isVisible() and "0.2.0" in c.actions.update.text()
    assert c.notifications[-1][0] == "Update available"
    opened: list[str] = []
    monkeypatch.setattr(
        "app.qt.controller.QDesktopServices.openUrl", lambda url: opened.append(url.toLocalFile())
    )
    c.updates.handle({"offer": True, "version": "0.2.0", "file": "/tmp/verified.deb"}, downloading=True)
    assert opened == ["/tmp/verified.deb"]
    c.updates.handle({"offer": False, "error": "DownloadMismatch: sha256 differs"}, downloading=True)
    assert c.notifications[-1] == ("Update not downloaded", "DownloadMismatch: sha256 differs")
