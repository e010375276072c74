"""The bundle's entry point: ``learning-at-home [SUBCOMMAND] ...``.

With no subcommand (a double-click, the desktop entry, the Start menu) it is the tray app; ``node``,
``coordinator``, ``demo`` and the others run as in ``lah``; ``--self-test`` (or ``self-test``) checks the
bundle and exits. The app starts its node as ``[sys.executable, "node", ...]``, so the bundle is the only
program on the machine.

The self-test is dispatched before anything heavy is imported: a damaged bundle file must make it fail
with the part named, not crash the entry point with a traceback.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

SUBCOMMANDS = (
    "app", "node", "status", "pause", "resume", "snooze", "coordinator", "demo", "demo-transport", "self-test"
)
GLOBAL_FLAGS = ("-v", "--verbose")
HELP_FLAGS = ("-h", "--help")


def route(argv: list[str]) -> list[str]:
    """``lah`` arguments for the bundle's ``argv``: the app unless a subcommand (or help) is named."""
    if "--self-test" in argv[:2]:
        return ["self-test", *[a for a in argv if a != "--self-test"]]
    i = 0
    while i < len(argv) and argv[i] in GLOBAL_FLAGS:
        i += 1
    if i < len(argv) and (argv[i] in SUBCOMMANDS or argv[i] in HELP_FLAGS):
        return argv
    return [*argv[:i], "app", *argv[i:]]


def command(args: list[str]) -> str | None:
    """The subcommand in routed arguments (the first one that is not a global flag)."""
    return next((a for a in args if a not in GLOBAL_FLAGS), None)


def no_display_message() -> str | None:
    """Why the tray app cannot start here (Linux without X11 or Wayland), with what to run instead."""
    if not sys.platform.startswith("linux"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    if os.environ.get("QT_QPA_PLATFORM", "").startswith("offscreen"):
        return None
    return (
        "learning-at-home: no display here (DISPLAY and WAYLAND_DISPLAY are unset), so the tray app cannot "
        "start, and nothing runs without your consent in it.\nOn a headless machine run the node instead:\n"
        "  learning-at-home node --coordinator URL --name NAME\n"
        "and control it with `learning-at-home status|pause|resume|snooze MINUTES`; "
        "`learning-at-home --self-test` checks this installation."
    )


def windows_console(cmd: str | None) -> None:
    """Give a windowed Windows executable (no console: the tray app) somewhere to print.

    In a terminal the subcommands print there (the parent's console); the Start menu's self-test gets a
    console of its own; anything else, such as the node the app starts, writes to nowhere, quietly."""
    if sys.platform != "win32" or sys.stdout is not None:
        return
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32")
    attached = bool(kernel32.AttachConsole(-1))  # ATTACH_PARENT_PROCESS
    if not attached and cmd == "self-test":
        attached = bool(kernel32.AllocConsole())
        os.environ["LAH_SELF_TEST_PAUSE"] = "1"
    target = "CONOUT$" if attached else os.devnull
    sys.stdout = open(target, "w", encoding="utf-8", errors="replace")  # noqa: SIM115 (for the process)
    sys.stderr = open(target, "w", encoding="utf-8", errors="replace")  # noqa: SIM115


def main() -> int:
    if not any(os.environ.get(v) for v in ("LC_ALL", "LC_CTYPE", "LANG")):
        os.environ["LC_CTYPE"] = "C.UTF-8"  # what Python itself coerces to; Qt warns about plain "C"
    args = route(sys.argv[1:])
    windows_console(command(args))
    if args and args[0] == "self-test":
        from lah.selftest import main as self_test  # imports nothing heavy before its own checks

        status = self_test(args[1:])
        if os.environ.get("LAH_SELF_TEST_PAUSE"):  # its own console closes when the process ends
            input("Press Enter to close this window.")
        return status
    if command(args) == "app":
        message = no_display_message()
        if message is not None:
            print(message, file=sys.stderr)
            return 2
    from lah.cli import main as lah_main

    return lah_main(args)


if __name__ == "__main__":
    multiprocessing.freeze_support()  # the coordinator's receipt verifiers are spawned processes
    sys.exit(main())
