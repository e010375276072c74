"""``lah coordinator``: run the whole coordinator from a TOML config (and ``LAH_*`` environment);
``lah coordinator invite NAME`` / ``disable NAME`` / ``enable NAME`` / ``grant-trainer NAME`` and the review
of credit (``flags [--host PEER]``, ``undo-flag ID``, ``refusals [--days N]``) act on its database
directly (the operator's tools, no admin token needed; a running coordinator sees the change at once)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shlex
import signal
import socket
from datetime import UTC, datetime
from pathlib import Path

from ..config import CoordinatorConfig, load_config
from ..services import open_services
from .app import start_full


def valid_until(expires_at: float) -> str:
    """``2026-05-02 14:03 UTC (16:03 CEST here)``: when a code stops working, for a person to read (the
    operator passes it on, perhaps to someone in another time zone)."""
    utc = datetime.fromtimestamp(expires_at, UTC)
    local = utc.astimezone()
    text = f"{utc:%Y-%m-%d %H:%M} UTC"
    if local.utcoffset() != utc.utcoffset():
        day = "" if local.date() == utc.date() else f"{local:%Y-%m-%d} "
        text += f" ({day}{local:%H:%M} {local.tzname() or 'local time'} here)"
    return text


def public_url(config: CoordinatorConfig) -> str:
    """The address others reach this coordinator at, for the commands it prints: ``public_url`` where
    the operator set one, else its own host and port (a wildcard host named by this machine's name)."""
    if config.public_url:
        return config.public_url.rstrip("/")
    host = config.host if config.host not in ("", "0.0.0.0", "::") else socket.gethostname()
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{config.port}"


async def run(config_path: Path | None, host: str | None, port: int | None, make_admin: str | None) -> None:
    config = load_config(config_path)
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if overrides:
        import msgspec

        config = msgspec.structs.replace(config, **overrides)
    running = await start_full(config)
    services = running.services
    if make_admin:
        await services.accounts.set_role(make_admin, "admin", by=None)
        print(f"coordinator: {make_admin} is an admin", flush=True)
    # Everything allocated so far lives as long as the process: keep the collector from rescanning
    # it, which otherwise stalls deep leaderboard pages by 100+ ms now and then.
    gc.freeze()
    print(f"coordinator: site {running.url}/ signaling {running.signaling_url}", flush=True)
    print(
        f"coordinator: database {config.database_url or 'SQLite in the user data dir'}; "
        "Ctrl+C or SIGTERM stops",
        flush=True,
    )
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError):  # no add_signal_handler on Windows' loop
        # SIGTERM is how systemd, Docker and an operator's kill stop a replica: stopping cleanly takes
        # its presence rows at once instead of after the dead-replica bound.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()
        print("coordinator: stopped", flush=True)


async def invite(config_path: Path | None, name: str, ttl_s: float | None = None) -> str:
    """Create an invitation for ``name`` and print its code (shown once: only its hash is kept)."""
    config = load_config(config_path)
    services = await open_services(config)
    try:
        code, expires_at = await services.accounts.invite(name, by=None, ttl_s=ttl_s)
    finally:
        await services.close()
    print(
        f"invitation for {name}: code {code} (single use, valid until {valid_until(expires_at)}); the "
        f"app asks for it on first run (lah app --coordinator {public_url(config)}), or: lah node "
        f"--coordinator {public_url(config)} --name {shlex.quote(name)} --invite {code}",
        flush=True,
    )
    return code


async def set_disabled(config_path: Path | None, name: str, disabled: bool) -> None:
    """Disable (every token of the account is refused at once) or re-enable an account."""
    services = await open_services(load_config(config_path))
    try:
        account = await services.accounts.set_disabled(name, disabled, by=None)
    finally:
        await services.close()
    print(f"coordinator: {account.name} is {'disabled' if account.disabled else 'enabled'}", flush=True)


async def grant_trainer(config_path: Path | None, name: str, ttl_s: float | None = None) -> str:
    """Make ``name`` a trainer (creating the account if needed) and print its single-use login code
    for ``lah train login`` (shown once: only its hash is kept)."""
    from ..accounts.trainers import grant_trainer as grant

    config = load_config(config_path)
    services = await open_services(config)
    try:
        account, code, expires_at = await grant(services.accounts, name, by=None, ttl_s=ttl_s)
    finally:
        await services.close()
    print(
        f"coordinator: {account.name} is a {account.role}; login code {code} (single use, valid until "
        f"{valid_until(expires_at)}); on the trainer's computer: lah train login --coordinator "
        f"{public_url(config)} --name {shlex.quote(account.name)} --code={code}",
        flush=True,
    )
    return code


async def flags(config_path: Path | None, host: str | None = None) -> None:
    """Print spot-check flags, newest first (maybe of one host): what an operator reviews."""
    from ..credit.review import list_flags

    services = await open_services(load_config(config_path))
    try:
        rows = await list_flags(services.sessions, host)
    finally:
        await services.close()
    if not rows:
        print("coordinator: no spot-check flags", flush=True)
    for f in rows:
        period = f"{_when(f['period_start'])} to {_when(f['period_end'])}"
        state = f"undone {_when(f['undone_at'])}" if f["undone_at"] is not None else "active"
        print(
            f"flag {f['id']}: host {f['host_peer_id']} reported by {f['reporter_peer_id']} (account "
            f"{f['reporter_account_id']}) for {f['expert_uid']}, {period}: {f['reason']} [{state}]",
            flush=True,
        )


async def undo_flag(config_path: Path | None, flag_id: int) -> None:
    """Undo a spot-check flag and give back the credit it took (``coordinator.credit.review``)."""
    from ..credit.review import undo_flag as undo

    services = await open_services(load_config(config_path))
    try:
        result = await undo(services.sessions, flag_id)
    finally:
        await services.close()
    print(
        f"coordinator: flag {flag_id} undone; {result.restored_receipts} receipts of host "
        f"{result.host_peer_id} credit {result.restored_credit:g} again",
        flush=True,
    )


async def refusals(config_path: Path | None, days: int = 7) -> None:
    """Print receipts and spot-check reports refused over the last ``days`` days, by reason."""
    from ..credit.review import refusals as counts

    services = await open_services(load_config(config_path))
    try:
        rows = await counts(services.sessions, days)
    finally:
        await services.close()
    if not rows:
        print(f"coordinator: nothing refused in the last {days} days", flush=True)
    for r in rows:
        print(f"{r['kind']:8} {r['reason']:20} {r['count']}", flush=True)


def _when(t: float | None) -> str:
    return "-" if t is None else f"{datetime.fromtimestamp(t, UTC):%Y-%m-%d %H:%M:%S} UTC"
