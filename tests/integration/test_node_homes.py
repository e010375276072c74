"""Two real ``lah node`` processes on one machine and account, each with its own --data-dir, against a
real coordinator: they share no file (lock, control file, identity, token, settings, log), each is
reached by its home, a third node on a taken home is refused with the PID, the one without a display
says why it waits and which flag changes that, the one with limit flags runs with them, and an edit of
a settings file is picked up by its running node."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.server.app import RunningCoordinator
from engine.control import ControlClient, ControlError, file_mode
from engine.control.commands import run_client, run_node
from engine.node import NodeHome
from tests.integration.test_node_swarm import full_coordinator

pytestmark = pytest.mark.integration
__all__ = ["full_coordinator"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.pop("DBUS_SESSION_BUS_ADDRESS", None)  # no session to ask about idleness: a server
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
        env[var] = str(tmp_path / "user" / var.lower())  # the default home: never used here
    env |= {"LAH_HOST_ADDRESSES": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
    env["PYTHON_KEYRING_BACKEND"] = "keyring.backends.fail.Keyring"
    return env


async def _status(home: NodeHome, timeout: float = 90.0, until: Any = None) -> dict[str, Any]:
    """The node's status once it has joined (and ``until(status)`` holds)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                async with ControlClient(home.control, timeout=5) as client:
                    status = await client.status()
                if status["state"] != "starting" and (until is None or until(status)):
                    return status
            except ControlError:
                pass
            await asyncio.sleep(0.3)


@pytest.mark.timeout(240)
async def test_two_nodes_with_their_own_data_dir_share_nothing(
    full_coordinator: RunningCoordinator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = full_coordinator.url
    a, b = NodeHome.at(tmp_path / "a"), NodeHome.at(tmp_path / "b")
    common = ["--coordinator", url, "--no-use-gpu", "--ram-budget-mib", "1024"]
    flags = ["--no-only-when-idle", "--pause-when-other-cpu-percent", "0"]
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lah",
            "node",
            *common,
            "--name",
            name,
            "--data-dir",
            str(home.data),
            *extra,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=_env(tmp_path),
        )
        for name, home, extra in (("ada", a, []), ("bob", b, flags))
    ]
    try:
        sa, sb = await asyncio.gather(_status(a), _status(b))
        # nothing shared: each home holds its own lock (with its PID), control file, key and token
        assert a.lock.read_text() == str(procs[0].pid) and b.lock.read_text() == str(procs[1].pid)
        for home in (a, b):
            for path in (home.control, home.identity, home.data / "token.json"):
                assert path.exists() and file_mode(path) == 0o600, path
        assert a.identity.read_bytes() != b.identity.read_bytes()
        assert sa["peer_id"] != sb["peer_id"] and sa["account_id"] != sb["account_id"]
        assert not (tmp_path / "user").exists()  # nothing in the user's own folders

        # a server without a display: ada waits, and says which setting and flag would let it work
        assert (sa["state"], sa["reason_code"]) == ("waiting", "idle_unknown")
        assert "--no-only-when-idle" in sa["hint"] and str(a.settings) in sa["hint"]
        assert sa["overrides"] == {"use_gpu": False, "ram_budget_mib": 1024}
        # bob's flags hold for the run, never written to his settings file
        assert sb["overrides"] == {
            **sa["overrides"],
            "only_when_idle": False,
            "pause_when_other_cpu_percent": 0,
        }
        sb = await _status(b, until=lambda s: s["state"] == "running")
        assert sb["limits"]["only_when_idle"] is False and not b.settings.exists()

        # `lah status --data-dir` reaches each one
        capsys.readouterr()
        assert await run_client("status", home=a) == 0
        shown = capsys.readouterr().out
        assert "hint:      Nothing here tells whether someone is using this computer" in shown
        assert "work:      " in shown and "credit:    " in shown

        # a third node on ada's home is refused with her node's PID, and changes nothing there
        assert await run_node(url, home=NodeHome.at(a.data)) == 2
        refused = capsys.readouterr().err
        assert f"pid {procs[0].pid}" in refused and f"lah status --data-dir {a.data}" in refused
        assert a.lock.read_text() == str(procs[0].pid)

        # ada's node has said in her home's log why it waits (checked each HINT_CHECK_S), before ...
        log = a.data / "logs" / "node.log"
        async with asyncio.timeout(30):
            while not log.exists() or "waiting. Nothing here tells" not in log.read_text():
                await asyncio.sleep(0.2)
        # ... it follows an edit of her settings file
        a.settings.write_text("only_when_idle = false\npause_when_other_cpu_percent = 0\n")
        sa = await _status(a, 30, until=lambda s: s["state"] == "running")
        assert sa["hint"] is None and sa["limits"]["only_when_idle"] is False
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        outputs = [(await asyncio.wait_for(p.communicate(), 60))[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    said = log.read_text()  # what the console said is in the home's log too
    assert "waiting. Nothing here tells" in said and f"settings: {a.settings} changed" in said
    assert "lah node: stopping; this run served" in outputs[0]
    assert not a.lock.exists() and not a.control.exists()
