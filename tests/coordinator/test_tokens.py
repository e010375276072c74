"""Tokens: issue/verify, expiry, forgery, revocation, refresh; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.tokens import (
    TokenAuthority,
    TokenExpired,
    TokenInvalid,
    TokenRevoked,
    load_signing_key,
)
from coordinator.db.models import RevokedToken
from coordinator.db.session import session_factory

from .accounts_helpers import FakeClock


def authority(db: AsyncEngine, clock: FakeClock, key: Ed25519PrivateKey | None = None) -> TokenAuthority:
    return TokenAuthority(key or Ed25519PrivateKey.generate(), session_factory(db), ttl_s=3600, clock=clock)


def _flip(token: str, index: int) -> str:
    chars = list(token)
    chars[index] = "A" if chars[index] != "A" else "B"
    return "".join(chars)


async def test_issue_verify_expire(db: AsyncEngine) -> None:
    clock = FakeClock()
    tokens = authority(db, clock)
    token = tokens.issue(7, "trainer", peer="ab" * 20)
    claims = await tokens.verify(token)
    assert (claims.sub, claims.role, claims.peer) == (7, "trainer", "ab" * 20)
    assert claims.exp - claims.iat == 3600 and len(claims.jti) == 32
    clock.advance(3599)
    await tokens.verify(token)
    clock.advance(1)
    with pytest.raises(TokenExpired) as e:
        await tokens.verify(token)
    assert e.value.code == "token_expired"
    # Issued "in the future" (a clock far ahead) is not valid yet either.
    with pytest.raises(TokenExpired):
        tokens.decode(tokens.issue(1, "volunteer", now=clock.t + 600))


async def test_forged_and_malformed_tokens(db: AsyncEngine) -> None:
    clock = FakeClock()
    tokens = authority(db, clock)
    other = authority(db, clock)  # another key: a forger's own authority
    token = tokens.issue(1, "volunteer")
    payload, _, sig = token.partition(".")
    forged = [
        other.issue(1, "volunteer"),
        _flip(token, 3),  # a byte of the claims
        _flip(token, len(payload) + 5),  # a byte of the signature
        # claims rewritten to admin, old signature kept
        base64.urlsafe_b64encode(
            base64.urlsafe_b64decode(payload + "==").replace(b"volunteer", b"admin\x00\x00\x00\x00")
        )
        .rstrip(b"=")
        .decode()
        + "."
        + sig,
        payload + "." + sig + "." + sig,
        payload,
        "",
        ".",
        "not a token at all",
        "é" * 10 + "." + sig,
        "x" * 5000,
        payload + ".%%%%",
    ]
    for bad in forged:
        with pytest.raises(TokenInvalid) as e:
            await tokens.verify(bad)
        assert e.value.code == "token_invalid"
    assert (await tokens.verify(token)).sub == 1


async def test_revocation_and_cache(db: AsyncEngine) -> None:
    clock = FakeClock()
    tokens = authority(db, clock)
    token = tokens.issue(3, "volunteer")
    claims = await tokens.verify(token)  # caches "not revoked" briefly
    await tokens.revoke(claims.jti, claims.exp)
    await tokens.revoke(claims.jti, claims.exp)  # idempotent
    with pytest.raises(TokenRevoked) as e:
        await tokens.verify(token)
    assert e.value.code == "token_revoked"
    # A second authority (another process, same key) sees it from the table.
    twin = TokenAuthority(tokens._key, tokens.sessions, clock=clock)
    with pytest.raises(TokenRevoked):
        await twin.verify(token)
    with pytest.raises(TokenInvalid):
        await tokens.revoke("'; DROP TABLE revoked_tokens; --")
    # Rows of expired tokens are pruned; others stay.
    other = tokens.issue(4, "volunteer")
    await tokens.revoke(tokens.decode(other).jti, clock.t + 10_000)
    clock.advance(3601)
    assert await tokens.prune() == 1
    async with tokens.sessions() as s:
        assert len((await s.execute(select(RevokedToken.jti))).all()) == 1


async def test_refresh_revokes_the_old_token_once(db: AsyncEngine) -> None:
    clock = FakeClock()
    tokens = authority(db, clock)
    old = tokens.issue(5, "volunteer", peer="cd" * 20)
    clock.advance(100)
    new = await tokens.refresh(old, role="trainer")
    claims = await tokens.verify(new)
    assert (claims.sub, claims.role, claims.peer) == (5, "trainer", "cd" * 20)
    assert claims.iat == int(clock.t)
    with pytest.raises(TokenRevoked):
        await tokens.verify(old)
    with pytest.raises(TokenRevoked):
        await tokens.refresh(old)
    # Two concurrent refreshes of one token: exactly one wins.
    fresh = TokenAuthority(tokens._key, tokens.sessions, ttl_s=3600, clock=clock)
    results = await asyncio.gather(fresh.refresh(new), fresh.refresh(new), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["TokenRevoked", "str"]
    clock.advance(7200)
    with pytest.raises(TokenExpired):
        await tokens.refresh(str(next(r for r in results if isinstance(r, str))))


def test_signing_key_file_is_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "token.key"
    key = load_signing_key(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = load_signing_key(path)
    assert key.sign(b"x") == again.sign(b"x")  # Ed25519 signatures are deterministic
