"""The update check against a real aiohttp server on 127.0.0.1: good, tampered, older, wrong key, down."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.updates import (
    Download,
    DownloadMismatch,
    ManifestInvalid,
    SignatureInvalid,
    UpdateError,
    UpdateUnavailable,
    check_for_update,
    download_release,
    parse_manifest,
    parse_version,
    sign_manifest,
)

PLATFORM = "linux-x86_64"
INSTALLER = b"pretend this is learning-at-home-0.2.0.tar.gz\n" * 1000


@dataclass
class Site:
    base: str
    routes: dict[str, bytes] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    site = Site("")

    async def serve(request: web.Request) -> web.Response:
        body = site.routes.get(request.path)
        return web.Response(body=body) if body is not None else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = runner.addresses[0][1]
    site.base = f"http://127.0.0.1:{port}"
    try:
        yield site
    finally:
        await runner.cleanup()


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def release(site: Site, version: str, body: bytes = INSTALLER) -> dict[str, Download]:
    site.routes["/releases/installer.tar.gz"] = body
    url = site.url("/releases/installer.tar.gz")
    return {PLATFORM: Download(url, hashlib.sha256(INSTALLER).hexdigest(), len(INSTALLER))}


async def check(site: Site, key: Ed25519PrivateKey, current: str = "0.1.0") -> object:
    return await check_for_update(
        current, url=site.url("/manifest.json"), public_key=key.public_key(), platform=PLATFORM,
        timeout=5, require_https=False,
    )


async def test_a_newer_signed_release_is_offered_and_downloads(site: Site, key: Ed25519PrivateKey,
                                                               tmp_path: Path) -> None:
    site.routes["/manifest.json"] = sign_manifest("0.2.0", release(site, "0.2.0"), key)
    result = await check(site, key)
    assert result.newer and result.offer and result.latest.version == "0.2.0"
    assert result.download is not None
    path = await download_release(result.download, tmp_path, timeout=10)
    assert path.read_bytes() == INSTALLER and path.name == "installer.tar.gz"
    assert os.listdir(tmp_path) == ["installer.tar.gz"]


async def test_an_older_or_equal_release_is_not_offered(site: Site, key: Ed25519PrivateKey) -> None:
    site.routes["/manifest.json"] = sign_manifest("0.0.9", release(site, "0.0.9"), key)
    assert not (await check(site, key)).newer
    site.routes["/manifest.json"] = sign_manifest("0.1.0", release(site, "0.1.0"), key)
    result = await check(site, key)
    assert not result.newer and not result.offer


async def test_a_tampered_manifest_is_refused(site: Site, key: Ed25519PrivateKey) -> None:
    envelope = json.loads(sign_manifest("0.2.0", release(site, "0.2.0"), key))
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["downloads"][PLATFORM]["url"] = site.url("/evil.tar.gz")  # same signature, another file
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    site.routes["/manifest.json"] = json.dumps(envelope).encode()
    with pytest.raises(SignatureInvalid):
        await check(site, key)


async def test_a_manifest_signed_by_another_key_is_refused(site: Site, key: Ed25519PrivateKey) -> None:
    stranger = Ed25519PrivateKey.generate()
    site.routes["/manifest.json"] = sign_manifest("9.0.0", release(site, "9.0.0"), stranger)
    with pytest.raises(SignatureInvalid):
        await check(site, key)


async def test_the_built_in_key_verifies_nothing_signed_here(key: Ed25519PrivateKey) -> None:
    with pytest.raises(SignatureInvalid):
        parse_manifest(sign_manifest("9.0.0", {}, key))


async def test_a_site_that_is_down_or_missing_the_manifest(site: Site, key: Ed25519PrivateKey) -> None:
    with pytest.raises(UpdateUnavailable, match="404"):
        await check(site, key)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UpdateUnavailable):
        await check_for_update("0.1.0", url=f"http://127.0.0.1:{port}/m.json", public_key=key.public_key(),
                               timeout=5, require_https=False)


async def test_a_file_that_does_not_match_is_never_kept(site: Site, key: Ed25519PrivateKey,
                                                        tmp_path: Path) -> None:
    downloads = release(site, "0.2.0", body=INSTALLER[:-1] + b"X")  # same size, other bytes
    site.routes["/manifest.json"] = sign_manifest("0.2.0", downloads, key)
    result = await check(site, key)
    assert result.download is not None
    with pytest.raises(DownloadMismatch, match="SHA-256"):
        await download_release(result.download, tmp_path, timeout=10)
    site.routes["/releases/installer.tar.gz"] = INSTALLER + b"more"
    with pytest.raises(DownloadMismatch, match="longer"):
        await download_release(result.download, tmp_path, timeout=10)
    assert os.listdir(tmp_path) == []


async def test_garbage_and_https_rules(key: Ed25519PrivateKey) -> None:
    for raw in (b"", b"[]", b"{}", b'{"payload": "!!", "signature": "AA=="}', b"\xff"):
        with pytest.raises(ManifestInvalid):
            parse_manifest(raw, key.public_key())
    http = {PLATFORM: Download("http://example.invalid/x", "0" * 64, 1)}
    with pytest.raises(ManifestInvalid, match="https"):
        parse_manifest(sign_manifest("1.0", http, key), key.public_key())
    assert issubclass(SignatureInvalid, ManifestInvalid) and issubclass(DownloadMismatch, UpdateError)


def test_versions_order() -> None:
    ordered = ["0.1.0rc1", "0.1", "0.1.1", "0.2.0a1", "0.2.0b2", "0.2.0rc1", "0.2.0", "0.10.0", "1.0"]
    assert sorted(ordered, key=parse_version) == ordered
    assert parse_version("1.0") == parse_version("1.0.0")
    with pytest.raises(ManifestInvalid):
        parse_version("1.0-beta")
