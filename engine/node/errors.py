"""The node's exceptions (the tree is drawn in ``engine/node/__init__.py``)."""

from __future__ import annotations


class NodeError(Exception):
    """Anything that keeps the volunteer node from starting or running."""


class CoordinatorError(NodeError):
    """The coordinator answered with an error; ``code`` is its machine-readable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"coordinator refused ({status} {code}): {message}")
        self.status = status
        self.code = code
        self.message = message


class CoordinatorUnreachable(NodeError):
    """No answer from the coordinator (connection refused, DNS, timeout)."""


class AlreadyRunning(NodeError):
    """Another node process of this user holds the instance lock."""

    def __init__(self, pid: int, path: str) -> None:
        super().__init__(
            f"a volunteer node is already running (pid {pid}); use `lah status` to see it, "
            f"or stop it first (lock file {path})"
        )
        self.pid = pid
        self.path = path
