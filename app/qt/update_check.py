"""UpdateChecker: once a day, ``lah update`` as a short-lived child process (QProcess, no thread of
ours) says whether a newer, correctly signed release exists; on the volunteer's click it fetches the
file (kept only if its size and SHA-256 match the signed manifest) and the app opens it.

The check runs in a child so that the network code and its memory never live in the tray app, and a
slow or hostile site cannot stall it; every run has a time limit. The child asks the coordinator the app
joined where releases are published (``--coordinator``) and keeps the newest manifest it accepted in
``--state``; when the coordinator names no place, nothing is checked, and :func:`summary` says so in the
About box, as it says where updates come from and why the last check offered nothing.
"""

from __future__ import annotations

import html
import json
import logging
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QProcess, QTimer, Signal

log = logging.getLogger(__name__)

FIRST_CHECK_S = 120.0
EVERY_S = 24 * 3600.0
CHECK_TIMEOUT_S = 60.0
DOWNLOAD_TIMEOUT_S = 3600.0


def update_command(args: list[str]) -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, "update", *args]
    return [sys.executable, "-m", "lah", "update", *args]


class UpdateChecker(QObject):
    available = Signal(str, str)  # version, release notes URL
    downloaded = Signal(str)  # the verified file
    failed = Signal(str)  # why a download did not happen

    def __init__(
        self,
        download_dir: Path,
        extra_args: list[str] | None = None,
        parent: QObject | None = None,
        *,
        coordinator_url: str = "",
        state: Path | None = None,
    ):
        super().__init__(parent)
        self.download_dir = download_dir
        self.extra_args = extra_args or []
        self.coordinator_url = coordinator_url  # who names the manifest; set once the volunteer joined
        self.state = state
        self.last: dict[str, Any] | None = None
        self._proc: QProcess | None = None
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.check)
        self._deadline = QTimer(self, singleShot=True)
        self._deadline.timeout.connect(self._on_deadline)

    def start(self, first_s: float = FIRST_CHECK_S) -> None:
        self._timer.start(int(first_s * 1000))

    def check(self) -> None:
        self._run([], CHECK_TIMEOUT_S)
        self._timer.start(int(EVERY_S * 1000))

    def download(self) -> None:
        self._run(["--download", str(self.download_dir)], DOWNLOAD_TIMEOUT_S)

    def _run(self, args: list[str], timeout_s: float) -> None:
        if self._proc is not None:
            return  # one at a time
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.SeparateChannels)
        proc.finished.connect(lambda *_: self._on_finished(proc, downloading=bool(args)))
        command = update_command([*args, *self.source_args(), *self.extra_args])
        self._proc = proc
        proc.start(command[0], command[1:])
        self._deadline.start(int(timeout_s * 1000))

    def source_args(self) -> list[str]:
        out = ["--coordinator", self.coordinator_url] if self.coordinator_url else []
        return out + (["--state", str(self.state)] if self.state is not None else [])

    def summary(self) -> str:
        return summary(self.last, self.coordinator_url)

    def _on_deadline(self) -> None:
        if self._proc is not None:
            log.warning("the update check did not finish in time; stopped")
            self._proc.kill()

    def _on_finished(self, proc: QProcess, downloading: bool) -> None:
        self._deadline.stop()
        self._proc = None
        out = bytes(proc.readAllStandardOutput().data()).decode(errors="replace").strip().splitlines()
        # The lambda connected in _run holds this checker: left connected, checker -> child process ->
        # lambda -> checker is a cycle that Python's collector may free on whichever thread it runs
        # (an HTTP or aiortc thread), deleting Qt objects off the GUI thread.
        proc.finished.disconnect()
        proc.deleteLater()
        try:
            reply = json.loads(out[-1]) if out else {}
        except ValueError:
            reply = {}
        self.handle(reply, downloading)

    def handle(self, reply: dict[str, Any], downloading: bool) -> None:
        """What a run said (one JSON object from ``lah update``)."""
        self.last = reply
        if reply.get("error"):
            log.info("no update offered: %s", reply["error"])
        if downloading:
            if reply.get("file"):
                self.downloaded.emit(str(reply["file"]))
            else:
                self.failed.emit(str(reply.get("error") or "the download did not complete"))
        elif reply.get("offer") and reply.get("version"):
            self.available.emit(str(reply["version"]), str(reply.get("notes_url") or ""))


def summary(reply: dict[str, Any] | None, coordinator_url: str) -> str:
    """Where updates come from and what the last check found, as one line of the About box (HTML)."""
    e = html.escape
    if reply is None:
        return f"Updates: not checked yet; {e(coordinator_url)} will be asked where new versions are found."
    named_by, source = str(reply.get("named_by") or coordinator_url), reply.get("source")
    if reply.get("error"):
        why = str(reply["error"]).partition(": ")[2] or str(reply["error"])
        where = f"from {e(str(source))}" if source else f"as named by {e(named_by)}"
        return f"Updates: {where}. The last check offered nothing: {e(why)}."
    if not source:
        return (
            f"Updates: not checked. {e(named_by)} names no place where new versions are published, so "
            "Learning@home does not look for them; install new versions yourself."
        )
    where = f"from {e(str(source))} (named by {e(named_by)})"
    if reply.get("offer"):
        return f"Updates: {where}. Version {e(str(reply.get('version')))} is available."
    note = reply.get("note")
    return f"Updates: {where}. " + (f"Nothing offered: {e(str(note))}." if note else "Up to date.")
