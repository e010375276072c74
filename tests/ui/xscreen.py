"""A real X screen with a real system tray host, for tests that must see and click a Qt tray icon.

Why not QT_QPA_PLATFORM=offscreen: there `QSystemTrayIcon.isSystemTrayAvailable()` is False, so the
tray code the volunteer actually runs is never exercised. Here Xvfb gives a real X server on a Unix
socket only (`-nolisten tcp`), `trayer` owns `_NET_SYSTEM_TRAY_S0` and docks XEmbed icons, xdotool
sends real XTest input, and python-xlib reads the window tree to find icons and popup menus.

    with XScreen() as screen:
        app = screen.popen([sys.executable, "tray_probe.py", str(events)])
        x, y = screen.wait_for_tray_icon(timeout=10)
        screen.click(x, y, button=3)
        menu = screen.wait_for_menu(timeout=5)
        screen.click(*menu_item_center(menu, index=0, count=2))

Every wait has a finite timeout and raises XScreenError saying what it waited for; close() ends
every process this class started (terminate, then kill) and reaps it, so no Xvfb is left behind.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from Xlib import X, display, error

T = TypeVar("T")
DOUBLE_CLICK_GAP = 0.6  # s; Qt's default double-click interval on X11 without XSETTINGS is 400 ms
# Top right, as on most desktops; sized to its icons; opaque, so screenshots show the icons plainly;
# no struts or dock hints to negotiate, as there is no window manager.
TRAYER_ARGS = ["--edge", "top", "--align", "right", "--widthtype", "request", "--height", "32"]
TRAYER_ARGS += ["--transparent", "false", "--SetDockType", "true", "--SetPartialStrut", "false"]


class XScreenError(RuntimeError):
    """A wait ran out or a process of the screen died; the message says which and shows its log."""


@dataclass(frozen=True)
class WindowInfo:
    """A mapped window as the X server sees it; x, y are root (screen) coordinates."""

    id: int
    name: str
    wm_class: tuple[str, ...]
    types: tuple[str, ...]  # _NET_WM_WINDOW_TYPE atom names, e.g. "_NET_WM_WINDOW_TYPE_POPUP_MENU"
    override_redirect: bool
    x: int
    y: int
    width: int
    height: int

    @property
    def center(self) -> tuple[int, int]:
        return self.x + self.width // 2, self.y + self.height // 2


def menu_item_center(menu: WindowInfo, index: int, count: int) -> tuple[int, int]:
    """Centre of item `index` of a menu whose `count` items all have the same height (no separators);
    for menus with separators or sections prefer keyboard navigation (key("Down", ..., "Return"))."""
    return menu.x + menu.width // 2, menu.y + (2 * index + 1) * menu.height // (2 * count)


def _poll(what: str, probe: Callable[[], T | None], timeout: float, check: Callable[[], None]) -> T:
    """Call probe until it returns something not None, at most `timeout` seconds; `check` raises if a
    process we depend on has died, so a crash is reported as a crash and not as a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise XScreenError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(0.05)


