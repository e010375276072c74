"""The .deb's Depends: Debian packages for the system libraries the bundle links to but does not carry.

PyInstaller leaves glibc, libGL/libEGL, libxcb and a few others out on purpose (they must match the
machine's C library and graphics drivers). This reads every ELF file's NEEDED entries (readelf, in
batches), drops those the bundle has, finds the rest in the linker cache (ldconfig -p) and asks dpkg
which package owns each. Prints one Depends line, e.g. ``libc6, libegl1, libgl1, libxcb1``.

    python installers/linux/depends.py dist/learning-at-home
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def elf_files(root: Path) -> list[Path]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if p.is_symlink() or not (".so" in name or os.access(p, os.X_OK)):
                continue
            with p.open("rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def needed(files: list[Path]) -> set[str]:
    libs: set[str] = set()
    for i in range(0, len(files), 200):
        text = subprocess.run(
            ["readelf", "-d", "-W", *map(str, files[i : i + 200])], capture_output=True, text=True
        ).stdout
        libs.update(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", text))
    return libs


def linker_cache() -> dict[str, str]:
    ldconfig = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), "ldconfig")
    text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    cache: dict[str, str] = {}
    for m in re.finditer(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", text, re.M):
        if "x86-64" in m.group(2) or "64" in m.group(2):
            cache.setdefault(m.group(1), m.group(3))
    return cache


def owners(paths: list[str]) -> set[str]:
    if not paths:
        return set()
    candidates = sorted({q for p in paths for q in (p, os.path.realpath(p))})
    text = subprocess.run(["dpkg", "-S", *candidates], capture_output=True, text=True).stdout
    return {line.split(":", 1)[0].split(",")[0].strip() for line in text.splitlines() if ": " in line}


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "dist/learning-at-home")
    have = {name for _d, _s, names in os.walk(root) for name in names}
    cache = linker_cache()
    missing = sorted(lib for lib in needed(elf_files(root)) if lib not in have)
    packages = owners([cache[lib] for lib in missing if lib in cache]) | {"libc6"}
    print(", ".join(sorted(packages)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
