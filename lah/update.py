"""``lah update``: is there a newer release? (and with ``--download DIR``, fetch its verified file).

The tray app runs this as a short-lived child once a day instead of checking in its own process: the
network code (aiohttp, ~26 MiB) then never lives in the app, and a hung site cannot touch the GUI. One
JSON line on stdout: ``{"offer": bool, "version", "notes_url", "file", "error", "note", "source",
"named_by"}``; exit 0 either way, since "no update" and "the site is down" are normal answers.

Where to look: ``--manifest-url`` (tests, a mirror); else the manifest the ``--coordinator`` names
(``GET /api/updates``), and nothing at all when it names none, so an app joined to a private project
never contacts the public one behind its volunteer's back; else, run by hand, the project's own
``MANIFEST_URL``. The newest manifest accepted is kept in ``--state`` (default: ``update-state.json``
in the node's data folder), so an old copy served later is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from app.core import updates
from app.core.update_policy import STATE_NAME

PROJECT = "the Learning@home project"


def _reply(**fields: Any) -> dict[str, Any]:
    keys = ("offer", "version", "notes_url", "file", "error", "note", "source", "named_by")
    return {"offer": False, **dict.fromkeys(keys[1:]), **fields}


async def _source(manifest_url: str | None, coordinator: str | None) -> tuple[str | None, str]:
    """``(manifest URL or None, who named it)``."""
    if manifest_url:
        return manifest_url, "--manifest-url"
    if coordinator:
        return await updates.advertised_source(coordinator), coordinator.rstrip("/")
    return updates.MANIFEST_URL, PROJECT


async def check(
    download_to: Path | None,
    url: str | None,
    *,
    coordinator: str | None = None,
    state: Path | None = None,
) -> dict[str, Any]:
    from app.qt.about import version

    out = _reply()
    try:
        source, named_by = await _source(url, coordinator)
        out["named_by"] = named_by
        if source is None:
            out["note"] = f"{named_by} names no update source, so no update check is made"
            return out
        out["source"] = source
        result = await updates.check_for_update(version(), url=source, state=state)
        out["version"], out["notes_url"] = result.latest.version, result.latest.notes_url
        out["offer"], out["note"] = result.offer, result.note or None
        if result.offer and download_to is not None and result.download is not None:
            await asyncio.to_thread(download_to.mkdir, parents=True, exist_ok=True)
            out["file"] = str(await updates.download_release(result.download, download_to))
    except updates.UpdateError as e:
        out["offer"], out["error"] = False, f"{type(e).__name__}: {e}"
    return out


def default_state() -> Path:
    from engine.control import data_dir

    return data_dir() / STATE_NAME


def run(args: argparse.Namespace) -> int:
    state = args.state or default_state()
    reply = asyncio.run(check(args.download, args.manifest_url, coordinator=args.coordinator, state=state))
    print(json.dumps(reply), flush=True)
    return 0
