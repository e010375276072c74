"""The resources package's one exception tree::

    ResourceError
    ├── SettingsError        settings that cannot be used as given (``validated``) or cannot be saved
    └── BandwidthError       misuse of a token bucket or the data-cap counter
        └── DataCapReached   this month's data cap is spent (``DataCapCounter.check``)

Readings never raise for an absent or vanished device: they return ``None`` with a reason.
"""

from __future__ import annotations


class ResourceError(Exception):
    """Base of everything the resources package raises."""


class SettingsError(ResourceError):
    pass


class BandwidthError(ResourceError):
    pass


class DataCapReached(BandwidthError):
    pass
