"""What the lifecycle asks of the side that owns windows, processes and threads, and the callbacks it
hands that side.

:class:`Host` is the seam between :mod:`app.core.lifecycle` (what the app decides) and the Qt
controller (``app.qt.controller``: the windows, the node's process, the control link, the loop thread);
a test's recording host implements it with no event loop. ``Done`` and ``Reply`` are the shapes of
what comes back: a finished piece of work or command, and an answer to a window.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from .consent import FirstRun
from .presentation import View

Done = Callable[[Any, BaseException | None], None]  # (result, error), called back on the host's thread
Reply = Callable[[str | None], None]  # to a window: a sentence for the volunteer, or None when it worked


class Host(Protocol):
    """What the lifecycle asks of the side that owns windows, processes and threads."""

    def notify(self, title: str, text: str) -> None:
        """Tell the volunteer: a tray message, or the no-tray window's note."""

    def show_tray(self) -> None:
        """The tray icon appears (nothing where the desktop has no tray)."""

    def render(self, view: View) -> None:
        """Show ``view`` everywhere: menu status line, Pause/Resume, tray icon and tooltip, windows."""

    def show_wizard(self, first_run: FirstRun) -> None:
        """Open the first-run wizard; it calls ``register`` and, once closed, ``wizard_closed``."""

    def show_window(self) -> bool:
        """Show the window that stands in for the tray; False where there is a tray instead."""

    def start_node(self) -> None:
        """Start the node's process (made once, from ``node_args``) and follow its control API."""

    def restart_node(self) -> None:
        """Start the node's process again after it was given up on."""

    def start_updates(self, coordinator_url: str) -> None:
        """Start the daily update check against what that server names."""

    def run(self, work: Coroutine[Any, Any, Any], done: Done) -> None:
        """Run ``work`` off the GUI thread; ``done(result, error)`` back on it."""

    def send(self, cmd: str, done: Done | None, **args: Any) -> None:
        """A command to the node's control API; ``done(result, error)`` back on the GUI thread."""

    def show_node_status(self, status: dict[str, Any], new_point: bool) -> None:
        """A new status for the status window, where it is open (``new_point``: a new chart point)."""

    def node_state(self) -> tuple[str, str] | None:
        """The node's process: (supervisor state, a sentence), or None before it was first started."""

    def node_connected(self) -> bool:
        """Whether the node's control API answers now."""

    def wind_down(self, on_stopped: Callable[[], None]) -> None:
        """Quit: hide every window, stop the node cleanly (bounded), then ``on_stopped`` (maybe twice)."""

    def finish(self) -> None:
        """Stop following the node, drop the tray, close the loop thread, leave the event loop."""
