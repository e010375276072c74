"""The bundle's manifest: every file's size and SHA-256, written at build time, checked by the self-test.

A truncated download, a half-copied folder or a damaged disk shows up as a file whose size or hash is not
the one built; the self-test names that file instead of letting a broken library crash the process.

The manifest is ``lah-bundle-manifest.json`` in the bundle's data folder (``sys._MEIPASS``, ``_internal/``
in a one-folder build); paths in it are relative to the folder holding the executable, with ``/``
separators. Build scripts write it last (``python -m lah.bundle write DIST/learning-at-home``); macOS
builds skip it, because code signing rewrites the binaries and its seal already does this job.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MANIFEST_NAME", "BundleDamage", "Mismatch", "verify", "write_manifest"]

MANIFEST_NAME = "lah-bundle-manifest.json"
DATA_DIR = "_internal"  # PyInstaller 6's one-folder layout: sys._MEIPASS next to the executable
CHUNK = 1 << 20


@dataclass(frozen=True)
class Mismatch:
    path: str  # relative to the bundle root
    problem: str  # "missing", "truncated: 12 of 4,096 bytes", "changed: SHA-256 differs"

    def __str__(self) -> str:
        return f"{self.path} {self.problem}"


class BundleDamage(Exception):
    """The manifest itself is missing where it should be, or unreadable."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if name != MANIFEST_NAME and p.is_file() and not p.is_symlink():
                out.append(p)
    return sorted(out)


def write_manifest(root: Path, data_dir: str = DATA_DIR) -> Path:
    """Hash every regular file under ``root`` (the folder with the executable) into the manifest."""
    entries = {p.relative_to(root).as_posix(): [p.stat().st_size, _digest(p)] for p in _files(root)}
    target = root / data_dir / MANIFEST_NAME
    target.write_text(json.dumps({"version": 1, "files": entries}, indent=0, sort_keys=True))
    return target


def load_manifest(path: Path) -> dict[str, tuple[int, str]]:
    try:
        raw = json.loads(path.read_text())
        files = raw["files"]
        return {str(k): (int(v[0]), str(v[1])) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise BundleDamage(f"{path.name} is unreadable ({type(e).__name__}: {e})") from e


def verify(root: Path, manifest: Path) -> tuple[int, list[Mismatch]]:
    """``(files checked, mismatches)``: sizes first (cheap), then the hash of every file of the right size."""
    expected = load_manifest(manifest)
    bad: list[Mismatch] = []
    for rel, (size, digest) in sorted(expected.items()):
        p = root / rel
        try:
            actual = p.stat().st_size
        except OSError:
            bad.append(Mismatch(rel, "missing"))
            continue
        if actual != size:
            what = "truncated" if actual < size else "grown"
            bad.append(Mismatch(rel, f"{what}: {actual:,} of {size:,} bytes"))
        elif _digest(p) != digest:
            bad.append(Mismatch(rel, "changed: SHA-256 differs from the build's"))
    return len(expected), bad


def main(argv: list[str]) -> int:
    """``python -m lah.bundle write|verify ROOT``."""
    if len(argv) != 2 or argv[0] not in ("write", "verify"):
        print("usage: python -m lah.bundle write|verify BUNDLE_DIR", file=sys.stderr)
        return 2
    root = Path(argv[1])
    if argv[0] == "write":
        print(write_manifest(root))
        return 0
    count, bad = verify(root, root / DATA_DIR / MANIFEST_NAME)
    for m in bad:
        print(m)
    print(f"{count} files, {len(bad)} damaged")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
