"""How big the Linux bundle and its packages are, and how fast the bundle starts.

    .venv/bin/python benchmarks/bundle_size.py [--build] [--runs N]

Measures ``dist/`` as ``installers/build-linux`` (``make installer``) leaves it, building first when
``--build`` is given or nothing is there. Figures: the unpacked bundle, the ``.tar.gz`` and the ``.deb``
(MiB); the ten largest files and the ten largest packages (top folder under ``_internal/``); startup, the
seconds from exec to the self-test's first line (median of ``--runs``, in a clean environment, from a
directory outside the tree); and the whole self-test's seconds. The last line is JSON.
Targets (issue 10): bundle at most 900 MiB, .tar.gz at most 350 MiB, startup under 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
NAME = "learning-at-home"
MIB = 1 << 20


def _files(root: Path) -> list[tuple[str, int]]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if not p.is_symlink():
                out.append((p.relative_to(root).as_posix(), p.stat().st_size))
    return out


def _newest(pattern: str) -> Path | None:
    found = sorted(DIST.glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _clean_env(home: str) -> dict[str, str]:
    return {"HOME": home, "PATH": "/usr/bin:/bin"}


def startup_s(exe: Path, home: str) -> float:
    """Seconds from exec to the self-test's first line; the process is stopped right after."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(exe), "--self-test"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=home,
        env=_clean_env(home),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.kill()
    proc.wait()
    if b"self-test" not in line:
        raise SystemExit(f"unexpected first line from {exe}: {line!r}")
    return elapsed


def self_test_s(exe: Path, home: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(exe), "--self-test"], capture_output=True, cwd=home, env=_clean_env(home), timeout=600
    )
    return time.perf_counter() - t0, done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="store_true", help="run installers/build-linux first")
    parser.add_argument("--runs", type=int, default=3, help="startup measurements (median reported)")
    args = parser.parse_args()
    bundle = DIST / NAME
    if args.build or not (bundle / NAME).exists():
        subprocess.run([str(ROOT / "installers/build-linux")], check=True)
    files = _files(bundle)
    total = sum(size for _, size in files)
    packages: Counter[str] = Counter()
    for rel, size in files:
        parts = rel.split("/")
        key = parts[1] if parts[0] == "_internal" and len(parts) > 2 else rel
        packages[key] += size
    largest = sorted(files, key=lambda f: -f[1])[:10]
    tar, deb = _newest(f"{NAME}-*-linux-*.tar.gz"), _newest(f"{NAME}_*.deb")
    with tempfile.TemporaryDirectory(prefix="lah-bench-") as home:
        starts = [startup_s(bundle / NAME, home) for _ in range(max(1, args.runs))]
        full_s, ok = self_test_s(bundle / NAME, home)
    times_file = DIST / "build-times.json"
    result = {
        "bundle_mib": round(total / MIB, 1),
        "files": len(files),
        "tar_gz_mib": round(tar.stat().st_size / MIB, 1) if tar else None,
        "deb_mib": round(deb.stat().st_size / MIB, 1) if deb else None,
        "largest": [{"path": rel, "mib": round(size / MIB, 1)} for rel, size in largest],
        "largest_packages": [{"name": k, "mib": round(v / MIB, 1)} for k, v in packages.most_common(10)],
        "startup_s": round(statistics.median(starts), 2),
        "startup_runs_s": [round(s, 2) for s in starts],
        "self_test_s": round(full_s, 1),
        "self_test_ok": ok,
        "build": json.loads(times_file.read_text()) if times_file.exists() else None,
    }
    print(f"bundle {result['bundle_mib']} MiB in {len(files)} files; .tar.gz {result['tar_gz_mib']} MiB; "
          f".deb {result['deb_mib']} MiB")
    for entry in result["largest"]:
        print(f"  {entry['mib']:8.1f} MiB  {entry['path']}")
    print(f"startup to the self-test's first line: {result['startup_s']} s (median of {len(starts)}); "
          f"whole self-test {result['self_test_s']} s ({'passed' if ok else 'FAILED'})")
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
