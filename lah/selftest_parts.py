"""The self-test's parts after ``bundle`` (see :mod:`lah.selftest`); each returns one line or raises.

Each part imports what it tests inside itself, so a broken dependency fails that part, named, and the
others still run.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lah.resources import assets_dir

__all__ = ["PARTS_AFTER_BUNDLE", "PartFailed", "TorchInfo", "describe_error", "describe_torch"]


class PartFailed(Exception):
    """A part found a problem it can say in one sentence (no traceback wanted)."""


def describe_error(e: BaseException) -> str:
    """One line for an exception: its root cause's type and first line (numpy, for one, wraps a
    library that fails to load in an ImportError whose own first line is only a banner)."""
    if isinstance(e, PartFailed):
        return str(e)
    root, seen = e, {id(e)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    return f"{type(root).__name__}: {lines[0] if lines else repr(root)}"


#: Every third-party package the program imports (the demo's sklearn too), then the project's packages.
DEPENDENCIES = [
    "numpy",
    "torch",
    "aiortc",
    "aioice",
    "av",
    "msgspec",
    "cryptography",
    "platformdirs",
    "aiohttp",
    "sqlalchemy",
    "alembic",
    "aiosqlite",
    "asyncpg",
    "jinja2",
    "safetensors",
    "psutil",
    "pynvml",
    "tomli_w",
    "keyring",
    "sklearn.datasets",
    "sklearn.model_selection",
    "tqdm",
    "PySide6.QtCore",
    "PySide6.QtGui",
    "PySide6.QtWidgets",
    "PySide6.QtSvg",
    "PySide6.QtNetwork",
    "pyqtgraph",
    "engine.p2p",
    "engine.moe",
    "engine.dht",
    "engine.node",
    "engine.control",
    "engine.trainer",
    "coordinator.server.app",
    "app.qt.main",
    "lah.cli",
    "lah.demo",
]
if sys.platform != "win32":
    DEPENDENCIES.append("uvloop")
if sys.platform.startswith("linux"):
    DEPENDENCIES += ["Xlib", "PySide6.QtDBus"]


def check_imports() -> str:
    failed = []
    for name in DEPENDENCIES:
        try:
            importlib.import_module(name)
        except BaseException as e:  # an import can fail any way a damaged file lets it
            failed.append(f"{name} ({describe_error(e)})")
    if failed:
        raise PartFailed(f"{len(failed)} of {len(DEPENDENCIES)} failed to import: {'; '.join(failed)}")
    import av

    media = "PyAV stand-in (data channels only)" if getattr(av, "STUB", False) else f"PyAV {av.__version__}"
    return f"{len(DEPENDENCIES)} modules; {media}"


@dataclass(frozen=True)
class TorchInfo:
    """Which torch build this is and where experts run (the app shows this too)."""

    version: str
    build: str  # "CPU" or "CUDA 12.8" / "ROCm 6.2"
    device: str  # "cpu", "cuda:0"
    device_name: str  # "NVIDIA GeForce RTX 4070", or the CPU's name
    note: str  # what happens without a GPU

    def __str__(self) -> str:
        where = f"device {self.device} ({self.device_name})"
        return f"torch {self.version} ({self.build} build), {where}{self.note}"


def describe_torch() -> TorchInfo:
    import platform

    import torch

    from engine.moe import default_device

    cuda = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    build = f"CUDA {cuda}" if cuda else (f"ROCm {hip}" if hip else "CPU")
    device = default_device()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        note = ""
    else:
        name = platform.processor() or platform.machine()
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            note = ": an Apple GPU (MPS) is present, but experts run on the CPU (the engine uses CUDA or CPU)"
        elif build == "CPU":
            note = ": this build has no GPU support, experts run on the CPU"
        else:
            note = ": no usable GPU found, experts run on the CPU"
    return TorchInfo(torch.__version__, build, str(device), name, note)


async def _expert_step() -> float:
    import torch

    from engine.moe import ExpertBackend, ExpertSpec

    backend = ExpertBackend("selftest.0", ExpertSpec("ffn", dim=32, hidden=64), seed=0)
    try:
        x = torch.randn(8, 32, device=backend.device)
        y = await backend.forward("self-test", "a1", x)
        grad = await backend.backward("self-test", "a1", torch.ones_like(y))
        if y.shape != x.shape or grad.shape != x.shape:
            shapes = f"{tuple(y.shape)} and {tuple(grad.shape)}"
            raise PartFailed(f"expert returned shapes {shapes}, not {tuple(x.shape)}")
        if not (torch.isfinite(y).all() and torch.isfinite(grad).all()):
            raise PartFailed("expert's forward or backward is not finite")
        return float(grad.abs().sum())
    finally:
        await backend.close()


def check_compute() -> str:
    from engine.p2p import eventloop

    info = describe_torch()
    eventloop.run(_expert_step())
    return f"{info}; an ffn expert's forward and backward with an Adam step"


async def _loopback() -> str:
    import torch

    from coordinator.server.app import start
    from engine.p2p import CallContext, Handlers, Identity, Peer, patches
    from engine.p2p.patches import pin_host_addresses
    from engine.wire import Kind, Message

    patches.install()  # what the node runs (the bundle's self-test comes here without lah's CLI)
    pin_host_addresses(["127.0.0.1"])  # the test never leaves this machine
    handlers = Handlers()

    async def double(msg: Message, ctx: CallContext) -> Message:
        return Message(Kind.RESPONSE, 0, tensors=[t * 2 for t in msg.tensors])

    handlers.add_unary("double", double)
    hub = await start("127.0.0.1", 0)
    a = Peer(Identity.generate(), hub.signaling_url)
    b = Peer(Identity.generate(), hub.signaling_url, handlers=handlers)
    try:
        async with asyncio.timeout(60):
            await a.start()
            await b.start()
            x = torch.randn(256, 256)
            reply = await a.call(b.peer_id, "double", {}, [x], timeout=30)
        if not torch.equal(reply.tensors[0], 2 * x):
            raise PartFailed("the tensor came back different")
        from engine.p2p import native

        fast = [g for g in patches.GROUPS if patches.installed(g)]
        stock = [g for g in patches.GROUPS if not patches.installed(g)]
        link = a.links.get(b.peer_id)
        used = patches.transport_stats(link.pc.sctp).get("records") if link and link.pc.sctp else None
        return (
            "two peers on 127.0.0.1, a signed WebRTC data channel, 256 KiB tensor there and back"
            f" (aiortc patches: {', '.join(fast) or 'none'}; stock: {', '.join(stock) or 'none'};"
            f" records: {used or 'stock'}, {native.status()})"
        )
    finally:
        await a.stop()
        await b.stop()
        await hub.stop()
        pin_host_addresses(None)


def check_webrtc() -> str:
    from engine.p2p import eventloop

    return f"{eventloop.run(_loopback())} ({eventloop.loop_name()})"


def _with_timeout(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except Exception as e:
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise PartFailed(f"{what} did not answer within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def check_keyring() -> str:
    from engine.account.tokens import FileTokenStore, KeyringTokenStore, default_token_store

    with tempfile.TemporaryDirectory(prefix="lah-selftest-") as tmp:
        store = default_token_store(Path(tmp))
        if isinstance(store, KeyringTokenStore):
            import keyring

            backend = type(keyring.get_keyring())
            _with_timeout(lambda: store.get("self-test: no such entry"), 10, "the OS keyring")
            return f"OS keyring {backend.__module__}.{backend.__name__} answers (read-only probe)"
        assert isinstance(store, FileTokenStore)
        store.set("self-test", "value")
        mode = stat.S_IMODE(store.path.stat().st_mode)
        if store.get("self-test") != "value":
            raise PartFailed(f"the token file {store.path} does not read back what was written")
        if os.name == "posix" and mode != 0o600:
            raise PartFailed(f"the token file fallback has mode {mode:o}, not 600")
    return "no OS keyring here: the account token is kept in a private file (mode 600) in the data dir"


async def _migrate(url: str) -> None:
    from coordinator.db.migrations import migrate

    await migrate(url)


def check_coordinator() -> str:
    from coordinator.site.render import STATIC_DIR, TEMPLATES_DIR, make_env
    from engine.p2p import eventloop

    with tempfile.TemporaryDirectory(prefix="lah-selftest-") as tmp:
        eventloop.run(_migrate(f"sqlite+aiosqlite:///{Path(tmp) / 'selftest.sqlite3'}"))
    env = make_env()
    names = env.list_templates()
    for name in names:
        env.get_template(name)
    if not names or not any(STATIC_DIR.iterdir()):
        raise PartFailed(f"the site's templates or static files are missing ({TEMPLATES_DIR})")
    return f"migrations to head on SQLite; {len(names)} site templates load"


def _in_child(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def check_processes() -> str:
    """A spawned worker (the coordinator verifies large receipt batches that way): in a bundle the child
    is this same executable, which must hand over to multiprocessing (entry.py's freeze_support)."""
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        pid, value = pool.submit(_in_child, 7).result(timeout=60)
    if value != 49 or pid == os.getpid():
        raise PartFailed(f"the spawned worker answered {value} from pid {pid}")
    return "a spawned worker process answers (how the coordinator checks large receipt batches)"


def _display() -> str | None:
    if not sys.platform.startswith("linux"):
        return "desktop"
    return os.environ.get("WAYLAND_DISPLAY") or os.environ.get("DISPLAY")


def check_app() -> str:
    display = _display()
    if display is None or os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtCore import QCoreApplication
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon

    icon = assets_dir() / "icons" / "app.svg"
    if not icon.is_file():
        raise PartFailed(f"the app's icon {icon} is missing")
    app = QCoreApplication.instance() or QApplication([sys.argv[0]])
    renderer = QSvgRenderer(str(icon))
    if not renderer.isValid():
        raise PartFailed(f"{icon} is not a valid SVG")
    image = QImage(32, 32, QImage.Format.Format_ARGB32)
    image.fill(0)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    if image.pixelColor(16, 16).alpha() == 0:
        raise PartFailed(f"{icon} rendered empty")
    platform_name = QGuiApplication.platformName()
    tray = QSystemTrayIcon.isSystemTrayAvailable()
    del app
    if display is None:
        where = (
            "no display: the tray app cannot start here and says so; `learning-at-home node` is the "
            "headless volunteer"
        )
    elif not tray:
        where = f"display {display} ({platform_name}) has no system tray: the app cannot show a tray icon"
    else:
        where = f"display {display} ({platform_name}) with a system tray"
    return f"Qt renders the app's icon from {icon.parent}; {where}"


PARTS_AFTER_BUNDLE: dict[str, Callable[[], str]] = {
    "imports": check_imports,
    "compute": check_compute,
    "webrtc": check_webrtc,
    "keyring": check_keyring,
    "coordinator": check_coordinator,
    "processes": check_processes,
    "app": check_app,
}
