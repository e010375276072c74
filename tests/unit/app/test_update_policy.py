"""Which signed manifests the update check believes (``app.core.update_policy``), without a network: the
https rule and its loopback exception, a build's version (releases, development builds, unknown), the
freshness and newest-seen rules, and the record of the newest manifest on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.errors import InsecureUrl, ManifestInvalid, ManifestRefused
from app.core.update_policy import (
    CLOCK_SKEW_S,
    Seen,
    admit,
    build_version,
    check_url,
    load_seen,
    parse_version,
    save_seen,
    url_allowed,
)

NOW = 1_767_225_600  # 2026-01-01 00:00 UTC
DAY = 86_400


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://learning-at-home.org/releases/manifest.json", True),
        ("https://mirror.example:8443/m.json", True),
        ("http://127.0.0.1:8080/m.json", True),  # tests on this machine
        ("http://127.8.9.10/m.json", True),
        ("http://[::1]:9/m.json", True),
        ("http://learning-at-home.org/releases/manifest.json", False),
        ("http://localhost/m.json", False),  # a name: whatever the resolver says it is
        ("http://127.0.0.1.example.org/m.json", False),
        ("http://10.0.0.1/m.json", False),
        ("ftp://127.0.0.1/m.json", False),
        ("https:///m.json", False),
        ("http://[::1/m.json", False),  # not a URL at all
        ("m.json", False),
    ],
)
def test_https_or_loopback_http_only(url: str, allowed: bool) -> None:
    assert url_allowed(url) is allowed


def test_an_insecure_url_is_refused_with_a_sentence() -> None:
    with pytest.raises(InsecureUrl, match=r"'http://example\.org/m\.json', which is not an https address"):
        check_url("http://example.org/m.json")


def test_release_and_build_versions_order() -> None:
    ordered = ["0.1.0rc1", "0.1", "0.1.1", "0.2.0a1", "0.2.0b2", "0.2.0rc1", "0.2.0", "0.10.0", "1.0"]
    assert sorted(ordered, key=parse_version) == ordered
    assert parse_version("1.0") == parse_version("1.0.0")
    for bad in ("1.0-beta", "1.3.0.dev4", "1.2.3+local", "unknown"):  # releases carry plain versions
        with pytest.raises(ManifestInvalid):
            parse_version(bad)
    builds = ["1.2.0", "1.3.0.dev1", "1.3.0.dev4", "1.3.0a1.dev2", "1.3.0a1", "1.3.0"]
    assert sorted(builds, key=lambda v: build_version(v) or ()) == builds
    assert build_version("1.2.3+g1a2b3c") == parse_version("1.2.3")  # a local build of 1.2.3


@pytest.mark.parametrize("text", ["unknown", "0+unknown", "", "a development tree", "1.2.3+"])
def test_a_build_whose_version_is_not_known(text: str) -> None:
    assert build_version(text) is None


def test_a_fresh_manifest_is_admitted() -> None:
    admit("0.2.0", NOW - DAY, NOW + 30 * DAY, NOW, None)
    admit("0.2.0", NOW + CLOCK_SKEW_S, NOW + 30 * DAY, NOW, None)  # a clock a little behind
    admit("0.2.0", NOW - DAY, NOW + 30 * DAY, NOW, Seen("0.2.0", NOW - DAY))  # the same one again
    admit("0.2.1", NOW, NOW + 30 * DAY, NOW, Seen("0.2.0", NOW - DAY))  # a newer one


def test_an_expired_manifest_is_refused() -> None:
    with pytest.raises(ManifestRefused, match="expired on 2025-12-31 00:00 UTC: this is an old copy"):
        admit("0.2.0", NOW - 90 * DAY, NOW - DAY, NOW, None)
    with pytest.raises(ManifestRefused, match="expired"):
        admit("0.2.0", NOW - DAY, NOW, NOW, None)  # expires is the first second it is no longer valid


def test_a_manifest_from_the_future_is_refused() -> None:
    with pytest.raises(ManifestRefused, match=r"later than this computer's clock .*check the date and time"):
        admit("0.2.0", NOW + CLOCK_SKEW_S + 1, NOW + 30 * DAY, NOW, None)


def test_a_replayed_older_manifest_is_refused() -> None:
    with pytest.raises(ManifestRefused, match=r"before the one this computer already accepted \(2026-01-01"):
        admit("0.3.0", NOW - DAY, NOW + 30 * DAY, NOW, Seen("0.2.0", NOW))


def test_an_older_release_in_a_newer_manifest_is_refused() -> None:
    with pytest.raises(ManifestRefused, match=r"names version 0\.1\.0, older than version 0\.2\.0"):
        admit("0.1.0", NOW, NOW + 30 * DAY, NOW, Seen("0.2.0", NOW - DAY))


def test_the_newest_seen_is_kept_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "data" / "update-state.json"
    assert load_seen(path) == (None, "")
    assert save_seen(path, Seen("0.2.0", NOW)) == ""
    assert load_seen(path) == (Seen("0.2.0", NOW), "")
    assert json.loads(path.read_text()) == {"version": "0.2.0", "issued_at": NOW}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"[]",
        b'{"version": "0.2.0"}',
        b'{"version": 2, "issued_at": 1}',
        b'{"version": "x", "issued_at": 1}',
        b'{"version": "0.2.0", "issued_at": true}',
        b"\xff",
    ],
)
def test_a_damaged_record_counts_as_none_and_says_so(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "update-state.json"
    path.write_bytes(content)
    seen, warning = load_seen(path)
    assert seen is None and "update-state.json was unreadable" in warning and "starts over" in warning


def test_a_record_that_cannot_be_saved_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    warning = save_seen(blocker / "update-state.json", Seen("0.2.0", NOW))
    assert warning.startswith("the update record update-state.json could not be saved")
