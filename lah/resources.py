"""Where the program's read-only files are, in a source checkout and in a PyInstaller bundle.

``assets/`` (the app's icons, ``assets/icons/*.svg``) sits at the repository root in a checkout and at
``sys._MEIPASS/assets`` in a bundle built by ``installers/learning-at-home.spec`` (one-folder builds put
``_MEIPASS`` in ``_internal/`` next to the executable; a macOS ``.app`` puts it in ``Contents/Frameworks``
and links ``Contents/Resources`` to the same files). Only this module knows the difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["assets_dir", "bundle_dir", "frozen"]


def frozen() -> bool:
    """True when running from a PyInstaller bundle (``sys.frozen`` and ``sys._MEIPASS`` are set)."""
    return bool(getattr(sys, "frozen", False)) and hasattr(sys, "_MEIPASS")


def bundle_dir() -> Path:
    """The bundle's data root (``sys._MEIPASS``) when frozen, else the repository root of this checkout."""
    if frozen():
        return Path(getattr(sys, "_MEIPASS"))  # noqa: B009 (not in typeshed's sys)
    return Path(__file__).resolve().parent.parent


def assets_dir() -> Path:
    """The folder holding ``icons/`` and the app's other read-only files, frozen or not."""
    return bundle_dir() / "assets"
