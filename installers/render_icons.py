"""Render the app's SVG icon to PNGs (the .deb's hicolor theme, the Windows .ico, the macOS iconset).

    python installers/render_icons.py assets/icons/app.svg OUT_DIR [--sizes 16,32,48,64,128,256] [--ico F]

Writes ``OUT_DIR/{N}x{N}.png`` for each size; ``--ico`` also writes a Windows icon (256 px, Qt's ICO
writer). Qt renders offscreen, so it works on a build machine without a display.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def render(svg: Path, out: Path, sizes: list[int], ico: Path | None = None) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: not a valid SVG")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        path = out / f"{size}x{size}.png"
        if not image.save(str(path), "PNG"):
            raise SystemExit(f"cannot write {path}")
        written.append(path)
        if ico is not None and size == max(sizes) and not image.save(str(ico), "ICO"):
            raise SystemExit(f"cannot write {ico}")
    del app
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("svg", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sizes", default="16,24,32,48,64,128,256")
    parser.add_argument("--ico", type=Path)
    args = parser.parse_args()
    for path in render(args.svg, args.out, [int(s) for s in args.sizes.split(",")], args.ico):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
