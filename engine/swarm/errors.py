"""The swarm facade's exceptions (the tree is drawn in ``engine/swarm/__init__.py``).

Every message is a plain sentence a researcher can act on: what is wrong and what to do about it."""

from __future__ import annotations

__all__ = [
    "CoordinatorNotFound",
    "JoinFailed",
    "LoginRequired",
    "Mismatch",
    "SwarmError",
    "UnknownExperiment",
    "UnknownGrid",
]


class SwarmError(Exception):
    """Anything that keeps a researcher's script from joining or using the swarm."""


class CoordinatorNotFound(SwarmError):
    """The coordinator's URL: not an http(s) address, unreachable, refused, or not a coordinator."""


class LoginRequired(SwarmError):
    """No trainer login for this coordinator, one no longer valid, or an account that is not a trainer."""


class UnknownExperiment(SwarmError):
    """The coordinator runs no experiment of that name."""


class UnknownGrid(SwarmError):
    """The experiment offers no grid of that name."""


class Mismatch(SwarmError, ValueError):
    """A layer, an input or an option that does not fit what the experiment fixes."""


class JoinFailed(SwarmError):
    """The swarm could not be joined: signaling, the DHT, or another trainer on the same data dir."""
