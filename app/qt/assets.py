"""Where the icons are: ``assets/`` beside the packages in a source tree, inside the bundle when frozen.

PyInstaller unpacks data files under ``sys._MEIPASS``; the installer spec puts ``assets/`` there.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

from PySide6.QtGui import QIcon


def assets_dir() -> Path:
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "assets"
    return Path(__file__).resolve().parents[2] / "assets"  # app/qt/assets.py -> the tree's root


@cache
def icon(name: str) -> QIcon:
    """An SVG icon (``assets/icons/<name>.svg``): Qt renders it crisp at every size and device ratio.
    Cached: the tray asks for its icon on every status update."""
    path = assets_dir() / "icons" / f"{name}.svg"
    if not path.is_file():
        raise FileNotFoundError(f"icon {name!r} is missing from {path.parent}")
    return QIcon(str(path))
