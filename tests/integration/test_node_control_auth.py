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

    def refresh_credit(self) -> dict[str, Any]:
        self.calls.append("refresh_credit")
        return {"reading": True, "credit_at": None}

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


async def idle_connections(port: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 0.05) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def test_idle_unauthenticated_connections_are_capped_and_evicted(tmp_path: Path) -> None:
    """Another local user opening connections that never authenticate cannot pile them up."""
    node = FakeNode()
    server = ControlServer(node, tmp_path / "control.json", auth_timeout=60, max_unauthenticated=4)
    await server.start()
    try:
        flood = await idle_connections(server.port, 40)
        async with asyncio.timeout(20):
            while True:
                open_ = [r for r, _ in flood if not await closed_by_server(r)]
                if len(open_) <= 4:
                    break
        assert len(server._unauthenticated) <= 4 and server.evicted >= 36
        # The owner still gets in at once: its connection evicts the oldest idle one.
        async with ControlClient(server.path) as client:
            assert (await client.pause())["calls"] == ["pause"]
        for _, writer in flood:
            writer.close()
    finally:
        await server.stop()


async def test_a_connection_that_never_authenticates_is_closed_at_the_deadline(tmp_path: Path) -> None:
    server = ControlServer(FakeNode(), tmp_path / "control.json", auth_timeout=0.5)
    await server.start()
    try:
        ((reader, writer),) = await idle_connections(server.port, 1)
        assert await asyncio.wait_for(reader.read(), 20) == b""
        assert server.timed_out == 1 and not server._unauthenticated
        writer.close()
    finally:
        await server.stop()


async def test_authenticated_clients_are_capped(tmp_path: Path) -> None:
    server = ControlServer(FakeNode(), tmp_path / "control.json", max_clients=2)
    await server.start()
    try:
        async with ControlClient(server.path), ControlClient(server.path):
            with pytest.raises(ControlError, match="busy"):
                await ControlClient(server.path).connect()
        assert server.busy == 1
        async with ControlClient(server.path) as again:  # slots come back when clients leave
            await again.status()
    finally:
        await server.stop()


async def test_the_runtime_folder_is_private_even_if_it_existed_wider(tmp_path: Path) -> None:
    folder = tmp_path / "runtime"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    server = ControlServer(FakeNode(), folder / "control.json")
    await server.start()
    try:
        assert file_mode(folder) == 0o700
        assert file_mode(server.path) == 0o600
        fresh = tmp_path / "a" / "b"
        ConnectionInfo("127.0.0.1", 1, "s", 1).write(fresh / "control.json")
        assert file_mode(fresh) == 0o700
    finally:
        await server.stop()
