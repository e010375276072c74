"""``app/core`` stays free of Qt: no module there imports PySide6 (or another Qt binding, or pyqtgraph),
nor anything of ``app.qt``, so the app's decisions run and are tested without a screen or an event loop.

Read with :mod:`ast` (every import counts: module level, inside functions, under ``TYPE_CHECKING``,
relative ones, ``importlib.import_module`` and ``__import__`` with a constant name), then checked once
for real in a child process: importing every core module loads no Qt at all, not even through the
engine."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CORE = REPO / "app" / "core"
QT_TOPS = {"PySide6", "shiboken6", "PyQt5", "PyQt6", "PySide2", "pyqtgraph"}


def imported_modules(file: Path, package: str) -> list[tuple[int, str]]:
    """Every module ``file`` imports as ``(line, absolute name)``; ``package`` resolves relative ones."""
    tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, node.module] if node.module else parts)
            else:
                base = node.module or ""
            found += [(node.lineno, f"{base}.{alias.name}" if base else alias.name) for alias in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((node.lineno, first.value))
    return found


def _is_dynamic_import(func: ast.expr) -> bool:
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in ("import_module", "__import__")


def qt_imports(root: Path, core: Path) -> list[str]:
    """What under ``core`` imports Qt or ``app.qt``, each as ``file line N: module`` (one per line)."""
    problems: dict[tuple[Path, int], str] = {}
    for file in sorted(core.rglob("*.py")):
        package = ".".join(file.parent.relative_to(root).parts)
        for line, module in imported_modules(file, package):
            if module.split(".")[0] in QT_TOPS or module == "app.qt" or module.startswith("app.qt."):
                problems.setdefault((file, line), f"{file.relative_to(root)} line {line}: {module}")
    return list(problems.values())


def test_nothing_in_app_core_imports_qt() -> None:
    assert len(list(CORE.glob("*.py"))) >= 10  # the walk reads the real package
    assert qt_imports(REPO, CORE) == []


def test_importing_every_core_module_loads_no_qt() -> None:
    modules = sorted(f"app.core.{p.stem}" for p in CORE.glob("*.py") if p.name != "__init__.py")
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(QT_TOPS)!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "source",
    [
        "from PySide6.QtCore import QObject\n",
        "import PySide6\n",
        "def f():\n    from PySide6 import QtWidgets\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import shiboken6\n",
        "import pyqtgraph as pg\n",
        "from ..qt.controller import AppController\n",
        "from app.qt import bridge\n",
        "import importlib\nimportlib.import_module('PySide6.QtGui')\n",
        "__import__('PySide6')\n",
    ],
)
def test_the_check_catches_qt_wherever_it_is_imported(tmp_path: Path, source: str) -> None:
    core = tmp_path / "app" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "clean.py").write_text("import json\nfrom .errors import Oops\nfrom engine.files import x\n")
    (core / "bad.py").write_text(source)
    problems = qt_imports(tmp_path, core)
    assert len(problems) == 1 and problems[0].startswith(str(Path("app/core/bad.py")))
