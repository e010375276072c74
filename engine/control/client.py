"""ControlClient: what the tray app and ``lah status/pause/resume/snooze`` use to talk to the node."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .protocol import MAX_LINE, ConnectionInfo, ControlError, NodeNotRunning, Unauthorized, decode, encode


class ControlClient:
    """``async with ControlClient() as c: await c.pause()``. Every wait is bounded by ``timeout``."""

    def __init__(self, path: Path | None = None, *, timeout: float = 10.0, secret: str | None = None) -> None:
        from .protocol import default_connection_path

        self.path = path or default_connection_path()
        self.timeout = timeout
        self._secret = secret
        self._ids = itertools.count(1)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        info = ConnectionInfo.read(self.path)
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_connection(info.host, info.port, limit=MAX_LINE)
                self._reader, self._writer = reader, writer
                writer.write(encode({"auth": self._secret if self._secret is not None else info.secret}))
                await writer.drain()
                reply = decode(await reader.readline() or b"{}")
        except (OSError, TimeoutError) as e:
            raise NodeNotRunning(
                f"the node (pid {info.pid}) does not answer on {info.host}:{info.port}: {e}"
            ) from e
        if reply.get("ok") is not True:
            await self.close()
            if reply.get("error") == "busy":
                raise ControlError("busy", str(reply.get("message", "busy")))
            raise Unauthorized(str(reply.get("message", "refused")))

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> ControlClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, cmd: str, **args: Any) -> Any:
        if self._reader is None or self._writer is None:
            raise ControlError("not_connected", "call connect() first")
        rid = next(self._ids)
        async with asyncio.timeout(self.timeout):
            self._writer.write(encode({"id": rid, "cmd": cmd, **args}))
            await self._writer.drain()
            line = await self._reader.readline()
        if not line:
            raise ControlError("disconnected", "the node closed the connection")
        reply = decode(line)
        if not reply.get("ok"):
            raise ControlError(str(reply.get("error", "error")), str(reply.get("message", "")))
        return reply.get("result")

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("status")
        return result

    async def pause(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("pause")
        return result

    async def resume(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("resume")
        return result

    async def snooze(self, seconds: float) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("snooze", seconds=seconds)
        return result

    async def set_limits(self, **limits: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("set_limits", limits=limits)
        return result

    async def shutdown(self) -> None:
        """Ask the node to stop cleanly (checkpoints written); it exits soon after replying."""
        await self.request("shutdown")

    async def feed_idle(self, seconds: float, source: str) -> None:
        await self.request("feed_idle", seconds=seconds, source=source)

    async def refresh_credit(self) -> dict[str, Any]:
        """Have the node read its credit from the coordinator now (the value follows in its status)."""
        result: dict[str, Any] = await self.request("refresh_credit")
        return result

    async def follow_status(self, idle_timeout: float = 30.0) -> AsyncIterator[dict[str, Any]]:
        """Status updates as they change (a heartbeat at least every few seconds); this connection only."""
        if self._reader is None or self._writer is None:
            raise ControlError("not_connected", "call connect() first")
        self._writer.write(encode({"id": next(self._ids), "cmd": "status", "follow": True}))
        await self._writer.drain()
        while True:
            async with asyncio.timeout(idle_timeout):
                line = await self._reader.readline()
            if not line:
                return
            event = decode(line)
            if event.get("event") == "status" and isinstance(event.get("status"), dict):
                yield event["status"]
            elif not event.get("ok", True):
                raise ControlError(str(event.get("error")), str(event.get("message", "")))
