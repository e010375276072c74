"""Update check: a release manifest signed with Ed25519, checked against the key built into the app.

Pure logic (no Qt), run by the ``lah update`` child: :func:`check_for_update` says whether a newer
release exists; on the volunteer's click :func:`download_release` fetches the file for this platform and
keeps it only if its size and SHA-256 are the ones the signed manifest names. Nothing is offered otherwise.

Where the manifest is: the coordinator the app joined names it (``GET /api/updates`` ->
``{"manifest_url": "https://..." | null}``, :func:`advertised_source`); ``MANIFEST_URL`` is the project's
own, for ``lah update`` run by hand. A coordinator can only point at a manifest, never make one: whatever
it names must still carry the release key's signature and pass :mod:`app.update_policy`.

The manifest is JSON: ``{"payload": base64, "signature": base64}``. The signature is over
``SIGNING_CONTEXT + payload`` (a fixed prefix, so a signature made for anything else never verifies
here); the payload is JSON (``issued_at`` and ``expires`` in seconds since 1970, UTC)::

    {"schema": 2, "version": "0.2.0", "notes_url": "https://...", "issued_at": 1767225600,
     "expires": 1774999600,
     "downloads": {"linux-x86_64-deb": {"url": "https://...", "sha256": "<hex>", "size": 123}, ...}}

``scripts/sign-release`` makes one with the private key. The exceptions are the app's
(``app.errors``: ``UpdateError`` and its branches), re-exported here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import aiohttp
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from yarl import URL

from .errors import (
    DownloadMismatch,
    InsecureUrl,
    ManifestInvalid,
    ManifestRefused,
    SignatureInvalid,
    UpdateError,
    UpdateUnavailable,
)
from .update_policy import (
    MAX_VALIDITY_S,
    Seen,
    admit,
    build_version,
    check_url,
    load_seen,
    parse_version,
    save_seen,
    url_allowed,
)

__all__ = [
    "MANIFEST_URL",
    "RELEASE_PUBLIC_KEY",
    "SIGNING_CONTEXT",
    "Download",
    "DownloadMismatch",
    "InsecureUrl",
    "ManifestInvalid",
    "ManifestRefused",
    "Release",
    "SignatureInvalid",
    "UpdateCheck",
    "UpdateError",
    "UpdateUnavailable",
    "advertised_source",
    "check_for_update",
    "download_release",
    "parse_manifest",
    "parse_version",
    "platform_key",
    "sign_manifest",
    "verify_file",
]

#: Where the project site publishes the newest release's manifest.
MANIFEST_URL = "https://learning-at-home.org/releases/manifest.json"
#: The release key's public half (raw 32 bytes, base64). The private half is kept off this repository by
#: the release manager; ``scripts/sign-release keygen`` makes a pair. Until the project's real key is put
#: here (installers/README.md, "Releases"), this is a key whose private half was discarded: no manifest
#: verifies, so no update is ever offered.
RELEASE_PUBLIC_KEY = "5MNZaRlBnASRyd553Bw1VY/KUyc61aLqWQofN0AQLAg="
SIGNING_CONTEXT = b"learning-at-home release manifest v1\n"
#: The coordinator's answer to "where are releases published?" (``coordinator/server/app.py``).
SOURCE_PATH = "/api/updates"
SCHEMA = 2  # 1 had no issue time or expiry, so any old copy stayed valid forever: refused
MAX_MANIFEST_BYTES = 64 * 1024
MAX_REDIRECTS = 5
MAX_DOWNLOAD_BYTES = 4 << 30
#: How long ``sign_manifest`` makes a manifest valid unless told: the release manager re-signs before.
DEFAULT_VALIDITY_S = 90 * 86400
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Download:
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Release:
    version: str
    notes_url: str
    downloads: dict[str, Download]
    issued_at: int  # seconds since 1970, UTC
    expires: int


@dataclass(frozen=True)
class UpdateCheck:
    current: str
    latest: Release
    newer: bool  # latest.version > current (False when this build's version is not known)
    download: Download | None  # this platform's file, if the release has one
    note: str = ""  # why nothing is offered, and anything worth a line in the log

    @property
    def offer(self) -> bool:
        """Whether to tell the user: a newer release with a file for this platform."""
        return self.newer and self.download is not None


def platform_key(deb: bool = False, variant: str = "") -> str:
    """This machine's download key: ``linux-x86_64`` (``-deb`` for the package), ``windows-x86_64``,
    ``macos-arm64``; ``variant`` (e.g. ``cuda``) for the GPU builds: ``linux-x86_64-cuda-deb``."""
    system = {"win32": "windows", "darwin": "macos"}.get(sys.platform, "linux")
    machine = platform.machine().lower().replace("amd64", "x86_64").replace("aarch64", "arm64")
    key = f"{system}-{machine}" + (f"-{variant}" if variant else "")
    return key + ("-deb" if deb and system == "linux" else "")


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ManifestInvalid(f"{what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ManifestInvalid(f"{what} is not valid base64") from e


def _public_key(key: str | bytes | Ed25519PublicKey) -> Ed25519PublicKey:
    if isinstance(key, Ed25519PublicKey):
        return key
    raw = base64.b64decode(key) if isinstance(key, str) else key
    return Ed25519PublicKey.from_public_bytes(raw)


def _download(name: str, raw: Any) -> Download:
    if not isinstance(raw, dict):
        raise ManifestInvalid(f"download {name!r} is not an object")
    url, sha, size = raw.get("url"), raw.get("sha256"), raw.get("size")
    if not isinstance(url, str) or not url_allowed(url):
        raise ManifestInvalid(f"download {name!r}: url must be https")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise ManifestInvalid(f"download {name!r}: sha256 must be 64 lowercase hex digits")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_DOWNLOAD_BYTES:
        raise ManifestInvalid(f"download {name!r}: size must be a positive number of bytes")
    return Download(url, sha, size)


def _seconds(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ManifestInvalid(f"the manifest's {name} must be a positive number of seconds since 1970")
    return value


def parse_manifest(raw: bytes, public_key: str | bytes | Ed25519PublicKey = RELEASE_PUBLIC_KEY) -> Release:
    """The release in a manifest, after its signature verifies; raises :class:`ManifestInvalid` and
    :class:`SignatureInvalid`. Whether to believe it now is :func:`app.update_policy.admit`'s call."""
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestInvalid("the manifest is not JSON") from e
    if not isinstance(envelope, dict):
        raise ManifestInvalid("the manifest is not a JSON object")
    payload = _b64(envelope.get("payload"), "payload")
    signature = _b64(envelope.get("signature"), "signature")
    try:
        _public_key(public_key).verify(signature, SIGNING_CONTEXT + payload)
    except (InvalidSignature, ValueError) as e:
        raise SignatureInvalid("the manifest's signature does not verify with the release key") from e
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestInvalid("the signed payload is not JSON") from e
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        raise ManifestInvalid(f"unknown manifest schema (this app reads schema {SCHEMA})")
    version, notes, downloads = body.get("version"), body.get("notes_url", ""), body.get("downloads")
    if not isinstance(version, str) or not isinstance(notes, str) or not isinstance(downloads, dict):
        raise ManifestInvalid("version, notes_url or downloads is missing or of the wrong type")
    parse_version(version)
    issued_at, expires = _seconds(body, "issued_at"), _seconds(body, "expires")
    if not 0 < expires - issued_at <= MAX_VALIDITY_S:
        raise ManifestInvalid(
            f"the manifest must expire after it is issued and within {MAX_VALIDITY_S // 86400} days"
        )
    parsed = {str(k): _download(str(k), v) for k, v in downloads.items()}
    return Release(version, notes, parsed, issued_at, expires)


