"""Update check: a release manifest signed with Ed25519, checked against the key built into the app.

Pure logic (no Qt): the app calls :func:`check_for_update` now and then; when ``UpdateCheck.newer`` it
tells the user, and on their click :func:`download_release` fetches the file for this platform and keeps
it only if its size and SHA-256 are the ones the signed manifest names. Nothing is offered otherwise.

The manifest (``MANIFEST_URL``) is JSON: ``{"payload": base64, "signature": base64}``. The signature is
over ``SIGNING_CONTEXT + payload`` (a fixed prefix, so a signature made for anything else never verifies
here); the payload is JSON::

    {"schema": 1, "version": "0.2.0", "notes_url": "https://...",
     "downloads": {"linux-x86_64-deb": {"url": "https://...", "sha256": "<hex>", "size": 123}, ...}}

``scripts/sign-release`` makes one with the private key. Exceptions (one tree)::

    UpdateError
    ├── UpdateUnavailable     the site is down, slow, answers an error, or sends too much
    ├── ManifestInvalid       not a manifest: bad JSON, missing or ill-typed fields, a bad version
    │   └── SignatureInvalid  the signature does not verify with the built-in key (tampered or forged)
    └── DownloadMismatch      the downloaded file's size or SHA-256 is not the manifest's (it is deleted)
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import aiohttp
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "MANIFEST_URL", "RELEASE_PUBLIC_KEY", "SIGNING_CONTEXT", "Download", "DownloadMismatch",
    "ManifestInvalid", "Release", "SignatureInvalid", "UpdateCheck", "UpdateError", "UpdateUnavailable",
    "check_for_update", "download_release", "parse_manifest", "parse_version", "platform_key",
    "sign_manifest", "verify_file",
]

#: Where the project site publishes the newest release's manifest.
MANIFEST_URL = "https://learning-at-home.org/releases/manifest.json"
#: The release key's public half (raw 32 bytes, base64). The private half is kept off this repository by
#: the release manager; ``scripts/sign-release keygen`` makes a pair. Until the project's real key is put
#: here (installers/README.md, "Releases"), this is a key whose private half was discarded: no manifest
#: verifies, so no update is ever offered.
RELEASE_PUBLIC_KEY = "5MNZaRlBnASRyd553Bw1VY/KUyc61aLqWQofN0AQLAg="
SIGNING_CONTEXT = b"learning-at-home release manifest v1\n"
MAX_MANIFEST_BYTES = 64 * 1024
MAX_DOWNLOAD_BYTES = 4 << 30
_VERSION = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class UpdateError(Exception):
    """Base of everything this module raises."""


class UpdateUnavailable(UpdateError):
    pass


class ManifestInvalid(UpdateError):
    pass


class SignatureInvalid(ManifestInvalid):
    pass


class DownloadMismatch(UpdateError):
    pass


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


@dataclass(frozen=True)
class UpdateCheck:
    current: str
    latest: Release
    newer: bool  # latest.version > current
    download: Download | None  # this platform's file, if the release has one

    @property
    def offer(self) -> bool:
        """Whether to tell the user: a newer release with a file for this platform."""
        return self.newer and self.download is not None


def parse_version(text: str) -> tuple[tuple[int, ...], tuple[int, int]]:
    """A sortable key for ``1.2.3``, ``1.2.0rc1`` (pre-releases sort before the release)."""
    m = _VERSION.match(text.strip())
    if m is None:
        raise ManifestInvalid(f"not a release version: {text!r}")
    release = tuple(int(p) for p in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = (("a", "b", "rc").index(m.group(2)), int(m.group(3))) if m.group(2) else (3, 0)
    return release, pre


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


def _download(name: str, raw: Any, require_https: bool) -> Download:
    if not isinstance(raw, dict):
        raise ManifestInvalid(f"download {name!r} is not an object")
    url, sha, size = raw.get("url"), raw.get("sha256"), raw.get("size")
    schemes = ("https",) if require_https else ("https", "http")
    if not isinstance(url, str) or urlsplit(url).scheme not in schemes:
        raise ManifestInvalid(f"download {name!r}: url must be https")
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise ManifestInvalid(f"download {name!r}: sha256 must be 64 lowercase hex digits")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_DOWNLOAD_BYTES:
        raise ManifestInvalid(f"download {name!r}: size must be a positive number of bytes")
    return Download(url, sha, size)


def parse_manifest(
    raw: bytes, public_key: str | bytes | Ed25519PublicKey = RELEASE_PUBLIC_KEY, *, require_https: bool = True
) -> Release:
    """The release in a manifest, after its signature verifies; raises :class:`ManifestInvalid` and
    :class:`SignatureInvalid`."""
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
    if not isinstance(body, dict) or body.get("schema") != 1:
        raise ManifestInvalid("unknown manifest schema (this app reads schema 1)")
    version, notes, downloads = body.get("version"), body.get("notes_url", ""), body.get("downloads")
    if not isinstance(version, str) or not isinstance(notes, str) or not isinstance(downloads, dict):
        raise ManifestInvalid("version, notes_url or downloads is missing or of the wrong type")
    parse_version(version)
    return Release(
        version, notes, {str(k): _download(str(k), v, require_https) for k, v in downloads.items()}
    )


def sign_manifest(
    version: str, downloads: dict[str, Download], private_key: Ed25519PrivateKey, notes_url: str = ""
) -> bytes:
    """A manifest for ``scripts/sign-release`` (and the tests): the payload, signed."""
    parse_version(version)
    body = {
        "schema": 1,
        "version": version,
        "notes_url": notes_url,
        "downloads": {k: {"url": d.url, "sha256": d.sha256, "size": d.size} for k, d in downloads.items()},
    }
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = private_key.sign(SIGNING_CONTEXT + payload)
    envelope = {"payload": _text(payload), "signature": _text(signature)}
    return json.dumps(envelope, indent=1).encode()


def _text(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


async def _fetch_manifest(url: str, timeout: float) -> bytes:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url, allow_redirects=True) as response,
        ):
            if response.status != 200:
                raise UpdateUnavailable(f"{url} answered HTTP {response.status}")
            body = await response.content.read(MAX_MANIFEST_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise UpdateUnavailable(f"cannot reach {url}: {type(e).__name__} {e}".strip()) from e
    if len(body) > MAX_MANIFEST_BYTES:
        raise UpdateUnavailable(f"{url} sent more than {MAX_MANIFEST_BYTES} bytes: not a manifest")
    return body


async def check_for_update(
    current: str,
    *,
    url: str = MANIFEST_URL,
    public_key: str | bytes | Ed25519PublicKey = RELEASE_PUBLIC_KEY,
    platform: str | None = None,
    timeout: float = 15.0,
    require_https: bool = True,
) -> UpdateCheck:
    """Fetch and verify the manifest; compare its version with ``current`` (this app's)."""
    release = parse_manifest(await _fetch_manifest(url, timeout), public_key, require_https=require_https)
    key = platform or platform_key()
    try:
        newer = parse_version(release.version) > parse_version(current)
    except ManifestInvalid:  # a development build ("0+unknown"): any release is newer
        newer = True
    return UpdateCheck(current, release, newer, release.downloads.get(key))


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
            session.get(download.url) as response,
        ):
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
