"""Which signed manifests the update check believes, and which releases it offers (pure, no network).

A valid signature proves the project made a manifest, not that it is the newest one: anyone who kept an
old copy could serve it forever and hide every later release, or offer an old release with a known
flaw. So the signed payload carries ``issued_at`` and ``expires`` (seconds since 1970, UTC), and a
manifest is refused (:class:`ManifestRefused`) when it has expired, when it was issued later than this
computer's clock allows (``CLOCK_SKEW_S``), or when it is older, by issue time or by version, than the
newest one this computer accepted before. That newest one is kept in a small JSON file in the app's data
folder (``update-state.json``), so a rollback is refused across restarts too.

A build is never offered a release older than itself or equal to it. Builds carry PEP 440-style
versions: releases are ``1.2.3`` or ``1.2.0rc1``; a development build may be ``1.3.0.dev4`` (before
1.3.0's pre-releases) or carry a local label (``1.2.3+g1a2b3c``: compares as 1.2.3). A build whose
version is not known at all (``unknown``, ``0+unknown``: run from a source tree without an installed
distribution) is offered nothing, since any release might be older than it.

Manifests and downloads travel over https only. The one exception, for tests on this machine, is plain
http to a loopback IP address written as such (``127.x.x.x`` or ``[::1]``): those bytes never leave the
computer. A name like ``localhost`` is not excepted (it is whatever the resolver says).
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from engine.files import atomic_write

from .errors import InsecureUrl, ManifestInvalid, ManifestRefused

__all__ = [
    "CLOCK_SKEW_S",
    "MAX_VALIDITY_S",
    "STATE_NAME",
    "UNKNOWN_VERSIONS",
    "Seen",
    "admit",
    "build_version",
    "check_url",
    "load_seen",
    "parse_version",
    "save_seen",
    "url_allowed",
]

#: How far in the future a manifest's issue time may be before this computer's clock is doubted.
CLOCK_SKEW_S = 3600
#: The longest validity a manifest may claim: a stolen copy is useless after at most this long.
MAX_VALIDITY_S = 366 * 86400
STATE_NAME = "update-state.json"
UNKNOWN_VERSIONS = frozenset({"unknown", "0+unknown"})

VersionKey = tuple[tuple[int, ...], tuple[int, int], tuple[int, int]]

_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?$")
_BUILD = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.dev(\d+))?(?:\+[A-Za-z0-9.]+)?$")


def _key(m: re.Match[str], dev: str | None) -> VersionKey:
    release = tuple(int(p) for p in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    if m.group(2):
        pre = (("a", "b", "rc").index(m.group(2)), int(m.group(3)))
    else:
        pre = (-1, 0) if dev is not None else (3, 0)  # 1.3.0.dev4 comes before 1.3.0a1
    return release, pre, ((0, int(dev)) if dev is not None else (1, 0))


def parse_version(text: str) -> VersionKey:
    """A sortable key for a release's version, ``1.2.3`` or ``1.2.0rc1`` (pre-releases sort first)."""
    m = _RELEASE.match(text.strip())
    if m is None:
        raise ManifestInvalid(f"not a release version: {text!r}")
    return _key(m, None)


def build_version(text: str) -> VersionKey | None:
    """This build's version as a key, or None when it is not known (a build from a bare source tree)."""
    text = text.strip()
    m = _BUILD.match(text)
    if text in UNKNOWN_VERSIONS or m is None:
        return None
    return _key(m, m.group(4))


def url_allowed(url: str) -> bool:
    """https anywhere, or http to a loopback IP literal (tests on this machine); nothing else."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if not host:
        return False
    if parts.scheme == "https":
        return True
    if parts.scheme != "http":
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, what: str = "the release manifest") -> None:
    if not url_allowed(url):
        raise InsecureUrl(
            f"{what} would come from {url!r}, which is not an https address; updates are fetched over "
            "https only"
        )


@dataclass(frozen=True)
class Seen:
    """The newest manifest this computer accepted."""

    version: str
    issued_at: int


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def admit(version: str, issued_at: int, expires: int, now: float, seen: Seen | None) -> None:
    """Raise :class:`ManifestRefused` unless a signed manifest with these fields may be believed now."""
    if now >= expires:
        raise ManifestRefused(
            f"the release manifest expired on {_when(expires)}: this is an old copy, so no update is "
            "offered from it"
        )
    if issued_at > now + CLOCK_SKEW_S:
        raise ManifestRefused(
            f"the release manifest was issued on {_when(issued_at)}, later than this computer's clock "
            f"({_when(now)}); check the date and time"
        )
    if seen is None:
        return
    if issued_at < seen.issued_at:
        raise ManifestRefused(
            f"the release manifest was issued on {_when(issued_at)}, before the one this computer "
            f"already accepted ({_when(seen.issued_at)}, version {seen.version}): an old copy is being served"
        )
    if parse_version(version) < parse_version(seen.version):
        raise ManifestRefused(
            f"the release manifest names version {version}, older than version {seen.version} this "
            "computer already saw: an old release is being served"
        )


def load_seen(path: Path) -> tuple[Seen | None, str]:
    """The newest accepted manifest and a warning ("" when none). A damaged file counts as none: it only
    ever raises the bar, so starting over loses one rollback check and nothing of the volunteer's."""
    try:
        raw = json.loads(path.read_bytes())
        version, issued_at = raw["version"], raw["issued_at"]
        if not isinstance(version, str) or isinstance(issued_at, bool) or not isinstance(issued_at, int):
            raise TypeError("version or issued_at has the wrong type")
        parse_version(version)
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError, KeyError, TypeError, ManifestInvalid) as e:
        return None, f"the update record {path.name} was unreadable ({e}) and starts over"
    return Seen(version, issued_at), ""


def save_seen(path: Path, seen: Seen) -> str:
    """Keep ``seen`` as the newest accepted manifest; a warning ("" when saved)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"version": seen.version, "issued_at": seen.issued_at}).encode())
    except OSError as e:
        return f"the update record {path.name} could not be saved ({e.strerror or e})"
    return ""
