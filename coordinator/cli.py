"""``lah coordinator``: run the whole coordinator from a TOML config (and ``LAH_*`` environment);
``lah coordinator invite NAME`` / ``disable NAME`` / ``enable NAME`` / ``grant-trainer NAME`` act on its
database directly (the operator's tools, no admin token needed; a running coordinator sees the change
at once)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from pathlib import Path

from .app import start_full
from .config import load_config
from .services import open_services


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
    services = await open_services(load_config(config_path))
    try:
        code, expires_at = await services.accounts.invite(name, by=None, ttl_s=ttl_s)
    finally:
        await services.close()
    print(
        f"invitation for {name}: code {code} (single use, expires at unix time {expires_at:.0f})", flush=True
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
    from .trainers import grant_trainer as grant

    services = await open_services(load_config(config_path))
    try:
        account, code, expires_at = await grant(services.accounts, name, by=None, ttl_s=ttl_s)
    finally:
        await services.close()
    print(
        f"coordinator: {account.name} is a {account.role}; login code {code} (single use, expires at "
        f"unix time {expires_at:.0f}): lah train login --name {account.name} --code={code}",
        flush=True,
    )
    return code
