"""The self-test names the part that fails, and the bundle check names the damaged file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lah import bundle, selftest
from lah.selftest_parts import PartFailed

ROOT = Path(__file__).resolve().parents[2]


def fake_bundle(tmp_path: Path) -> Path:
    root = tmp_path / "learning-at-home"
    (root / "_internal" / "torch" / "lib").mkdir(parents=True)
    (root / "learning-at-home").write_bytes(b"\x7fELF executable")
    (root / "_internal" / "torch" / "lib" / "libtorch_cpu.so").write_bytes(os.urandom(4096))
    (root / "_internal" / "base_library.zip").write_bytes(b"zip" * 100)
    bundle.write_manifest(root)
    return root


def test_an_intact_bundle_passes(tmp_path: Path) -> None:
    root = fake_bundle(tmp_path)
    assert "3 files match" in selftest.check_bundle(root)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "libtorch_cpu.so truncated: 100 of 4,096 bytes"),
        (lambda p: p.write_bytes(bytes(4096)), "libtorch_cpu.so changed: SHA-256"),
        (lambda p: p.unlink(), "libtorch_cpu.so missing"),
    ],
)
def test_a_damaged_file_is_named(tmp_path: Path, damage: object, expected: str) -> None:
    root = fake_bundle(tmp_path)
    damage(root / "_internal" / "torch" / "lib" / "libtorch_cpu.so")  # type: ignore[operator]
    with pytest.raises(PartFailed, match=expected):
        selftest.check_bundle(root)


def test_a_missing_or_broken_manifest_is_named(tmp_path: Path) -> None:
    root = fake_bundle(tmp_path)
    manifest = root / "_internal" / bundle.MANIFEST_NAME
    manifest.write_text("{not json")
    with pytest.raises(PartFailed, match="unreadable"):
        selftest.check_bundle(root)
    manifest.unlink()
    if sys.platform != "darwin":
        with pytest.raises(PartFailed, match="missing"):
            selftest.check_bundle(root)


def test_failures_are_named_without_a_traceback_and_a_damaged_bundle_stops_the_rest() -> None:
    lines: list[str] = []

    def broken() -> str:
        raise OSError("libfoo.so: file too short")

    def never() -> str:
        raise AssertionError("must not run after a damaged bundle")

    results = selftest.run_parts({"bundle": broken, "compute": never}, say=lines.append)
    summary = [(r.part, r.ok, r.skipped) for r in results]
    assert summary == [("bundle", False, False), ("compute", False, True)]
    assert "FAIL  bundle       OSError: libfoo.so: file too short" in lines[0]
    assert "skipped: the bundle is damaged" in lines[1]

    lines.clear()
    results = selftest.run_parts({"keyring": broken, "app": lambda: "fine"}, say=lines.append)
    assert [r.ok for r in results] == [False, True]


def test_exit_status_and_summary(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(selftest.PARTS, "keyring", lambda: (_ for _ in ()).throw(PartFailed("no keyring")))
    assert selftest.main(["--part", "keyring", "--json"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("learning-at-home ") and "self-test" in out[0]
    assert out[-2].startswith("self-test FAILED: keyring")
    assert '"failed": ["keyring"]' in out[-1]


def test_a_part_that_hangs_is_named_and_ends_the_process() -> None:
    code = (
        "import time; from lah import selftest; selftest.PARTS.clear();"
        "selftest.PARTS['webrtc'] = lambda: time.sleep(60) or 'x';"
        "selftest.main(['--timeout', '1'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 1
    assert "FAIL  webrtc       no answer within 1 s" in done.stdout
    assert "self-test FAILED: webrtc" in done.stdout


@pytest.mark.integration
def test_the_whole_self_test_passes_from_source(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    done = subprocess.run(
        [sys.executable, "-m", "lah", "self-test"], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for part in ("imports", "compute", "webrtc", "keyring", "coordinator", "processes", "app"):
        assert f"ok    {part}" in done.stdout
    assert "skip  bundle" in done.stdout and "Traceback" not in done.stderr
    # no group fell back
    assert "aiortc patches: hosts, guard, sctp, ice, dtls, handshake; stock: none" in done.stdout
