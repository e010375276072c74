"""A release manifest signed with Ed25519: its format, its signature, and the files it names.

Pure (no network): :func:`parse_manifest` believes a manifest only once its signature verifies with the
key built into the app (``RELEASE_PUBLIC_KEY``), :func:`sign_manifest` makes one (``scripts/sign-release``
and the tests), :func:`verify_file` holds a downloaded file to the size and SHA-256 the manifest names,
and :func:`platform_key` names this machine's file among the manifest's downloads. Fetching it, and
whether to offer what it names, is :mod:`app.core.updates`'s part; whether to believe a verified
manifest now (expiry, rollback) is :mod:`app.core.update_policy`'s.

The manifest is JSON: ``{"payload": base64, "signature": base64}``. The signature is over
``SIGNING_CONTEXT + payload`` (a fixed prefix, so a signature made for anything else never verifies
here); the payload is JSON (``issued_at`` and ``expires`` in seconds since 1970, UTC)::

    {"schema": 2, "version": "0.2.0", "notes_url": "https://...", "issued_at": 1767225600,
     "expires": 1774999600,
     "downloads": {"linux-x86_64-deb": {"url": "https://...", "sha256": "<hex>", "size": 123}, ...}}
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import DownloadMismatch, ManifestInvalid, SignatureInvalid
from .update_policy import MAX_VALIDITY_S, parse_version, url_allowed

#: The release key's public half (raw 32 bytes, base64). The private half is kept off this repository by
#: the release manager; ``scripts/sign-release keygen`` makes a pair. Until the project's real key is put
#: here (installers/README.md, "Releases"), this is a key whose private half was discarded: no manifest
#: verifies, so no update is ever offered.
RELEASE_PUBLIC_KEY = "5MNZaRlBnASRyd553Bw1VY/KUyc61aLqWQofN0AQLAg="
SIGNING_CONTEXT = b"learning-at-home release manifest v1\n"
SCHEMA = 2  # 1 had no issue time or expiry, so any old copy stayed valid forever: refused
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
