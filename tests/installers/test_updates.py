"""The update check against a real aiohttp server on 127.0.0.1: good, tampered, older, wrong key, down;
expired, replayed and rolled-back manifests across runs (the record on disk), a development build, plain
http and redirects to it, the coordinator naming the source (or none), and ``lah update``'s reply.

Plain http is allowed here only because the server is on a loopback address (``app.core.update_policy``)."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.core.manifest import Download, parse_manifest, sign_manifest
from app.core.updates import (
    DownloadMismatch,
    InsecureUrl,
    ManifestInvalid,
    ManifestRefused,
    SignatureInvalid,
    UpdateCheck,
    UpdateError,
    UpdateUnavailable,
    advertised_source,
    check_for_update,
    download_release,
)
from lah import update as lah_update

PLATFORM = "linux-x86_64"
INSTALLER = b"pretend this is learning-at-home-0.2.0.tar.gz\n" * 1000


@dataclass
class Site:
    base: str
    routes: dict[str, bytes] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    site = Site("")

    async def serve(request: web.Request) -> web.Response:
        site.hits.append(request.path)
        if request.path in site.redirects:
            raise web.HTTPFound(site.redirects[request.path])
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


async def check(
    site: Site, key: Ed25519PrivateKey, current: str = "0.1.0", state: Path | None = None
) -> UpdateCheck:
    return await check_for_update(
        current,
        url=site.url("/manifest.json"),
        public_key=key.public_key(),
        platform=PLATFORM,
        timeout=5,
        state=state,
    )


def serve(site: Site, key: Ed25519PrivateKey, version: str, issued_at: int | None = None, **kw: Any) -> None:
    site.routes["/manifest.json"] = sign_manifest(
        version, release(site, version), key, issued_at=issued_at, **kw
    )


async def test_a_newer_signed_release_is_offered_and_downloads(
    site: Site, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
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
        await check_for_update(
            "0.1.0", url=f"http://127.0.0.1:{port}/m.json", public_key=key.public_key(), timeout=5
        )


async def test_a_file_that_does_not_match_is_never_kept(
    site: Site, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
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


def _resign(raw: bytes, key: Ed25519PrivateKey, **changes: Any) -> bytes:
    """The same manifest's payload with ``changes`` (None: the field removed), signed again."""
    envelope = json.loads(raw)
    payload = json.loads(base64.b64decode(envelope["payload"]))
    for name, value in changes.items():
        if value is None:
            payload.pop(name)
        else:
            payload[name] = value
    body = json.dumps(payload).encode()
    signature = key.sign(b"learning-at-home release manifest v1\n" + body)
    return json.dumps(
        {"payload": base64.b64encode(body).decode(), "signature": base64.b64encode(signature).decode()}
    ).encode()


async def test_issue_time_and_expiry_are_signed_and_checked(key: Ed25519PrivateKey) -> None:
    good = sign_manifest("0.2.0", {}, key, issued_at=1_767_225_600, valid_for_s=30 * 86400)
    parsed = parse_manifest(good, key.public_key())
    assert (parsed.issued_at, parsed.expires) == (1_767_225_600, 1_767_225_600 + 30 * 86400)
    cases = [
        ({"schema": 1}, "schema 2"),  # schema 1 had neither: any old copy stayed valid forever
        ({"issued_at": None}, "issued_at must be a positive number"),
        ({"expires": "2027-01-01"}, "expires must be a positive number"),
        ({"issued_at": True}, "issued_at must be"),
        ({"expires": 1_767_225_600}, "must expire after it is issued"),
        ({"expires": 1_767_225_600 + 400 * 86400}, "within 366 days"),
    ]
    for changes, message in cases:
        with pytest.raises(ManifestInvalid, match=message):
            parse_manifest(_resign(good, key, **changes), key.public_key())


async def test_an_expired_manifest_offers_nothing(site: Site, key: Ed25519PrivateKey) -> None:
    serve(site, key, "0.2.0", issued_at=int(time.time()) - 100 * 86400, valid_for_s=90 * 86400)
    with pytest.raises(ManifestRefused, match=r"expired on .*an old copy"):
        await check(site, key)


async def test_a_manifest_issued_in_the_future_offers_nothing(site: Site, key: Ed25519PrivateKey) -> None:
    serve(site, key, "0.2.0", issued_at=int(time.time()) + 2 * 86400)
    with pytest.raises(ManifestRefused, match="check the date and time"):
        await check(site, key)


