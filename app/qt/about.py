"""The About box: version, licence, links, and what the engine computes on (build and device)."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from PySide6.QtWidgets import QMessageBox, QWidget

from .assets import icon

SOURCE_URL = "https://github.com/learning-at-home/learning-at-home"


def version() -> str:
    try:
        return metadata.version("learning-at-home")
    except metadata.PackageNotFoundError:
        return "unknown"


def about_text(site_url: str, status: dict[str, Any] | None, updates: str = "") -> str:
    """``updates``: where updates come from and what the last check found (``update_check.summary``)."""
    runtime = (status or {}).get("runtime") or {}
    device = (status or {}).get("device") or "not known yet (the engine is not running)"
    build = runtime.get("torch", "not known yet")
    transport = runtime.get("transport", "not known yet")
    return (
        f"<h3>Learning@home {version()}</h3>"
        "<p>Lend your computer's idle time to train large neural networks together, after the papers "
        "<i>Learning@home</i> (decentralized mixture of experts) and <i>DeDLOC</i> "
        "(collaborative training).</p>"
        f"<p>Computes on: <b>{device}</b><br>PyTorch: {build}<br>Data channels: {transport}</p>"
        + (f"<p>{updates}</p>" if updates else "")
        + "<p>Licence: Apache License 2.0</p>"
        f'<p><a href="{site_url}">Project site</a> · <a href="{SOURCE_URL}">Source code</a></p>'
    )


def show_about(
    parent: QWidget | None, site_url: str, status: dict[str, Any] | None, updates: str = ""
) -> QMessageBox:
    box = QMessageBox(parent)
    box.setWindowTitle("About Learning@home")
    box.setIconPixmap(icon("app").pixmap(64, 64))
    box.setText(about_text(site_url, status, updates))
    box.setStandardButtons(QMessageBox.StandardButton.Close)
    box.setModal(False)
    box.show()
    return box