def sign_manifest(
    version: str,
    downloads: dict[str, Download],
    private_key: Ed25519PrivateKey,
    notes_url: str = "",
    *,
    issued_at: int | None = None,
    valid_for_s: int = DEFAULT_VALIDITY_S,
) -> bytes:
    """A manifest for ``scripts/sign-release`` (and the tests): the payload, signed; issued now unless
    ``issued_at`` says otherwise."""
    parse_version(version)
    issued = int(time.time()) if issued_at is None else issued_at
    body = {
        "schema": SCHEMA,
        "version": version,
        "notes_url": notes_url,
        "issued_at": issued,
        "expires": issued + valid_for_s,
        "downloads": {k: {"url": d.url, "sha256": d.sha256, "size": d.size} for k, d in downloads.items()},
    }
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = private_key.sign(SIGNING_CONTEXT + payload)
    envelope = {"payload": _text(payload), "signature": _text(signature)}
    return json.dumps(envelope, indent=1).encode()


def _text(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


async def _get(url: str, timeout: float, what: str) -> tuple[int, bytes]:
    """``(status, body)`` of a GET whose every hop is an allowed URL, checked before it is contacted
    (an https address that redirects to plain http is refused, not followed)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            for _hop in range(MAX_REDIRECTS + 1):
                check_url(url, what)
                async with session.get(url, allow_redirects=False) as response:
                    location = response.headers.get("Location")
                    if response.status in (301, 302, 303, 307, 308) and location:
                        url = str(response.url.join(URL(location)))
                        continue
                    return response.status, await _bounded(response, url, what)
            raise UpdateUnavailable(f"{url}: more than {MAX_REDIRECTS} redirects")
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UpdateUnavailable(f"cannot reach {url}: {type(e).__name__} {e}".strip()) from e


async def _bounded(response: aiohttp.ClientResponse, url: str, what: str) -> bytes:
    body = await response.content.read(MAX_MANIFEST_BYTES + 1)
    if len(body) > MAX_MANIFEST_BYTES:
        raise UpdateUnavailable(f"{url} sent more than {MAX_MANIFEST_BYTES} bytes: not {what}")
    return body


async def _fetch_manifest(url: str, timeout: float) -> bytes:
    status, body = await _get(url, timeout, "the release manifest")
    if status != 200:
        raise UpdateUnavailable(f"{url} answered HTTP {status}")
    return body


async def advertised_source(coordinator_url: str, timeout: float = 15.0) -> str | None:
    """The manifest URL the coordinator names, or None when it names none (``null``, or a coordinator
    older than ``/api/updates``: 404). The coordinator may be plain http on a home network; what it names
    must be https, and the manifest there is believed only for its signature."""
    base = coordinator_url.rstrip("/")
    if urlsplit(base).scheme not in ("http", "https"):
        raise InsecureUrl(f"the project server {coordinator_url!r} is not an http(s) address")
    url = base + SOURCE_PATH
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            status, body = response.status, await _bounded(response, url, "an update source")
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UpdateUnavailable(f"cannot reach {base}: {type(e).__name__} {e}".strip()) from e
    if status == 404:
        return None
    if status != 200:
        raise UpdateUnavailable(f"{url} answered HTTP {status}")
    try:
        source = json.loads(body)["manifest_url"]
    except (ValueError, KeyError, TypeError) as e:
        raise UpdateUnavailable(f"{url} did not answer with an update source") from e
    if source is None:
        return None
    if not isinstance(source, str):
        raise UpdateUnavailable(f"{url} did not answer with an update source")
    check_url(source, f"the release manifest {base} names")
    return source


async def check_for_update(
    current: str,
    *,
    url: str = MANIFEST_URL,
    public_key: str | bytes | Ed25519PublicKey = RELEASE_PUBLIC_KEY,
    platform: str | None = None,
    timeout: float = 15.0,
    state: Path | None = None,
    now: float | None = None,
) -> UpdateCheck:
    """Fetch and verify the manifest, believe it only if :func:`app.update_policy.admit` does (against
    the newest one recorded in ``state``, which it then becomes), and compare its version with
    ``current`` (this build's)."""
    release = parse_manifest(await _fetch_manifest(url, timeout), public_key)
    seen, warning = load_seen(state) if state is not None else (None, "")
    admit(release.version, release.issued_at, release.expires, time.time() if now is None else now, seen)
    notes = [warning]
    newest = Seen(release.version, release.issued_at)
    if state is not None and newest != seen:  # admitted, so not older than seen in either respect
        notes.append(save_seen(state, newest))
    download = release.downloads.get(platform or platform_key())
    build = build_version(current)
    newer = build is not None and parse_version(release.version) > build
    if build is None:
        notes.append(f"this build's version ({current}) is not known, so no release is offered")
    elif not newer:
        notes.append(f"{release.version} is not newer than this build ({current})")
    elif download is None:
        notes.append(f"release {release.version} has no file for {platform or platform_key()}")
    return UpdateCheck(current, release, newer, download, "; ".join(n for n in notes if n))


def verify_file(path: Path, download: Download) -> None:
    """Raise :class:`DownloadMismatch` unless ``path`` has the manifest's size and SHA-256."""
    size = path.stat().st_size
    if size != download.size:
        raise DownloadMismatch(f"{path.name}: {size} bytes, the release manifest says {download.size}")
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != download.sha256:
        raise DownloadMismatch(f"{path.name}: SHA-256 differs from the release manifest's")


def _file_name(url: str) -> str:
    name = Path(urlsplit(url).path).name
    return name if re.fullmatch(r"[A-Za-z0-9._+-]{1,200}", name) and not name.startswith(".") else "update"


def _open_partial(dest_dir: Path) -> tuple[Path, BinaryIO]:
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".partial-", dir=dest_dir)
    return Path(name), open(fd, "wb")  # closed by _finish


def _finish(tmp: Path, out: BinaryIO, download: Download, target: Path | None) -> None:
    """Close the partial file; keep it as ``target`` if it matches the manifest, else delete it."""
    out.close()
    try:
        if target is not None:
            verify_file(tmp, download)
            tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


async def download_release(download: Download, dest_dir: Path, *, timeout: float = 3600.0) -> Path:
    """Fetch ``download`` into ``dest_dir``; the file is kept only if it matches the manifest."""
    target = dest_dir / _file_name(download.url)
    tmp, out = await asyncio.to_thread(_open_partial, dest_dir)
    done = False
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(download.url) as response,  # release hosts redirect to their storage
        ):
            check_url(str(response.url), "the download")  # its bytes are checked by hash besides
            if response.status != 200:
                raise UpdateUnavailable(f"{download.url} answered HTTP {response.status}")
            received = 0
            async for chunk in response.content.iter_chunked(1 << 20):
                received += len(chunk)
                if received > download.size:
                    raise DownloadMismatch(f"{target.name}: longer than the manifest's {download.size} bytes")
                out.write(chunk)
        done = True
    except (aiohttp.ClientError, TimeoutError) as e:
        raise UpdateUnavailable(f"download of {download.url} failed: {type(e).__name__} {e}") from e
    finally:
        await asyncio.to_thread(_finish, tmp, out, download, target if done else None)
    return target
