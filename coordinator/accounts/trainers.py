"""Trainer accounts: an admin grants the role and hands the researcher a single-use login code.

Accounts have no passwords: a volunteer's node keeps the token it got at registration. A researcher
runs ``lah train`` on machines of their own, possibly long after, so the operator's grant
(``lah coordinator grant-trainer NAME`` or ``POST /api/admin/trainers``) creates the account where
there is none, makes it a trainer and returns a login code; ``POST /api/trainers/login`` exchanges
name and code for a token with role ``trainer``, which refreshes as every token does. A code that was
lost, used, or has expired (as has the token, after a long pause) is replaced by granting again.

A login code is an invitation for that name (the ``invites`` table: stored as a hash, expiring, used once):
the account exists by then, so it can never register a second one, and an admin's invitation for a trainer's
name is an admin's word either way. Errors are the accounts' (``coordinator.accounts.accounts``):
``BadInvite`` for a wrong, used or expired code, ``Forbidden`` for an account that is not a trainer,
``Disabled`` for a disabled one.
"""

from __future__ import annotations

from sqlalchemy import update

from ..credit.ledger import TRAINER_ROLES  # who posts receipts is who trains
from ..db.models import Invite
from .accounts import (
    Accounts,
    AccountView,
    BadInvite,
    Disabled,
    Forbidden,
    InvalidName,
    NotFound,
    code_hash,
    validate_name,
)


async def grant_trainer(
    accounts: Accounts, name: object, *, by: int | None, ttl_s: float | None = None
) -> tuple[AccountView, str, float]:
    """Make ``name`` a trainer (creating the account if there is none); returns the account, a login
    code (shown once) and when it expires. An admin keeps the admin role (admins train too)."""
    if by is not None:
        await accounts.require_admin(by)
    name = validate_name(name)
    accounts.invite_ttl(ttl_s)  # checked before anything changes: a refused grant leaves no trace
    try:
        account = await accounts.by_name(name)
    except NotFound:
        invite = None
        if accounts.allowlist_mode:  # the operator's own invitation, used up by this registration
            invite, _ = await accounts.invite(name, by=None, ttl_s=ttl_s)
        account = await accounts.register(name, None, invite)
    if account.role not in TRAINER_ROLES:
        account = await accounts.set_role(name, "trainer", by=None)
    code, expires_at = await accounts.invite(name, by=None, ttl_s=ttl_s)
    return account, code, expires_at


async def redeem_login_code(accounts: Accounts, name: object, code: object) -> AccountView:
    """The trainer account ``name`` if ``code`` is an open login code for it (now used up)."""
    if not isinstance(name, str) or not isinstance(code, str) or not code:
        raise BadInvite("send the account's name and the login code the operator gave you")
    try:
        account = await accounts.by_name(validate_name(name))
    except (NotFound, InvalidName) as e:
        raise BadInvite("this login code is wrong, used or expired") from e
    now = accounts.clock()
    async with accounts.sessions() as s, s.begin():
        used = await s.execute(
            update(Invite)
            .where(
                Invite.code_hash == code_hash(code),
                Invite.name == account.name,
                Invite.used_at.is_(None),
                Invite.expires_at > now,
            )
            .values(used_at=now, used_by=account.id)
        )
        if int(getattr(used, "rowcount", 0) or 0) != 1:
            raise BadInvite("this login code is wrong, used or expired")
    # Checked after the code is used up: a code for a disabled account or a former trainer is spent.
    if account.disabled:
        raise Disabled("this account is disabled")
    if account.role not in TRAINER_ROLES:
        raise Forbidden("this account is not a trainer: ask the operator to grant it the role")
    return account
