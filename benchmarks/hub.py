"""The signaling hub the transport benchmarks share: the real coordinator's hub on 127.0.0.1, on a
thread of its own, so the processes it introduces measure their links and not its event loop.

Imported by sibling scripts (``from hub import signaling_hub_thread``): benchmarks/ is first on a
script's sys.path.
"""

from __future__ import annotations

import asyncio
import threading


def signaling_hub_thread() -> tuple[str, threading.Event]:
    """Start the hub; returns its signaling URL and the event that stops it."""
    from coordinator.server.app import start

    ready: dict[str, str] = {}
    stop = threading.Event()
    started = threading.Event()

    async def serve() -> None:
        running = await start("127.0.0.1", 0)
        ready["url"] = running.signaling_url
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await running.stop()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    started.wait(30)
    return ready["url"], stop
