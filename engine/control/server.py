"""ControlServer: the node's local control socket (localhost TCP, secret-file auth, JSON lines).

Any local user can open a TCP connection to it, so what an unauthenticated connection may hold is
bounded: it must send the secret within ``auth_timeout``; at most ``max_unauthenticated`` wait for
that at once, and a new one evicts the oldest waiting (an honest client sends its secret at once, an
idle flood only pushes itself out); at most ``max_clients`` authenticated connections are served
(the tray app uses two). Counters: ``refused`` (wrong secret), ``evicted``, ``timed_out``, ``busy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from .protocol import (
    AUTH_TIMEOUT_S,
    MAX_LINE,
    ConnectionInfo,
    ControlError,
    decode,
    default_connection_path,
    encode,
)

logger = logging.getLogger(__name__)


class Controller(Protocol):
    def status(self) -> dict[str, Any]: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def snooze(self, seconds: float) -> None: ...

    async def set_limits(self, limits: dict[str, Any]) -> dict[str, Any]: ...

    def feed_idle(self, seconds: float, source: str) -> None: ...

    def refresh_credit(self) -> dict[str, Any]: ...

    def shutdown(self) -> None: ...


MAX_SNOOZE_S = 7 * 24 * 3600.0


class ControlServer:
    def __init__(
        self,
        controller: Controller,
        path: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        follow_interval: float = 0.5,
        heartbeat_s: float = 5.0,
        auth_timeout: float = AUTH_TIMEOUT_S,
        max_unauthenticated: int = 8,
        max_clients: int = 16,
    ) -> None:
        self.controller = controller
        self.path = path or default_connection_path()
        self.host = host
        self.port = port
        self.follow_interval = follow_interval
        self.heartbeat_s = heartbeat_s
        self.secret = ConnectionInfo.new_secret()
        self.auth_timeout = auth_timeout
        self.max_unauthenticated = max_unauthenticated
        self.max_clients = max_clients
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self.busy = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._unauthenticated: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}  # oldest first
        self._clients = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_LINE)
        self.port = self._server.sockets[0].getsockname()[1]
        ConnectionInfo(self.host, self.port, self.secret, os.getpid()).write(self.path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError, ValueError, ControlError):
            if ConnectionInfo.read(self.path).secret == self.secret:
                self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        while len(self._unauthenticated) >= self.max_unauthenticated:
            oldest = next(iter(self._unauthenticated))
            self._unauthenticated.pop(oldest).transport.abort()
            oldest.cancel()
            self.evicted += 1
        self._unauthenticated[task] = writer
        client = False
        try:
            client = await self._authenticate(reader, writer)
            self._unauthenticated.pop(task, None)
            if client:
                await self._requests(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except TimeoutError:
            if task in self._unauthenticated:
                self.timed_out += 1
        finally:
            self._unauthenticated.pop(task, None)
            self._clients -= client
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await writer.wait_closed()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        async with asyncio.timeout(self.auth_timeout):
            line = await reader.readline()
        try:
            given = decode(line).get("auth")
        except ControlError:
            given = None
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.secret.encode()):
            self.refused += 1
            writer.write(encode({"ok": False, "error": "unauthorized", "message": "wrong or missing secret"}))
            await writer.drain()
            return False
        if self._clients >= self.max_clients:
            self.busy += 1
            writer.write(encode({"ok": False, "error": "busy", "message": "too many control clients"}))
            await writer.drain()
            return False
        self._clients += 1  # counted from here; _serve gives it back once this returns True
        try:
            writer.write(encode({"ok": True}))
            await writer.drain()
        except BaseException:
            self._clients -= 1
            raise
        return True

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            rid: Any = None
            try:
                request = decode(line)
                rid = request.get("id")
                cmd = request.get("cmd")
                if cmd == "status" and request.get("follow"):
                    await self._follow(rid, writer)
                    return
                result = await self._dispatch(str(cmd), request)
                reply: dict[str, Any] = {"id": rid, "ok": True, "result": result}
            except ControlError as e:
                reply = {"id": rid, "ok": False, "error": e.code, "message": e.message}
            except Exception as e:  # a bug in a command must not take the node down
                logger.exception("control command failed")
                reply = {"id": rid, "ok": False, "error": "internal", "message": str(e)}
            writer.write(encode(reply))
            await writer.drain()

    async def _dispatch(self, cmd: str, request: dict[str, Any]) -> Any:
        c = self.controller
        if cmd == "status":
            return c.status()
        if cmd == "pause":
            await c.pause()
            return c.status()
        if cmd == "resume":
            await c.resume()
            return c.status()
        if cmd == "snooze":
            seconds = request.get("seconds")
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, int | float)
                or not 0 < seconds <= MAX_SNOOZE_S
            ):
                raise ControlError("bad_request", f"snooze takes seconds in (0, {MAX_SNOOZE_S:.0f}]")
            await c.snooze(float(seconds))
            return c.status()
        if cmd == "set_limits":
            limits = request.get("limits")
            if not isinstance(limits, dict):
                raise ControlError("bad_request", "set_limits takes {'limits': {field: value, ...}}")
            return await c.set_limits(limits)
        if cmd == "shutdown":
            c.shutdown()
            return None
        if cmd == "refresh_credit":
            return c.refresh_credit()
        if cmd == "feed_idle":
            seconds, source = request.get("seconds"), request.get("source", "app")
            number = isinstance(seconds, int | float) and not isinstance(seconds, bool)
            if not number or not isinstance(source, str):
                raise ControlError("bad_request", "feed_idle takes {'seconds': number, 'source': text}")
            c.feed_idle(float(seconds), source)  # type: ignore[arg-type]
            return None
        raise ControlError("unknown_command", f"unknown command {cmd!r}")

    async def _follow(self, rid: Any, writer: asyncio.StreamWriter) -> None:
        last: dict[str, Any] | None = None
        sent_at = 0.0
        loop = asyncio.get_running_loop()
        while True:
            status = self.controller.status()
            now = loop.time()
            if status != last or now - sent_at >= self.heartbeat_s:
                writer.write(encode({"id": rid, "event": "status", "status": status}))
                async with asyncio.timeout(30):
                    await writer.drain()
                last, sent_at = status, now
            await asyncio.sleep(self.follow_interval)
