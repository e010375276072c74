"""Accounts service: registration, names, allowlist, host binding, roles; on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.accounts.accounts import (
    BadProof,
    Conflict,
    Forbidden,
    InvalidKey,
    InvalidName,
    InvalidRole,
    NotAllowlisted,
    NotFound,
    bind_message,
    validate_name,
)
from coordinator.db.models import Account, AllowlistEntry, Host, Team
from engine.p2p.identity import Identity

from . import accounts_helpers as h

INJECTIONS = [
    "'; DROP TABLE accounts; --",
    "x' OR '1'='1",
    'Robert"); DELETE FROM hosts; --',
    "1; UPDATE accounts SET role='admin'",
    "%' UNION SELECT jti FROM revoked_tokens --",
]


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ada",
        "ada ",
        "a" * 65,
        "ada\x00",
        "a\nb",
        "a\tb",
        "a\x1b[31mred",
        "evil\u202etxt.exe",  # right-to-left override
        "zero\u200bwidth",
        "line\u2028sep",
        "\x7f",
        "bad\ud800",
        None,
        12,
    ],
)
def test_invalid_names(bad: object) -> None:
    with pytest.raises(InvalidName):
        validate_name(bad)


def test_valid_names_are_kept_verbatim() -> None:
    for name in ["Ada", "<script>alert(1)</script>", "Zoë & Co", "名前", "a" * 64, "a b", *INJECTIONS]:
        assert validate_name(name) == name
    assert validate_name("Zoe\u0308") == "Zo\u00eb"  # NFC


async def test_register_team_and_duplicates(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path)
    ada = await s.accounts.register("Ada", "Red Team")
    bob = await s.accounts.register("bob", "red team")  # same team, case-insensitively
    assert ada.role == "volunteer" and ada.team == "Red Team" and bob.team == "Red Team"
    for dup in ["Ada", "ADA", "ada"]:
        with pytest.raises(Conflict) as e:
            await s.accounts.register(dup)
        assert e.value.code == "name_taken"
    with pytest.raises(InvalidName):
        await s.accounts.register("carol", "team\x00")
    async with s.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(Account)) == 2
        assert await session.scalar(select(func.count()).select_from(Team)) == 1


async def test_hostile_names_are_stored_verbatim_and_harmless(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path)
    names = ["<img src=x onerror=alert(1)>", *INJECTIONS]
    for i, name in enumerate(names):
        account = await s.accounts.register(name, INJECTIONS[i % len(INJECTIONS)])
        assert (await s.accounts.get(account.id)).name == name
        assert (await s.accounts.by_name(name)).id == account.id
    with pytest.raises(NotFound):
        await s.accounts.by_name("' OR '1'='1")
    async with s.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(Account)) == len(names)
        roles = set((await session.execute(select(Account.role))).scalars())
        assert roles == {"volunteer"}


async def test_allowlist_mode(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path, allowlist_mode=True)
    with pytest.raises(NotAllowlisted):
        await s.accounts.register("ada")
    assert await s.accounts.update_allowlist(["ada", "bob", "ada"], by=None) == (2, 0)
    code, _ = await s.accounts.invite("ada", by=None)
    await s.accounts.register("ada", invite=code)
    assert await s.accounts.update_allowlist(["ada"], ["bob"], by=None) == (0, 1)
    with pytest.raises(NotAllowlisted):
        await s.accounts.register("bob")
    with pytest.raises(NotAllowlisted):
        await s.accounts.register("Ada2")
    # Only admins change the list, and a bad name changes nothing.
    ada = await s.accounts.by_name("ada")
    with pytest.raises(Forbidden):
        await s.accounts.update_allowlist(["carol"], by=ada.id)
    await s.accounts.set_role("ada", "admin", by=None)
    with pytest.raises(InvalidName):
        await s.accounts.update_allowlist(["carol", "bad\x00"], by=ada.id)
    assert list(await s.accounts.allowlist()) == ["ada"]
    async with s.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AllowlistEntry)) == 1


async def test_bind_host_needs_the_keys_proof(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path)
    ada = await s.accounts.register("ada")
    eve = await s.accounts.register("eve")
    host = Identity.generate()
    # Eve cannot bind Ada's host: without the key she has no proof; Ada's proof is for Ada's account.
    with pytest.raises(BadProof):
        await s.accounts.bind_host(eve.id, host.public_key, Identity.generate().sign(bind_message(eve.id)))
    with pytest.raises(BadProof):
        await s.accounts.bind_host(eve.id, host.public_key, host.sign(bind_message(ada.id)))
    with pytest.raises(BadProof):
        await s.accounts.bind_host(eve.id, host.public_key, b"\x00" * 64)
    with pytest.raises(InvalidKey):
        await s.accounts.bind_host(ada.id, b"short", host.sign(bind_message(ada.id)))
    assert await s.accounts.bind_host(ada.id, host.public_key, host.sign(bind_message(ada.id))) == (
        host.peer_id,
        True,
    )
    assert await s.accounts.bind_host(ada.id, host.public_key, host.sign(bind_message(ada.id))) == (
        host.peer_id,
        False,
    )
    # The key holder cannot move the host to another account either: one owner per host.
    with pytest.raises(Conflict) as e:
        await s.accounts.bind_host(eve.id, host.public_key, host.sign(bind_message(eve.id)))
    assert e.value.code == "host_taken"
    second = Identity.generate()
    await s.accounts.bind_host(ada.id, second.public_key, second.sign(bind_message(ada.id)))
    assert await s.accounts.hosts_of(ada.id) == sorted([host.peer_id, second.peer_id])
    assert await s.accounts.host_owner(host.peer_id) == ada.id
    assert await s.accounts.host_owner("0" * 40) is None
    async with s.sessions() as session:
        assert await session.scalar(select(func.count()).select_from(Host)) == 2


async def test_roles_are_granted_by_admins_only(db: AsyncEngine, tmp_path: Path) -> None:
    s = await h.services(db, tmp_path)
    ada = await s.accounts.register("ada")
    bob = await s.accounts.register("bob")
    with pytest.raises(Forbidden):
        await s.accounts.set_role("bob", "trainer", by=ada.id)
    with pytest.raises(Forbidden):
        await s.accounts.set_role("ada", "admin", by=ada.id)
    assert (await s.accounts.set_role("ada", "admin", by=None)).role == "admin"  # the operator
    assert (await s.accounts.set_role("bob", "trainer", by=ada.id)).role == "trainer"
    with pytest.raises(InvalidRole):
        await s.accounts.set_role("bob", "root", by=ada.id)
    with pytest.raises(NotFound):
        await s.accounts.set_role("nobody", "trainer", by=ada.id)
    with pytest.raises(Forbidden):
        await s.accounts.set_role("ada", "volunteer", by=bob.id)
    await s.accounts.set_disabled("ada", True, by=None)
    with pytest.raises(Forbidden):  # a disabled admin is no admin
        await s.accounts.set_role("bob", "volunteer", by=ada.id)
