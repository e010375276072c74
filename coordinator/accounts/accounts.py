"""Accounts, teams, hosts and the allowlist.

Anyone may register a display name (optionally in a team) and gets a volunteer token; only an admin
grants ``trainer`` or ``admin`` (the first admin is made by the operator: ``set_role(..., by=None)``).
In allowlist mode only names on the allowlist may register, and only with the secret code of an
unused, unexpired invitation for that name (``invite``: an admin creates it; only its hash is stored).
A name that looks like a taken one (same skeleton, ``coordinator.accounts.confusables``: Cyrillic U+0430
for Latin "a") is taken; a team name that looks like an existing team's names that team. A disabled account
is refused by every authenticated call (``require_enabled``).
An account binds hosts (peer keys) by showing the host key's signature of ``bind_message(account id)``
(engine/wire/statements.py), so nobody can bind a key they do not hold, and a key holder's proof binds
to that one account only.

Names are display text: 1..64 characters after NFC normalization, no control, format or separator
characters, no surrounding whitespace. Anything else (``<b>``, quotes, ``'; DROP TABLE``) is stored
verbatim through bound parameters; pages escape it. Uniqueness is case-insensitive. Errors::

    AccountError         code -> HTTP status in api_accounts
    ├── InvalidName      invalid_name       400
    ├── InvalidRole      invalid_role       400
    ├── InvalidKey       invalid_key        400
    ├── BadProof         bad_proof          403   the signature does not prove the key
    ├── Forbidden        forbidden          403   not an admin, or the account is disabled
    │   └── Disabled     account_disabled   403   the token's account is disabled
    ├── NotAllowlisted   not_allowlisted    403
    ├── BadInvite        invite_invalid     403   no such code for this name, or used, or expired
    ├── NotFound         not_found          404
    └── Conflict         name_taken / host_taken   409
"""

from __future__ import annotations

import hashlib
import secrets
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine.p2p.errors import IdentityError
from engine.p2p.identity import peer_id_of, verify
from engine.wire.statements import bind_message

from ..credit.ledger import in_list
from ..db.models import NAME_MAX, ROLES, Account, AllowlistEntry, Host, Invite, Team
from .confusables import skeleton

INVITE_BYTES = 18  # 24 URL-safe characters
MAX_INVITE_TTL_S = 366 * 86400.0

_BAD_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


class AccountError(Exception):
    code = "account_error"


class InvalidName(AccountError):
    code = "invalid_name"


class InvalidRole(AccountError):
    code = "invalid_role"


class InvalidKey(AccountError):
    code = "invalid_key"


class BadProof(AccountError):
    code = "bad_proof"


class Forbidden(AccountError):
    code = "forbidden"


class Disabled(Forbidden):
    code = "account_disabled"


class NotAllowlisted(AccountError):
    code = "not_allowlisted"


class BadInvite(AccountError):
    code = "invite_invalid"


class NotFound(AccountError):
    code = "not_found"


class Conflict(AccountError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def validate_name(value: object, what: str = "name") -> str:
    """The NFC form of a valid display name; raise InvalidName otherwise."""
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a string")
    name = unicodedata.normalize("NFC", value)
    if not name:
        raise InvalidName(f"{what} must not be empty")
    if len(name) > NAME_MAX:
        raise InvalidName(f"{what} is longer than {NAME_MAX} characters")
    if name != name.strip():
        raise InvalidName(f"{what} must not start or end with whitespace")
    for ch in name:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            raise InvalidName(f"{what} contains a control or invisible character (U+{ord(ch):04X})")
    return name


@dataclass(frozen=True)
class AccountView:
    id: int
    name: str
    team: str | None
    role: str
    disabled: bool

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "team": self.team, "role": self.role}


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


