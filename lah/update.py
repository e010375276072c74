"""``lah update``: is there a newer release? (and with ``--download DIR``, fetch its verified file).

The tray app runs this as a short-lived child once a day instead of checking in its own process: the
network code (aiohttp, ~26 MiB) then never lives in the app, and a hung site cannot touch the GUI. One
JSON line on stdout: ``{"offer": bool, "version", "notes_url", "file", "error"}``; exit 0 either way,
since "no update" and "the site is down" are normal answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from app import updates


async def check(download_to: Path | None, url: str) -> dict[str, Any]:
    from app.about import version

    out: dict[str, Any] = {"offer": False, "version": None, "notes_url": None, "file": None, "error": None}
    try:
        result = await updates.check_for_update(version(), url=url)
        out["version"], out["notes_url"] = result.latest.version, result.latest.notes_url
        out["offer"] = result.offer
        if result.offer and download_to is not None and result.download is not None:
            await asyncio.to_thread(download_to.mkdir, parents=True, exist_ok=True)
            out["file"] = str(await updates.download_release(result.download, download_to))
    except updates.UpdateError as e:
        out["offer"], out["error"] = False, f"{type(e).__name__}: {e}"
    return out


def run(args: argparse.Namespace) -> int:
    url = args.manifest_url or updates.MANIFEST_URL
    print(json.dumps(asyncio.run(check(args.download, url))), flush=True)
    return 0
