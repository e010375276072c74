"""A coordinator replica in its own process, for tests that kill one with SIGKILL.

``python -m tests.coordinator.replica_process <database url> <schema> <token key path> <exports dir>``
starts the full coordinator on a free loopback port inside ``schema``, prints ``port <n>`` and
serves until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.server.app import start_full
from coordinator.services import open_services


def replica_config(url: str, key_path: str, exports_dir: str, **overrides: Any) -> CoordinatorConfig:
    settings: dict[str, Any] = {"verify_workers": 0, "max_ws_per_ip": 1000, **overrides}
    return CoordinatorConfig(
        port=0, database_url=url, token_key_path=key_path, exports_dir=exports_dir, **settings
    )


async def main(url: str, schema: str, key_path: str, exports_dir: str) -> None:
    config = replica_config(url, key_path, exports_dir)
    services = await open_services(config, search_path=schema, run_migrations=False)
    running = await start_full(config, services)
    print(f"port {running.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
