"""NodeSupervisor: the node as the app's child process, restarted with back-off, given up on plainly.

The node is the same program with the ``node`` subcommand (``python -m lah node`` from source, the
bundle's own executable when frozen), so a bundle needs no Python. Qt's QProcess runs it without any
thread of ours: start, exit and output are events on the GUI thread, and the child's output goes
straight to ``node.log`` (rotated at each start), never through the GUI.

Policy: an unexpected exit is restarted after 1, 2, 4 ... 60 s; a run that lasted ``stable_s`` resets
the count; ``give_up_after`` quick failures in a row stop the restarts and say so (``gave_up``).
Exit code 2 means another node of this user already runs (e.g. started from a terminal, or one still
shutting down): the app uses that one, and starts its own again once that one no longer answers. ``stop()``
asks the node to shut down cleanly through the control API (checkpoints are written), then terminates, then
kills, each step bounded.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

log = logging.getLogger(__name__)

ALREADY_RUNNING_EXIT = 2
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)
EXTERNAL_CHECK_S = 10.0
LOG_KEEP = 3
LOG_ROTATE_BYTES = 2 * 2**20


def node_command(args: list[str]) -> list[str]:
    """How to start the node: the bundle's own executable, or this Python with ``-m lah``."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "node", *args]
    return [sys.executable, "-m", "lah", "node", *args]


def rotate(path: Path, keep: int = LOG_KEEP, max_bytes: int = LOG_ROTATE_BYTES) -> None:
    """node.log -> node.log.1 -> ... -> node.log.<keep> (dropped) once it is over ``max_bytes``."""
    try:
        if path.stat().st_size < max_bytes:
            return
    except FileNotFoundError:
        return
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


