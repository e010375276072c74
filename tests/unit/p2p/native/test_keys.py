"""The record keys the compiled layer seals with: TLS 1.2's PRF and the key block's layout.

The PRF vectors were produced by OpenSSL's own TLS1-PRF (``openssl kdf ... TLS1-PRF``), the function
that derived the keys OpenSSL seals with; the integration tests then show stock OpenSSL opening records
sealed with keys from :func:`derive` (tests/integration/test_dtls_fast_path.py).
"""

from __future__ import annotations

import pytest

from engine.p2p.native import keys

SHA256_OUT = bytes.fromhex(
    "E3F229BA727BE17B8D122620557CD453C2AAB21D07C3D495329B52D4E61EDB5A6B301791E90D35C9C9A46B4E14BAF9AF0FA0"
    "22F7077DEF17ABFD3797C0564BAB4FBC91666E9DEF9B97FCE34F796789BAA48082D122EE42C5A72E5A5110FFF70187347B66"
)
SHA384_OUT = bytes.fromhex(
    "7B0C18E9CED410ED1804F2CFA34A336A1C14DFFB4900BB5FD7942107E81C83CDE9CA0FAA60BE9FE34F82B1233C9146A0"
    "E534CB400FED2700884F9DC236F80EDD"
)


def test_prf_sha256_matches_openssl() -> None:
    secret = bytes.fromhex("9bbe436ba940f017b17652849a71db35")
    seed = bytes.fromhex("a0ba9f936cda311827a6f796ffd5198c")
    assert keys.prf(secret, b"test label", seed, 100) == SHA256_OUT
    assert keys.prf(secret, b"test label", seed, 7) == SHA256_OUT[:7]


def test_prf_sha384_matches_openssl() -> None:
    secret = bytes.fromhex("b80b733d6ceefcdc71566ea48e5567df")
    seed = bytes.fromhex("cd665cf6a8447dd6ff8b27555edb7465")
    assert keys.prf(secret, b"test label", seed, 64, "sha384") == SHA384_OUT


@pytest.mark.parametrize("suite", sorted(keys.SUITES))
def test_client_and_server_keys_mirror_each_other(suite: str) -> None:
    master, cr, sr = bytes(range(48)), b"c" * 32, b"s" * 32
    client = keys.derive(suite, master, cr, sr, is_client=True)
    server = keys.derive(suite, master, cr, sr, is_client=False)
    assert client is not None and server is not None
    assert (client.write_key, client.write_iv) == (server.read_key, server.read_iv)
    assert (client.read_key, client.read_iv) == (server.write_key, server.write_iv)
    cipher, key_len, iv_len, hash_name = keys.SUITES[suite]
    assert client.cipher == cipher and len(client.write_key) == key_len and len(client.write_iv) == iv_len
    # RFC 5246 6.3: client key, server key, client IV, server IV, from PRF(master, "key expansion", sr + cr)
    block = keys.prf(master, b"key expansion", sr + cr, 2 * (key_len + iv_len), hash_name)
    assert client.write_key == block[:key_len]
    assert client.write_iv == block[2 * key_len : 2 * key_len + iv_len]


def test_suites_without_an_aead_stay_in_openssl() -> None:
    master, r = bytes(48), bytes(32)
    assert keys.derive("ECDHE-ECDSA-AES128-SHA", master, r, r, is_client=True) is None
    assert keys.derive("", master, r, r, is_client=True) is None
    assert keys.derive("ECDHE-ECDSA-AES128-GCM-SHA256", b"short", r, r, is_client=True) is None
