"""Bearer tokens: signed by the coordinator's Ed25519 key, short-lived, refreshable and revocable.

Format (compact, URL-safe, no padding)::

    base64url(msgpack(Claims)) "." base64url(Ed25519 signature over DOMAIN + msgpack bytes)

The claims say who (``sub``: account id), as what (``role``), which token (``jti``: random hex, the
revocation handle), when (``iat``/``exp``: unix seconds) and optionally for which host (``peer``).
Checks run cheapest first: size and shape, signature, expiry, then revocation (the ``revoked_tokens``
table, behind a small in-memory cache). Errors::

    TokenError             code says which; the API answers 401, the signaling hub closes the socket
    ├── TokenInvalid       malformed, forged (bad signature, other key) or claims out of range
    ├── TokenExpired       past ``exp`` (or issued in the future beyond the clock skew)
    └── TokenRevoked       its jti is in the revocation table (refreshed, logged out, revoked by an admin)

With several replicas on one PostgreSQL the cache of "not revoked" answers is what could let a token
revoked on replica A pass on replica B. So a revocation is announced with NOTIFY in the transaction
that inserts it (delivered only if it commits), every replica LISTENs (``pg_link.Listener``) and drops
the jti from its cache when told: the bound is the notification's latency, milliseconds. While the
listener is down (or before it connects) "not revoked" answers are trusted for ``negative_cache_s``
(5 s) only, and all of them are forgotten whenever notifications may have been missed; while it is up
they are trusted for ``listened_cache_s`` (60 s), since any revocation would have reached us. A
listener whose connection died silently is noticed by its ping within ~10 s: the worst-case bound.

The whole list in memory. A signaling hello carries a token whose jti this replica has usually never
seen (a failover brings a thousand of them at once), so the per-jti cache alone costs one database
read per hello. Once the listener is up, ``load_revocations`` reads every unexpired revoked jti (the
LISTEN is established first, so a revocation committed meanwhile arrives as a notification too) and
from then on, while the listener stays up, a jti absent from that set is not revoked: no database at
all. Any gap (``notifications_missed``) drops the set's completeness until the next load; meanwhile
the per-jti path above answers. A table larger than ``MAX_REVOCATIONS_IN_MEMORY`` is not held whole.
Expiry is checked on this replica's clock; with replicas, ``services`` hands it a clock corrected to
the database's (``pg_link.DbClock``), so a replica whose clock is off does not misjudge expiry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import msgspec
import platformdirs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.p2p.errors import IdentityError
from engine.p2p.identity import APP_NAME, Identity

from ..db.models import ROLES, RevokedToken

log = logging.getLogger(__name__)
DOMAIN = b"lah-token-v1\x00"
KEY_FILE = "coordinator-token.key"
MAX_TOKEN_CHARS = 1024  # a real token is ~200 characters; anything longer is refused unparsed
CLOCK_SKEW_S = 60.0
JTI_BYTES = 16  # 32 hex characters: RevokedToken.jti is String(32)
LOAD_RETRY_S = 1.0
MAX_REVOCATIONS_IN_MEMORY = 1_000_000  # ~100 MB of Python strings at most; beyond it, per-jti reads


class TokenError(Exception):
    code = "token_invalid"


class TokenInvalid(TokenError):
    code = "token_invalid"


class TokenExpired(TokenError):
    code = "token_expired"


class TokenRevoked(TokenError):
    code = "token_revoked"


class Claims(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sub: int
    role: str
    jti: str
    iat: int
    exp: int
    peer: str | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Claims)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or not text.isascii():
        raise TokenInvalid("token is not base64url")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as e:
        raise TokenInvalid("token is not base64url") from e


def is_jti(value: object) -> bool:
    return isinstance(value, str) and len(value) == 2 * JTI_BYTES and all(c in _HEX for c in value)


_HEX = frozenset("0123456789abcdef")


def default_key_path() -> Path:
    return Path(platformdirs.user_data_dir(APP_NAME)) / KEY_FILE


def load_signing_key(path: str | Path | None = None) -> Ed25519PrivateKey:
    """The token key at ``path`` (default: the user data dir), created 0600 on first use."""
    try:
        return Identity.load_or_create(Path(path) if path is not None else default_key_path()).private_key
    except IdentityError as e:
        raise TokenError(f"cannot load the token signing key: {e}") from e


class TokenAuthority:
    """Issues and checks tokens. ``sessions`` reaches the revocation table; ``clock`` is for tests."""

    def __init__(
        self,
        key: Ed25519PrivateKey,
        sessions: async_sessionmaker[AsyncSession],
        *,
        ttl_s: float = 24 * 3600,
        clock: Callable[[], float] = time.time,
        cache_size: int = 4096,
        negative_cache_s: float = 5.0,
        listened_cache_s: float = 60.0,
    ) -> None:
        self._key = key
        self.public_key: Ed25519PublicKey = key.public_key()
        self.sessions = sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self.cache_size = cache_size
        # Negative answers ("not revoked") are cached briefly: a revocation made through this
        # authority is seen at once; one made by another coordinator process within negative_cache_s.
        self.negative_cache_s = negative_cache_s
        # Replicas (PostgreSQL): revocations are announced on ``notify_channel``; while ``listening()``
        # says our listener hears them, negative answers hold for listened_cache_s.
        self.listened_cache_s = listened_cache_s
        self.notify_channel: str | None = None
        self.listening: Callable[[], bool] = lambda: False
        self._epoch = 0  # bumped when notifications may have been missed: in-flight reads are not cached
        self._revoked: OrderedDict[str, float] = OrderedDict()  # jti -> exp
        self._not_revoked: OrderedDict[str, float] = OrderedDict()  # jti -> checked at
        # Every revoked jti (-> when its row may go) while ``_complete``: loaded after the listener
        # connected, kept current by its notifications, no longer trusted after a gap.
        self._all_revoked: dict[str, float] = {}
        self._complete = False
        self._loading: asyncio.Future[None] | None = None

    # -- issuing ------------------------------------------------------------------------------------

    def issue(self, sub: int, role: str, *, peer: str | None = None, now: float | None = None) -> str:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        now = self.clock() if now is None else now
        claims = Claims(
            sub=sub,
            role=role,
            jti=secrets.token_hex(JTI_BYTES),
            iat=int(now),
            exp=int(now + self.ttl_s),
            peer=peer,
        )
        payload = _encoder.encode(claims)
        return _b64(payload) + "." + _b64(self._key.sign(DOMAIN + payload))

    @property
    def public_key_bytes(self) -> bytes:
        """The coordinator's raw public key: what readers check its statements against."""
        from cryptography.hazmat.primitives import serialization

        return self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign_statement(self, data: bytes) -> bytes:
        """The coordinator's signature of a statement that starts with its own domain tag
        (``engine.wire.statements``): never confusable with a token, whose signed bytes start ``DOMAIN``."""
        if data.startswith(DOMAIN):
            raise ValueError("a statement must not look like a token")
        return self._key.sign(data)

    # -- checking -----------------------------------------------------------------------------------

    def decode(self, token: str, now: float | None = None) -> Claims:
        """Signature and expiry only (no database): raise TokenInvalid or TokenExpired."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise TokenInvalid("token is malformed")
        payload_b64, dot, sig_b64 = token.partition(".")
        if not dot or "." in sig_b64:
            raise TokenInvalid("token is malformed")
        payload, signature = _unb64(payload_b64), _unb64(sig_b64)
        try:
            self.public_key.verify(signature, DOMAIN + payload)
        except InvalidSignature as e:
            raise TokenInvalid("token signature does not verify") from e
        try:
            claims = _decoder.decode(payload)
        except msgspec.DecodeError as e:  # signed by us, so only a format change gets here
            raise TokenInvalid(f"token claims are malformed: {e}") from e
        if claims.role not in ROLES or not is_jti(claims.jti):
            raise TokenInvalid("token claims are out of range")
        now = self.clock() if now is None else now
        if now >= claims.exp:
            raise TokenExpired("token has expired")
        if claims.iat > now + CLOCK_SKEW_S:
            raise TokenExpired("token is not valid yet")
        return claims

    async def verify(self, token: str, now: float | None = None) -> Claims:
        """Full check: signature, expiry and revocation. Raises a TokenError."""
        claims = self.decode(token, now)
        if await self.is_revoked(claims.jti):
            raise TokenRevoked("token has been revoked")
        return claims

    def revocations_complete(self) -> bool:
        """True while every revocation is in memory and the listener hears new ones."""
        return self._complete and self.listening()

    async def is_revoked(self, jti: str) -> bool:
        if jti in self._revoked:
            self._revoked.move_to_end(jti)
            return True
        if self.revocations_complete():
            return jti in self._all_revoked
        checked = self._not_revoked.get(jti)
        trust = self.listened_cache_s if self.listening() else self.negative_cache_s
        if checked is not None and self.clock() - checked < trust:
            return False
        epoch = self._epoch
        async with self.sessions() as s:
            row = (await s.execute(select(RevokedToken.jti).where(RevokedToken.jti == jti))).first()
        if row is not None:
            self._remember_revoked(jti, 0.0)
            return True
        if epoch != self._epoch or jti in self._revoked:  # news arrived while we read: do not cache
            return False
        self._not_revoked[jti] = self.clock()
        self._not_revoked.move_to_end(jti)
        while len(self._not_revoked) > self.cache_size:
            self._not_revoked.popitem(last=False)
        return False

    # -- refresh and revocation ---------------------------------------------------------------------

    async def refresh(self, token: str, *, role: str | None = None, now: float | None = None) -> str:
        """A new token for the same subject (``role`` overrides the old claim); the old one is revoked.

        Single use: of two concurrent refreshes of one token, the second finds its jti already revoked.
        """
        claims = await self.verify(token, now)
        if not await self._insert_revocation(claims.jti, claims.exp):
            raise TokenRevoked("token has been revoked")
        return self.issue(claims.sub, role or claims.role, peer=claims.peer, now=now)

    async def revoke(self, jti: str, expires_at: float | None = None) -> None:
        """Revoke ``jti`` (idempotent). ``expires_at``: when the row may be pruned (default: now + ttl)."""
        if not is_jti(jti):
            raise TokenInvalid("a token id is 32 lowercase hex characters")
        await self._insert_revocation(jti, self.clock() + self.ttl_s if expires_at is None else expires_at)

    async def _insert_revocation(self, jti: str, expires_at: float) -> bool:
        """True if this call revoked ``jti``, False if it already was."""
        self._not_revoked.pop(jti, None)
        try:
            async with self.sessions() as s, s.begin():
                s.add(RevokedToken(jti=jti, expires_at=float(expires_at)))
                await s.flush()
                if self.notify_channel is not None:  # delivered at commit, to every replica
                    await s.execute(select(func.pg_notify(self.notify_channel, jti)))
        except IntegrityError:
            self._remember_revoked(jti, expires_at)
            return False
        self._remember_revoked(jti, expires_at)
        return True

    def revoked_elsewhere(self, jti: str) -> None:
        """A replica's NOTIFY: ``jti`` was revoked (perhaps by another replica)."""
        if is_jti(jti):
            self._not_revoked.pop(jti, None)
            self._remember_revoked(jti, 0.0)

    def notifications_missed(self) -> None:
        """The listener was (re)connected or lost: forget every "not revoked" answer; once it
        listens again, read the whole list anew (in a task: the listener calls this synchronously)."""
        self._epoch += 1
        self._not_revoked.clear()
        self._complete = False
        if self.notify_channel is not None and self.listening():
            self._loading = asyncio.ensure_future(self._load_while_listening(self._epoch))

    async def _load_while_listening(self, epoch: int) -> None:
        while epoch == self._epoch and self.listening():
            try:
                if await self.load_revocations():
                    return
            except Exception as e:  # the database is away: the per-jti path serves meanwhile
                log.warning("cannot load the revocation list: %s", e)
            if epoch != self._epoch:
                return
            await asyncio.sleep(LOAD_RETRY_S)

    async def load_revocations(self) -> bool:
        """Read every unexpired revocation into memory (call once the listener is up); True if the
        set is now complete. A gap during the read leaves it incomplete: the next load retries."""
        epoch = self._epoch
        now = self.clock()
        async with self.sessions() as s:
            # One read: a row past the bound says the table is too large to hold, no count first.
            rows = (
                await s.execute(
                    select(RevokedToken.jti, RevokedToken.expires_at)
                    .where(RevokedToken.expires_at >= now)
                    .limit(MAX_REVOCATIONS_IN_MEMORY + 1)
                )
            ).all()
        if len(rows) > MAX_REVOCATIONS_IN_MEMORY or epoch != self._epoch:
            return False
        loaded = {jti: float(exp) for jti, exp in rows}
        loaded.update(self._all_revoked)  # those notified while we read
        self._all_revoked = {jti: exp for jti, exp in loaded.items() if exp >= now}
        self._complete = True
        return True

    def _remember_revoked(self, jti: str, expires_at: float) -> None:
        if self.notify_channel is not None:  # replicas: the full set, kept until the token is dead
            self._all_revoked[jti] = expires_at if expires_at > 0 else self.clock() + self.ttl_s
            if len(self._all_revoked) > MAX_REVOCATIONS_IN_MEMORY:
                self.forget_expired()
                if len(self._all_revoked) > MAX_REVOCATIONS_IN_MEMORY:
                    self._complete = False
                    self._all_revoked.clear()
        self._revoked[jti] = expires_at
        self._revoked.move_to_end(jti)
        while len(self._revoked) > self.cache_size:
            self._revoked.popitem(last=False)

    async def prune(self, now: float | None = None) -> int:
        """Delete revocations of tokens that have expired anyway; returns how many."""
        now = self.clock() if now is None else now
        async with self.sessions() as s, s.begin():
            result = await s.execute(delete(RevokedToken).where(RevokedToken.expires_at < now))
        return int(getattr(result, "rowcount", 0) or 0)

    def forget_expired(self) -> int:
        """Drop in-memory revocations of tokens expired anyway (every replica, housekeeping)."""
        now = self.clock()
        gone = [jti for jti, exp in self._all_revoked.items() if exp < now]
        for jti in gone:
            del self._all_revoked[jti]
        return len(gone)
