"""Where a token is kept: the credentials record, the memory and 0600 file stores, and the keyring's
place in words a volunteer can check (a keyrings.alt file named as the file it is)."""

from __future__ import annotations

from pathlib import Path

from keyrings.alt.file import PlaintextKeyring

from engine.account import Credentials, FileTokenStore, MemoryTokenStore, keyring_place
from engine.control import file_mode


def test_token_stores(tmp_path: Path) -> None:
    creds = Credentials(7, "tok", 123.5)
    assert Credentials.loads(creds.dumps()) == creds
    assert Credentials.loads("{}") is None and Credentials.loads("nope") is None
    file_store = FileTokenStore(tmp_path / "t" / "tokens.json")
    for store in (MemoryTokenStore(), file_store):
        assert store.get("http://c") is None
        store.set("http://c", creds.dumps())
        assert store.get("http://c") == creds.dumps()
    assert file_mode(file_store.path) == 0o600


def test_a_plaintext_key_file_is_named_as_the_file_it_is(tmp_path: Path) -> None:
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring_pass.cfg")  # type: ignore[misc]
    words = keyring_place(backend)
    assert words.startswith("a plain-text key file, ") and str(tmp_path / "keyring_pass.cfg") in words
    assert "not your system's keyring" in words

    class SecretService:  # a real system keyring's backend has no file of its own
        pass

    assert keyring_place(SecretService()) == "your system's keyring (SecretService)"
