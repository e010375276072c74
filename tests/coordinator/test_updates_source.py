"""``GET /api/updates``: where a project's apps look for releases, on a real full coordinator (SQLite and
PostgreSQL), read back by the app's own client (``app.core.updates.advertised_source``); and the config rule
that keeps an operator from naming a plain-http manifest."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.updates import advertised_source
from coordinator.config import ConfigError, load_config
from coordinator.server.app import create_full_app

from . import accounts_helpers as h

MANIFEST = "https://releases.example.org/learning-at-home/manifest.json"


@pytest.mark.parametrize("named", [MANIFEST, None])
async def test_the_coordinator_names_its_update_source_or_none(
    db: AsyncEngine, tmp_path: Path, named: str | None
) -> None:
    services = await h.services(db, tmp_path, verify_workers=0, update_manifest_url=named)
    app = await create_full_app(services.config, services)
    async with TestClient(TestServer(app)) as client:
        async with client.get("/api/updates") as r:  # no token: the app asks before it holds one
            assert r.status == 200
            assert await r.json() == {"manifest_url": named}
        assert await advertised_source(str(client.make_url("/")), timeout=5) == named


def test_the_config_takes_https_or_loopback_http_only() -> None:
    env = "LAH_UPDATE_MANIFEST_URL"
    assert load_config(environ={}).update_manifest_url is None
    for good in (
        MANIFEST,
        "https://example.org:8443/m.json",
        "http://127.0.0.1:8080/m.json",
        "http://[::1]/m",
    ):
        assert load_config(environ={env: good}).update_manifest_url == good
    for bad in (
        "http://releases.example.org/m.json",
        "http://127.0.0.1.example.org/m",
        "ftp://x/m",
        "https://",
    ):
        with pytest.raises(ConfigError, match="update_manifest_url must be an https address"):
            load_config(environ={env: bad})
