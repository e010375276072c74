"""The bundle's entry point routes arguments, and aiortc's data channel works with the PyAV stand-in."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from lah.resources import assets_dir, bundle_dir, frozen

ROOT = Path(__file__).resolve().parents[2]


def entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lah_bundle_entry", ROOT / "installers" / "entry.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "routed"),
    [
        ([], ["app"]),
        (["--coordinator", "https://x"], ["app", "--coordinator", "https://x"]),
        (["-v"], ["-v", "app"]),
        (["node", "--name", "app"], ["node", "--name", "app"]),
        (["-v", "status"], ["-v", "status"]),
        (["--self-test"], ["self-test"]),
        (["--self-test", "--part", "compute"], ["self-test", "--part", "compute"]),
        (["--help"], ["--help"]),
    ],
)
def test_routing(argv: list[str], routed: list[str]) -> None:
    assert entry().route(argv) == routed


def test_no_display_message(monkeypatch: pytest.MonkeyPatch) -> None:
    e = entry()
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(var, raising=False)
    message = e.no_display_message()
    if sys.platform.startswith("linux"):
        assert message is not None and "learning-at-home node" in message
    monkeypatch.setenv("DISPLAY", ":0")
    assert e.no_display_message() is None
    assert e.command(["-v", "app"]) == "app" and e.command(["node", "--name", "app"]) == "node"


def test_assets_dir_in_a_checkout() -> None:
    assert not frozen()
    assert bundle_dir() == ROOT
    assert (assets_dir() / "icons" / "app.svg").is_file()


def test_assets_dir_in_a_bundle(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert assets_dir() == tmp_path / "assets"


STUB_CHANNEL = """
import asyncio
import av
assert getattr(av, "STUB", False), av.__file__
from aiortc import RTCPeerConnection

async def main():
    a, b = RTCPeerConnection(), RTCPeerConnection()
    channel = a.createDataChannel("lah-rpc")
    got = asyncio.get_running_loop().create_future()
    b.on("datachannel", lambda c: c.on("message", lambda m: got.done() or got.set_result(m)))
    channel.on("open", lambda: channel.send(b"x" * 100_000))
    await a.setLocalDescription(await a.createOffer())
    await b.setRemoteDescription(a.localDescription)
    await b.setLocalDescription(await b.createAnswer())
    await a.setRemoteDescription(b.localDescription)
    message = await asyncio.wait_for(got, 30)
    await a.close()
    await b.close()
    try:
        av.VideoFrame()
    except av.MediaUnavailable as e:
        print("media refused:", e)
    print("received", len(message))

asyncio.run(main())
"""


def test_aiortc_data_channel_works_with_the_pyav_stand_in() -> None:
    env = {"PYTHONPATH": str(ROOT / "installers" / "stubs"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", STUB_CHANNEL], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "received 100000" in done.stdout and "media refused: VideoFrame" in done.stdout