class Accounts:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        allowlist_mode: bool = False,
        invite_ttl_s: float = 14 * 86400,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.allowlist_mode = allowlist_mode
        self.invite_ttl_s = invite_ttl_s
        self.clock = clock

    # -- registration -------------------------------------------------------------------------------

    async def register(self, name: object, team: object = None, invite: object = None) -> AccountView:
        """A new volunteer account. In allowlist mode ``invite`` must be the code of an open
        invitation for this name; it is used up in the same transaction that creates the account."""
        name = validate_name(name)
        team_name = None if team is None else validate_name(team, "team name")
        shape = skeleton(name)
        async with self.sessions() as s:
            if self.allowlist_mode:
                listed = await s.get(AllowlistEntry, name)
                if listed is None:
                    raise NotAllowlisted("registration is by invitation: this name is not on the allowlist")
                if not isinstance(invite, str) or not invite:
                    raise BadInvite("registration is by invitation: send the invitation's code")
                # Checked here too (and used up atomically below), so a wrong code creates no team.
                open_invite = await s.execute(
                    select(Invite.code_hash).where(
                        Invite.code_hash == code_hash(invite),
                        Invite.name == name,
                        Invite.used_at.is_(None),
                        Invite.expires_at > self.clock(),
                    )
                )
                if open_invite.first() is None:
                    raise BadInvite("this invitation code is wrong, used or expired")
            taken = await s.execute(
                select(Account.id).where(
                    (func.lower(Account.name) == name.lower()) | (Account.name_skeleton == shape)
                )
            )
            if taken.first() is not None:
                raise Conflict("name_taken", "that name is taken (or one that looks the same)")
        team_id = None if team_name is None else await self._team_id(team_name)
        try:
            async with self.sessions() as s, s.begin():
                account = Account(name=name, name_skeleton=shape, team_id=team_id, role="volunteer")
                s.add(account)
                await s.flush()
                account_id = account.id
                if self.allowlist_mode:
                    assert isinstance(invite, str)
                    now = self.clock()
                    used = await s.execute(
                        update(Invite)
                        .where(
                            Invite.code_hash == code_hash(invite),
                            Invite.name == name,
                            Invite.used_at.is_(None),
                            Invite.expires_at > now,
                        )
                        .values(used_at=now, used_by=account_id)
                    )
                    if int(getattr(used, "rowcount", 0) or 0) != 1:
                        raise BadInvite("this invitation code is wrong, used or expired")
        except IntegrityError as e:  # a concurrent registration of the same name
            raise Conflict("name_taken", "that name is taken") from e
        return await self.get(account_id)

    def invite_ttl(self, ttl_s: float | None) -> float:
        """How long an invitation (or a trainer's login code) lasts; InvalidName outside a second..a year."""
        ttl = self.invite_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl <= MAX_INVITE_TTL_S:
            raise InvalidName("an invitation lasts between a second and a year")
        return ttl

    async def invite(self, name: object, *, by: int | None, ttl_s: float | None = None) -> tuple[str, float]:
        """An invitation for ``name`` (put on the allowlist too): returns (code, expires at).

        The code is shown once; only its hash is kept."""
        if by is not None:
            await self.require_admin(by)
        name = validate_name(name)
        ttl = self.invite_ttl(ttl_s)
        code = secrets.token_urlsafe(INVITE_BYTES)
        now = self.clock()
        async with self.sessions() as s, s.begin():
            if await s.get(AllowlistEntry, name) is None:
                s.add(AllowlistEntry(name=name))
            s.add(Invite(code_hash=code_hash(code), name=name, created_at=now, expires_at=now + ttl))
        return code, now + ttl

    async def require_enabled(self, account_id: int) -> AccountView:
        """The account, or Disabled (also for an account that no longer exists)."""
        try:
            account = await self.get(account_id)
        except NotFound as e:
            raise Disabled("this account does not exist") from e
        if account.disabled:
            raise Disabled("this account is disabled")
        return account

    async def _team_id(self, team_name: str) -> int:
        for _ in range(3):
            async with self.sessions() as s:
                # A look-alike of a team's name is that team, as its other spellings in case are.
                found = await s.execute(
                    select(Team.id)
                    .where(
                        (func.lower(Team.name) == team_name.lower())
                        | (Team.name_skeleton == skeleton(team_name))
                    )
                    .order_by(Team.id)
                )
                row = found.first()
                if row is not None:
                    return int(row[0])
            try:
                async with self.sessions() as s, s.begin():
                    new = Team(name=team_name, name_skeleton=skeleton(team_name))
                    s.add(new)
                    await s.flush()
                    return new.id
            except IntegrityError:  # created concurrently: look it up again
                continue
        raise Conflict("team_conflict", "could not create the team; try again")

    # -- lookups ------------------------------------------------------------------------------------

    async def get(self, account_id: int) -> AccountView:
        async with self.sessions() as s:
            row = (
                await s.execute(
                    select(Account.id, Account.name, Team.name, Account.role, Account.disabled)
                    .outerjoin(Team, Account.team_id == Team.id)
                    .where(Account.id == account_id)
                )
            ).first()
        if row is None:
            raise NotFound("no such account")
        return AccountView(int(row[0]), row[1], row[2], row[3], bool(row[4]))

    async def by_name(self, name: object) -> AccountView:
        if not isinstance(name, str):
            raise NotFound("no such account")
        async with self.sessions() as s:
            found = await s.execute(select(Account.id).where(Account.name == name))
            row = found.first()
        if row is None:
            raise NotFound("no such account")
        return await self.get(int(row[0]))

    async def hosts_of(self, account_id: int) -> list[str]:
        async with self.sessions() as s:
            rows = await s.execute(
                select(Host.peer_id).where(Host.account_id == account_id).order_by(Host.peer_id)
            )
            return [r[0] for r in rows]

    async def host_owner(self, peer_id: str) -> int | None:
        """The account a host is bound to, or None."""
        async with self.sessions() as s:
            row = (await s.execute(select(Host.account_id).where(Host.peer_id == peer_id))).first()
        return None if row is None else int(row[0])

    async def host_owners(self, peer_ids: Sequence[str]) -> list[tuple[int, bool] | None]:
        """For each host: (its account, whether that account is disabled), or None if unbound; one
        query for all (the signaling hub's admissions, batched)."""
        async with self.sessions() as s:
            rows = await s.execute(
                select(Host.peer_id, Host.account_id, Account.disabled)
                .join(Account, Account.id == Host.account_id)
                .where(in_list(s, Host.peer_id, sorted(set(peer_ids))))
            )
            found = {r[0]: (int(r[1]), bool(r[2])) for r in rows}
        return [found.get(p) for p in peer_ids]

    # -- hosts --------------------------------------------------------------------------------------

    async def bind_host(self, account_id: int, public_key: bytes, signature: bytes) -> tuple[str, bool]:
        """Bind the key to the account; returns (peer id, whether it was newly bound)."""
        try:
            peer_id = peer_id_of(public_key)
        except IdentityError as e:
            raise InvalidKey(str(e)) from e
        try:
            verify(public_key, bind_message(account_id), signature)
        except IdentityError as e:
            raise BadProof("the signature does not prove this key for this account") from e
        account = await self.get(account_id)
        if account.disabled:
            raise Forbidden("this account is disabled")
        owner = await self.host_owner(peer_id)
        if owner == account_id:
            return peer_id, False
        if owner is not None:
            raise Conflict("host_taken", "this host is bound to another account")
        try:
            async with self.sessions() as s, s.begin():
                s.add(Host(peer_id=peer_id, public_key=bytes(public_key), account_id=account_id))
        except IntegrityError as e:
            if await self.host_owner(peer_id) == account_id:
                return peer_id, False
            raise Conflict("host_taken", "this host is bound to another account") from e
        return peer_id, True

    # -- administration -----------------------------------------------------------------------------

    async def require_admin(self, account_id: int) -> AccountView:
        actor = await self.get(account_id)
        if actor.role != "admin" or actor.disabled:
            raise Forbidden("this needs an admin account")
        return actor

    async def set_role(self, name: object, role: object, *, by: int | None) -> AccountView:
        """Give the account called ``name`` a role. ``by``: the acting admin's id; None for the operator."""
        if by is not None:
            await self.require_admin(by)
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRole(f"role must be one of {', '.join(ROLES)}")
        return await self._update(name, role=role)

    async def _update(self, name: object, **values: object) -> AccountView:
        target = await self.by_name(name)
        async with self.sessions() as s, s.begin():
            account = await s.get(Account, target.id)
            if account is None:
                raise NotFound("no such account")
            for column, value in values.items():
                setattr(account, column, value)
        return await self.get(target.id)

    async def set_disabled(self, name: object, disabled: bool, *, by: int | None) -> AccountView:
        if by is not None:
            await self.require_admin(by)
        return await self._update(name, disabled=disabled)

    async def update_allowlist(
        self, add: Iterable[object] = (), remove: Iterable[object] = (), *, by: int | None
    ) -> tuple[int, int]:
        """Add and remove names; returns (added, removed). All names are validated before any change."""
        if by is not None:
            await self.require_admin(by)
        to_add = list(dict.fromkeys(validate_name(n) for n in add))
        to_remove = list(dict.fromkeys(validate_name(n) for n in remove))
        added = 0
        async with self.sessions() as s, s.begin():
            for name in to_add:
                if await s.get(AllowlistEntry, name) is None:
                    s.add(AllowlistEntry(name=name))
                    added += 1
            removed = 0
            if to_remove:
                result = await s.execute(delete(AllowlistEntry).where(AllowlistEntry.name.in_(to_remove)))
                removed = int(getattr(result, "rowcount", 0) or 0)
        return added, removed

    async def allowlist(self) -> Sequence[str]:
        async with self.sessions() as s:
            return [r[0] for r in await s.execute(select(AllowlistEntry.name).order_by(AllowlistEntry.name))]
