"""Helper processes die with the coordinator: an initializer for the receipt verifier's process pool.

A pool's workers are spawned children that wait on their call queue; when the coordinator is killed
(``kill -9``, the OOM killer) nothing tells them, and they stay, each holding a Python with the
coordinator's imports (about 340 MB). ``watch_parent`` runs in each worker: a daemon thread that ends
the worker once its parent is gone (POSIX: the parent pid it was started under is no longer its
parent, the orphan having been re-parented; elsewhere: that pid no longer runs). Polling, not
``PR_SET_PDEATHSIG``: Linux sends that signal when the *thread* that forked the child ends, which in a
pool may be any thread that submitted work.
"""

from __future__ import annotations

import os
import sys
import threading
import time

POLL_S = 0.5


def parent_gone(parent_pid: int) -> bool:
    if sys.platform != "win32":
        return os.getppid() != parent_pid
    import psutil  # type: ignore[import-untyped]  # Windows reports a dead parent's pid as getppid()

    return not psutil.pid_exists(parent_pid)


def watch_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Pool initializer: exit this worker (status 0, nothing to flush) within ``poll_s`` of its parent
    ``parent_pid`` ending."""

    def watch() -> None:
        while not parent_gone(parent_pid):
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="lah-parent-watch", daemon=True).start()