async def test_an_old_copy_served_after_a_newer_one_is_refused(
    site: Site, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    state, now = tmp_path / "update-state.json", int(time.time())
    serve(site, key, "0.2.0", issued_at=now - 10 * 86400)  # the copy an attacker keeps
    old = site.routes["/manifest.json"]
    assert (await check(site, key, state=state)).offer
    serve(site, key, "0.3.0", issued_at=now - 86400)
    result = await check(site, key, state=state)
    assert result.offer and result.latest.version == "0.3.0"
    assert json.loads(state.read_text()) == {"version": "0.3.0", "issued_at": now - 86400}
    assert (await check(site, key, state=state)).offer  # the same manifest again: still believed
    site.routes["/manifest.json"] = old  # replayed: validly signed, not expired, but older
    with pytest.raises(
        ManifestRefused, match=r"before the one this computer already accepted .*version 0\.3\.0"
    ):
        await check(site, key, state=state)
    serve(site, key, "0.2.5", issued_at=now)  # newer issue time, older release: a rollback
    with pytest.raises(ManifestRefused, match=r"names version 0\.2\.5, older than version 0\.3\.0"):
        await check(site, key, state=state)
    assert json.loads(state.read_text()) == {"version": "0.3.0", "issued_at": now - 86400}  # unchanged


async def test_a_damaged_record_starts_over_and_says_so(
    site: Site, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    state = tmp_path / "update-state.json"
    state.write_text("{not json")
    serve(site, key, "0.2.0")
    result = await check(site, key, state=state)
    assert result.offer and "update-state.json was unreadable" in result.note
    assert json.loads(state.read_text())["version"] == "0.2.0"


async def test_a_development_build_is_never_offered_an_older_release(
    site: Site, key: Ed25519PrivateKey
) -> None:
    serve(site, key, "0.2.0")
    older = await check(site, key, current="0.3.0.dev2")
    assert not older.offer and older.note == "0.2.0 is not newer than this build (0.3.0.dev2)"
    assert (await check(site, key, current="0.2.0.dev5")).offer  # its own release is newer
    assert not (await check(site, key, current="0.2.0+g1a2b3c")).offer  # a local build of 0.2.0
    unknown = await check(site, key, current="0+unknown")  # a source tree without its metadata
    assert (
        not unknown.offer
        and unknown.note == "this build's version (0+unknown) is not known, so no release is offered"
    )


async def test_plain_http_is_refused_before_anything_is_contacted(site: Site, key: Ed25519PrivateKey) -> None:
    with pytest.raises(InsecureUrl, match="not an https address"):
        await check_for_update("0.1.0", url="http://releases.example.invalid/manifest.json", timeout=5)
    serve(site, key, "0.2.0")
    site.redirects["/moved.json"] = "http://releases.example.invalid/manifest.json"
    with pytest.raises(InsecureUrl, match=r"releases\.example\.invalid"):
        await check_for_update("0.1.0", url=site.url("/moved.json"), public_key=key.public_key(), timeout=5)
    site.redirects["/here.json"] = "/manifest.json"  # a redirect that stays allowed is followed
    moved = await check_for_update(
        "0.1.0", url=site.url("/here.json"), public_key=key.public_key(), platform=PLATFORM, timeout=5
    )
    assert moved.offer and site.hits[-2:] == ["/here.json", "/manifest.json"]


async def test_the_coordinator_names_the_source(site: Site) -> None:
    answers = {
        "/named/api/updates": json.dumps({"manifest_url": "https://releases.example.org/m.json"}).encode(),
        "/none/api/updates": b'{"manifest_url": null}',
        "/plain/api/updates": b'{"manifest_url": "http://releases.example.org/m.json"}',
        "/garbage/api/updates": b"<html>",
        "/number/api/updates": b'{"manifest_url": 7}',
    }
    site.routes.update(answers)
    assert await advertised_source(site.url("/named/"), timeout=5) == "https://releases.example.org/m.json"
    assert await advertised_source(site.url("/none"), timeout=5) is None
    assert await advertised_source(site.url("/older"), timeout=5) is None  # 404: predates /api/updates
    with pytest.raises(InsecureUrl, match=r"the release manifest http://127\.0\.0\.1:\d+/plain names"):
        await advertised_source(site.url("/plain"), timeout=5)
    for name in ("garbage", "number"):
        with pytest.raises(UpdateUnavailable, match="did not answer with an update source"):
            await advertised_source(site.url(f"/{name}"), timeout=5)
    with pytest.raises(InsecureUrl, match="not an http"):
        await advertised_source("file:///etc", timeout=5)


async def test_lah_update_asks_the_coordinator_and_checks_nothing_when_it_names_none(
    site: Site, key: Ed25519PrivateKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site.routes["/api/updates"] = b'{"manifest_url": null}'
    state = tmp_path / "update-state.json"
    reply = await lah_update.check(None, None, coordinator=site.base + "/", state=state)
    assert reply == {
        "offer": False,
        "version": None,
        "notes_url": None,
        "file": None,
        "error": None,
        "note": f"{site.base} names no update source, so no update check is made",
        "source": None,
        "named_by": site.base,
    }
    assert site.hits == ["/api/updates"] and not state.exists()
    # Named: the manifest there, believed for the key's signature (the built-in key, in the app).
    monkeypatch.setattr(
        "app.core.updates.check_for_update",
        functools.partial(check_for_update, public_key=key.public_key(), platform=PLATFORM, timeout=5),
    )
    monkeypatch.setattr("app.qt.about.version", lambda: "0.1.0")
    site.routes["/api/updates"] = json.dumps({"manifest_url": site.url("/manifest.json")}).encode()
    serve(site, key, "0.2.0", notes_url="https://learning-at-home.org/releases/0.2.0")
    reply = await lah_update.check(tmp_path / "dl", None, coordinator=site.base, state=state)
    assert reply["offer"] is True and reply["version"] == "0.2.0" and reply["error"] is None
    assert reply["source"] == site.url("/manifest.json") and reply["named_by"] == site.base
    assert Path(reply["file"]).read_bytes() == INSTALLER  # noqa: ASYNC240 (a test's few bytes)
    assert json.loads(state.read_text())["version"] == "0.2.0"
    site.routes["/api/updates"] = json.dumps({"manifest_url": "http://releases.example.org/m"}).encode()
    reply = await lah_update.check(None, None, coordinator=site.base, state=state)
    assert reply["offer"] is False and reply["error"].startswith("InsecureUrl: the release manifest")