class XScreen:
    """Xvfb (1280x800x24 by default) plus, unless tray=False, the trayer system tray at the top right.

    tray=False is the "no tray host" desktop: isSystemTrayAvailable() is False there; start_tray()
    can add the host later (a tray that appears after the app, as at a slow login)."""

    def __init__(
        self,
        *,
        tray: bool = True,
        width: int = 1280,
        height: int = 800,
        depth: int = 24,
        start_timeout: float = 15.0,
    ) -> None:
        self._tray_wanted = tray
        self._size = f"{width}x{height}x{depth}"
        self._start_timeout = start_timeout
        self._logdir = tempfile.TemporaryDirectory(prefix="xscreen-")
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._tray: subprocess.Popen[bytes] | None = None
        self._dpy: Any = None
        self._last_click: tuple[int, int, int, float] | None = None  # x, y, button, monotonic time
        self.display = ""
        self.env: dict[str, str] = {}
        self.startup_seconds = 0.0  # Xvfb + tray host ready, measured by start()

    # ---- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> XScreen:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        began = time.monotonic()
        read_end, write_end = os.pipe()
        try:
            # -displayfd: Xvfb picks a free display itself (lock files make this race-free across
            # parallel tests) and writes its number once it accepts connections. -noreset: the server
            # must not reset when its last client leaves, between one app and the next.
            args = ["Xvfb", "-displayfd", str(write_end), "-screen", "0", self._size]
            args += ["-nolisten", "tcp", "-noreset"]
            self._xvfb = self._spawn("Xvfb", args, pass_fds=(write_end,), env=os.environ)
            os.close(write_end)
            write_end = -1
            number = b""
            deadline = time.monotonic() + self._start_timeout
            while not number.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read_end], [], [], left)[0]:
                    raise XScreenError(
                        f"Xvfb gave no display number in {self._start_timeout}s\n{self.log('Xvfb')}"
                    )
                chunk = os.read(read_end, 16)
                if not chunk:
                    raise XScreenError(f"Xvfb exited before it was ready\n{self.log('Xvfb')}")
                number += chunk
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        self.display = f":{int(number)}"
        env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "XAUTHORITY")}
        # DBUS: a tray app must not reach the developer's real session bus (Qt would register a
        # StatusNotifierItem there, on the real desktop) nor autolaunch a dbus-daemon via X11.
        env.update(
            DISPLAY=self.display,
            QT_QPA_PLATFORM="xcb",
            XDG_SESSION_TYPE="x11",
            DBUS_SESSION_BUS_ADDRESS="unix:path=/nonexistent/xscreen-no-bus",
        )
        env.pop("QT_QPA_PLATFORMTHEME", None)
        self.env = env
        self._dpy = display.Display(self.display)
        if self._tray_wanted:
            self.start_tray()
        self.startup_seconds = time.monotonic() - began

    def start_tray(self, timeout: float | None = None) -> None:
        """Start trayer and wait until it owns _NET_SYSTEM_TRAY_S0, i.e. until apps can dock."""
        if self._tray is not None:
            raise XScreenError("the tray host is already running")
        self._tray = self._spawn("trayer", ["trayer", *TRAYER_ARGS], env=self.env)
        self.wait_for(
            "trayer to own _NET_SYSTEM_TRAY_S0",
            lambda: True if self.tray_available() else None,
            timeout or self._start_timeout,
        )

    def tray_available(self) -> bool:
        """What QSystemTrayIcon.isSystemTrayAvailable() asks on X11: does anyone own the selection?"""
        owner = self._dpy.get_selection_owner(self._dpy.intern_atom("_NET_SYSTEM_TRAY_S0"))
        return bool(getattr(owner, "id", owner) != X.NONE)

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start an app on this screen (env preset); close() ends it if the test has not."""
        kwargs.setdefault("env", self.env)
        return self._spawn(Path(args[0]).name, list(args), **kwargs)

    def close(self) -> None:
        """End apps first, then the tray host, then Xvfb: each SIGTERM, then SIGKILL after 5 s."""
        for _, proc in reversed(self._procs):
            if proc is self._xvfb and self._dpy is not None:
                with contextlib.suppress(Exception):  # the server may be gone; it is being ended anyway
                    self._dpy.close()
                self._dpy = None
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self._procs.clear()
        self._logdir.cleanup()

    def _spawn(self, name: str, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        # Logs go to files, not pipes: a full pipe nobody reads would block Xvfb or the app.
        with open(Path(self._logdir.name) / f"{name}-{len(self._procs)}.log", "wb") as log:
            kwargs.setdefault("stdout", log)
            kwargs.setdefault("stderr", subprocess.STDOUT)
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, **kwargs)
        self._procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        """The tail of the output of every process started under `name` (e.g. "Xvfb", "python")."""
        tails = [
            p.read_text(errors="replace")[-2000:]
            for p in sorted(Path(self._logdir.name).glob(f"{name}-*.log"))
        ]
        return f"--- {name} log ---\n" + "\n".join(tails)

    def _check(self) -> None:
        for name, proc in self._procs:
            if proc in (self._xvfb, self._tray) and proc.poll() is not None:
                raise XScreenError(f"{name} exited with {proc.returncode}\n{self.log(name)}")

    # ---- input and pictures ----------------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 20) -> None:
        self._check()
        subprocess.run(args, env=self.env, check=True, timeout=timeout, capture_output=True)

    def click(self, x: int, y: int, button: int = 1) -> None:
        """Real XTest pointer motion and a single click: 1 left, 2 middle, 3 right.

        Qt merges two presses of one button within its double-click interval (400 ms) and 5 px into
        a double click, and a right double click opens no menu (measured: reopening a menu 0.2 s
        after closing it failed every time). So a click that would merge with the previous one
        waits until it cannot; use double_click() to mean one."""
        last = self._last_click
        if last and last[2] == button and abs(last[0] - x) <= 8 and abs(last[1] - y) <= 8:
            time.sleep(max(0.0, last[3] + DOUBLE_CLICK_GAP - time.monotonic()))
        self.move(x, y)
        self._run("xdotool", "click", str(button))
        self._last_click = (x, y, button, time.monotonic())

    def double_click(self, x: int, y: int, button: int = 1) -> None:
        """Two clicks inside Qt's double-click interval: Qt reports Trigger, then DoubleClick."""
        self.click(x, y, button)
        self._run("xdotool", "click", str(button))
        self._last_click = (x, y, button, time.monotonic())

    def move(self, x: int, y: int) -> None:
        # `mousemove --sync` to where the pointer already is waits ~15 s for motion that never comes
        # (measured), so a second click on the same icon would stall: skip the move in that case.
        pointer = self._dpy.screen().root.query_pointer()
        if (pointer.root_x, pointer.root_y) != (x, y):
            self._run("xdotool", "mousemove", "--sync", str(x), str(y))

    def key(self, *keys: str) -> None:
        """xdotool key names, e.g. key("Down", "Return"); they go to whoever has the keyboard (an open
        Qt menu grabs it)."""
        self._run("xdotool", "key", "--delay", "50", *keys)

    def screenshot(self, path: str | os.PathLike[str]) -> Path:
        """The whole screen as a PNG (ImageMagick's import reads the root window)."""
        out = Path(path)
        self._run("import", "-display", self.display, "-window", "root", f"png:{out}")
        return out

    # ---- the window tree -------------------------------------------------------------------------

    def _info(self, win: Any, attrs: Any | None = None) -> WindowInfo:
        attrs = attrs or win.get_attributes()
        geom = win.get_geometry()
        pos = self._dpy.screen().root.translate_coords(win, 0, 0)
        prop = win.get_full_property(self._dpy.intern_atom("_NET_WM_NAME"), X.AnyPropertyType)
        name = prop.value.decode("utf-8", "replace") if prop and isinstance(prop.value, bytes) else ""
        types = win.get_full_property(self._dpy.intern_atom("_NET_WM_WINDOW_TYPE"), X.AnyPropertyType)
        return WindowInfo(
            id=win.id,
            name=name or (win.get_wm_name() or ""),
            wm_class=tuple(win.get_wm_class() or ()),
            types=tuple(self._dpy.get_atom_name(a) for a in (types.value if types else ())),
            override_redirect=bool(attrs.override_redirect),
            x=pos.x,
            y=pos.y,
            width=geom.width,
            height=geom.height,
        )

    def windows(self) -> list[WindowInfo]:
        """Mapped top-level windows (children of the root; there is no window manager to reparent)."""
        found = []
        for win in self._dpy.screen().root.query_tree().children:
            try:  # a window may vanish between query_tree and the next request
                attrs = win.get_attributes()
                if attrs.map_state == X.IsViewable:
                    found.append(self._info(win, attrs))
            except error.XError:
                continue
        return found

    def tray_icons(self) -> list[WindowInfo]:
        """Docked icons: viewable windows carrying _XEMBED_INFO that were reparented below another
        client's window (depth >= 2 under the root), which is what docking in any XEmbed tray does."""
        xembed = self._dpy.intern_atom("_XEMBED_INFO")
        icons: list[WindowInfo] = []

        def walk(win: Any, depth: int) -> None:
            try:
                for child in win.query_tree().children:
                    attrs = child.get_attributes()
                    if attrs.map_state != X.IsViewable:
                        continue
                    if depth >= 1 and child.get_full_property(xembed, X.AnyPropertyType) is not None:
                        info = self._info(child, attrs)
                        if info.width > 1 and info.height > 1:  # not yet sized by the host otherwise
                            icons.append(info)
                    else:
                        walk(child, depth + 1)
            except error.XError:
                return

        walk(self._dpy.screen().root, 0)
        return icons

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 10.0) -> T:
        """Poll `probe` (every 50 ms) until it returns non-None; XScreenError naming `what` after
        `timeout` s, or at once if Xvfb or the tray host has died. Every wait here goes through it."""
        return _poll(what, probe, timeout, self._check)

    def wait_for_tray_icon(self, timeout: float = 10.0) -> tuple[int, int]:
        """Screen coordinates of the centre of the first docked icon."""
        return self.wait_for(
            "a tray icon to dock", lambda: next((i.center for i in self.tray_icons()), None), timeout
        )

    def wait_for_window(self, name_or_class: str, timeout: float = 10.0) -> WindowInfo:
        """A mapped top-level whose _NET_WM_NAME/WM_NAME or either WM_CLASS part equals the string."""
        return self.wait_for(
            f"a window named {name_or_class!r}",
            lambda: next((w for w in self.windows() if name_or_class in (w.name, *w.wm_class)), None),
            timeout,
        )

    def menus(self) -> list[WindowInfo]:
        """Open popup menus: mapped override-redirect windows typed POPUP_MENU or DROPDOWN_MENU (Qt
        and GTK both set the type; tooltips and Qt's tray balloon are _NET_WM_WINDOW_TYPE_TOOLTIP)."""
        kinds = {"_NET_WM_WINDOW_TYPE_POPUP_MENU", "_NET_WM_WINDOW_TYPE_DROPDOWN_MENU"}
        return [w for w in self.windows() if w.override_redirect and kinds.intersection(w.types)]

    def wait_for_menu(self, timeout: float = 10.0) -> WindowInfo:
        return self.wait_for("a popup menu to open", lambda: next(iter(self.menus()), None), timeout)

    def wait_for_no_menu(self, timeout: float = 10.0) -> None:
        self.wait_for("every popup menu to close", lambda: True if not self.menus() else None, timeout)
