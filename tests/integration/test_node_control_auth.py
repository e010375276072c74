"""The control socket admits only holders of the secret file's secret (the same user)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engine.control import ConnectionInfo, ControlClient, ControlError, ControlServer, Unauthorized, file_mode
from engine.control.protocol import NodeNotRunning

pytestmark = pytest.mark.integration


class FakeNode:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def status(self) -> dict[str, Any]:
        return {"state": "running", "calls": list(self.calls)}

    async def pause(self) -> None:
        self.calls.append("pause")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def snooze(self, seconds: float) -> None:
        self.calls.append(f"snooze {seconds}")

    async def set_limits(self, limits: dict[str, Any]) -> dict[str, Any]:
        return limits

    def feed_idle(self, seconds: float, source: str) -> None:
        self.calls.append(f"idle {seconds} {source}")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


async def test_wrong_secret_is_refused_and_the_file_is_private(tmp_path: Path) -> None:
    node = FakeNode()
    server = ControlServer(node, tmp_path / "control.json")
    await server.start()
    try:
        assert file_mode(server.path) == 0o600
        assert ConnectionInfo.read(server.path).port == server.port
        with pytest.raises(Unauthorized):
            await ControlClient(server.path, secret="0" * 64).connect()
        # a raw client that skips auth gets nothing but the refusal
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b'{"id": 1, "cmd": "pause"}\n')
        await writer.drain()
        reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
        assert reply == {"ok": False, "error": "unauthorized", "message": "wrong or missing secret"}
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert node.calls == [] and server.refused == 2

        async with ControlClient(server.path) as client:
            assert (await client.pause())["calls"] == ["pause"]
            await client.snooze(90)
            assert node.calls == ["pause", "snooze 90.0"]
            with pytest.raises(ControlError, match="bad_request"):
                await client.snooze(-1)
            with pytest.raises(ControlError, match="unknown_command"):
                await client.request("format_disk")
            await client.feed_idle(12.5, "app:x11")
            await client.shutdown()
            assert node.calls[-2:] == ["idle 12.5 app:x11", "shutdown"]
            with pytest.raises(ControlError, match="bad_request"):
                await client.request("feed_idle", seconds="soon")
    finally:
        await server.stop()
    assert not server.path.exists()
    with pytest.raises(NodeNotRunning, match="lah node"):
        await ControlClient(server.path).connect()
