"""The node's exceptions (the tree is drawn in ``engine/node/__init__.py``).

The coordinator's API fails with the account layer's own (:mod:`engine.account.errors`), whoever calls it.
"""

from __future__ import annotations


class NodeError(Exception):
    """Anything of the node's own that keeps the volunteer node from starting or running."""


class AlreadyRunning(NodeError):
    """Another node process of this user holds the instance lock."""

    def __init__(self, pid: int, path: str) -> None:
        super().__init__(
            f"a volunteer node is already running (pid {pid}); use `lah status` to see it, "
            f"or stop it first (lock file {path})"
        )
        self.pid = pid
        self.path = path
