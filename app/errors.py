"""The app's exceptions. Everything the engine raises stays the engine's; these are the app's own::

AppError
├── ConfigError          the app's file could not be saved (full disk, no permission)
├── RegistrationError    the coordinator refused or could not be reached during first run
│                        (``unreachable`` tells which, so the wizard can offer to retry)
└── AlreadyRunning       another copy of the app runs for this user (it was asked to come forward)
"""

from __future__ import annotations


class AppError(Exception):
    pass


class ConfigError(AppError):
    pass


class RegistrationError(AppError):
    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class AlreadyRunning(AppError):
    pass
