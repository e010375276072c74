"""The record keys of an established DTLS 1.2 session, derived as OpenSSL derived them (RFC 5246 6.3).

OpenSSL keeps its traffic keys to itself; what pyOpenSSL does expose is the master secret and both
randoms, from which TLS 1.2's PRF gives the same key block (RFC 5246 section 5 and 6.3). Only AEAD suites
are listed: their records carry no MAC key and no CBC padding, so one seal and one open per record is
all the compiled layer does. Any other suite gives None and the session stays in OpenSSL.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

# OpenSSL's suite name -> (the compiled layer's cipher, key bytes, fixed IV bytes, PRF hash)
SUITES: dict[str, tuple[str, int, int, str]] = {
    "ECDHE-ECDSA-AES128-GCM-SHA256": ("AES128-GCM", 16, 4, "sha256"),
    "ECDHE-RSA-AES128-GCM-SHA256": ("AES128-GCM", 16, 4, "sha256"),
    "ECDHE-ECDSA-AES256-GCM-SHA384": ("AES256-GCM", 32, 4, "sha384"),
    "ECDHE-RSA-AES256-GCM-SHA384": ("AES256-GCM", 32, 4, "sha384"),
    "ECDHE-ECDSA-CHACHA20-POLY1305": ("CHACHA20-POLY1305", 32, 12, "sha256"),
    "ECDHE-RSA-CHACHA20-POLY1305": ("CHACHA20-POLY1305", 32, 12, "sha256"),
}


@dataclass(frozen=True)
class RecordKeys:
    cipher: str
    write_key: bytes
    write_iv: bytes
    read_key: bytes
    read_iv: bytes


def prf(secret: bytes, label: bytes, seed: bytes, size: int, hash_name: str = "sha256") -> bytes:
    """TLS 1.2's PRF: P_hash(secret, label + seed) cut to ``size`` bytes (RFC 5246 section 5)."""
    digest = getattr(hashlib, hash_name)
    seed = label + seed
    out = bytearray()
    a = seed
    while len(out) < size:
        a = hmac.new(secret, a, digest).digest()
        out += hmac.new(secret, a + seed, digest).digest()
    return bytes(out[:size])


def derive(
    suite: str, master_secret: bytes, client_random: bytes, server_random: bytes, is_client: bool
) -> RecordKeys | None:
    """This side's write and read keys for ``suite``, or None when the suite is not an AEAD one we seal."""
    spec = SUITES.get(suite)
    if spec is None or len(master_secret) != 48 or len(client_random) != 32 or len(server_random) != 32:
        return None
    cipher, key_len, iv_len, hash_name = spec
    seed = server_random + client_random
    block = prf(master_secret, b"key expansion", seed, 2 * (key_len + iv_len), hash_name)
    client_key, server_key = block[:key_len], block[key_len : 2 * key_len]
    ivs = block[2 * key_len :]
    client_iv, server_iv = ivs[:iv_len], ivs[iv_len:]
    if is_client:
        return RecordKeys(cipher, client_key, client_iv, server_key, server_iv)
    return RecordKeys(cipher, server_key, server_iv, client_key, client_iv)
