"""The app's exceptions. Everything the engine raises stays the engine's; these are the app's own::

AppError
├── ConfigError          the app's file could not be saved (full disk, no permission)
├── RegistrationError    the coordinator refused or could not be reached during first run
│                        (``unreachable`` tells which, so the wizard can offer to retry)
├── AlreadyRunning       another copy of the app runs for this user (it was asked to come forward)
└── UpdateError          the update check (``app.core.updates``, run in the ``lah update`` child)
    ├── UpdateUnavailable     the site or the coordinator is down, slow, answers an error, or sends too much
    ├── InsecureUrl           a manifest URL that is neither https nor http to a loopback address
    ├── ManifestInvalid       not a manifest: bad JSON, missing or ill-typed fields, a bad version or time
    │   └── SignatureInvalid  the signature does not verify with the built-in key (tampered or forged)
    ├── ManifestRefused       signed and well formed, but expired, issued in the future, or older than
    │                         one this computer accepted before (a replayed or rolled-back copy)
    └── DownloadMismatch      the downloaded file's size or SHA-256 is not the manifest's (it is deleted)

Every update error's message is a sentence the About box can show as it is.
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


class UpdateError(AppError):
    """Base of everything the update check raises."""


class UpdateUnavailable(UpdateError):
    pass


class InsecureUrl(UpdateError):
    pass


class ManifestInvalid(UpdateError):
    pass


class SignatureInvalid(ManifestInvalid):
    pass


class ManifestRefused(UpdateError):
    pass


class DownloadMismatch(UpdateError):
    pass
