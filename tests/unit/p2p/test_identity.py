import os
import stat
from pathlib import Path

import pytest

from engine.p2p.errors import IdentityError
from engine.p2p.identity import Identity, peer_id_of, verify


def test_key_file_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "identity.key"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = Identity.load_or_create(path)
    assert again.peer_id == first.peer_id == peer_id_of(first.public_key)
    assert len(first.peer_id) == 40


def test_signatures(tmp_path: Path) -> None:
    me = Identity.generate()
    sig = me.sign(b"hello")
    verify(me.public_key, b"hello", sig)
    with pytest.raises(IdentityError):
        verify(me.public_key, b"hellO", sig)
    with pytest.raises(IdentityError):
        verify(Identity.generate().public_key, b"hello", sig)


def test_corrupt_key_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "identity.key"
    path.write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="not a PEM"):
        Identity.load_or_create(path)


def test_peer_id_needs_a_real_key() -> None:
    with pytest.raises(IdentityError):
        peer_id_of(b"short")
