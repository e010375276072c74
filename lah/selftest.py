"""``learning-at-home --self-test`` / ``lah self-test``: does this installation work? Headless, a few seconds.

Parts, in order; each prints one line, and a failure names its part and the cause (never a traceback)::

    bundle       every file of a frozen bundle has the size and SHA-256 it was built with (lah.bundle);
                 on damage the other parts are skipped: loading a damaged library could crash the process
    imports      every dependency imports, each on its own (a broken one is named)
    compute      an expert's forward and backward through engine.moe on the device found (CUDA or CPU),
                 with the torch build (CPU or CUDA x.y) and the device named
    webrtc       a signaling-only coordinator on 127.0.0.1, two peers, a signed WebRTC link between
                 them, a tensor sent through it and back
    keyring      the OS keyring (read-only probe) or, where there is none, the 0600 token file fallback
    coordinator  the database migrations to head on a temporary SQLite file; the site's templates load
    processes    a spawned worker process answers (the coordinator's receipt verifiers; in a bundle the
                 child is the same executable)
    app          Qt (offscreen where there is no display): the app's icon renders from assets/; says
                 whether there is a display and a system tray, and what the program does without them

The first line is printed before anything heavy is imported (benchmarks/bundle_size.py times it).
Exit status: 0 when every part passed, 1 when one failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from lah import __version__
from lah.resources import bundle_dir, frozen
from lah.selftest_parts import PARTS_AFTER_BUNDLE, PartFailed, TorchInfo, describe_error, describe_torch

__all__ = [
    "PARTS",
    "PartResult",
    "TorchInfo",
    "add_arguments",
    "check_bundle",
    "describe_torch",
    "main",
    "run",
    "run_parts",
]


@dataclass
class PartResult:
    part: str
    ok: bool
    detail: str
    seconds: float
    skipped: bool = False


def check_bundle(root: Path | None = None, data: Path | None = None) -> str:
    """The bundle part: files against the manifest (frozen builds; a checkout has nothing to check)."""
    from lah.bundle import MANIFEST_NAME, BundleDamage, verify

    if root is None:
        if not frozen():
            return "skipped: running from source, not from a bundle"
        root = Path(sys.executable).resolve().parent
    data = data or (bundle_dir() if frozen() else root / "_internal")
    manifest = data / MANIFEST_NAME
    if not manifest.exists():
        if sys.platform == "darwin":
            return "skipped: no manifest (macOS bundles are sealed by their code signature instead)"
        raise PartFailed(f"{manifest} is missing: the bundle is incomplete; reinstall it")
    try:
        count, bad = verify(root, manifest)
    except BundleDamage as e:
        raise PartFailed(str(e)) from e
    if bad:
        shown = "; ".join(str(m) for m in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise PartFailed(f"{len(bad)} damaged file(s): {shown}{more}; reinstall or re-download the bundle")
    return f"{count} files match the build's sizes and SHA-256"


Part = Callable[[], str]
PARTS: dict[str, Part] = {"bundle": check_bundle, **PARTS_AFTER_BUNDLE}


def _run_one(name: str, fn: Part, timeout: float, say: Callable[[str], None]) -> PartResult:
    """Run one part on the main thread (Qt and asyncio want it) under a watchdog: a part that hangs (a
    D-Bus keyring, a stuck socket) is reported by name and the process ends with status 1."""

    def expired() -> None:
        say(f"  FAIL  {name:<12} no answer within {timeout:.0f} s")
        say(f"self-test FAILED: {name}")
        os._exit(1)

    watchdog = threading.Timer(timeout, expired)
    watchdog.daemon = True
    t0 = time.perf_counter()
    watchdog.start()
    try:
        detail = fn()
    except BaseException as e:  # a part's failure is data here, whatever it is
        if isinstance(e, KeyboardInterrupt):
            raise
        return PartResult(name, False, describe_error(e), time.perf_counter() - t0)
    finally:
        watchdog.cancel()
    return PartResult(name, True, detail, time.perf_counter() - t0, skipped=detail.startswith("skipped"))


def run_parts(
    parts: dict[str, Part], say: Callable[[str], None] = print, timeout: float = 120.0
) -> list[PartResult]:
    """Run ``parts`` in order, printing a line for each; after a failed ``bundle`` the rest are skipped."""
    results: list[PartResult] = []
    damaged = False
    for name, fn in parts.items():
        if damaged:
            result = PartResult(name, False, "skipped: the bundle is damaged (see above)", 0.0, skipped=True)
        else:
            result = _run_one(name, fn, timeout, say)
            damaged = name == "bundle" and not result.ok
        results.append(result)
        mark = "ok  " if result.ok and not result.skipped else ("skip" if result.skipped else "FAIL")
        say(f"  {mark}  {name:<12} {result.detail} ({result.seconds:.1f} s)")
    return results


def _header() -> str:
    where = f"bundle at {Path(sys.executable).resolve().parent}" if frozen() else f"source at {bundle_dir()}"
    return (
        f"learning-at-home {__version__} self-test: {where}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The self-test's options, on its own parser or on ``lah self-test``'s."""
    parser.add_argument("--part", action="append", choices=list(PARTS), help="run only these parts")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line last")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per part")


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    print(_header(), flush=True)

    def say(line: str) -> None:
        print(line, flush=True)

    chosen = {name: PARTS[name] for name in (args.part or PARTS)}
    results = run_parts(chosen, say=say, timeout=args.timeout)
    failed = [r.part for r in results if not r.ok and not r.skipped]
    skipped = [r.part for r in results if not r.ok and r.skipped]
    elapsed = time.perf_counter() - t0
    if failed:
        more = f"; {len(skipped)} part(s) not run" if skipped else ""
        say(f"self-test FAILED: {', '.join(failed)}{more} ({elapsed:.1f} s)")
    else:
        say(f"self-test passed: {len(results)} parts in {elapsed:.1f} s")
    if args.json:
        say(json.dumps({"ok": not failed, "failed": failed, "parts": [asdict(r) for r in results]}))
    return 1 if failed or skipped else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``learning-at-home --self-test [--part NAME] [--json] [--timeout S]``."""
    parser = argparse.ArgumentParser(prog="learning-at-home --self-test", description="checks the install")
    add_arguments(parser)
    return run(parser.parse_args(list(argv) if argv is not None else None))
