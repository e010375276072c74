"""The app's one asyncio event loop, on a worker thread, and the way results come back to Qt.

The GUI thread never waits on the network: it hands a coroutine to :meth:`Bridge.submit` and gets its
result (or exception) later through a Qt signal, delivered on the GUI thread by Qt's queued connection.
Objects living on the loop (the control client) are only touched from coroutines run there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

log = logging.getLogger(__name__)

Done = Callable[[Any, BaseException | None], None]


class Bridge(QObject):
    """``submit(coro, on_done)``: run ``coro`` on the loop thread; ``on_done(result, error)`` on the GUI."""

    _deliver = Signal(object, object, object)  # callback, result, error

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._deliver.connect(self._on_deliver)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="app-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(
        self, coro: Coroutine[Any, Any, Any], on_done: Done | None = None
    ) -> concurrent.futures.Future[Any]:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if on_done is not None:

            def finished(f: concurrent.futures.Future[Any]) -> None:
                if f.cancelled():
                    self._deliver.emit(on_done, None, asyncio.CancelledError())
                    return
                error = f.exception()
                self._deliver.emit(on_done, None if error else f.result(), error)

            future.add_done_callback(finished)
        return future

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run a plain function on the loop thread (for objects that live there)."""
        self.loop.call_soon_threadsafe(fn)

    @Slot(object, object, object)
    def _on_deliver(self, callback: Done, result: Any, error: BaseException | None) -> None:
        try:
            callback(result, error)
        except Exception:
            log.exception("a result callback failed")

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop (bounded), then stop the thread."""
        if not self._thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=timeout) if tasks else None

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout + 1)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("some app tasks did not finish within %.0f s", timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
