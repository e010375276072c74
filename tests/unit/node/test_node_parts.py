"""The node's pure parts: lock file, bind message, signaling URL, connection file, work gate, status, upkeep.

The token stores and the assignment's parsing are the account layer's: tests/unit/account."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from engine.account import MemoryTokenStore
from engine.control import ConnectionInfo, file_mode
from engine.node import STATUS_KEYS, UNAVAILABLE, AlreadyRunning, InstanceLock, Volunteer, WorkGate
from engine.p2p import CallContext, Handlers, Identity, RemoteError
from engine.p2p.signaling import signaling_url_of
from engine.resources import Settings
from engine.wire import Kind, Message
from engine.wire.statements import bind_message


def test_bind_message_bytes_are_stable() -> None:
    # Signed by nodes and verified by the coordinator: changing these bytes breaks every binding.
    for account in (1, 42, 10**9):
        assert bind_message(account) == b"lah-bind-host-v1\x00" + str(account).encode()


def test_signaling_url() -> None:
    assert signaling_url_of("http://127.0.0.1:8470") == "ws://127.0.0.1:8470/ws/signal"
    assert signaling_url_of("https://lah.example/") == "wss://lah.example/ws/signal"


def test_lock_refuses_a_second_node_and_takes_over_a_stale_one(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    with InstanceLock(path):
        assert path.read_text() == str(os.getpid())
        assert file_mode(path) == 0o600
        # another live process holding it: refused with its pid
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            path.write_text(str(child.pid))
            with pytest.raises(AlreadyRunning, match=f"pid {child.pid}") as e:
                InstanceLock(path).acquire()
            assert e.value.pid == child.pid
        finally:
            child.kill()
            child.wait(timeout=10)
        # its process is gone: the lock is stale and is taken over
        second = InstanceLock(path)
        second.acquire()
        assert second.held and path.read_text() == str(os.getpid())
        second.release()
    assert not path.exists()


def test_lock_with_garbage_is_stale(tmp_path: Path) -> None:
    path = tmp_path / "node.lock"
    path.write_text("not a pid")
    with InstanceLock(path) as lock:
        assert lock.held


def test_connection_file_is_0600_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "run" / "control.json"
    info = ConnectionInfo("127.0.0.1", 1234, ConnectionInfo.new_secret(), os.getpid())
    info.write(path)
    assert file_mode(path) == 0o600
    assert ConnectionInfo.read(path) == info
    assert len(info.secret) == 64 and info.secret != ConnectionInfo.new_secret()


async def test_work_gate_refuses_at_once_and_drains() -> None:
    handlers = Handlers()
    release = asyncio.Event()

    async def forward(msg: Message, ctx: CallContext) -> Message:
        await release.wait()
        return Message(Kind.RESPONSE, 0)

    handlers.add_unary("moe.forward", forward)
    gate = WorkGate()
    gate.wrap(handlers)
    gate.wrap(handlers)  # idempotent: one gate layer
    call = handlers.unary["moe.forward"]
    ctx = CallContext("p", 1)
    with pytest.raises(RemoteError) as e:
        await call(Message(Kind.REQUEST, 1), ctx)
    assert e.value.code == UNAVAILABLE and "starting" in e.value.message
    gate.reopen()
    running = asyncio.create_task(call(Message(Kind.REQUEST, 1), ctx))
    await asyncio.sleep(0.01)
    assert gate.in_flight == 1
    gate.close("You are using the computer")
    with pytest.raises(RemoteError, match="using the computer"):
        await call(Message(Kind.REQUEST, 2), ctx)
    assert not await gate.drain(0.05)
    release.set()
    assert await gate.drain(1.0)
    await running
    assert (gate.served, gate.refused) == (1, 2)


def test_status_model_before_start(tmp_path: Path) -> None:
    v = Volunteer(
        Identity.generate(), "http://127.0.0.1:9", MemoryTokenStore(), Settings(use_gpu=False), tmp_path
    )
    status = v.status()
    assert tuple(status) == STATUS_KEYS
    assert status["state"] == "starting" and status["accepting"] is False
    assert status["experts"] == [] and status["requests_served"] == 0
    assert status["device"] == "cpu" and status["credit"] is None


async def test_an_unforeseen_upkeep_failure_is_said_and_the_upkeep_goes_on() -> None:
    """Before, any error but the expected kinds ended the upkeep task silently: no more re-assignment,
    re-declaration or credit for the rest of the run."""
    from engine.node.config import VolunteerConfig
    from engine.node.volunteer import Volunteer

    volunteer = Volunteer.__new__(Volunteer)  # only the upkeep loop and its error list
    volunteer.config = VolunteerConfig(upkeep_interval=0.0)
    volunteer.errors = deque(maxlen=20)
    calls: list[int] = []

    async def upkeep_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("assignment")  # e.g. a coordinator reply without a field
        if len(calls) == 3:
            raise asyncio.CancelledError

    volunteer._upkeep_once = upkeep_once  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await volunteer._run_upkeep()
    assert len(calls) == 3
    assert [e["message"] for e in volunteer.errors] == ["upkeep: unexpected KeyError: 'assignment'"]
