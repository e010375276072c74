"""Update check: fetch the release manifest, believe it only as signed and admitted, offer what is newer.

Run by the ``lah update`` child (no Qt): :func:`check_for_update` says whether a newer release exists; on
the volunteer's click :func:`download_release` fetches the file for this platform and keeps it only if its
size and SHA-256 are the ones the signed manifest names. Nothing is offered otherwise. The manifest's
format and signature are :mod:`app.core.manifest`'s; whether to believe a verified one now is
:mod:`app.core.update_policy`'s. Every address is checked before it is contacted, every body bounded.

Where the manifest is: the coordinator the app joined names it (``GET /api/updates`` ->
``{"manifest_url": "https://..." | null}``, :func:`advertised_source`); ``MANIFEST_URL`` is the project's
own, for ``lah update`` run by hand. A coordinator can only point at a manifest, never make one: whatever
it names must still carry the release key's signature and pass :mod:`app.core.update_policy`.

The exceptions are the app's (``app.core.errors``: ``UpdateError`` and its branches), re-exported here.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
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
from .manifest import RELEASE_PUBLIC_KEY, Download, Release, parse_manifest, platform_key, verify_file
from .update_policy import Seen, admit, build_version, check_url, load_seen, parse_version, save_seen

__all__ = [
    "MANIFEST_URL",
    "DownloadMismatch",
    "InsecureUrl",
    "ManifestInvalid",
    "ManifestRefused",
    "SignatureInvalid",
    "UpdateCheck",
    "UpdateError",
    "UpdateUnavailable",
    "advertised_source",
    "check_for_update",
    "download_release",
    "parse_version",
]

#: Where the project site publishes the newest release's manifest.
MANIFEST_URL = "https://learning-at-home.org/releases/manifest.json"
#: The coordinator's answer to "where are releases published?" (``coordinator/server/app.py``).
SOURCE_PATH = "/api/updates"
MAX_MANIFEST_BYTES = 64 * 1024
MAX_REDIRECTS = 5


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
