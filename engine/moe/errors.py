"""The moe package's one exception tree (drawn in the package docstring).

Errors a host sends to a trainer carry a stable ``code``: the server turns any :class:`ExpertRequestError`
into ``RemoteError(code, message)`` so the trainer can react by code (re-send inputs on
``inputs_evicted``, skip the expert on anything else) without parsing messages.
"""

from __future__ import annotations


class MoEError(Exception):
    """Base of everything the moe package raises."""


class SpecError(MoEError, ValueError):
    """An expert spec names no registered architecture or has impossible sizes."""


class CheckpointError(MoEError):
    """A checkpoint file cannot be read, or does not fit the expert it is loaded into."""


class ExpertRequestError(MoEError):
    """A request a host refuses; ``code`` travels to the caller as ``RemoteError.code``."""

    code = "expert_error"


class BadInput(ExpertRequestError):
    """Wrong shape, dtype, or non-finite values: refused before it reaches a batch."""

    code = "bad_input"


class UnknownExpert(ExpertRequestError):
    """The host serves no expert with this uid."""

    code = "unknown_expert"


class InputsEvicted(ExpertRequestError):
    """The host no longer holds the forward inputs for this backward; re-send them."""

    code = "inputs_evicted"


class GradientTooLarge(ExpertRequestError):
    """A backward whose output gradient is over the expert's bound on recent sizes (:mod:`.guard`)."""

    code = "grad_too_large"


class OverShare(ExpertRequestError):
    """A backward that would give its trainer more than its share of the expert's updates (:mod:`.guard`)."""

    code = "over_share"


class ExpertUnavailable(ExpertRequestError):
    """The host is shutting down (or the backend is closed) and takes no new work."""

    code = "unavailable"


class ExpertCallFailed(MoEError):
    """A trainer's call to a remote expert failed; ``code`` is the host's error code when it sent one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotEnoughExperts(ExpertCallFailed):
    """Fewer than ``k_min`` experts answered a mixture layer's call in time."""


class BadExpertState(ExpertCallFailed):
    """An expert's weights from a host that cannot be used: a digest that does not match the bytes,
    names, dtypes or shapes other than the registry's module of the spec, non-finite values, or a
    malformed reply (``code``: "bad_state"; ``reason``: which check failed)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, "bad_state")
        self.reason = reason
