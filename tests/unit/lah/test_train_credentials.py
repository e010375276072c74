"""Where ``lah train`` keeps its token: its own keyring service, the 0600 file where there is no keyring
or it is locked, ``--token-file``; and that nothing it says contains the token."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import keyring
import keyring.core
import pytest
from keyring.backend import KeyringBackend

from engine.account.tokens import KEYRING_SERVICE as NODE_SERVICE
from engine.account.tokens import Credentials
from lah.train_credentials import KEYRING_SERVICE, TOKEN_FILE, TrainerCredentials
from tests.app.locked_keyring import LockedKeyring

URL = "http://coordinator.example:8470"
SECRET = "eyJzdWIiOjF9.c2lnbmF0dXJl"  # stands in for a token: must never be printed or logged
CREDS = Credentials(7, SECRET, 1_900_000_000.0)


class MemoryKeyring(KeyringBackend):
    priority = 1.0  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.values.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.values[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.values.pop((service, username), None)


@pytest.fixture
def backend() -> Iterator[None]:
    """Restore the process's keyring backend after each test."""
    before = keyring.get_keyring()
    yield
    keyring.core.set_keyring(before)


def _no_secret(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and SECRET not in caplog.text


def test_a_working_keyring_keeps_the_trainer_token_under_its_own_service(
    tmp_path: Path, backend: None, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    ring = MemoryKeyring()
    keyring.core.set_keyring(ring)
    ring.set_password(NODE_SERVICE, URL, "the node's own entry")
    store = TrainerCredentials(tmp_path)
    assert "keyring" in store.save(URL + "/", CREDS)
    assert ring.values[(KEYRING_SERVICE, URL)] == CREDS.dumps()
    assert ring.values[(NODE_SERVICE, URL)] == "the node's own entry"  # the volunteer's untouched
    assert not (tmp_path / TOKEN_FILE).exists()
    assert TrainerCredentials(tmp_path).load(URL) == CREDS
    assert TrainerCredentials(tmp_path).load("http://elsewhere") is None
    _no_secret(caplog, capsys)


def test_without_a_keyring_the_token_goes_to_a_private_file(
    tmp_path: Path, backend: None, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    keyring.core.set_keyring(keyring.core.load_keyring("keyring.backends.fail.Keyring"))
    store = TrainerCredentials(tmp_path)
    assert str(tmp_path / TOKEN_FILE) in store.save(URL, CREDS)
    assert stat.S_IMODE((tmp_path / TOKEN_FILE).stat().st_mode) == 0o600
    assert TrainerCredentials(tmp_path).load(URL) == CREDS
    _no_secret(caplog, capsys)


def test_a_locked_keyring_falls_back_to_the_file_and_says_so(
    tmp_path: Path, backend: None, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    keyring.core.set_keyring(LockedKeyring())
    store = TrainerCredentials(tmp_path)
    with caplog.at_level(logging.WARNING):
        place = store.save(URL, CREDS)
    assert str(tmp_path / TOKEN_FILE) in place and "KeyringLocked" in caplog.text
    assert stat.S_IMODE((tmp_path / TOKEN_FILE).stat().st_mode) == 0o600
    # the next run finds it there: the locked keyring answers nothing, the file does
    assert TrainerCredentials(tmp_path).load(URL) == CREDS
    _no_secret(caplog, capsys)


def test_a_token_file_is_used_alone(tmp_path: Path, backend: None) -> None:
    ring = MemoryKeyring()
    keyring.core.set_keyring(ring)
    path = tmp_path / "sub" / "t.json"
    store = TrainerCredentials(tmp_path, path)
    assert str(path) in store.save(URL, CREDS)
    assert ring.values == {} and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TrainerCredentials(tmp_path, path).load(URL) == CREDS
    assert TrainerCredentials(tmp_path).load(URL) is None  # the keyring never saw it


@pytest.mark.parametrize("content", ["", "not json", '{"http://coordinator.example:8470": "{}"}', "[1, 2]"])
def test_a_damaged_store_reads_as_no_login(tmp_path: Path, backend: None, content: str) -> None:
    keyring.core.set_keyring(keyring.core.load_keyring("keyring.backends.fail.Keyring"))
    (tmp_path / TOKEN_FILE).write_text(content)
    assert TrainerCredentials(tmp_path).load(URL) is None
