"""One call to put a volunteer on a (local) swarm: a fresh identity and account, then ``start()``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.account.tokens import FileTokenStore
from engine.p2p import Identity
from engine.resources import Settings

from .volunteer import Volunteer


async def join_local(
    coordinator_url: str,
    name: str,
    data_dir: Path,
    settings: Settings | None = None,
    **options: Any,
) -> Volunteer:
    """Register a fresh account ``name``, bind a new identity (kept in ``data_dir``), host what is assigned.

    ``options`` go to :class:`Volunteer` (``device``, ``team``, ``sensors``, timeouts...). The token is
    kept in ``data_dir/tokens.json`` (0600), not the OS keyring: local swarms are throwaway.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    identity = Identity.load_or_create(data_dir / "identity.key")
    volunteer = Volunteer(
        identity,
        coordinator_url,
        FileTokenStore(data_dir / "tokens.json"),
        settings if settings is not None else Settings(),
        data_dir,
        account_name=name,
        **options,
    )
    try:
        await volunteer.start()
    except BaseException:
        await volunteer.stop()
        raise
    return volunteer
