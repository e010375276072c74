"""A pool worker's guard ends it once the process it was started under is no longer its parent."""

from __future__ import annotations

import os
import subprocess
import sys

from coordinator.credit.pool_guard import parent_gone


def test_parent_gone_only_for_another_pid() -> None:
    assert not parent_gone(os.getppid())
    assert parent_gone(os.getppid() + 1 if os.getppid() + 1 != os.getpid() else os.getppid() + 2)


def test_a_worker_whose_parent_is_gone_exits_at_once() -> None:
    # The child watches a pid that is not its parent, as a worker sees once its coordinator died.
    code = (
        "import time; from coordinator.credit.pool_guard import watch_parent; "
        "watch_parent(-1, poll_s=0.05); time.sleep(60); raise SystemExit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=30, check=False)
    assert done.returncode == 0  # ended by the guard, not by the sleep running out
    # And one whose parent is alive keeps running until its own end.
    code = (
        "import os, time; from coordinator.credit.pool_guard import watch_parent; "
        "watch_parent(os.getppid(), poll_s=0.05); time.sleep(0.5); raise SystemExit(3)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=30, check=False).returncode == 3