class NodeSupervisor(QObject):
    # "starting", "running", "restarting", "gave_up", "external", "stopped"; and a sentence for people
    state_changed = Signal(str, str)

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        *,
        request_shutdown: Callable[[], None] | None = None,
        node_reachable: Callable[[], bool] | None = None,
        backoff_s: tuple[float, ...] = BACKOFF_S,
        give_up_after: int = 5,
        stable_s: float = 300.0,
        shutdown_grace_s: float = 20.0,
        env: dict[str, str] | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.command = command
        self.log_path = log_path
        self.request_shutdown = request_shutdown
        self.node_reachable = node_reachable
        self.backoff_s = backoff_s
        self.give_up_after = give_up_after
        self.stable_s = stable_s
        self.shutdown_grace_s = shutdown_grace_s
        self.env = env
        self.state = "stopped"
        self.text = "Not started yet."
        self.failures = 0  # quick failures in a row
        self.starts = 0
        self.last_exit: tuple[int, str] | None = None  # code, "normal" / "crashed"
        self._stopping = False
        self._started_at = 0.0
        self._proc: QProcess | None = None
        self._retry = QTimer(self, singleShot=True)
        self._retry.timeout.connect(self._spawn)
        self._escalate = QTimer(self, singleShot=True)
        self._escalate.timeout.connect(self._on_escalate)
        self._external = QTimer(self, interval=int(EXTERNAL_CHECK_S * 1000))
        self._external.timeout.connect(self._check_external)
        self._on_stopped: list[Callable[[], None]] = []
        self._escalation = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return (
            int(proc.processId())
            if proc is not None and proc.state() != QProcess.ProcessState.NotRunning
            else None
        )

    def _set(self, state: str, text: str) -> None:
        self.state, self.text = state, text
        log.info("node %s: %s", state, text)
        self.state_changed.emit(state, text)

    def start(self) -> None:
        self._stopping = False
        self.failures = 0
        self._spawn()

    def _spawn(self) -> None:
        if self._stopping or (
            self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning
        ):
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            rotate(self.log_path)
        except OSError as e:
            log.warning("could not rotate %s: %s", self.log_path, e)
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        proc.setStandardOutputFile(str(self.log_path), QProcess.OpenModeFlag.Append)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        env.insert("LAH_PARENT_PID", str(os.getpid()))  # the node stops by itself if the app is gone
        for key, value in (self.env or {}).items():
            env.insert(key, value)
        proc.setProcessEnvironment(env)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        proc.started.connect(lambda: self._set("running", "The contribution engine is running."))
        self._proc = proc
        self.starts += 1
        self._started_at = time.monotonic()
        self._set("starting", "Starting the contribution engine…")
        proc.start(self.command[0], self.command[1:])

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:  # no finished() follows
            self._after_exit(
                -1, f"could not be started ({self._proc.errorString() if self._proc else error})"
            )

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        crashed = status == QProcess.ExitStatus.CrashExit
        self.last_exit = (code, "crashed" if crashed else "normal")
        if self._stopping:
            self._escalate.stop()
            self._set("stopped", "The contribution engine has stopped.")
            callbacks, self._on_stopped = self._on_stopped, []
            for callback in callbacks:
                callback()
            return
        if code == ALREADY_RUNNING_EXIT and not crashed:
            self._set("external", "Another copy of the contribution engine is already running; using it.")
            self._external.start()
            return
        self._after_exit(code, "crashed" if crashed else f"stopped with exit code {code}")

    def _check_external(self) -> None:
        if self._stopping or self.state != "external":
            self._external.stop()
        elif self.node_reachable is not None and not self.node_reachable():
            self._external.stop()
            self._spawn()

    def _after_exit(self, code: int, what: str) -> None:
        if self._stopping:
            return
        if time.monotonic() - self._started_at >= self.stable_s:
            self.failures = 0
        self.failures += 1
        if self.failures >= self.give_up_after:
            self._set(
                "gave_up",
                f"The contribution engine {what} {self.failures} times in a row, so it is no longer "
                "restarted. The log says why; 'Resume' tries again.",
            )
            return
        delay = self.backoff_s[min(self.failures - 1, len(self.backoff_s) - 1)]
        self._set("restarting", f"The contribution engine {what}; restarting in {delay:.0f} s.")
        self._retry.start(int(delay * 1000))

    def stop(self, on_stopped: Callable[[], None] | None = None) -> None:
        """Clean stop, bounded: shutdown through the control API, then terminate, then kill."""
        self._stopping = True
        self._retry.stop()
        self._external.stop()
        proc = self._proc
        if proc is None or proc.state() == QProcess.ProcessState.NotRunning:
            self._set("stopped", "The contribution engine is not running.")
            if on_stopped is not None:
                on_stopped()
            return
        if on_stopped is not None:
            self._on_stopped.append(on_stopped)
        if self.request_shutdown is not None:
            self.request_shutdown()
        else:
            proc.terminate()
        self._escalation = 0
        self._escalate.start(int(self.shutdown_grace_s * 1000))

    def kill(self, timeout_s: float = 10.0) -> None:
        """No more restarts, and the node killed now (for the app's own crash handling and tests)."""
        self._stopping = True
        self._retry.stop()
        self._escalate.stop()
        proc = self._proc
        if proc is not None and proc.state() != QProcess.ProcessState.NotRunning:
            proc.kill()
            proc.waitForFinished(int(timeout_s * 1000))

    def terminate_now(self) -> None:
        """The control API could not carry the shutdown: ask the OS instead (the kill timer still runs)."""
        if self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning:
            self._proc.terminate()

    def _on_escalate(self) -> None:
        proc = self._proc
        if proc is None or proc.state() == QProcess.ProcessState.NotRunning:
            return
        self._escalation += 1
        if self._escalation == 1:
            log.warning("the node did not stop within %.0f s; terminating it", self.shutdown_grace_s)
            proc.terminate()
            self._escalate.start(5000)
        else:
            log.warning("the node did not terminate; killing it")
            proc.kill()
