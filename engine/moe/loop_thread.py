"""An asyncio loop on a background thread, so synchronous torch code can call into async networking.

A trainer's model is ordinary synchronous PyTorch: autograd calls ``forward``/``backward`` of a
``torch.autograd.Function`` on the training thread. The :class:`~engine.p2p.Peer` it talks through lives
on an event loop. ``LoopThread.run`` bridges the two: it submits a coroutine to the loop and blocks the
calling thread, never the loop, for at most ``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from engine.p2p.eventloop import new_event_loop

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """Owns a loop running on a daemon thread (or, with :meth:`attach`, borrows a running one)."""

    def __init__(self, name: str = "moe-loop") -> None:
        self._owned = True
        self.loop = new_event_loop()
        self._thread: threading.Thread | None = threading.Thread(target=self._main, name=name, daemon=True)
        self._started = threading.Event()
        self._thread.start()
        self._started.wait(10)

    @classmethod
    def attach(cls, loop: asyncio.AbstractEventLoop) -> LoopThread:
        """Use a loop some other thread runs (e.g. a test's); ``close`` then leaves it alone."""
        self = cls.__new__(cls)
        self._owned = False
        self.loop = loop
        self._thread = None
        self._started = threading.Event()
        self._started.set()
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait; after ``timeout`` cancel it and raise ``TimeoutError``."""
        if self._on_loop_thread():
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop: it would wait on itself forever")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout:.3g} s") from None

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def close(self, timeout: float = 5.0) -> None:
        """Stop and close an owned loop (pending tasks are cancelled first)."""
        if not self._owned or self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            with_timeout = asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                with_timeout.result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)
        if not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
