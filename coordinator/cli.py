"""``lah coordinator``: run the whole coordinator from a TOML config (and ``LAH_*`` environment)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from .app import start_full
from .config import load_config


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
        f"coordinator: database {config.database_url or 'SQLite in the user data dir'}; Ctrl+C stops",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await running.stop()
