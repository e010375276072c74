"""Coroutines started from timer callbacks (a probe, a resend, an abort), held until they finish.

The event loop keeps only a weak reference to a task, so one nobody holds may be collected before it
ran; the patches' callbacks have no caller to hand the task to, so this set holds it.
"""

from __future__ import annotations

import asyncio
from typing import Any

_tasks: set[asyncio.Future[Any]] = set()


def spawn(coro: Any) -> None:
    """Run ``coro`` as a task that stays referenced until it is done."""
    task = asyncio.ensure_future(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
