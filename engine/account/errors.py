"""The account layer's exceptions (the tree is drawn in ``engine/account/__init__.py``).

Every failure of the coordinator's HTTP API is one of these, whoever calls it: the volunteer's node, the
trainer, ``engine.swarm``, the tray app's first run and ``lah``; each says what it means to its reader.
"""

from __future__ import annotations


class AccountError(Exception):
    """The coordinator's HTTP API did not do what was asked: no answer, or an answer with an error."""


class CoordinatorError(AccountError):
    """The coordinator answered with an error; ``code`` is its machine-readable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"coordinator refused ({status} {code}): {message}")
        self.status = status
        self.code = code
        self.message = message


class CoordinatorUnreachable(AccountError):
    """No answer from the coordinator (connection refused, DNS, timeout)."""
