"""A node's long-lived Ed25519 identity.

The peer id is derived from the public key (first 20 bytes of its SHA-256, hex): anyone can check
that a key belongs to an id, so ids cannot be claimed without the key. The private key lives in the
user data dir in a file only the owner can read (mode 0600, created that way, never widened).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.files import atomic_write

from .errors import IdentityError

APP_NAME = "learning-at-home"
KEY_FILE = "identity.key"
PEER_ID_BYTES = 20


def peer_id_of(public_key: bytes) -> str:
    if len(public_key) != 32:
        raise IdentityError(f"an Ed25519 public key has 32 bytes, got {len(public_key)}")
    return hashlib.sha256(public_key).digest()[:PEER_ID_BYTES].hex()


def verify(public_key: bytes, data: bytes, signature: bytes) -> None:
    """Raise IdentityError unless ``signature`` is ``public_key``'s signature of ``data``."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError) as e:
        raise IdentityError("signature does not verify") from e


@dataclass(frozen=True)
class Identity:
    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def peer_id(self) -> str:
        return peer_id_of(self.public_key)

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    @classmethod
    def load_or_create(cls, path: Path | None = None) -> Identity:
        """Load the key at ``path`` (default: the user data dir), creating it on first run."""
        path = path or default_key_path()
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls._create(path)
        except OSError as e:
            raise IdentityError(f"cannot read identity key {path}: {e}") from e
        try:
            key = serialization.load_pem_private_key(raw, password=None)
        except ValueError as e:
            raise IdentityError(f"identity key {path} is not a PEM private key: {e}") from e
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"identity key {path} is not an Ed25519 key")
        return cls(key)

    @classmethod
    def _create(cls, path: Path) -> Identity:
        identity = cls.generate()
        pem = identity.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        atomic_write(path, pem, private=True)  # 0600 from creation: never readable by others
        return identity


def default_key_path() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME)) / KEY_FILE
