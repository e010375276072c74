"""Light and dark: Fusion everywhere (the same look and contrast on every desktop), with an explicit
dark palette when the desktop asks for dark or the volunteer forces it (``LAH_COLOR_SCHEME``).

Some platform themes (and the offscreen platform used for screenshots) never report a colour scheme,
so the palette is set here rather than left to the platform.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

Role = QPalette.ColorRole

DARK = {
    Role.Window: "#1f2329",
    Role.WindowText: "#e6e8eb",
    Role.Base: "#16191d",
    Role.AlternateBase: "#252a31",
    Role.ToolTipBase: "#2b3038",
    Role.ToolTipText: "#e6e8eb",
    Role.Text: "#e6e8eb",
    Role.Button: "#2b3038",
    Role.ButtonText: "#e6e8eb",
    Role.BrightText: "#ffffff",
    Role.Link: "#6ea8fe",
    Role.Highlight: "#3d8b63",
    Role.HighlightedText: "#ffffff",
    Role.PlaceholderText: "#9aa1ab",
}


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in DARK.items():
        palette.setColor(role, QColor(colour))
    for role in (Role.WindowText, Role.Text, Role.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#7d8590"))
    return palette


def apply_color_scheme(qapp: QApplication, forced: str = "") -> str:
    """Returns the scheme in use: "dark" or "light"."""
    qapp.setStyle("Fusion")
    scheme = forced.lower()
    if scheme not in ("light", "dark"):
        scheme = "dark" if qapp.styleHints().colorScheme() == Qt.ColorScheme.Dark else "light"
    qapp.setPalette(dark_palette() if scheme == "dark" else qapp.style().standardPalette())
    return scheme
