"""``lah app``: placeholder until the tray app lands."""

from __future__ import annotations


def main(*, coordinator: str | None = None, demo: bool = False) -> int:
    raise SystemExit("the tray app is not built yet")
